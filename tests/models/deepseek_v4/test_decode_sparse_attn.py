"""Decode sparse-attention cores (decode_sparse_attn.py, pypto-lib `decode_sparse_attn_swa.py` / pypto-lib `decode_sparse_attn_hca.py`) at the tiny preset.

The kernels against their goldens in check mode (B = 4 at positions 0, 1, 127, 300 with S = 1
and 2, an inactive request, reversed page tables); the golden against a float64 per-token
reference written from transformers `models/deepseek_v4/modeling_deepseek_v4.py` (sink in the denominator, inverse RoPE); invariance
under a permutation of the physical pages; FLASH as slow.
"""


import pytest
import torch

import pto
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_metadata import hca_cmp_cols
from pto.models.deepseek_v4.decode_sparse_attn import (golden_decode_attention_core, golden_decode_sparse_attn,
                                                       decode_sparse_attn_kernels, make_decode_attn_inputs)

TINY = get_config("tiny")
SWA = ("q", "ori_kv", "swa_indices", "attn_sink", "rope_cos", "rope_sin", "wo_a", "wo_b", "wo_b_scale")
HCA = SWA[:3] + ("cmp_kv", "cmp_block_table", "cmp_indices") + SWA[3:]


def _case(name, preset="tiny", **opts):
    cr = get_case(name).build(preset, "decode", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error
    return res


@pytest.mark.parametrize("name", ["decode_sparse_attn_swa", "decode_sparse_attn_hca"])
@pytest.mark.parametrize("opts", [{}, {"start_pos": (0, 1, 127, 300)}, {"start_pos": (0, 1, 127, 300), "S": 1},
                                  {"start_pos": (300, -1, 128, 255), "reverse_tables": True}])
def test_kernel_matches_golden(name, opts):
    res = _case(name, **opts)
    assert res.outputs["attn_out"].stats["max_abs"] <= 2 ** -6  # bit-level agreement up to BF16 rounding
    if -1 in opts.get("start_pos", ()):
        assert (res.actual["attn_out"][2:4] == 0).all()  # inactive request: zero rows


def _reference_core(d, cfg, n_cmp):
    """Float64, one token at a time: valid keys only, softmax with the sink column."""
    T, H, hd = d["q"].shape
    S = T // 4
    n, out = cfg.nope_head_dim, torch.zeros(T, H, hd, dtype=torch.float64)
    ori = d["ori_kv"].reshape(-1, hd).double()
    for t in range(T):
        keys = [ori[int(i)] for i in d["swa_indices"][t] if i >= 0]
        if n_cmp:
            cmp = d["cmp_kv"].reshape(-1, hd).double()
            for k in d["cmp_indices"][t].tolist():
                if k >= 0:
                    page = int(d["cmp_block_table"][t // S, k // cfg.block_size])
                    keys.append(cmp[page * cfg.block_size + k % cfg.block_size])
        if not keys:
            continue
        K = torch.stack(keys)
        s = d["q"][t].double() @ K.T * cfg.head_dim ** -0.5  # [H, J]
        full = torch.cat([s, d["attn_sink"].double()[:, None]], dim=1)
        p = torch.softmax(full, dim=1)[:, :-1]
        o = p @ K
        c, si = d["rope_cos"][t, :cfg.qk_rope_head_dim // 2].double(), d["rope_sin"][t, :cfg.qk_rope_head_dim // 2].double()
        e, od = o[:, n::2].clone(), o[:, n + 1::2].clone()
        o[:, n::2], o[:, n + 1::2] = e * c + od * si, od * c - e * si  # rotation by minus the angle
        out[t] = o
    return out


@pytest.mark.parametrize("n_cmp", [0, hca_cmp_cols(TINY)])
def test_golden_core_against_float64_reference(n_cmp):
    d = make_decode_attn_inputs(TINY, (0, 1, 127, 300), 2, seed=3, n_cmp=n_cmp)
    cmp = (d["cmp_kv"], d["cmp_block_table"], d["cmp_indices"]) if n_cmp else (None, None, None)
    got = golden_decode_attention_core(d["q"], d["ori_kv"], d["swa_indices"], *cmp, d["attn_sink"], d["rope_cos"],
                                       d["rope_sin"], TINY, float32=True)
    ref = _reference_core(d, TINY, n_cmp)
    assert (got.double() - ref).abs().max() < 1e-5
    if n_cmp:  # tokens at 127 and 300 see compressed rows: dropping them changes the output
        no_cmp = golden_decode_attention_core(d["q"], d["ori_kv"], d["swa_indices"], None, None, None, d["attn_sink"],
                                              d["rope_cos"], d["rope_sin"], TINY, float32=True)
        assert (no_cmp[4:] - got[4:]).abs().max() > 1e-3 and torch.equal(no_cmp[:4], got[:4])


def test_physical_page_permutation_is_invisible():
    """Moving raw pages (and their table entries) and reversing every request's compressed
    pages (contents moved along) gives bit-identical kernel output."""
    cfg, n_cmp = TINY, hca_cmp_cols(TINY)
    d = make_decode_attn_inputs(cfg, (0, 1, 127, 300), 2, seed=5, n_cmp=n_cmp)
    k = decode_sparse_attn_kernels(cfg, n_cmp)

    def run(v):
        out = torch.zeros(v["q"].shape[0], cfg.hidden_size, dtype=torch.bfloat16)
        k.decode_sparse_attn_test.run(*[v[n] for n in HCA], out, config=pto.RunConfig(check=True))
        return out

    base = run(d)
    P, bs, CP = cfg.ori_kv_block_num, cfg.block_size, cfg.cmp_kv_block_num
    perm = torch.randperm(P, generator=torch.Generator().manual_seed(1))  # old page i -> new page perm[i]
    e = dict(d)
    e["ori_kv"] = torch.empty_like(d["ori_kv"])
    e["ori_kv"][perm] = d["ori_kv"]
    sw = d["swa_indices"].long()
    e["swa_indices"] = torch.where(sw >= 0, perm[sw.clamp(min=0) // bs] * bs + sw % bs, -1).to(torch.int32)
    cperm = torch.arange(CP).flip(0)
    e["cmp_kv"] = d["cmp_kv"][cperm]  # new page j holds old page CP-1-j
    ct = d["cmp_block_table"].long()
    e["cmp_block_table"] = torch.where(ct >= 0, CP - 1 - ct, -1).to(torch.int32)
    assert not torch.equal(e["swa_indices"], d["swa_indices"])
    assert torch.equal(run(e), base)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decode_sparse_attn_swa", "decode_sparse_attn_hca"])
def test_flash(name):
    res = _case(name, preset="flash")
    tl = decode_sparse_attn_kernels(get_config("flash"), 0 if name.endswith("swa") else 128).tiling
    assert tl.key_blocks == (1 if name.endswith("swa") else 2)  # pypto-lib `decode_sparse_attn_swa.py` / pypto-lib `decode_sparse_attn_hca.py` SPARSE_BLOCKS


def test_generic_core_with_top_k_like_compressed_columns():
    """The core the CSA variant uses: n_cmp = index_topk columns of arbitrary (non-monotone,
    repeated-page, partly -1) compressed slots per token; kernel == golden == float64."""
    cfg, n_cmp = TINY, TINY.index_topk
    d = make_decode_attn_inputs(cfg, (300, 0, 127, 64), 2, seed=12, n_cmp=hca_cmp_cols(cfg))
    gen = torch.Generator().manual_seed(13)
    picks = torch.full((8, n_cmp), -1, dtype=torch.int32)
    for t, n in enumerate([16, 9, 0, 3, 16, 1, 5, 12]):
        picks[t, :n] = torch.randperm(2 * cfg.block_size, generator=gen)[:n].to(torch.int32)  # slots of 2 pages
    ct = d["cmp_block_table"].clone()
    ct[:, 1] = ct[:, 0].flip(0)  # logical page 1 of each request: another request's page 0
    d.update(cmp_indices=picks, cmp_block_table=ct)
    k = decode_sparse_attn_kernels(cfg, n_cmp)
    assert k.tiling.key_blocks == 2  # 64 window + 16 compressed columns, padded to 128
    out = torch.zeros(8, cfg.hidden_size, dtype=torch.bfloat16)
    k.decode_sparse_attn_test.run(*[d[n] for n in HCA], out, config=pto.RunConfig(check=True))
    want = golden_decode_sparse_attn(*[d[n] for n in HCA], cfg)
    assert (out.float() - want.float()).abs().max() <= 2 ** -6
    core = golden_decode_attention_core(*[d[n] for n in HCA[:9]], cfg, float32=True)
    assert (core.double() - _reference_core(d, cfg, n_cmp)).abs().max() < 1e-5


def test_shared_int8_row_quantiser_equals_the_former_decode_copy():
    """The decode o-projection quantises with qkv_proj_rope.int8_quantize_rows and pl.recip
    (its former copy: ``127 / amax`` as a number over a tile, ``1.0 / s``): codes and dequant
    scales bit for bit, zero rows (the amax floor), tiny and huge rows included."""
    import pto.language as pl
    from pto.models.deepseek_v4.qkv_proj_rope import INT8_SCALE_MAX, int8_quantize_rows, int8_row_amax, int8_row_codes
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 96, generator=gen) * torch.logspace(-6, 4, 64)[:, None]
    x[5] = 0.0
    x[9, :] = 1e-5
    M, N = x.shape

    @pl.jit
    def both(x: pl.Tensor[[M, N], pl.FP32], c_new: pl.Out[pl.Tensor[[M, N], pl.INT8]],
             d_new: pl.Out[pl.Tensor[[M, 1], pl.FP32]], c_old: pl.Out[pl.Tensor[[M, N], pl.INT8]],
             d_old: pl.Out[pl.Tensor[[M, 1], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="quant"):
            t = x[0:M, 0:N]
            codes, s = int8_quantize_rows(t)
            c_new[0:M, 0:N] = codes
            d_new[0:M, 0:1] = pl.recip(s)
            s_old = INT8_SCALE_MAX / int8_row_amax(t)
            c_old[0:M, 0:N] = int8_row_codes(t, s_old)
            d_old[0:M, 0:1] = 1.0 / s_old

    outs = [torch.zeros(M, N, dtype=torch.int8), torch.zeros(M, 1), torch.zeros(M, N, dtype=torch.int8),
            torch.zeros(M, 1)]
    both(x, *outs)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    assert int(outs[0].abs().amax(dim=1).min()) == 0 and int(outs[0].abs().max()) == 127
