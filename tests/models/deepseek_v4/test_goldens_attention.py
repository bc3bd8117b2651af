"""Goldens of the attention path: RoPE tables, prefill sparse attention, the SWA block and
the ratio-128 compressor (tiny preset, fast)."""

from __future__ import annotations

import math

import pytest
import torch

from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_attention_swa import (
    build_window_indices,
    golden_prefill_attention_swa,
    make_swa_inputs,
    permuted_block_table,
)
from pto.models.deepseek_v4.prefill_compressor_ratio128 import (
    HCA_RATIO,
    golden_prefill_compressor_ratio128,
    make_compressor_inputs,
)
from pto.models.deepseek_v4.prefill_sparse_attn import (
    golden_attention_core,
    golden_prefill_sparse_attn,
    make_sparse_attn_inputs,
)
from pto.models.deepseek_v4.rope import (
    golden_materialize_rope_rows,
    profile_for_ratio,
    rope_inv_freq,
    rope_tables,
    yarn_correction_range,
)

from dsv4_checks import compressor_chunk

TINY = get_config("tiny")
FLASH = get_config("flash")


# ---------------------------------------------------------------- RoPE tables
def test_main_table_position_zero_is_identity():
    cos, sin = rope_tables(TINY, "main")
    assert cos.shape == (TINY.max_position_embeddings, TINY.qk_rope_head_dim)
    assert cos.dtype == torch.float32
    assert torch.equal(cos[0], torch.ones(TINY.qk_rope_head_dim))
    assert torch.equal(sin[0], torch.zeros(TINY.qk_rope_head_dim))


def test_tables_are_full_width_duplicated():
    half = TINY.qk_rope_head_dim // 2
    for profile in ("main", "compress"):
        cos, sin = rope_tables(TINY, profile, max_pos=300)
        assert torch.equal(cos[:, :half], cos[:, half:])
        assert torch.equal(sin[:, :half], sin[:, half:])


def test_main_table_values():
    cos, sin = rope_tables(TINY, "main", max_pos=50)
    r = TINY.qk_rope_head_dim
    i = torch.arange(r // 2, dtype=torch.float64)
    w = 1e4 ** (-2 * i / r)
    assert torch.allclose(cos[49, : r // 2].double(), torch.cos(49 * w), atol=2e-6)
    assert torch.allclose(sin[49, : r // 2].double(), torch.sin(49 * w), atol=2e-6)


def test_yarn_range_at_flash_is_15_25():
    assert yarn_correction_range(FLASH) == (15, 25)
    assert yarn_correction_range(TINY) == (15, 25)


def test_yarn_compress_frequencies_blend():
    r = FLASH.qk_rope_head_dim
    base = 1.6e5 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    w = rope_inv_freq(FLASH, "compress").double()
    assert torch.allclose(w[:16], base[:16], rtol=1e-6)  # pairs 0..15 unscaled
    assert torch.allclose(w[25:], base[25:] / 16, rtol=1e-6)  # pairs >= 25 divided by 16
    rho = (20 - 15) / (25 - 15)
    assert w[20].item() == pytest.approx(base[20].item() * (1 - rho) + base[20].item() / 16 * rho, rel=1e-6)
    assert torch.equal(rope_inv_freq(TINY, "compress"), rope_inv_freq(FLASH, "compress"))


def test_rope_tables_bitwise_parity_with_transformers():
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    configuration = pytest.importorskip("transformers.models.deepseek_v4.configuration_deepseek_v4")
    ys = TINY.rope_scaling
    hf_cfg = configuration.DeepseekV4Config(
        hidden_size=TINY.hidden_size, num_attention_heads=TINY.num_attention_heads,
        head_dim=TINY.head_dim, qk_rope_head_dim=TINY.qk_rope_head_dim,
        max_position_embeddings=TINY.max_position_embeddings,
        rope_parameters={"rope_type": "yarn", "factor": ys.factor, "beta_fast": ys.beta_fast,
                         "beta_slow": ys.beta_slow,
                         "original_max_position_embeddings": ys.original_max_position_embeddings})
    rotary = modeling.DeepseekV4RotaryEmbedding(hf_cfg)
    pos = torch.tensor([[0, 5, 127, 1000, 16383]])
    half = TINY.qk_rope_head_dim // 2
    for profile in ("main", "compress"):
        assert torch.equal(getattr(rotary, f"{profile}_inv_freq"), rope_inv_freq(TINY, profile))
        cos_hf, sin_hf = rotary(torch.zeros(1), pos, layer_type=profile)
        cos, sin = rope_tables(TINY, profile)
        assert torch.equal(cos_hf[0], cos[pos[0], :half])
        assert torch.equal(sin_hf[0], sin[pos[0], :half])


def test_profile_for_ratio():
    assert profile_for_ratio(0) == "main"
    assert profile_for_ratio(4) == "compress"
    assert profile_for_ratio(128) == "compress"
    with pytest.raises(ConfigError):
        profile_for_ratio(8)
    with pytest.raises(ConfigError):
        rope_inv_freq(TINY, "yarn")


def test_materialize_rope_rows_leaves_tail_untouched():
    cos, sin = rope_tables(TINY, "main", max_pos=64)
    pos = torch.tensor([5, 9, 63, 0], dtype=torch.int32)
    fill = torch.full((4, TINY.qk_rope_head_dim), 7.0)
    c, s = golden_materialize_rope_rows(cos, sin, pos, 3, fill, fill)
    assert torch.equal(c[:3], cos[[5, 9, 63]]) and torch.equal(s[:3], sin[[5, 9, 63]])
    assert torch.equal(c[3], fill[3]) and torch.equal(s[3], fill[3])
    assert torch.equal(fill, torch.full_like(fill, 7.0))  # inputs not modified
    with pytest.raises(BindError):
        golden_materialize_rope_rows(cos, sin, torch.tensor([64]), 1, fill[:1], fill[:1])


# ---------------------------------------------------------------- sparse attention
def _naive_dense(d: dict, cfg, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 dense masked softmax with sink over whole caches, inverse RoPE, bf16 o-proj."""
    H, hd, r, bs = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.block_size
    n, G = cfg.nope_head_dim, cfg.o_groups
    ori = d["ori_kv"].reshape(-1, hd).double()
    cmp = d["cmp_kv"].reshape(-1, hd).double()
    keys = torch.cat([ori, cmp])  # [N_ori + N_cmp, hd]
    T = d["q"].shape[0]
    o = torch.zeros(T, H, hd, dtype=torch.float64)
    for t in range(num_tokens):
        mask = torch.zeros(keys.shape[0], dtype=torch.bool)
        for idx in d["swa_indices"][t].tolist():
            if idx >= 0:
                mask[idx] = True
        for slot in d["cmp_indices"][t].tolist():
            if slot >= 0 and slot // bs < d["cmp_block_table"].numel():
                phys = int(d["cmp_block_table"][slot // bs])
                if phys >= 0:
                    mask[ori.shape[0] + phys * bs + slot % bs] = True
        logits = d["q"][t].double() @ keys.T * hd ** -0.5  # [H, N]
        logits = logits.masked_fill(~mask, -math.inf)
        full = torch.cat([logits, d["attn_sink"].double()[:, None]], dim=1)
        p = torch.softmax(full, dim=1)[:, :-1]
        o[t] = p @ keys
    c = d["rope_cos"].double()[:, None, : r // 2]
    s = d["rope_sin"].double()[:, None, : r // 2]
    e, od = o[..., n::2].clone(), o[..., n + 1::2].clone()
    o[..., n::2] = e * c + od * s
    o[..., n + 1::2] = od * c - e * s
    o_r = torch.einsum("tgk,gok->tgo", o.reshape(T, G, -1), d["wo_a"].double())
    out = o_r.reshape(T, -1) @ d["wo_b"].double().T
    return o, out


@pytest.mark.parametrize("ratio", [0, 4])
def test_sparse_attn_matches_dense_float64(ratio):
    cfg = TINY
    d = make_sparse_attn_inputs(cfg, 24, 21, seed=3, compress_ratio=ratio, weight_format="bf16")
    d["attn_sink"] = d["attn_sink"] * 2  # a sink that matters
    o_ref, out_ref = _naive_dense(d, cfg, 21)
    o = golden_attention_core(*[d[k] for k in ("q", "ori_kv", "swa_indices", "cmp_kv",
                                               "cmp_block_table", "cmp_indices", "attn_sink")],
                              21, d["rope_cos"], d["rope_sin"], cfg, out_bf16=False)
    # Stated tolerance: BF16 probabilities in PV -> ~2^-9 relative per term.
    assert torch.allclose(o.double(), o_ref, atol=2e-3, rtol=1e-2)
    out = golden_prefill_sparse_attn(**d, cfg=cfg, weight_format="bf16", out_bf16=False)
    # Plus BF16 o_packed and BF16 o_r before wo_b.
    assert torch.allclose(out.double(), out_ref, atol=2e-3, rtol=2e-2)
    assert torch.equal(out[21:], torch.zeros_like(out[21:]))
    rel = (out.double() - out_ref).norm() / out_ref.norm()
    assert rel < 5e-3


def test_int8_o_proj_close_to_bf16():
    d = make_sparse_attn_inputs(TINY, 16, 16, seed=5, compress_ratio=4, weight_format="int8")
    out_q = golden_prefill_sparse_attn(**d, cfg=TINY).float()
    # dequantised weight through the float path: only the activation quant differs
    d_f = dict(d, wo_b=(d["wo_b"].float() * d["wo_b_scale"][:, None]))
    out_f = golden_prefill_sparse_attn(**d_f, cfg=TINY, weight_format="bf16").float()
    rel = (out_q - out_f).norm() / out_f.norm()
    assert rel < 1e-2


def test_query_with_no_valid_key_gives_zero_row():
    d = make_sparse_attn_inputs(TINY, 8, 8, seed=1, compress_ratio=4)
    d["swa_indices"][2] = -1
    d["cmp_indices"][2] = -1
    d["attn_sink"] = torch.full_like(d["attn_sink"], 3.0)
    core = golden_attention_core(*[d[k] for k in ("q", "ori_kv", "swa_indices", "cmp_kv",
                                                  "cmp_block_table", "cmp_indices", "attn_sink")],
                                 8, d["rope_cos"], d["rope_sin"], TINY)
    out = golden_prefill_sparse_attn(**d, cfg=TINY)
    assert not torch.isnan(core).any() and not torch.isnan(out).any()
    assert torch.equal(core[2], torch.zeros_like(core[2]))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert core[1].abs().sum() > 0


def test_cmp_slots_lowered_through_block_table():
    # The same key rows reached raw (swa) or through the compressed table give equal output.
    cfg = TINY
    d = make_sparse_attn_inputs(cfg, 4, 4, seed=2, compress_ratio=0)
    hd, bs = cfg.head_dim, cfg.block_size
    table = permuted_block_table(cfg.cmp_kv_block_num, cfg.cmp_kv_block_num, offset=5)
    cmp_kv = torch.zeros(cfg.cmp_kv_block_num, bs, 1, hd, dtype=torch.bfloat16)
    k = cfg.index_topk  # move the last index_topk raw keys of each token to the cmp side
    moved = d["swa_indices"][:, -k:].clone()
    cmp_idx = torch.full_like(d["cmp_indices"], -1)
    for t in range(4):
        for j, row in enumerate(moved[t].tolist()):
            slot = t * k + j
            phys = int(table[slot // bs]) * bs + slot % bs
            cmp_kv.view(-1, hd)[phys] = d["ori_kv"].view(-1, hd)[row]
            cmp_idx[t, j] = slot
    d2 = dict(d, cmp_kv=cmp_kv, cmp_block_table=table, cmp_indices=cmp_idx,
              swa_indices=torch.cat([d["swa_indices"][:, :-k], torch.full_like(moved, -1)], dim=1))
    assert torch.equal(golden_prefill_sparse_attn(**d, cfg=cfg), golden_prefill_sparse_attn(**d2, cfg=cfg))
    # a -1 table entry drops those slots
    d3 = dict(d2, cmp_block_table=torch.full_like(table, -1))
    d4 = dict(d2, cmp_indices=torch.full_like(cmp_idx, -1))
    assert torch.equal(golden_prefill_sparse_attn(**d3, cfg=cfg), golden_prefill_sparse_attn(**d4, cfg=cfg))


def test_sparse_attn_rejects_bad_input():
    d = make_sparse_attn_inputs(TINY, 4, 4, seed=0)
    with pytest.raises(BindError):
        golden_prefill_sparse_attn(**dict(d, num_tokens=5), cfg=TINY)
    with pytest.raises(BindError):
        golden_prefill_sparse_attn(**dict(d, q=d["q"][:, :4]), cfg=TINY)
    bad = d["swa_indices"].clone()
    bad[0, 0] = TINY.ori_kv_block_num * TINY.block_size
    with pytest.raises(BindError):
        golden_prefill_sparse_attn(**dict(d, swa_indices=bad), cfg=TINY)
    with pytest.raises(BindError):
        golden_prefill_sparse_attn(**d, cfg=TINY, weight_format="fp8")


# ---------------------------------------------------------------- SWA block
def test_window_indices_start_pos_zero():
    cfg = TINY
    T, W = 80, cfg.sliding_window
    blk = torch.arange(cfg.max_blocks_per_seq)
    identity = torch.where(blk < cfg.ori_kv_block_num, blk, -1).to(torch.int32)
    idx = build_window_indices(torch.arange(T, dtype=torch.int32), 75, identity, cfg)
    assert idx.shape == (T, W) and idx.dtype == torch.int32
    for p in range(75):
        lo = max(0, p - W + 1)
        assert idx[p, : p - lo + 1].tolist() == list(range(lo, p + 1))
        assert (idx[p, p - lo + 1:] == -1).all()
    assert (idx[75:] == -1).all()


def test_window_indices_through_permuted_table():
    cfg = TINY
    bs = cfg.block_size
    table = permuted_block_table(cfg.max_blocks_per_seq, cfg.ori_kv_block_num)
    assert sorted(table[: cfg.ori_kv_block_num].tolist()) == list(range(cfg.ori_kv_block_num))
    idx = build_window_indices(torch.tensor([100], dtype=torch.int32), 1, table, cfg)
    keys = list(range(100 - cfg.sliding_window + 1, 101))
    assert idx[0].tolist() == [int(table[k // bs]) * bs + k % bs for k in keys]
    table2 = table.clone()
    table2[100 // bs] = -1
    idx2 = build_window_indices(torch.tensor([100], dtype=torch.int32), 1, table2, cfg)
    assert (idx2[0, -(100 % bs + 1):] == -1).all() and (idx2[0, : -(100 % bs + 1)] >= 0).all()


def test_swa_block_identity_and_permuted_tables_agree():
    cfg = TINY
    outs = {}
    for bt in ("identity", "permuted"):
        d = make_swa_inputs(cfg, 40, 100, 37, seed=4, block_table=bt, attn_sink=0.5)
        kv_cache, x_out, mids = golden_prefill_attention_swa(d, cfg, return_intermediates=True)
        assert x_out.shape == (40, cfg.hc_mult, cfg.hidden_size) and x_out.dtype == torch.float32
        assert torch.equal(x_out[37:], torch.zeros_like(x_out[37:]))
        assert torch.isfinite(x_out).all()
        # exactly the active tokens' rows changed, and hold this chunk's kv
        flat_new, flat_old = kv_cache.view(-1, cfg.head_dim), d["kv_cache"].view(-1, cfg.head_dim)
        slots = d["ori_slot_mapping"][:37]
        assert torch.equal(flat_new[slots], mids["kv"][:37])
        keep = torch.ones(flat_new.shape[0], dtype=torch.bool)
        keep[slots] = False
        assert torch.equal(flat_new[keep], flat_old[keep])
        outs[bt] = x_out
    assert torch.equal(outs["identity"], outs["permuted"])


def test_swa_block_sub_chain_consistency():
    cfg = TINY
    d = make_swa_inputs(cfg, 24, 0, 24, seed=6, weight_format="bf16")
    kv_cache, x_out, mids = golden_prefill_attention_swa(d, cfg, weight_format="bf16",
                                                         return_intermediates=True)
    # token 0 at position 0 attends only to itself: softmax weight 1/(1+exp(sink - s)) with sink 0
    q0 = mids["q"][0].float()
    k0 = mids["kv"][0].float()
    s = (q0 @ k0) * cfg.head_dim ** -0.5  # [H]
    w = torch.exp(s - torch.maximum(s, torch.zeros_like(s)))
    p = w / (w + torch.exp(-torch.maximum(s, torch.zeros_like(s))))
    o = p[:, None] * k0[None, :]  # position 0: inverse RoPE is the identity
    core = golden_attention_core(mids["q"], kv_cache, mids["swa_indices"],
                                 torch.zeros(cfg.cmp_kv_block_num, cfg.block_size, 1, cfg.head_dim),
                                 torch.zeros(cfg.cmp_kv_block_num, dtype=torch.int32),
                                 torch.full((24, cfg.index_topk), -1, dtype=torch.int32),
                                 d["attn_sink"], 24, mids["rope_cos"], mids["rope_sin"], cfg,
                                 out_bf16=False)
    assert torch.allclose(core[0], o, atol=1e-2, rtol=1e-2)
    assert mids["swa_indices"][0].tolist() == [0] + [-1] * (cfg.sliding_window - 1)


def test_make_swa_inputs_layout():
    cfg = TINY
    d = make_swa_inputs(cfg, 32, 70, 30, seed=0, block_table="permuted")
    W, bs, hd = cfg.sliding_window, cfg.block_size, cfg.head_dim
    table = d["block_table"]
    rows = [int(table[p // bs]) * bs + p % bs for p in range(70 - W, 70)]
    flat = d["kv_cache"].view(-1, hd)
    assert (flat[rows].float().abs().sum(dim=1) > 0).all()
    assert int((flat.float().abs().sum(dim=1) > 0).sum()) == W
    assert torch.equal(d["x_hc"][30:], torch.zeros_like(d["x_hc"][30:]))
    assert (d["ori_slot_mapping"][30:] == -1).all()
    assert d["wq_b"].dtype == torch.int8 and d["wo_b"].dtype == torch.int8
    with pytest.raises(BindError):
        make_swa_inputs(cfg, 32, 0, 33, seed=0)
    with pytest.raises(BindError):
        make_swa_inputs(cfg, 32, 0, 8, seed=0, block_table="random")


# ---------------------------------------------------------------- ratio-128 compressor
@pytest.mark.parametrize("start_pos", [0, 200])
def test_compressor_split_equals_single_call(start_pos):
    cfg = TINY
    d = make_compressor_inputs(cfg, 256, start_pos, 256, seed=7)
    cmp_one, state_one = golden_prefill_compressor_ratio128(**d, cfg=cfg)
    cmp_a, state_a = golden_prefill_compressor_ratio128(**compressor_chunk(d, 0, 100), cfg=cfg)
    cmp_b, state_b = golden_prefill_compressor_ratio128(
        **compressor_chunk(d, 100, 256, cmp_a, state_a), cfg=cfg)
    assert torch.equal(cmp_b, cmp_one)
    assert torch.equal(state_b, state_one)
    assert int((d["cmp_slot_mapping"] >= 0).sum()) == 2  # two windows close in either case


def _changed_cmp_rows(new: torch.Tensor, old: torch.Tensor) -> list[int]:
    diff = (new.float() - old.float()).reshape(-1, new.shape[-1]).abs().sum(dim=1)
    return diff.nonzero().flatten().tolist()


def test_compressor_windows_close_at_127_255_383():
    cfg = TINY
    d = make_compressor_inputs(cfg, 384, 0, 384, seed=8)
    closing = (d["cmp_slot_mapping"] >= 0).nonzero().flatten().tolist()
    assert closing == [127, 255, 383]
    cmp_kv, _ = golden_prefill_compressor_ratio128(**d, cfg=cfg)
    assert _changed_cmp_rows(cmp_kv, d["cmp_kv"]) == sorted(d["cmp_slot_mapping"][closing].tolist())


def test_compressor_incomplete_window_writes_no_row():
    cfg = TINY
    d = make_compressor_inputs(cfg, 100, 0, 100, seed=9)
    assert (d["cmp_slot_mapping"] == -1).all()
    cmp_kv, state = golden_prefill_compressor_ratio128(**d, cfg=cfg)
    assert torch.equal(cmp_kv, d["cmp_kv"])
    flat_new = state.view(-1, 2 * cfg.head_dim)
    flat_old = d["compress_state"].view(-1, 2 * cfg.head_dim)
    slots = d["state_slot_mapping"]
    assert (flat_new[slots].abs().sum(dim=1) > 0).all()
    keep = torch.ones(flat_new.shape[0], dtype=torch.bool)
    keep[slots] = False
    assert torch.equal(flat_new[keep], flat_old[keep])
    # a token that does not close a window must not carry a compressed destination
    bad = d["cmp_slot_mapping"].clone()
    bad[5] = 0
    with pytest.raises(BindError):
        golden_prefill_compressor_ratio128(**dict(d, cmp_slot_mapping=bad), cfg=cfg)


def test_compressor_entry_matches_direct_float64():
    cfg = TINY
    d = make_compressor_inputs(cfg, 256, 0, 256, seed=10)
    cmp_kv, _ = golden_prefill_compressor_ratio128(**d, cfg=cfg)
    hd, n, r, M = cfg.head_dim, cfg.nope_head_dim, cfg.qk_rope_head_dim, HCA_RATIO
    x = d["x"].double()
    kv = x @ d["wkv"].double().T
    score = x @ d["wgate"].double().T + d["ape"].double()[torch.arange(256) % M]
    w_freq = rope_inv_freq(cfg, "compress").double()
    for w in range(2):
        sl = slice(w * M, (w + 1) * M)
        pooled = (torch.softmax(score[sl], dim=0) * kv[sl]).sum(dim=0)
        e = pooled / torch.sqrt(pooled.square().mean() + cfg.rms_norm_eps) * d["norm_w"].double()
        ang = (w * M) * w_freq  # window start position
        ev, od = e[n::2].clone(), e[n + 1::2].clone()
        e[n::2] = ev * torch.cos(ang) - od * torch.sin(ang)
        e[n + 1::2] = ev * torch.sin(ang) + od * torch.cos(ang)
        row = int(d["cmp_slot_mapping"][(w + 1) * M - 1])
        got = cmp_kv.view(-1, hd)[row].double()
        assert torch.allclose(got, e, atol=1e-3, rtol=2 / 128), (w, (got - e).abs().max())


# ---------------------------------------------------------------- FLASH size (slow)
@pytest.mark.slow
def test_flash_swa_block_and_compressor_run():
    cfg = FLASH
    d = make_swa_inputs(cfg, 128, 128, 120, seed=0, block_table="permuted")
    kv_cache, x_out = golden_prefill_attention_swa(d, cfg)
    assert torch.isfinite(x_out).all()
    assert torch.equal(x_out[120:], torch.zeros_like(x_out[120:]))
    assert (kv_cache.view(-1, cfg.head_dim)[d["ori_slot_mapping"][:120]].float().abs().sum(dim=1) > 0).all()
    c = make_compressor_inputs(cfg, 128, 128, 128, seed=1)
    cmp_one, state_one = golden_prefill_compressor_ratio128(**c, cfg=cfg)
    cmp_a, state_a = golden_prefill_compressor_ratio128(**compressor_chunk(c, 0, 50), cfg=cfg)
    cmp_b, state_b = golden_prefill_compressor_ratio128(**compressor_chunk(c, 50, 128, cmp_a, state_a), cfg=cfg)
    assert torch.equal(cmp_b, cmp_one) and torch.equal(state_b, state_one)
    assert len(_changed_cmp_rows(cmp_one, c["cmp_kv"])) == 1
