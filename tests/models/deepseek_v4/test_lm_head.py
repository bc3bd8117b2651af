"""lm_head (FP32 logits), the model head chain hc_head -> rms_norm -> lm_head, and greedy
sampling (argmax, lowest id on ties) vs their goldens and float64 / torch references
(pypto-lib `models/deepseek/v4-flash/lm_head.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`)."""

import pytest
import torch

import pto
from pto.golden import TensorSpec, exact, ratio_allclose, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.hc_head import make_hc_head_inputs
from pto.models.deepseek_v4.lm_head import (build_lm_head, golden_final_logits, golden_lm_head, lm_head_kernels,
                                            make_lm_head_weight)
from pto.models.deepseek_v4.sampling import build_greedy_sample, golden_greedy_sample, greedy_sample_kernels

TINY = get_config("tiny")


def _run(cr, check=True):
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=check)
    assert res.passed, res.error
    return res


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("prefill", 9)])
def test_lm_head_matches_golden_and_float64(mode, T):
    cr = build_lm_head("tiny", mode, T=T)
    res = _run(cr)
    v = {s.name: s.init_value for s in cr.specs if s.init_value is not None}
    want = v["hidden"].double() @ v["weight"].double().T
    assert torch.allclose(res.actual["logits"].double(), want, rtol=1e-5, atol=1e-5)
    assert [t.name for t in res.program.graph.tasks] == ["lm_head"]


def test_lm_head_ragged_vocab_tiles():
    cfg = TINY.replace(vocab_size=2100)  # 2048 + a 52-column tail tile
    k = lm_head_kernels(cfg)
    hidden = torch.randn(5, cfg.hidden_size).to(torch.bfloat16)
    weight = make_lm_head_weight(cfg, 3)
    specs = [TensorSpec("hidden", [5, cfg.hidden_size], torch.bfloat16, init_value=hidden),
             TensorSpec("weight", list(weight.shape), torch.bfloat16, init_value=weight),
             TensorSpec("logits", [5, 2100], torch.float32, is_output=True)]

    def golden(v):
        v["logits"] = golden_lm_head(v["hidden"], v["weight"])

    res = run_jit(k.lm_head_test, specs, golden, {"logits": ratio_allclose(1e-3, 1e-3, 0.0)})
    assert res.passed, res.error
    assert res.program.graph.tasks[0].n_blocks == 2


def test_final_logits_chain_matches_golden():
    T = 12
    k = lm_head_kernels(TINY)
    hc = make_hc_head_inputs(TINY, T, 0)
    norm_w = (1 + 0.1 * torch.randn(TINY.hidden_size, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    weight = make_lm_head_weight(TINY, 0)
    ins = dict(hc, norm_w=norm_w, weight=weight)
    specs = [TensorSpec(n, list(t.shape), t.dtype, init_value=t) for n, t in ins.items()]
    specs.append(TensorSpec("logits", [T, TINY.vocab_size], torch.float32, is_output=True))

    def golden(v):
        v["logits"] = golden_final_logits(*(v[n] for n in ins), TINY)

    res = run_jit(k.final_logits_test, specs, golden, {"logits": ratio_allclose(1e-3, 1e-3, 0.005)})
    assert res.passed, res.error
    assert [t.name for t in res.program.graph.tasks] == ["hc_head_rms", "hc_head_linear", "hc_head_mix", "rms_norm",
                                                         "lm_head"]
    assert res.program.graph.named_edges() >= {("hc_head_mix", "rms_norm"), ("rms_norm", "lm_head")}


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("decode", 3)])
def test_greedy_sample_lowest_id_on_ties(mode, T):
    cr = build_greedy_sample("tiny", mode, T=T)
    res = _run(cr)
    ids = res.actual["next_ids"]
    V = TINY.vocab_size
    assert ids[0] == 0 and ids[1] == V // 2 and ids[2] == 7  # all equal / two maxima / -inf elsewhere
    logits = cr.specs[0].init_value
    assert torch.equal(ids, torch.tensor([int(r.tolist().index(max(r.tolist()))) for r in logits]))


def test_greedy_sample_ties_everywhere():
    """Rows of few distinct values: many ties per row, the kernel takes the first maximum."""
    k = greedy_sample_kernels(TINY)
    logits = torch.randint(0, 3, (16, TINY.vocab_size), generator=torch.Generator().manual_seed(5)).float()
    specs = [TensorSpec("logits", [16, TINY.vocab_size], torch.float32, init_value=logits),
             TensorSpec("next_ids", [16], torch.int64, is_output=True)]

    def golden(v):
        v["next_ids"] = golden_greedy_sample(v["logits"])

    res = run_jit(k.greedy_sample_test, specs, golden, {"next_ids": exact()})
    assert res.passed, res.error
    first_two = (logits == 2).float().argmax(dim=-1)
    assert torch.equal(res.actual["next_ids"], first_two)


def test_head_tiling_errors():
    with pytest.raises(pto.ConfigError, match="vocab_size"):
        greedy_sample_kernels(TINY.replace(vocab_size=2 ** 24))
    with pytest.raises(pto.ConfigError, match="hidden_size=120"):
        lm_head_kernels(TINY.replace(hidden_size=120))


@pytest.mark.slow
def test_lm_head_and_greedy_sample_flash_decode():
    _run(build_lm_head("flash", "decode"), check=False)
    _run(build_greedy_sample("flash", "decode"), check=False)
