"""prefill_attention_hca (pypto-lib `models/deepseek/v4-flash/prefill_attention_hca.py`) at the tiny preset, and the HCA decode path
continuing it.

The kernel against its golden in check mode (start of a sequence, a chunk after pre-filled
history, inactive tail rows, a permuted raw table, the seed variant); the compressed
candidates of each token (k < (pos + 1) // 128); and prefill of N tokens then K decode steps
(decode_attention_hca, S = 1 and 2) equals one prefill of N + K tokens: raw cache and
compressed cache bit for bit, compressor state and block outputs within the stated
tolerances (the projections run as other tiles). FLASH as slow.
"""

import pytest
import torch

import pto
from pto.golden import get_case, ratio_allclose, ratio_reldiff, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_attention_hca import HCA_ARGS, decode_attention_hca_kernels
from pto.models.deepseek_v4.decode_metadata import decode_positions
from pto.models.deepseek_v4.prefill_attention_hca import (PREFILL_HCA_ARGS, golden_prefill_attention_hca,
                                                          golden_prefill_cmp_indices, make_prefill_hca_inputs,
                                                          prefill_attention_hca_kernels)

TINY = get_config("tiny")
OUTS = ("kv_cache", "cmp_kv", "compress_state")


def _prefill(d, check=False):
    v = {n: d[n].clone() for n in OUTS}
    x_out = torch.zeros_like(d["x_hc"])
    prefill_attention_hca_kernels(TINY).prefill_attention_hca_test.run(
        *[v.get(n, d[n]) for n in PREFILL_HCA_ARGS], x_out, d["num_tokens"], config=pto.RunConfig(check=check))
    return v["kv_cache"], v["cmp_kv"], v["compress_state"], x_out


def _decode(d, check=True):
    v = {n: d[n].clone() for n in OUTS}
    x_out = torch.zeros_like(d["x_hc"])
    decode_attention_hca_kernels(TINY).decode_attention_hca_test.run(
        *[v.get(n, d[n]) for n in HCA_ARGS], x_out, config=pto.RunConfig(check=check))
    return v["kv_cache"], v["cmp_kv"], v["compress_state"], x_out


@pytest.mark.parametrize("opts", [{}, {"start_pos": 256, "num_tokens": 100}, {"start_pos": 128, "block_table": "permuted"},
                                  {"seed_scopes": True}, {"T": 40, "start_pos": 100}])
def test_kernel_matches_golden(opts):
    cr = get_case("prefill_attention_hca").build("tiny", "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error


def test_cmp_indices_per_token():
    pos = torch.arange(120, 140, dtype=torch.int32)
    idx = golden_prefill_cmp_indices(pos, 15, TINY.index_topk)
    assert (idx >= 0).sum(dim=1).tolist() == [0] * 7 + [1] * 8 + [0] * 5  # 127 sees entry 0; rows >= 15 none
    d = make_prefill_hca_inputs(TINY, 8, 124, 8, seed=1)  # positions 124..131: 127 closes window 0
    _, cmp_kv, _, _, mids = golden_prefill_attention_hca(d, TINY, return_intermediates=True)
    assert (mids["cmp_indices"] >= 0).sum(dim=1).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert int((cmp_kv != d["cmp_kv"]).any(dim=-1).sum()) == 1  # exactly one entry written


def test_packed_and_column_goldens_agree_bit_for_bit():
    """The packed golden needs no looser tolerance here (unlike the CSA block): a token sees a
    compressed entry only from position 127 on, where its window is full, so the packed valid
    keys fall into the kernel's column blocks."""
    d = make_prefill_hca_inputs(TINY, 48, 100, 48, seed=0)  # positions 100..147: 127 closes window 0
    packed = golden_prefill_attention_hca(d, TINY, return_intermediates=True)
    columns = golden_prefill_attention_hca(d, TINY, return_intermediates=True, blocking="columns")
    assert int((packed[-1]["cmp_indices"] >= 0).sum()) == 21
    for a, b in zip(packed[:-1], columns[:-1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("start,S", [(0, 1), (0, 2), (128, 2)])
def test_prefill_then_decode_equals_longer_prefill(start, S):
    N, K = 120, 8  # the decode steps close the window at start + 127
    full = make_prefill_hca_inputs(TINY, N + K, start, N + K, seed=11)
    f_kv, f_cmp, f_state, f_x = _prefill(full)
    part = dict(full, num_tokens=N)
    for n in ("x_hc", "position_ids", "ori_slot_mapping", "cmp_slot_mapping", "state_slot_mapping"):
        part[n] = full[n][:N]
    kv, cmp, state, _ = _prefill(part)
    outs = []
    for t0 in range(N, N + K, S):
        step = dict(full, kv_cache=kv, cmp_kv=cmp, compress_state=state)
        for n in ("ori_slot_mapping", "cmp_slot_mapping", "state_slot_mapping", "x_hc"):
            step[n] = full[n][t0:t0 + S]
        step["position_ids"] = decode_positions([start + t0], S)
        for n in ("block_table", "cmp_block_table", "state_block_table"):
            step[n] = full[n][None, :]
        kv, cmp, state, x = _decode(step)
        outs.append(x)
    assert torch.equal(kv, f_kv)
    assert torch.equal(cmp, f_cmp) and not torch.equal(cmp, full["cmp_kv"])
    ok, detail = ratio_allclose(1e-3, 1e-3, 0.0)(state, f_state, rtol_run=1e-3, atol_run=1e-3)
    assert ok, detail
    ok, detail = ratio_reldiff(3e-3, 0.008, 1.0)(torch.cat(outs), f_x[N:])
    assert ok, detail


@pytest.mark.slow
def test_flash():
    cr = get_case("prefill_attention_hca").build("flash", "prefill", start_pos=8192)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error
