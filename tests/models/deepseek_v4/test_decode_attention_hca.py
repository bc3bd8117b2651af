"""decode_attention_hca (pypto-lib `models/deepseek/v4-flash/decode_attention_hca.py`) at the tiny preset.

The kernel against its golden in check mode (B = 4 at positions 0, 1, 127, 300; windows not
yet full; requests with no compressed rows; an inactive request; S = 1 and 2; the seed
variant); the SWA pages of two requests swapped and every compressed table reversed (contents
moved along) give bit-identical results; a closing step writes exactly one compressed row per
closing request and the closing token attends to it. Prefill-then-decode equality is in
test_prefill_attention_hca.py.
"""

import pytest
import torch

import pto
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_attention_hca import (HCA_ARGS, decode_attention_hca_kernels,
                                                         golden_decode_attention_hca, make_decode_hca_inputs)
from pto.models.deepseek_v4.decode_metadata import page_rows

TINY = get_config("tiny")
OUTS = ("kv_cache", "cmp_kv", "compress_state")


def _run(d, check=True, seed_scopes=False):
    v = {n: d[n].clone() for n in OUTS}
    x_out = torch.zeros_like(d["x_hc"])
    decode_attention_hca_kernels(TINY, seed_scopes).decode_attention_hca_test.run(
        *[v.get(n, d[n]) for n in HCA_ARGS], x_out, config=pto.RunConfig(check=check))
    return v["kv_cache"], v["cmp_kv"], v["compress_state"], x_out


@pytest.mark.parametrize("opts", [{}, {"start_pos": (0, 1, 127, 300)}, {"start_pos": (0, 1, 127, 300), "S": 1},
                                  {"start_pos": (126, -1, 255, 383), "reverse_tables": True},
                                  {"seed_scopes": True}])
def test_kernel_matches_golden(opts):
    cr = get_case("decode_attention_hca").build("tiny", "decode", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error
    assert res.outputs["kv_cache"].stats["max_abs"] == 0.0


def test_seed_variant_is_bit_identical():
    d = make_decode_hca_inputs(TINY, (0, 1, 127, 300), 2, seed=3)
    for a, b in zip(_run(d), _run(d, seed_scopes=True)):
        assert torch.equal(a, b)


def test_pages_swapped_and_compressed_tables_reversed():
    d = make_decode_hca_inputs(TINY, (0, 1, 127, 300), 2, seed=6)
    base = _run(d)
    e = dict(d)
    bs, CP = TINY.block_size, TINY.cmp_kv_block_num
    tab = d["block_table"].clone()
    a, b = int(tab[2, 127 // bs]), int(tab[3, 300 // bs])
    tab[2, 127 // bs], tab[3, 300 // bs] = b, a
    cache = d["kv_cache"].clone()
    cache[[a, b]] = d["kv_cache"][[b, a]]
    ct = d["cmp_block_table"].long()
    e.update(block_table=tab, kv_cache=cache, cmp_kv=d["cmp_kv"].flip(0),
             cmp_block_table=torch.where(ct >= 0, CP - 1 - ct, -1).to(torch.int32),
             ori_slot_mapping=page_rows(d["position_ids"], tab, bs, TINY.ori_kv_block_num))
    e["cmp_slot_mapping"] = page_rows(torch.where(d["cmp_slot_mapping"] >= 0, d["position_ids"] // 128, -1),
                                      e["cmp_block_table"], bs, CP)
    kv, cmp, state, x = _run(e)
    assert torch.equal(x, base[3]) and torch.equal(state, base[2])
    assert torch.equal(kv[[a, b]], base[0][[b, a]]) and torch.equal(cmp.flip(0), base[1])


def test_closing_step_writes_one_row_and_attends_to_it():
    d = make_decode_hca_inputs(TINY, (126, 5, 300, 254), 2, seed=8)  # tokens 1 (127) and 7 (255) close
    kv, cmp, state, x = _run(d)
    changed = (cmp != d["cmp_kv"]).any(dim=-1).flatten().nonzero().flatten().tolist()
    assert changed == sorted(int(d["cmp_slot_mapping"][t]) for t in (1, 7))
    g = golden_decode_attention_hca(d, TINY, return_intermediates=True)
    mids = g[-1]
    n_vis = (mids["cmp_indices"] >= 0).sum(dim=1).tolist()
    assert n_vis == [0, 1, 0, 0, 2, 2, 1, 2]  # w < (p + 1) // 128 per token
    assert (mids["cmp_indices"][2:4] == -1).all() and (mids["swa_indices"][2:4] >= 0).sum() == 13  # 5, 6: 6 + 7 keys
    # the closing token 1 sees the entry written in this step: without it its output changes
    d2 = dict(d, cmp_slot_mapping=torch.where(torch.arange(8) == 1, -1, d["cmp_slot_mapping"]))
    _, _, _, x2 = _run(d2)
    assert (x2[1] - x[1]).abs().max() > 1e-4 and torch.equal(x2[2:], x[2:])


@pytest.mark.slow
def test_flash():
    cr = get_case("decode_attention_hca").build("flash", "decode")
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error
