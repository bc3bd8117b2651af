"""Decode attention sub-block of ratio-128 (HCA, heavily compressed attention) layers.

Chain (pypto-lib `models/deepseek/v4-flash/decode_attention_hca.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), decode geometry of decode_metadata.py:

    x_mixed, post, comb = hc_pre(x_hc) ; x_normed = rms_norm(x_mixed, attn_norm_w)
    cos_t, sin_t        = compress-profile rows at position_ids   # the whole layer uses it
    q, kv               = qkv_proj_rope(x_normed, ...)
    kv_cache[ori_slot_mapping[t]] = kv[t]
    cmp_kv, state       = decode_compressor_ratio128(x_normed, ...)   # one entry per closing token
    swa_indices         = window rows of position_ids[t] through block_table[t // S]
    cmp_indices[t, k]   = k for k < (p + 1) // 128, else -1            # every visible entry
    attn_out            = decode_sparse_attn_hca(q, kv_cache, swa_indices, cmp_kv, cmp_block_table,
                                                 cmp_indices, ...)
    x_out               = hc_post(attn_out, x_hc, post, comb)

The compressor writes before the attention reads, so the token that closes a window attends
to the entry it just wrote (transformers `models/deepseek_v4/modeling_deepseek_v4.py`: ``w < floor((t + 1) / 128)``); with ``S = 2``
each token has its own count. Deviations from pypto-lib `decode_attention_hca.py`: the deterministic compressed top-k is
``k < (p + 1) // 128`` without the extra ``kv_seq_len / 128`` bound of pypto-lib's
`decode_attention_hca.py` (the caller's slots
define the sequence), and the window / compressed indices are built in the kernel.
``seed_scopes=True`` passes the seed variant to hc_pre and qkv_proj_rope (their split-K
targets zero-filled by tasks instead of at allocation; bit-identical results).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, ratio_reldiff, register
from pto.models.deepseek_v4.attention_front import attention_front, golden_attention_front
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.decode_attention_swa import (SWA_ARGS, golden_decode_cache_write,
                                                         golden_decode_rope_rows, make_decode_swa_inputs)
from pto.models.deepseek_v4.decode_compressor_ratio128 import (decode_compressor_ratio128_kernels,
                                                               golden_decode_compressor_ratio128,
                                                               make_decode_compressor_inputs)
from pto.models.deepseek_v4.decode_metadata import (decode_metadata_kernels, golden_decode_cmp_indices,
                                                    golden_decode_window_indices, hca_cmp_cols)
from pto.models.deepseek_v4.decode_sparse_attn import (decode_case_options, decode_sparse_attn_kernels,
                                                       golden_decode_sparse_attn)
from pto.models.deepseek_v4.hc_post import golden_hc_post, hc_post_kernels
from pto.models.deepseek_v4.weight_format import weight_dtype
from pto.models.deepseek_v4.tiling import token_capacity

__all__ = [
    "decode_attention_hca_kernels",
    "decode_attention_hca",
    "golden_decode_attention_hca",
    "make_decode_hca_inputs",
    "build_case",
    "TOLERANCES",
    "HCA_ARGS",
]

# pypto-lib `models/deepseek/v4-flash/decode_attention_hca.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-2); compressor outputs as `decode_compressor_ratio128.py`.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_out": (3e-3, 0.008, 1.0),
    "kv_cache": (1e-4, 1 / 128, 0.005),
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

HCA_ARGS = SWA_ARGS[:13] + ("cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w", "compress_state", "state_block_table",
                            "kv_cache", "block_table", "ori_slot_mapping", "cmp_kv", "cmp_block_table",
                            "cmp_slot_mapping", "state_slot_mapping", "position_ids", "attn_sink", "wo_a", "wo_b",
                            "wo_b_scale")

# ---- kernel ----
T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")


@functools.lru_cache(maxsize=None)
def decode_attention_hca_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the ratio-128 decode attention sub-layer for ``cfg`` (cached per config / variant).

    Composition (pypto-lib `decode_attention_hca.py`): ``attention_front`` (``hc_pre`` -> ``rms_norm`` -> ``late_dep`` ->
    ``decode_rope_rows`` -> ``qkv_proj_rope(..., late_dep)``) -> ``decode_cache_write`` ->
    ``decode_compressor_ratio128(x_normed, ..., late_dep)`` (its FP32 ``kv`` rows go to
    scratch) -> ``decode_window_indices`` -> ``decode_cmp_indices`` ->
    ``decode_sparse_attn_hca`` -> ``hc_post``.

    Returns:
        namespace with the inline body ``decode_attention_hca(x_hc, hc_attn_fn, hc_attn_scale,
        hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
        freqs_sin, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table,
        kv_cache, block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping,
        state_slot_mapping, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out)`` returning
        ``(kv_cache, cmp_kv, compress_state, x_out)`` and its ``@pl.jit`` entry
        ``decode_attention_hca_test``. Shapes as decode_attention_swa plus the compressor's
        (decode_compressor_ratio128) and ``cmp_block_table [B, cmp_kv_block_num]`` INT32;
        ``freqs_cos / freqs_sin`` are the compress profile (used by the q / kv path and the
        compressor alike).

    Raises:
        ConfigError: the config cannot be tiled by a composed kernel; run-time errors of the
            composed kernels.
    """
    D, HC, H, HD, R = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    LQ, G, LO, GIN, W = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.sliding_window
    BS, P, CP, MAXPOS, NBLK, MIX = cfg.block_size, cfg.ori_kv_block_num, cfg.cmp_kv_block_num, \
        cfg.max_position_embeddings, cfg.max_blocks_per_seq, cfg.mix_hc
    SP, page = cfg.hca_state_block_num, cfg.hca_state_block_size
    NST, NC = MAXPOS // page, hca_cmp_cols(cfg)
    cap = token_capacity(cfg)
    meta = decode_metadata_kernels(cfg)
    compressor = decode_compressor_ratio128_kernels(cfg).decode_compressor_ratio128
    attn = decode_sparse_attn_kernels(cfg, NC).decode_sparse_attn
    post_mix = hc_post_kernels(cfg).hc_post

    @pl.jit.inline
    def decode_attention_hca(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
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
                             cmp_wkv: pl.Tensor[[HD, D], pl.BF16],
                             cmp_wgate: pl.Tensor[[HD, D], pl.BF16],
                             cmp_ape: pl.Tensor[[128, HD], pl.FP32],
                             cmp_norm_w: pl.Tensor[[HD], pl.BF16],
                             compress_state: pl.InOut[pl.Tensor[[SP, page, 2 * HD], pl.FP32]],
                             state_block_table: pl.Tensor[[B_DYN, NST], pl.INT32],
                             kv_cache: pl.InOut[pl.Tensor[[P, BS, 1, HD], pl.BF16]],
                             block_table: pl.Tensor[[B_DYN, NBLK], pl.INT32],
                             ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                             cmp_kv: pl.InOut[pl.Tensor[[CP, BS, 1, HD], pl.BF16]],
                             cmp_block_table: pl.Tensor[[B_DYN, CP], pl.INT32],
                             cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                             state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                             position_ids: pl.Tensor[[T_DYN], pl.INT32],
                             attn_sink: pl.Tensor[[H], pl.FP32],
                             wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                             wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                             wo_b_scale: pl.Tensor[[D], pl.FP32],
                             x_out: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]]):
        """Ratio-128 decode attention sub-layer (pypto-lib `decode_attention_hca.py`); returns ``(kv_cache, cmp_kv,
        compress_state, x_out)``."""
        t = pl.tensor.dim(x_hc, 0)
        f = attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                            gamma_cq, gamma_ckv,
                            lambda cos_t, sin_t: meta.decode_rope_rows(freqs_cos, freqs_sin, position_ids, cos_t,
                                                                       sin_t),
                            cfg, seed_scopes)
        cmp_kv_rows = pl.create_tensor([t, HD], pl.FP32, capacity=cap)  # compressor's FP32 rows, unused here
        swa_indices = pl.create_tensor([t, W], pl.INT32, capacity=cap)
        cmp_indices = pl.create_tensor([t, NC], pl.INT32, capacity=cap)
        attn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap)
        meta.decode_cache_write(f.kv, ori_slot_mapping, kv_cache)
        compressor(f.x_normed, cmp_kv_rows, compress_state, state_block_table, cmp_wkv, cmp_wgate, cmp_ape,
                   cmp_norm_w, freqs_cos, freqs_sin, cmp_kv, position_ids, cmp_slot_mapping, state_slot_mapping,
                   f.late_dep)
        meta.decode_window_indices(position_ids, block_table, swa_indices)
        meta.decode_cmp_indices(position_ids, cmp_indices)
        attn(f.q, kv_cache, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, f.rope_cos_t, f.rope_sin_t,
             wo_a, wo_b, wo_b_scale, attn_out)
        post_mix(attn_out, x_hc, f.post, f.comb, x_out)
        return kv_cache, cmp_kv, compress_state, x_out

    decode_attention_hca_test = pl.jit.entry(decode_attention_hca, name="decode_attention_hca_test")
    return SimpleNamespace(decode_attention_hca=decode_attention_hca,
                           decode_attention_hca_test=decode_attention_hca_test, seed_scopes=seed_scopes)


@pl.jit.inline
def decode_attention_hca(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
                         attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor,
                         wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor,
                         freqs_sin: pl.Tensor, cmp_wkv: pl.Tensor, cmp_wgate: pl.Tensor, cmp_ape: pl.Tensor,
                         cmp_norm_w: pl.Tensor, compress_state: pl.InOut[pl.Tensor], state_block_table: pl.Tensor,
                         kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor, ori_slot_mapping: pl.Tensor,
                         cmp_kv: pl.InOut[pl.Tensor], cmp_block_table: pl.Tensor, cmp_slot_mapping: pl.Tensor,
                         state_slot_mapping: pl.Tensor, position_ids: pl.Tensor, attn_sink: pl.Tensor,
                         wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor, x_out: pl.Out[pl.Tensor], cfg,
                         seed_scopes: bool = False):
    """Stable inline signature ``decode_attention_hca(x_hc, hc_attn_fn, hc_attn_scale,
    hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
    freqs_sin, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table,
    kv_cache, block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping,
    state_slot_mapping, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out, cfg,
    seed_scopes=False) -> (kv_cache, cmp_kv, compress_state, x_out)``: the body of
    :func:`decode_attention_hca_kernels` (shapes and errors there)."""
    return decode_attention_hca_kernels(cfg, seed_scopes).decode_attention_hca(
        x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
        gamma_ckv, freqs_cos, freqs_sin, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table,
        kv_cache, block_table, ori_slot_mapping, cmp_kv, cmp_block_table, cmp_slot_mapping, state_slot_mapping,
        position_ids, attn_sink, wo_a, wo_b, wo_b_scale, x_out)
# ---- end kernel ----


def golden_decode_attention_hca(
    inputs: dict,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
    return_intermediates: bool = False,
):
    """Golden of the ratio-128 decode attention block (pypto-lib `models/deepseek/v4-flash/decode_attention_hca.py`), over whole
    tensors: ``golden_decode_rope_rows`` -> ``golden_attention_front`` (hc_pre, RMSNorm, q / kv)
    -> ``golden_decode_cache_write`` ->
    ``golden_decode_compressor_ratio128`` (on ``x_normed``; FP32 throughout, the compressor
    has no BF16 mode) -> window and compressed indices -> ``golden_decode_sparse_attn`` ->
    ``golden_hc_post``.

    Args:
        inputs: dict keyed by :data:`HCA_ARGS` (as :func:`make_decode_hca_inputs`); not modified.
        cfg: model config.
        weight_format: ``"int8"`` (the kernel) or ``"bf16"`` (unquantised q-b / o-b).
        float32: parity mode: no BF16 rounding of the block's intermediates (caches keep
            their dtypes).
        return_intermediates: also return ``{x_normed, q, kv, swa_indices, cmp_indices,
            cmp_rows, attn_out}``.

    Returns:
        ``(kv_cache, cmp_kv, compress_state, x_out)`` (+ the intermediates dict).

    Raises:
        BindError: a missing input, bad shapes, or an index outside its tensor.
    """
    missing = [k for k in HCA_ARGS if k not in inputs]
    if missing:
        raise BindError(f"golden_decode_attention_hca: inputs missing {missing}")
    i = inputs
    rope_cos, rope_sin = golden_decode_rope_rows(i["freqs_cos"], i["freqs_sin"], i["position_ids"])
    f = golden_attention_front(i, rope_cos, rope_sin, cfg, weight_format=weight_format, float32=float32)
    x_normed, q, kv = f["x_normed"], f["q"], f["kv"]
    kv_cache = golden_decode_cache_write(i["kv_cache"], kv, i["ori_slot_mapping"])
    T = x_normed.shape[0]
    cmp_rows, cmp_kv, state = golden_decode_compressor_ratio128(
        x_normed, torch.zeros(T, cfg.head_dim), i["compress_state"], i["state_block_table"], i["cmp_wkv"],
        i["cmp_wgate"], i["cmp_ape"], i["cmp_norm_w"], i["freqs_cos"], i["freqs_sin"], i["cmp_kv"],
        i["position_ids"], i["cmp_slot_mapping"], i["state_slot_mapping"], cfg)
    swa_indices = golden_decode_window_indices(i["position_ids"], i["block_table"], cfg)
    cmp_indices = golden_decode_cmp_indices(i["position_ids"], hca_cmp_cols(cfg))
    attn_out = golden_decode_sparse_attn(q, kv_cache, swa_indices, cmp_kv, i["cmp_block_table"], cmp_indices,
                                         i["attn_sink"], rope_cos, rope_sin, i["wo_a"], i["wo_b"], i["wo_b_scale"],
                                         cfg, weight_format=weight_format, float32=float32)
    x_out = golden_hc_post(attn_out, i["x_hc"], f["post"], f["comb"])
    if not return_intermediates:
        return kv_cache, cmp_kv, state, x_out
    return kv_cache, cmp_kv, state, x_out, {"x_normed": x_normed, "q": q, "kv": kv, "swa_indices": swa_indices,
                                            "cmp_indices": cmp_indices, "cmp_rows": cmp_rows, "attn_out": attn_out}


def make_decode_hca_inputs(
    cfg: DeepSeekV4Config,
    start_pos: tuple | list,
    S: int,
    seed: int,
    *,
    reverse_tables: bool = False,
    weight_format: str = "int8",
) -> dict:
    """Seeded fixture of the HCA decode block: :func:`decode_attention_swa.make_decode_swa_inputs`
    with the compress RoPE profile, plus the compressor weights, state (each request's open
    window) and compressed cache of ``make_decode_compressor_inputs`` (same seed), and every
    compressed entry a request has before the step (``cmp_kv`` rows ``N(0, 1)``).

    Returns:
        dict keyed by :data:`HCA_ARGS` (plus the metadata).

    Raises:
        BindError: pools too small.
    """
    d = make_decode_swa_inputs(cfg, start_pos, S, seed, reverse_tables=reverse_tables, profile="compress",
                               weight_format=weight_format)
    c = make_decode_compressor_inputs(cfg, start_pos, S, seed + 2, reverse_tables=reverse_tables)
    d.update(cmp_wkv=c["wkv"], cmp_wgate=c["wgate"], cmp_ape=c["ape"], cmp_norm_w=c["norm_w"],
             compress_state=c["compress_state"], cmp_kv=c["cmp_kv"])
    return d


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_attention_hca`` (pypto-lib `decode_attention_hca.py`).

    Mode ``"decode"``. Options: ``start_pos`` (default ``DEFAULT_START_POS``), ``S``,
    ``seed``, ``reverse_tables``, ``seed_scopes``. Golden :func:`golden_decode_attention_hca`;
    compare functions from :data:`TOLERANCES` (``x_out`` ``ratio_reldiff``, the rest
    ``ratio_allclose``); run tolerances 1e-2.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    o = decode_case_options("decode_attention_hca", preset, mode, options, flags=("seed_scopes",),
                            weight_formats=True)
    cfg, start, S, seed, reverse, seed_scopes = o.cfg, o.start_pos, o.S, o.seed, o.reverse_tables, o.seed_scopes
    k = decode_attention_hca_kernels(cfg, seed_scopes)
    d = make_decode_hca_inputs(cfg, start, S, seed, reverse_tables=reverse, weight_format=o.weight_format)
    outs = ("kv_cache", "cmp_kv", "compress_state")
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=n in outs) for n in HCA_ARGS]
    specs.append(TensorSpec("x_out", list(d["x_hc"].shape), torch.float32, is_output=True))

    def golden(v: dict) -> None:
        v["kv_cache"], v["cmp_kv"], v["compress_state"], v["x_out"] = golden_decode_attention_hca(
            v, cfg, weight_format=o.weight_format)

    compare = {n: (ratio_reldiff if n == "x_out" else ratio_allclose)(*tol) for n, tol in TOLERANCES.items()}
    label = (f"decode B={len(start)} S={S} start_pos={list(start)}" + (" seed_scopes" if seed_scopes else "")
             + (" weight_format=bf16" if o.weight_format == "bf16" else ""))
    return CaseRun(fn=k.decode_attention_hca_test, specs=specs, golden=golden, compare=compare, rtol=1e-2,
                   atol=1e-2, label=label)


register(KernelCase("decode_attention_hca", build_case, modes=("decode",), seed_variant=True,
                    description="ratio-128 decode attention sub-layer (.. compressor .. sparse attn over window + "
                                "compressed rows .. hc_post), pypto-lib's decode_attention_hca.py"))
