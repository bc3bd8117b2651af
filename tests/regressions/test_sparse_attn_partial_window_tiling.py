"""prefill_sparse_attn: the kernel runs its online softmax over fixed column blocks (window
block, then compressed blocks) while the golden packed the valid keys and tiled that list (the
reference golden's order, pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`), so the BF16 rounding of the probabilities
fell in different places for every token whose window is not full while compressed entries
are visible (start_pos 0, compress_ratio 4: tokens 3 .. window-2). No fixture had such a
token (every token had a full window). Against the packed golden, 22-25 % of ``attn_out``
elements were outside the tolerance at tiny (30 % at flash); passing at the 0.5 % ratio would
have needed rtol ~0.35 (tiny) to ~0.5 (flash). The registered golden now follows the kernel's
column blocking (``blocking="columns"``): bit-identical on 2 of 3 tiny seeds, max 3.1e-5 on the
third. Both orders are equally far from FP32 probabilities (relative L2 ~1e-3)."""

import pytest
import torch

from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_sparse_attn import (build_case, golden_attention_core, make_sparse_attn_inputs,
                                                        sparse_attn_tiling)

CORE_ARGS = ("q", "ori_kv", "swa_indices", "cmp_kv", "cmp_block_table", "cmp_indices", "attn_sink", "num_tokens",
             "rope_cos", "rope_sin")


def _case(preset, **opts):
    cr = build_case(preset, "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=False)
    assert res.passed, res.error
    return res


@pytest.mark.parametrize("opts", [dict(T=64, start_pos=0), dict(T=48, start_pos=40, seed=1),
                                  dict(T=64, num_tokens=50, start_pos=0, seed=2)])
def test_partial_windows_with_visible_compressed_entries(opts):
    res = _case("tiny", **opts)
    a, e = res.actual["attn_out"].float(), res.expected["attn_out"].float()
    assert (a - e).abs().max() <= 1e-4
    assert (a == e).float().mean() >= 0.99


def test_fixture_has_partial_windows_and_visible_compressed_entries():
    cfg = get_config("tiny")
    d = make_sparse_attn_inputs(cfg, 64, 64, 0, compress_ratio=4, start_pos=0)
    n_window = (d["swa_indices"] >= 0).sum(dim=1)
    n_cmp = (d["cmp_indices"] >= 0).sum(dim=1)
    assert n_window.tolist() == list(range(1, 65))
    assert n_cmp.tolist() == [min(16, (p + 1) // 4) for p in range(64)]


def _cores(seed):
    cfg = get_config("tiny")
    d = make_sparse_attn_inputs(cfg, 64, 64, seed, compress_ratio=4, start_pos=0)
    args = [d[k] for k in CORE_ARGS]
    lim = sparse_attn_tiling(cfg).cmp_cols
    return [golden_attention_core(*args, cfg, cmp_candidate_limit=lim, out_bf16=False, blocking=b).float()
            for b in ("packed", "columns")] + [golden_attention_core(*args, cfg, cmp_candidate_limit=lim,
                                                                      float32=True).float()]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_two_orders_differ_only_on_partial_windows_and_are_equally_accurate(seed):
    packed, columns, fp32 = _cores(seed)
    differs = ((packed - columns).abs().amax(dim=(1, 2)) > 0).nonzero().flatten().tolist()
    assert differs == list(range(3, 63))  # partial window (t < 63) and a visible compressed entry (t >= 3)

    def rel_l2(x, ref):
        return float((x - ref).norm() / ref.norm())

    assert rel_l2(packed, columns) < 1e-3  # measured 6.5e-4 .. 6.8e-4
    assert rel_l2(packed, fp32) < 1.5e-3 and rel_l2(columns, fp32) < 1.5e-3  # measured 1.0e-3 and 9.3e-4


@pytest.mark.slow
def test_partial_windows_flash():
    res = _case("flash", T=128, start_pos=0)
    a, e = res.actual["attn_out"].float(), res.expected["attn_out"].float()
    assert (a == e).float().mean() >= 0.95  # measured 0.975 (packed golden: 0.29)
