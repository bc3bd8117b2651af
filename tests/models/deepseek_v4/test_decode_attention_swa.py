"""decode_attention_swa (pypto-lib `models/deepseek/v4-flash/decode_attention_swa.py`) at the tiny preset.

Prefill of N tokens then K decode steps equals one prefill of N + K tokens (cache and block
outputs), B = 4 requests at positions 0, 1, 127, 300 with the SWA pages of two requests
swapped, an inactive request, S = 1 and 2; FLASH as slow.
"""

import pytest
import torch

import pto
from pto.golden import get_case, ratio_reldiff, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_attention_swa import (SWA_ARGS, decode_attention_swa_kernels,
                                                         golden_decode_attention_swa, make_decode_swa_inputs)
from pto.models.deepseek_v4.decode_metadata import decode_positions, page_rows
from pto.models.deepseek_v4.prefill_attention_swa import (golden_prefill_attention_swa, make_swa_inputs,
                                                          prefill_attention_swa_kernels)

TINY = get_config("tiny")
PREFILL_ARGS = SWA_ARGS  # same names; the prefill block_table is one request's row


def _decode(d, cfg=TINY, check=True):
    kv = d["kv_cache"].clone()
    x_out = torch.zeros_like(d["x_hc"])
    decode_attention_swa_kernels(cfg).decode_attention_swa_test.run(
        *[kv if n == "kv_cache" else d[n] for n in SWA_ARGS], x_out, config=pto.RunConfig(check=check))
    return kv, x_out


def _prefill(d, cfg=TINY):
    kv = d["kv_cache"].clone()
    x_out = torch.zeros_like(d["x_hc"])
    prefill_attention_swa_kernels(cfg).prefill_attention_swa_test.run(
        *[kv if n == "kv_cache" else d[n] for n in PREFILL_ARGS], x_out, d["num_tokens"],
        config=pto.RunConfig(check=False))
    return kv, x_out


@pytest.mark.parametrize("opts", [{}, {"start_pos": (0, 1, 127, 300)}, {"start_pos": (0, 1, 127, 300), "S": 1},
                                  {"start_pos": (300, -1, 64, 2), "reverse_tables": True}])
def test_kernel_matches_golden(opts):
    cr = get_case("decode_attention_swa").build("tiny", "decode", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error
    assert res.outputs["kv_cache"].stats["max_abs"] == 0.0


@pytest.mark.parametrize("S", [1, 2])
def test_prefill_then_decode_equals_longer_prefill(S):
    N, K = 100, 4
    full = make_swa_inputs(TINY, N + K, 0, N + K, seed=7)
    kv_full, x_full = _prefill(full)
    part = dict(full)
    for n in ("x_hc", "ori_slot_mapping", "position_ids"):
        part[n] = full[n][:N]
    part["num_tokens"] = N
    kv, _ = _prefill(part)
    table = full["block_table"][None, :]
    outs = []
    for p0 in range(N, N + K, S):
        step = dict(full)
        pos = decode_positions([p0], S)
        step.update(x_hc=full["x_hc"][p0:p0 + S], position_ids=pos, block_table=table, kv_cache=kv,
                    ori_slot_mapping=page_rows(pos, table, TINY.block_size, TINY.ori_kv_block_num))
        kv, x_out = _decode(step)
        g_kv, g_x = golden_decode_attention_swa(step, TINY)
        assert torch.equal(g_kv, kv)
        outs.append(x_out)
    x_dec = torch.cat(outs)
    assert torch.equal(kv, kv_full)  # the cache, bit for bit
    ok, detail = ratio_reldiff(3e-3, 0.008, 1.0)(x_dec, x_full[N:])
    assert ok, detail
    # the goldens agree on the same split
    _, gx_full = golden_prefill_attention_swa(full, TINY)
    assert (gx_full[N:] - x_dec).abs().max() < 1e-2


def test_swapped_pages_of_two_requests_give_the_same_result():
    d = make_decode_swa_inputs(TINY, (0, 1, 127, 300), 2, seed=2)
    kv, x_out = _decode(d)
    e = dict(d)
    tab = d["block_table"].clone()
    a, b = int(tab[2, 127 // TINY.block_size]), int(tab[3, 300 // TINY.block_size])
    tab[2, 127 // TINY.block_size], tab[3, 300 // TINY.block_size] = b, a  # exchange two physical pages
    cache = d["kv_cache"].clone()
    cache[[a, b]] = d["kv_cache"][[b, a]]
    pos = d["position_ids"]
    e.update(block_table=tab, kv_cache=cache,
             ori_slot_mapping=page_rows(pos, tab, TINY.block_size, TINY.ori_kv_block_num))
    kv2, x2 = _decode(e)
    assert torch.equal(x2, x_out)
    assert torch.equal(kv2[[a, b]], kv[[b, a]])


def test_inactive_request_writes_nothing_and_attends_nothing():
    d = make_decode_swa_inputs(TINY, (40, -1, 3, 200), 2, seed=4)
    kv, x_out = _decode(d)
    written = (kv != d["kv_cache"]).any(dim=-1).flatten().nonzero().flatten()
    want = d["ori_slot_mapping"][d["ori_slot_mapping"] >= 0].sort().values
    assert torch.equal(written, want)  # exactly the 6 active tokens' rows
    _, _, mids = golden_decode_attention_swa(d, TINY, return_intermediates=True)
    assert (mids["attn_out"][2:4] == 0).all() and (mids["swa_indices"][2:4] == -1).all()


@pytest.mark.slow
def test_flash():
    cr = get_case("decode_attention_swa").build("flash", "decode")
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error
