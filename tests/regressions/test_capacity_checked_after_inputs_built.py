"""``pto run hc_pre --mode decode --opt T=100000`` built 13 GB of inputs in 27 s before the
kernel's first ``create_tensor`` raised a CapacityError that named only the padded size. The
builders of capacity-bound kernels now check ``T`` before any input is built (CapacityError
naming T and the capacity, CLI exit 2), and the runtime's capacity error names the call's
runtime dims (T=129) next to the padded size (144)."""

import pytest
import torch

import pto
from pto.cli import main
from pto.golden import TensorSpec, get_case
from pto.models.deepseek_v4 import (expert_routed, expert_shared, gate, hc_head, hc_pre, moe, prefill_attention_csa,
                                    prefill_attention_hca, prefill_attention_swa, prefill_compressor_ratio4,
                                    prefill_indexer, prefill_indexer_compressor, prefill_sparse_attn, qkv_proj_rope)
from pto.models.deepseek_v4.config import get_config

INPUT_MAKERS = [(hc_pre, "make_hc_pre_inputs"), (qkv_proj_rope, "make_qkv_inputs"),
                (prefill_sparse_attn, "make_sparse_attn_inputs"), (prefill_attention_swa, "make_swa_inputs"),
                (gate, "make_gate_inputs"), (expert_shared, "make_expert_activations"), (moe, "make_moe_inputs"),
                (hc_head, "make_hc_head_inputs"), (prefill_attention_hca, "make_prefill_hca_inputs"),
                (prefill_attention_csa, "make_prefill_csa_inputs"),
                (prefill_compressor_ratio4, "make_prefill_compressor_ratio4_inputs"),
                (prefill_indexer_compressor, "make_prefill_indexer_compressor_inputs"),
                (prefill_indexer, "make_indexer_inputs"), (expert_routed, "make_routed_inputs")]
BUILDERS = [("hc_pre", "prefill"), ("qkv_proj_rope", "decode"), ("prefill_sparse_attn", "prefill"),
            ("prefill_attention_swa", "prefill"), ("gate", "decode"), ("expert_shared", "prefill"), ("moe", "prefill"),
            ("hc_head", "decode"), ("prefill_attention_hca", "prefill"), ("prefill_attention_csa", "prefill"),
            ("prefill_compressor_ratio4", "prefill"), ("prefill_indexer_compressor", "prefill"),
            ("prefill_indexer", "prefill"), ("expert_routed", "decode")]


@pytest.fixture
def built(monkeypatch):
    """Every input maker and TensorSpec.create_tensor record a call and refuse to build."""
    calls = []

    def refuse(what):
        def f(*a, **k):
            calls.append(what)
            raise AssertionError(f"{what} built an input")
        return f

    for mod, name in INPUT_MAKERS:
        monkeypatch.setattr(mod, name, refuse(name))
    monkeypatch.setattr(TensorSpec, "create_tensor", refuse("TensorSpec.create_tensor"))
    return calls


def test_cli_capacity_error_before_any_input(built, capsys):
    assert main(["run", "hc_pre", "--mode", "decode", "--opt", "T=100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: CapacityError: kernel hc_pre: T=100000")
    assert "token capacity 128" in err
    assert built == []


@pytest.mark.parametrize("kernel, mode", BUILDERS)
def test_builders_check_capacity_first(built, kernel, mode):
    with pytest.raises(pto.CapacityError, match=rf"kernel {kernel}: T=129 tokens \(round_up\(T, 16\) = 144 rows.*"
                                                r"capacity 128"):
        get_case(kernel).build("tiny", mode, T=129)
    assert built == []


def test_runtime_capacity_error_names_the_runtime_count():
    cfg, T = get_config("tiny"), 129
    ins = qkv_proj_rope.make_qkv_inputs(cfg, T, 0)
    outs = [torch.zeros(T, cfg.num_attention_heads, cfg.head_dim, dtype=torch.bfloat16),
            torch.zeros(T, cfg.head_dim, dtype=torch.bfloat16), torch.zeros(T, cfg.q_lora_rank, dtype=torch.int8),
            torch.zeros(T, 1)]
    with pytest.raises(pto.CapacityError, match=r"'qr_fp32'.*dim 0 = 144 exceeds its declared capacity 128 .*"
                                                r"runtime dims of this call: T=129"):
        qkv_proj_rope.qkv_proj_rope_entry(cfg).run(*ins.values(), *outs)
