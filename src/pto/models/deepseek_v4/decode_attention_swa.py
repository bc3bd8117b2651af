"""Decode attention sub-block of ratio-0 (sliding-window-only) layers.

Chain (pypto-lib `models/deepseek/v4-flash/decode_attention_swa.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``B`` requests x ``S`` tokens, ``T = B*S``
token-major rows (decode_metadata.py has the geometry and the ``-1`` sentinels):

    x_mixed, post, comb = hc_pre(x_hc)                       # [T, D] bf16, [T, 4], [T, 16]
    x_normed            = rms_norm(x_mixed, attn_norm_w)
    cos_t, sin_t        = table rows at position_ids          # main RoPE profile; 0 if inactive
    q, kv               = qkv_proj_rope(x_normed, ...)        # [T, H, d], [T, d] bf16
    kv_cache[ori_slot_mapping[t]] = kv[t]                     # slot >= 0: the new tokens' keys
    swa_indices         = window rows of position_ids[t] through block_table[t // S]
    attn_out            = decode_sparse_attn_swa(q, kv_cache, swa_indices, ...)
    x_out               = hc_post(attn_out, x_hc, post, comb)

The cache write runs before the attention, so a token's window holds its own key and, with
``S = 2``, the second token sees the first. An inactive token (position ``-1``) writes no
key and attends to nothing (zero attention output; its ``x_out`` row is the plain stream
mix). Deviation from pypto-lib `decode_attention_swa.py`: the window indices are built in the kernel from positions and
block tables (``decode_window_indices``) instead of the reference's host-built indices and
``swa_lens`` bias; the bias comes from the indices.
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, ratio_reldiff, register
from pto.models.deepseek_v4.attention_front import attention_front, golden_attention_front
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.decode_metadata import (decode_block_tables, decode_metadata_kernels,
                                                    golden_decode_window_indices, make_decode_metadata)
from pto.models.deepseek_v4.decode_sparse_attn import (decode_case_options, decode_sparse_attn_kernels,
                                                       golden_decode_sparse_attn)
from pto.models.deepseek_v4.hc_post import golden_hc_post, hc_post_kernels
from pto.models.deepseek_v4.prefill_attention_swa import make_swa_inputs
from pto.models.deepseek_v4.rope import rope_tables
from pto.models.deepseek_v4.weight_format import weight_dtype
from pto.models.deepseek_v4.tiling import token_capacity

__all__ = [
    "decode_attention_swa_kernels",
    "decode_attention_swa",
    "golden_decode_rope_rows",
    "golden_decode_cache_write",
    "golden_decode_attention_swa",
    "make_decode_swa_inputs",
    "build_case",
    "TOLERANCES",
    "SWA_ARGS",
]

# pypto-lib `models/deepseek/v4-flash/decode_attention_swa.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-2):
#   x_out: ratio_reldiff (diff_thd, pct_thd, max_diff_hd); kv_cache: ratio_allclose (atol, rtol, ratio)
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_out": (3e-3, 0.008, 1.0),
    "kv_cache": (1e-4, 1 / 128, 0.005),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")


@functools.lru_cache(maxsize=None)
def decode_attention_swa_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the ratio-0 decode attention sub-layer for ``cfg`` (cached per config).

    Composition (pypto-lib `decode_attention_swa.py`): ``attention_front`` (``hc_pre`` -> ``rms_norm`` -> ``late_dep`` ->
    ``decode_rope_rows`` -> ``qkv_proj_rope(..., late_dep)``) -> ``decode_cache_write``
    -> ``decode_window_indices`` -> ``decode_sparse_attn_swa`` -> ``hc_post``. The block's own
    scratch is uninitialised (as pypto-lib `decode_attention_swa.py`); ``seed_scopes=True`` passes the seed variant to hc_pre
    and qkv_proj_rope (split-K targets zero-filled by tasks instead of at allocation).

    Returns:
        namespace with the inline body ``decode_attention_swa(x_hc, hc_attn_fn, hc_attn_scale,
        hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
        freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
        wo_b_scale, x_out)`` returning ``(kv_cache, x_out)`` and its ``@pl.jit`` entry
        ``decode_attention_swa_test``. Shapes: ``x_hc [T, hc_mult, D]`` FP32, ``kv_cache
        [ori_kv_block_num, block_size, 1, head_dim]`` BF16 (InOut), ``block_table [B,
        max_blocks_per_seq]`` INT32, ``ori_slot_mapping [T]`` INT64, ``position_ids [T]``
        INT32 (``-1`` inactive), ``freqs_cos / freqs_sin [max_position_embeddings, rope_dim]``
        BF16 (main profile), ``x_out [T, hc_mult, D]`` FP32; weights as prefill_attention_swa.

    Raises:
        ConfigError: the config cannot be tiled by a composed kernel. At run time:
            ``CapacityError`` for ``T`` above ``token_capacity(cfg)``, ``BindError`` for ``T``
            not a multiple of ``B`` or a position past the tables.
    """
    D, HC, H, HD, R = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    LQ, G, LO, GIN = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in
    BS, P, MAXPOS, NBLK, MIX = cfg.block_size, cfg.ori_kv_block_num, cfg.max_position_embeddings, \
        cfg.max_blocks_per_seq, cfg.mix_hc
    W = cfg.sliding_window
    cap = token_capacity(cfg)
    meta = decode_metadata_kernels(cfg)
    attn = decode_sparse_attn_kernels(cfg, 0).decode_sparse_attn
    post_mix = hc_post_kernels(cfg).hc_post

    @pl.jit.inline
    def decode_attention_swa(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
                             hc_attn_fn: pl.Tensor[[MIX, HC * D], pl.FP32],
                             hc_attn_scale: pl.Tensor[[3], pl.FP32],
                             hc_attn_base: pl.Tensor[[MIX], pl.FP32],
                             attn_norm_w: pl.Tensor[[D], pl.BF16],
                             wq_a: pl.Tensor[[D, LQ], pl.BF16],
                             wq_b: pl.Tensor[[LQ, H * HD], weight_dtype(cfg)],
                             wq_b_scale: pl.Tensor[[H * HD], pl.FP32],
                             wkv: pl.Tensor[[D, HD], pl.BF16],
                             gamma_cq: pl.Tensor[[LQ], pl.BF16],
                             gamma_ckv: pl.Tensor[[HD], pl.BF16],
                             freqs_cos: pl.Tensor[[MAXPOS, R], pl.BF16],
                             freqs_sin: pl.Tensor[[MAXPOS, R], pl.BF16],
                             kv_cache: pl.InOut[pl.Tensor[[P, BS, 1, HD], pl.BF16]],
                             block_table: pl.Tensor[[B_DYN, NBLK], pl.INT32],
                             ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                             position_ids: pl.Tensor[[T_DYN], pl.INT32],
                             attn_sink: pl.Tensor[[H], pl.FP32],
                             wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                             wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                             wo_b_scale: pl.Tensor[[D], pl.FP32],
                             x_out: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]]):
        """Ratio-0 decode attention sub-layer (pypto-lib `decode_attention_swa.py`); returns ``(kv_cache, x_out)``."""
        t = pl.tensor.dim(x_hc, 0)
        f = attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                            gamma_cq, gamma_ckv,
                            lambda cos_t, sin_t: meta.decode_rope_rows(freqs_cos, freqs_sin, position_ids, cos_t,
                                                                       sin_t),
                            cfg, seed_scopes)
        swa_indices = pl.create_tensor([t, W], pl.INT32, capacity=cap)
        attn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap)
        meta.decode_cache_write(f.kv, ori_slot_mapping, kv_cache)
        meta.decode_window_indices(position_ids, block_table, swa_indices)
        attn(f.q, kv_cache, swa_indices, attn_sink, f.rope_cos_t, f.rope_sin_t, wo_a, wo_b, wo_b_scale, attn_out)
        post_mix(attn_out, x_hc, f.post, f.comb, x_out)
        return kv_cache, x_out

    decode_attention_swa_test = pl.jit.entry(decode_attention_swa, name="decode_attention_swa_test")
    return SimpleNamespace(decode_attention_swa=decode_attention_swa,
                           decode_attention_swa_test=decode_attention_swa_test, seed_scopes=seed_scopes)


@pl.jit.inline
def decode_attention_swa(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
                         attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor,
                         wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor,
                         freqs_sin: pl.Tensor, kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor,
                         ori_slot_mapping: pl.Tensor, position_ids: pl.Tensor, attn_sink: pl.Tensor,
                         wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor, x_out: pl.Out[pl.Tensor], cfg,
                         seed_scopes: bool = False):
    """Stable inline signature ``decode_attention_swa(x_hc, hc_attn_fn, hc_attn_scale,
    hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
    freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
    wo_b_scale, x_out, cfg, seed_scopes=False) -> (kv_cache, x_out)``: the body of
    :func:`decode_attention_swa_kernels` (shapes and errors there)."""
    return decode_attention_swa_kernels(cfg, seed_scopes).decode_attention_swa(
        x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
        gamma_ckv, freqs_cos, freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a,
        wo_b, wo_b_scale, x_out)
# ---- end kernel ----


def golden_decode_rope_rows(
    freqs_cos: torch.Tensor,  # [P, rope_dim]
    freqs_sin: torch.Tensor,  # [P, rope_dim]
    position_ids: torch.Tensor,  # [T] int, < 0 = inactive
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, rope_dim], [T, rope_dim]) dtype of the tables
    """Per-token table rows at ``position_ids``, zero rows for inactive tokens (the
    ``decode_rope_rows`` task).

    Raises:
        BindError: an active position past the tables.
    """
    pos = position_ids.long()
    if bool((pos >= freqs_cos.shape[0]).any()):
        raise BindError(f"golden_decode_rope_rows: position {int(pos.max())} past the tables "
                        f"({freqs_cos.shape[0]} rows)")
    act = (pos >= 0)[:, None]
    zero = torch.zeros((), dtype=freqs_cos.dtype)
    return (torch.where(act, freqs_cos[pos.clamp(min=0)], zero),
            torch.where(act, freqs_sin[pos.clamp(min=0)], zero))


def golden_decode_cache_write(
    kv_cache: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    kv: torch.Tensor,  # [T, head_dim]
    ori_slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
) -> torch.Tensor:  # a new cache, kv rows written
    """A copy of ``kv_cache`` with ``kv[t]`` (cast to the cache dtype) at flat row
    ``ori_slot_mapping[t] >= 0``; on a repeated slot the later token wins.

    Raises:
        BindError: a slot outside the cache.
    """
    out = kv_cache.clone()
    flat = out.view(-1, out.shape[-1])
    slots = ori_slot_mapping.long()
    if bool((slots >= flat.shape[0]).any()):
        raise BindError(f"golden_decode_cache_write: slot {int(slots.max())} outside the cache ({flat.shape[0]} rows)")
    for t in torch.nonzero(slots >= 0).flatten().tolist():  # token order: a repeated slot keeps the last
        flat[int(slots[t])] = kv[t].to(out.dtype)
    return out


SWA_ARGS = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale",
            "wkv", "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "block_table",
            "ori_slot_mapping", "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")


def golden_decode_attention_swa(
    inputs: dict,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
    return_intermediates: bool = False,
):
    """Golden of the ratio-0 decode attention block (pypto-lib `models/deepseek/v4-flash/decode_attention_swa.py`).

    :func:`golden_decode_rope_rows` -> ``attention_front.golden_attention_front`` (hc_pre,
    RMSNorm, q / kv) -> :func:`golden_decode_cache_write` ->
    ``decode_metadata.golden_decode_window_indices`` -> ``golden_decode_sparse_attn`` (window
    only) -> ``golden_hc_post``, over whole tensors.

    Args:
        inputs: dict keyed by :data:`SWA_ARGS` (as :func:`make_decode_swa_inputs` builds it);
            not modified.
        cfg: model config.
        weight_format: ``"int8"`` (the kernel's W8A8 q-b / o-b) or ``"bf16"`` (unquantised).
        float32: parity mode: no BF16 rounding of any intermediate (``x_mixed``, ``x_normed``,
            ``q``, ``kv``, probabilities, ``attn_out``); the cache keeps its dtype.
        return_intermediates: also return ``{x_mixed, post, comb, x_normed, rope_cos, rope_sin,
            q, kv, swa_indices, attn_out}``.

    Returns:
        ``(kv_cache, x_out)`` (+ the intermediates dict).

    Raises:
        BindError: a missing input, bad shapes, or an index outside its cache.
    """
    missing = [k for k in SWA_ARGS if k not in inputs]
    if missing:
        raise BindError(f"golden_decode_attention_swa: inputs missing {missing}")
    i = inputs
    rope_cos, rope_sin = golden_decode_rope_rows(i["freqs_cos"], i["freqs_sin"], i["position_ids"])
    f = golden_attention_front(i, rope_cos, rope_sin, cfg, weight_format=weight_format, float32=float32)
    q, kv = f["q"], f["kv"]
    kv_cache = golden_decode_cache_write(i["kv_cache"], kv, i["ori_slot_mapping"])
    swa_indices = golden_decode_window_indices(i["position_ids"], i["block_table"], cfg)
    attn_out = golden_decode_sparse_attn(q, kv_cache, swa_indices, None, None, None, i["attn_sink"], rope_cos,
                                         rope_sin, i["wo_a"], i["wo_b"], i["wo_b_scale"], cfg,
                                         weight_format=weight_format, float32=float32)
    x_out = golden_hc_post(attn_out, i["x_hc"], f["post"], f["comb"])
    if not return_intermediates:
        return kv_cache, x_out
    return kv_cache, x_out, {"x_mixed": f["x_mixed"], "post": f["post"], "comb": f["comb"],
                             "x_normed": f["x_normed"], "rope_cos": rope_cos, "rope_sin": rope_sin, "q": q, "kv": kv,
                             "swa_indices": swa_indices, "attn_out": attn_out}


def make_decode_swa_inputs(
    cfg: DeepSeekV4Config,
    start_pos: tuple | list,
    S: int,
    seed: int,
    *,
    reverse_tables: bool = False,
    profile: str = "main",
    weight_format: str = "int8",
) -> dict:
    """Seeded fixture of a decode attention block: ``B = len(start_pos)`` requests of ``S``
    tokens (``start_pos[b] < 0``: inactive).

    Weights, ``x_hc`` and the sink come from ``prefill_attention_swa.make_swa_inputs(cfg, T,
    0, T, seed)`` (same draws); ``freqs_cos / freqs_sin`` are the ``profile`` tables (BF16);
    page tables from ``decode_metadata.decode_block_tables`` and the step's indices from
    ``make_decode_metadata``; the raw cache is zero except the ``W - 1`` keys before each
    active request's first position (``N(0, 1)`` rows, as the RMS-normalised random cache
    of pypto-lib's decode_attention_swa.py).

    Returns:
        dict keyed by :data:`SWA_ARGS` plus ``cmp_block_table``, ``state_block_table`` and
        the metadata (``swa_indices``, ``cmp_indices``, ``cmp_slot_mapping``,
        ``state_slot_mapping``).

    Raises:
        BindError: pools too small, bad ``weight_format``.
    """
    B = len(start_pos)
    T = B * S
    d = make_swa_inputs(cfg, T, 0, T, seed, weight_format=weight_format)
    tables = decode_block_tables(cfg, start_pos, S, reverse=reverse_tables)
    meta = make_decode_metadata(cfg, start_pos, S, tables["block_table"], tables["cmp_block_table"],
                                tables["state_block_table"])
    gen = torch.Generator().manual_seed(seed + 1)
    W, bs, hd = cfg.sliding_window, cfg.block_size, cfg.head_dim
    cache = torch.zeros(cfg.ori_kv_block_num, bs, 1, hd)
    flat = cache.view(-1, hd)
    tab = tables["block_table"].long()
    for b, p0 in enumerate(start_pos):
        keys = torch.arange(max(0, p0 - W + 1), max(0, p0))
        if p0 > 0 and keys.numel():
            flat[tab[b, keys // bs] * bs + keys % bs] = torch.randn(keys.numel(), hd, generator=gen)
    cos, sin = rope_tables(cfg, profile)
    d.update(kv_cache=cache.to(torch.bfloat16), freqs_cos=cos.to(torch.bfloat16), freqs_sin=sin.to(torch.bfloat16),
             **tables, **meta)
    del d["num_tokens"]
    return d


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_attention_swa`` (pypto-lib `decode_attention_swa.py`).

    Mode ``"decode"``. Options: ``start_pos`` (per request; default
    ``decode_sparse_attn.DEFAULT_START_POS``), ``S`` (default ``decode_seq``), ``seed``,
    ``reverse_tables``, ``seed_scopes``. Golden :func:`golden_decode_attention_swa`; ``x_out``
    ``ratio_reldiff(*TOLERANCES["x_out"])``, ``kv_cache`` ``ratio_allclose(*TOLERANCES
    ["kv_cache"])``; run tolerances 1e-2.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    o = decode_case_options("decode_attention_swa", preset, mode, options, flags=("seed_scopes",),
                            weight_formats=True)
    cfg, start, S, seed, reverse, seed_scopes = o.cfg, o.start_pos, o.S, o.seed, o.reverse_tables, o.seed_scopes
    k = decode_attention_swa_kernels(cfg, seed_scopes)
    d = make_decode_swa_inputs(cfg, start, S, seed, reverse_tables=reverse, weight_format=o.weight_format)
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=(n == "kv_cache")) for n in SWA_ARGS]
    specs.append(TensorSpec("x_out", list(d["x_hc"].shape), torch.float32, is_output=True))

    def golden(v: dict) -> None:
        v["kv_cache"], v["x_out"] = golden_decode_attention_swa(v, cfg, weight_format=o.weight_format)

    compare = {"x_out": ratio_reldiff(*TOLERANCES["x_out"]), "kv_cache": ratio_allclose(*TOLERANCES["kv_cache"])}
    return CaseRun(fn=k.decode_attention_swa_test, specs=specs, golden=golden, compare=compare, rtol=1e-2, atol=1e-2,
                   label=f"decode B={len(start)} S={S} start_pos={list(start)}" + (" seed_scopes" if seed_scopes else "")
                         + (" weight_format=bf16" if o.weight_format == "bf16" else ""))


register(KernelCase("decode_attention_swa", build_case, modes=("decode",), seed_variant=True,
                    description="ratio-0 decode attention sub-layer (hc_pre .. cache write .. sparse attn .. hc_post), "
                                "pypto-lib's decode_attention_swa.py"))
