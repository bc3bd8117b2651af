"""Attention sub-block of ratio-4 (CSA) layers, prefill; and the CSA block shared with decode.

Chain (pypto-lib `models/deepseek/v4-flash/decode_attention_csa.py`, `prefill_attention_csa.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``T`` token rows:

    x_mixed, post, comb = hc_pre(x_hc) ; x_normed = rms_norm(x_mixed)
    cos_t, sin_t        = compress-profile table rows at position_ids
    q, kv, qr, qr_scale = qkv_proj_rope(x_normed, ...)
    kv_cache[ori_slot_mapping[t]] = kv[t] ; swa_indices = window rows
    cmp_kv, state       = compressor_ratio4(x_normed, ...)          # entries closed by this call
    idx_kv_cache, ...   = indexer_compressor(x_normed, ...)          # INT8 index keys
    cmp_topk            = indexer(x_normed, qr, qr_scale, ...)       # [T, index_topk], -1 tail
    attn_out            = sparse attention over window + every selected compressed row
    x_out               = hc_post(attn_out, x_hc, post, comb)

The compressors run before the indexer and the attention, so an entry closed by a token of
this call is visible to that token (``w < (p + 1) // 4``). Prefill attends all
``index_topk`` selected rows (``prefill_sparse_attn_kernels(cfg, index_topk)``: no candidate
cap); decode uses ``decode_sparse_attn_csa``. Prefill and decode differ only in the metadata
tasks (prefill: ``prefill_swa_*`` tasks with ``num_tokens``; decode: ``decode_metadata``),
the compressor / indexer table shapes (``[L]`` vs ``[B, L]``), the attention core and
``hc_post_prefill`` vs ``hc_post``: :func:`csa_block_kernels` builds both from one body.

Deviations from the reference: the indexer compressor is called by the block, not by the
indexer (pypto-lib `prefill_indexer.py`); the indexer's cos / sin come from the tables by position (no
``prefill_csa_idx_halfrope`` task); the sparse indices are the indexer's top-k directly (it
already writes ``-1`` past the visible count, so the ``prefill_csa_sparse_idx_tile`` re-check of
pypto-lib's `prefill_attention_csa.py` is not needed); prefill attends every selected row (the reference attends 256 of 512).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_allclose, register, valid_ratio_reldiff
from pto.models.deepseek_v4.attention_front import attention_front, golden_attention_front
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.hc_post import golden_hc_post, golden_hc_post_prefill, hc_post_kernels
from pto.models.deepseek_v4.prefill_attention_swa import (build_window_indices, make_swa_inputs,
                                                          prefill_attention_swa_kernels)
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (_check_cache, golden_ratio4_compress,
                                                              ratio4_cache_write, ratio4_compress_tasks, ratio4_fixture,
                                                              ratio4_tiling)
from pto.models.deepseek_v4.prefill_indexer import golden_prefill_indexer, indexer_topk_tasks, make_indexer_inputs
from pto.models.deepseek_v4.prefill_indexer_compressor import (golden_prefill_indexer_compressor,
                                                               indexer_cache_inputs, indexer_cache_write)
from pto.models.deepseek_v4.prefill_sparse_attn import golden_prefill_sparse_attn, prefill_sparse_attn_kernels
from pto.models.deepseek_v4.qkv_proj_rope import materialize_rope_rows
from pto.models.deepseek_v4.rope import golden_materialize_rope_rows, rope_tables
from pto.models.deepseek_v4.weight_format import is_bf16, weight_format_of, with_weight_format
from pto.models.deepseek_v4.tiling import check_num_tokens, check_token_capacity, token_capacity

__all__ = ["TOLERANCES", "CSA_ARGS", "CSA_OUTPUTS", "csa_block_kernels", "attention_csa_inline", "prefill_attention_csa", "golden_csa_block",
           "golden_prefill_attention_csa", "csa_block_inputs", "make_prefill_csa_inputs", "csa_case",
           "build_prefill_attention_csa"]

# pypto-lib `models/deepseek/v4-flash/prefill_attention_csa.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-2): x_out valid_ratio_reldiff (diff_thd,
# pct_thd, max_diff_hd) as prefill_attention_swa's, against the golden of the kernel's column
# blocking (csa_case); caches ratio_allclose.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_out": (3e-3, 0.005, 1.0),
    "kv_cache": (1e-4, 1 / 128, 0.005),
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
    "idx_kv_cache": (1, 0, 0.01),
    "idx_kv_scale": (1e-4, 1 / 128, 0.01),
    "idx_compress_state": (1e-3, 1e-3, 0.0),
}
# weight_format="bf16": BF16 index keys (one BF16 ulp on 1 % of the elements), unit key scales
BF16_IDX_TOLERANCES: dict[str, tuple[float, float, float]] = {
    "idx_kv_cache": (1e-3, 1 / 128, 0.01),
    "idx_kv_scale": (0.0, 0.0, 0.0),
}

CSA_ARGS = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv",
            "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "block_table", "ori_slot_mapping",
            "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale",
            "cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w", "compress_state", "state_block_table", "cmp_kv",
            "cmp_block_table", "cmp_slot_mapping", "state_slot_mapping",
            "idx_wkv", "idx_wgate", "idx_ape", "idx_norm_w", "idx_compress_state", "idx_state_block_table",
            "idx_state_slot_mapping", "hadamard", "idx_kv_cache", "idx_kv_scale", "idx_block_table",
            "idx_slot_mapping", "idx_wq_b", "idx_wq_b_scale", "idx_weights_proj")
CSA_OUTPUTS = ("kv_cache", "cmp_kv", "compress_state", "idx_kv_cache", "idx_kv_scale", "idx_compress_state", "x_out")

# ---- kernel ----
T_DYN = pl.dynamic("T")


@functools.lru_cache(maxsize=None)
def csa_block_kernels(cfg: DeepSeekV4Config, mode: str, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the CSA attention sub-block for ``cfg`` and ``mode`` (``"prefill"`` / ``"decode"``).

    The inline body ``csa_block(<CSA_ARGS>, x_out, num_tokens)`` returns
    ``(kv_cache, cmp_kv, compress_state, idx_kv_cache, idx_kv_scale, idx_compress_state,
    x_out)``. Shapes: as prefill_attention_swa / decode_attention_swa for the common
    arguments (``freqs_*`` the compress profile), plus ``cmp_wkv / cmp_wgate [2d, D]`` BF16,
    ``cmp_ape [4, 2d]`` FP32, ``cmp_norm_w [d]``, ``compress_state [pages, 4, 4d]`` FP32, the
    indexer compressor's ``idx_*`` at ``c = index_head_dim``, ``hadamard [c, c]`` BF16,
    ``idx_kv_cache [pages, bs, 1, c]`` INT8, ``idx_kv_scale [pages, bs, 1, 1]`` FP32,
    ``idx_wq_b [q_lora, HI*c]`` INT8, ``idx_wq_b_scale [HI*c]``, ``idx_weights_proj [D, HI]``
    BF16. Prefill: one request, tables ``[n]``; decode: ``B`` requests, tables ``[B, n]``,
    ``num_tokens == T`` (an inactive request has position -1). ``seed_scopes`` selects the
    seed variants of hc_pre, qkv_proj_rope, the SWA metadata and the indexer's ``score_wide``
    (bit-identical; the ratio-4 compressors have no initialised scratch).

    Raises:
        ConfigError: an unknown mode or a config the composed kernels cannot tile. At run
            time: ``CapacityError`` / ``BindError`` from the composed kernels.
    """
    if mode not in ("prefill", "decode"):
        raise ConfigError(f"csa attention block: unknown mode {mode!r}; modes: prefill, decode")
    D, HC, HD = cfg.hidden_size, cfg.hc_mult, cfg.head_dim
    W, K = cfg.sliding_window, cfg.index_topk
    cap = token_capacity(cfg)
    tl_main = ratio4_tiling(cfg, HD)
    tl_idx = ratio4_tiling(cfg, cfg.index_head_dim)
    posts = hc_post_kernels(cfg)
    prefix = "prefill" if mode == "prefill" else "decode"
    if mode == "prefill":
        swa = prefill_attention_swa_kernels(cfg, seed_scopes)
        attn = prefill_sparse_attn_kernels(cfg, K).prefill_sparse_attn
    else:
        from pto.models.deepseek_v4.decode_metadata import decode_metadata_kernels
        from pto.models.deepseek_v4.decode_sparse_attn import decode_sparse_attn_csa
        meta = decode_metadata_kernels(cfg)

    def rows2(table):  # a prefill table [n] as the core's one-request [1, n]
        return pl.reshape(table, [1, pl.tensor.dim(table, 0)]) if mode == "prefill" else table

    @pl.jit.inline
    def csa_block(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32], hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor,
                  hc_attn_base: pl.Tensor, attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor,
                  wq_b_scale: pl.Tensor, wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor,
                  freqs_cos: pl.Tensor, freqs_sin: pl.Tensor, kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor,
                  ori_slot_mapping: pl.Tensor, position_ids: pl.Tensor[[T_DYN], pl.INT32], attn_sink: pl.Tensor,
                  wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor,
                  cmp_wkv: pl.Tensor, cmp_wgate: pl.Tensor, cmp_ape: pl.Tensor, cmp_norm_w: pl.Tensor,
                  compress_state: pl.InOut[pl.Tensor], state_block_table: pl.Tensor, cmp_kv: pl.InOut[pl.Tensor],
                  cmp_block_table: pl.Tensor, cmp_slot_mapping: pl.Tensor, state_slot_mapping: pl.Tensor,
                  idx_wkv: pl.Tensor, idx_wgate: pl.Tensor, idx_ape: pl.Tensor, idx_norm_w: pl.Tensor,
                  idx_compress_state: pl.InOut[pl.Tensor], idx_state_block_table: pl.Tensor,
                  idx_state_slot_mapping: pl.Tensor, hadamard: pl.Tensor, idx_kv_cache: pl.InOut[pl.Tensor],
                  idx_kv_scale: pl.InOut[pl.Tensor], idx_block_table: pl.Tensor, idx_slot_mapping: pl.Tensor,
                  idx_wq_b: pl.Tensor, idx_wq_b_scale: pl.Tensor, idx_weights_proj: pl.Tensor,
                  x_out: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]], num_tokens: pl.Scalar[pl.INT32]):
        """CSA attention sub-layer (pypto-lib `prefill_attention_csa.py` / pypto-lib `decode_attention_csa.py`); see :func:`csa_block_kernels`."""
        t = pl.tensor.dim(x_hc, 0)
        check_num_tokens(f"{prefix}_attention_csa", num_tokens, t)
        if mode == "decode" and int(num_tokens) != t:
            raise BindError(f"decode_attention_csa: num_tokens={int(num_tokens)} must be T={t} (an inactive "
                            "request is marked by position -1)")
        if mode == "prefill":
            def rope_rows(cos_t, sin_t):
                materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, cos_t, sin_t)
        else:
            def rope_rows(cos_t, sin_t):
                meta.decode_rope_rows(freqs_cos, freqs_sin, position_ids, cos_t, sin_t)
        f = attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                            gamma_cq, gamma_ckv, rope_rows, cfg, seed_scopes)
        post, comb, x_normed, rope_cos_t, rope_sin_t = f.post, f.comb, f.x_normed, f.rope_cos_t, f.rope_sin_t
        q, kv, qr, qr_scale = f.q, f.kv, f.qr, f.qr_scale
        swa_indices = pl.create_tensor([t, W], pl.INT32, capacity=cap)
        cmp_topk = pl.create_tensor([t, K], pl.INT32, capacity=cap)
        attn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap)
        if mode == "prefill":
            swa.swa_cache_write(kv, ori_slot_mapping, num_tokens, kv_cache)
            swa.swa_window_indices(position_ids, block_table, num_tokens, swa_indices)
        else:
            meta.decode_cache_write(kv, ori_slot_mapping, kv_cache)
            meta.decode_window_indices(position_ids, block_table, swa_indices)

        _check_cache(f"{prefix}_attention_csa", cmp_kv, cfg, HD)
        normed, dst_map, n_writes = ratio4_compress_tasks(
            x_normed, compress_state, rows2(state_block_table), cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, freqs_cos,
            freqs_sin, position_ids, num_tokens, cmp_slot_mapping, state_slot_mapping,
            cmp_kv.shape[0] * cmp_kv.shape[1], cfg, tl_main, f"{prefix}_c4")
        ratio4_cache_write(normed, dst_map, n_writes, cmp_kv, HD, f"{prefix}_c4")
        normed_i, dst_i, n_i = ratio4_compress_tasks(
            x_normed, idx_compress_state, rows2(idx_state_block_table), idx_wkv, idx_wgate, idx_ape, idx_norm_w,
            freqs_cos, freqs_sin, position_ids, num_tokens, idx_slot_mapping, idx_state_slot_mapping,
            idx_kv_cache.shape[0] * idx_kv_cache.shape[1], cfg, tl_idx, f"{prefix}_idx_c4")
        indexer_cache_write(normed_i, dst_i, n_i, hadamard, idx_kv_cache, idx_kv_scale, cfg.index_head_dim,
                            tl_idx.pad_capacity, f"{prefix}_idx_c4")
        indexer_topk_tasks(x_normed, qr, qr_scale, idx_wq_b, idx_wq_b_scale, idx_weights_proj, freqs_cos, freqs_sin,
                           hadamard, idx_kv_cache, idx_kv_scale, rows2(idx_block_table), position_ids, num_tokens,
                           cmp_topk, cfg, f"{prefix}_idx", seed_scopes)
        if mode == "prefill":
            attn(q, kv_cache, swa_indices, cmp_kv, cmp_block_table, cmp_topk, attn_sink, num_tokens, rope_cos_t,
                 rope_sin_t, wo_a, wo_b, wo_b_scale, attn_out)
            posts.hc_post_prefill(attn_out, x_hc, post, comb, x_out, num_tokens)
        else:
            decode_sparse_attn_csa(q, kv_cache, swa_indices, cmp_kv, cmp_block_table, cmp_topk, attn_sink,
                                   rope_cos_t, rope_sin_t, wo_a, wo_b, wo_b_scale, attn_out, cfg)
            posts.hc_post(attn_out, x_hc, post, comb, x_out)
        return kv_cache, cmp_kv, compress_state, idx_kv_cache, idx_kv_scale, idx_compress_state, x_out

    entry = pl.jit.entry(csa_block, name=f"{prefix}_attention_csa_test")
    return SimpleNamespace(csa_block=csa_block, entry=entry, mode=mode, seed_scopes=seed_scopes)


def attention_csa_inline(mode: str):
    """The stable ``@pl.jit.inline`` CSA sub-block of ``mode`` (``prefill_attention_csa`` /
    ``decode_attention_csa``), forwarding to the body of :func:`csa_block_kernels`."""

    @pl.jit.inline
    def attention_csa(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
                      attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor,
                      wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor,
                      freqs_sin: pl.Tensor, kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor,
                      ori_slot_mapping: pl.Tensor, position_ids: pl.Tensor, attn_sink: pl.Tensor,
                      wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor, cmp_wkv: pl.Tensor,
                      cmp_wgate: pl.Tensor, cmp_ape: pl.Tensor, cmp_norm_w: pl.Tensor,
                      compress_state: pl.InOut[pl.Tensor], state_block_table: pl.Tensor,
                      cmp_kv: pl.InOut[pl.Tensor], cmp_block_table: pl.Tensor, cmp_slot_mapping: pl.Tensor,
                      state_slot_mapping: pl.Tensor, idx_wkv: pl.Tensor, idx_wgate: pl.Tensor,
                      idx_ape: pl.Tensor, idx_norm_w: pl.Tensor, idx_compress_state: pl.InOut[pl.Tensor],
                      idx_state_block_table: pl.Tensor, idx_state_slot_mapping: pl.Tensor, hadamard: pl.Tensor,
                      idx_kv_cache: pl.InOut[pl.Tensor], idx_kv_scale: pl.InOut[pl.Tensor],
                      idx_block_table: pl.Tensor, idx_slot_mapping: pl.Tensor, idx_wq_b: pl.Tensor,
                      idx_wq_b_scale: pl.Tensor, idx_weights_proj: pl.Tensor, x_out: pl.Out[pl.Tensor],
                      num_tokens: pl.Scalar[pl.INT32], cfg, seed_scopes: bool = False):
        """Stable inline signature ``<mode>_attention_csa(<CSA_ARGS>, x_out, num_tokens, cfg,
        seed_scopes=False) -> (kv_cache, cmp_kv, compress_state, idx_kv_cache, idx_kv_scale,
        idx_compress_state, x_out)``: the body of :func:`csa_block_kernels` (prefill: one
        request, tables ``[n]``; decode: tables ``[B, n]``, ``num_tokens == T``; shapes,
        variants and errors there)."""
        return csa_block_kernels(cfg, mode, seed_scopes).csa_block(
            x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
            gamma_ckv, freqs_cos, freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a,
            wo_b, wo_b_scale, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table, cmp_kv,
            cmp_block_table, cmp_slot_mapping, state_slot_mapping, idx_wkv, idx_wgate, idx_ape, idx_norm_w,
            idx_compress_state, idx_state_block_table, idx_state_slot_mapping, hadamard, idx_kv_cache, idx_kv_scale,
            idx_block_table, idx_slot_mapping, idx_wq_b, idx_wq_b_scale, idx_weights_proj, x_out, num_tokens)

    attention_csa.__name__ = attention_csa.__qualname__ = f"{mode}_attention_csa"
    return attention_csa


prefill_attention_csa = attention_csa_inline("prefill")
# ---- end kernel ----


def golden_csa_block(inputs: dict, cfg: DeepSeekV4Config, mode: str, *, weight_format: str = "int8",
                     float32: bool = False, return_intermediates: bool = False, blocking: str = "packed"):
    """Golden of the CSA attention block (module docstring), whole tensors, in the kernel's
    order: rope rows -> ``golden_attention_front`` (hc_pre, RMSNorm, q / kv / qr) -> raw-cache
    scatter -> window indices -> ``golden_ratio4_compress`` (main) ->
    ``golden_prefill_indexer_compressor`` -> ``golden_prefill_indexer`` -> the mode's sparse
    attention golden (every selected row) -> ``golden_hc_post(_prefill)``.

    Args:
        inputs: dict keyed by :data:`CSA_ARGS` plus ``num_tokens``; not modified.
        mode: ``"prefill"`` or ``"decode"``.
        weight_format: ``"int8"`` (the kernels' W8A8 path) or ``"bf16"`` (float ``wq_b``,
            ``wo_b`` and ``idx_wq_b``: parity with an unquantised model).
        float32: parity mode: no BF16 rounding of any intermediate, unquantised index keys
            (``idx_kv_cache`` FP32 with scale 1) and queries.
        return_intermediates: also return ``{x_normed, q, kv, qr, swa_indices, cmp_topk,
            attn_out, cmp_entries}``.
        blocking: key tiling of the prefill sparse-attention golden
            (``golden_attention_core``): ``"packed"`` (default, the plain math for parity
            runs) or ``"columns"`` (the kernel's fixed column blocks, what the registered
            case compares against). Decode's golden always runs the kernel's blocks.

    Returns:
        the :data:`CSA_OUTPUTS` tensors in order (+ the intermediates dict).

    Raises:
        BindError: a missing input, bad shapes, an index outside its cache, or an unknown mode
            or blocking.
    """
    missing = [k for k in CSA_ARGS + ("num_tokens",) if k not in inputs]
    if missing or mode not in ("prefill", "decode") or blocking not in ("packed", "columns"):
        raise BindError(f"golden_csa_block: inputs missing {missing}, unknown mode {mode!r} or unknown blocking "
                        f"{blocking!r}")
    i, bf16 = inputs, not float32
    nt = int(i["num_tokens"])
    T = i["x_hc"].shape[0]
    pos = i["position_ids"]
    if mode == "prefill":
        zeros = torch.zeros(T, cfg.qk_rope_head_dim, dtype=i["freqs_cos"].dtype)
        rope_cos, rope_sin = golden_materialize_rope_rows(i["freqs_cos"], i["freqs_sin"], pos, nt, zeros, zeros)
    else:
        from pto.models.deepseek_v4.decode_attention_swa import golden_decode_rope_rows
        rope_cos, rope_sin = golden_decode_rope_rows(i["freqs_cos"], i["freqs_sin"], pos)
    front = golden_attention_front(i, rope_cos, rope_sin, cfg, weight_format=weight_format, float32=float32)
    post, comb, x_normed, q, kv, qr, qr_scale = (front[k] for k in ("post", "comb", "x_normed", "q", "kv", "qr",
                                                                    "qr_scale"))
    if weight_format == "bf16" and not float32:  # the kernel's BF16 latent, in its split-K order
        from pto.models.deepseek_v4.qkv_proj_rope import golden_qr_split_k
        qr, qr_scale = golden_qr_split_k(x_normed, i["wq_a"], i["gamma_cq"], cfg, "bf16")
    kv_cache = i["kv_cache"].clone()
    flat = kv_cache.view(-1, cfg.head_dim)
    slots = i["ori_slot_mapping"][:nt].long()
    keep = slots >= 0
    flat[slots[keep]] = kv[:nt][keep].to(kv_cache.dtype)  # slots are distinct within a call
    if mode == "prefill":
        swa_indices = build_window_indices(pos, nt, i["block_table"], cfg)
    else:
        from pto.models.deepseek_v4.decode_metadata import golden_decode_window_indices
        swa_indices = golden_decode_window_indices(pos, i["block_table"], cfg)
    entries, dst, compress_state = golden_ratio4_compress(
        x_normed, i["compress_state"], i["state_block_table"], i["cmp_wkv"], i["cmp_wgate"], i["cmp_ape"],
        i["cmp_norm_w"], i["freqs_cos"], i["freqs_sin"], pos, nt, i["cmp_slot_mapping"], i["state_slot_mapping"],
        cfg, "golden_csa_block", float32)
    cmp_kv = i["cmp_kv"].clone()
    cmp_kv.view(-1, cfg.head_dim)[dst] = entries.to(cmp_kv.dtype)
    idx_kv_cache, idx_kv_scale, idx_state = golden_prefill_indexer_compressor(
        x_normed, i["idx_compress_state"], i["idx_state_block_table"], i["idx_wkv"], i["idx_wgate"], i["idx_ape"],
        i["idx_norm_w"], i["freqs_cos"], i["freqs_sin"], i["hadamard"], i["idx_kv_cache"], i["idx_kv_scale"], pos,
        nt, i["idx_slot_mapping"], i["idx_state_slot_mapping"], cfg, weight_format=weight_format, float32=float32)
    cmp_topk = golden_prefill_indexer(x_normed, qr, qr_scale, i["idx_wq_b"], i["idx_wq_b_scale"],
                                      i["idx_weights_proj"], i["freqs_cos"], i["freqs_sin"], i["hadamard"],
                                      idx_kv_cache, idx_kv_scale, i["idx_block_table"], pos, nt,
                                      torch.empty(T, cfg.index_topk, dtype=torch.int32), cfg,
                                      weight_format=weight_format, float32=float32)
    if mode == "prefill":
        attn_out = golden_prefill_sparse_attn(q, kv_cache, swa_indices, cmp_kv, i["cmp_block_table"], cmp_topk,
                                              i["attn_sink"], nt, rope_cos, rope_sin, i["wo_a"], i["wo_b"],
                                              i["wo_b_scale"], cfg, weight_format=weight_format, float32=float32,
                                              blocking=blocking)
        x_out = golden_hc_post_prefill(attn_out, i["x_hc"], post, comb, nt)
    else:
        from pto.models.deepseek_v4.decode_sparse_attn import golden_decode_sparse_attn
        attn_out = golden_decode_sparse_attn(q, kv_cache, swa_indices, cmp_kv, i["cmp_block_table"], cmp_topk,
                                             i["attn_sink"], rope_cos, rope_sin, i["wo_a"], i["wo_b"],
                                             i["wo_b_scale"], cfg, weight_format=weight_format, float32=float32)
        x_out = golden_hc_post(attn_out, i["x_hc"], post, comb)
    out = (kv_cache, cmp_kv, compress_state, idx_kv_cache, idx_kv_scale, idx_state, x_out)
    if not return_intermediates:
        return out
    return out + ({"x_normed": x_normed, "q": q, "kv": kv, "qr": qr, "swa_indices": swa_indices,
                   "cmp_topk": cmp_topk, "attn_out": attn_out, "cmp_entries": entries},)


def golden_prefill_attention_csa(inputs: dict, cfg: DeepSeekV4Config, **kw):
    """Prefill CSA block golden: :func:`golden_csa_block` with ``mode="prefill"``."""
    return golden_csa_block(inputs, cfg, "prefill", **kw)


def csa_block_inputs(cfg: DeepSeekV4Config, base: dict, starts: list[int], S: int, num_tokens: int, seed: int,
                     state_pages: int = 65) -> dict:
    """Add the CSA pieces to a SWA-block fixture ``base`` (weights, caches, tables of the
    common arguments): compress-profile ``freqs_*``; the main compressor's weights, state, state
    table, prior ``cmp_kv ~ N(0, 1)`` BF16, ``cmp_block_table`` and slot mappings from
    :func:`prefill_compressor_ratio4.ratio4_fixture` (seed ``seed + 10``); the indexer
    compressor's (``idx_*``, :func:`prefill_indexer_compressor.indexer_cache_inputs`, seed
    ``seed + 20``); the indexer's ``idx_wq_b / idx_wq_b_scale / idx_weights_proj`` from
    :func:`prefill_indexer.make_indexer_inputs` (seed ``seed + 30``). Tables keep the ``[B, n]``
    shape (prefill callers take row 0); ``cmp_block_table`` is ``[B, cmp_kv_block_num]``
    (``-1`` past a request's own pages)."""
    d = dict(base)
    cos, sin = rope_tables(cfg, "compress")
    d["freqs_cos"], d["freqs_sin"] = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    f = ratio4_fixture(cfg, starts, S, cfg.head_dim, num_tokens, seed + 10, state_pages)
    gen = torch.Generator().manual_seed(seed + 11)
    d.update(cmp_wkv=f["wkv"], cmp_wgate=f["wgate"], cmp_ape=f["ape"], cmp_norm_w=f["norm_w"],
             compress_state=f["compress_state"], state_block_table=f["state_block_table"],
             cmp_kv=torch.randn(f["cmp_pages"], cfg.block_size, 1, cfg.head_dim, generator=gen).to(torch.bfloat16),
             cmp_block_table=torch.nn.functional.pad(f["cmp_block_table"], (0, cfg.cmp_kv_block_num
                                                                             - f["cmp_block_table"].shape[1]),
                                                     value=-1),
             cmp_slot_mapping=f["cmp_slot_mapping"],
             state_slot_mapping=f["state_slot_mapping"])
    fi = indexer_cache_inputs(ratio4_fixture(cfg, starts, S, cfg.index_head_dim, num_tokens, seed + 20, state_pages),
                              cfg, seed + 20)
    d.update(idx_wkv=fi["wkv"], idx_wgate=fi["wgate"], idx_ape=fi["ape"], idx_norm_w=fi["norm_w"],
             idx_compress_state=fi["compress_state"], idx_state_block_table=fi["state_block_table"],
             idx_state_slot_mapping=fi["state_slot_mapping"], hadamard=fi["hadamard"],
             idx_kv_cache=fi["idx_kv_cache"], idx_kv_scale=fi["idx_kv_scale"], idx_block_table=fi["idx_block_table"],
             idx_slot_mapping=fi["idx_slot_mapping"])
    fx = make_indexer_inputs(cfg, starts, S, num_tokens, seed + 30)
    d.update(idx_wq_b=fx["wq_b"], idx_wq_b_scale=fx["wq_b_scale"], idx_weights_proj=fx["weights_proj"])
    return d


def make_prefill_csa_inputs(cfg: DeepSeekV4Config, T: int, start_pos: int, num_tokens: int, seed: int, *,
                            block_table: str = "permuted", attn_sink: float = 0.0, state_pages: int = 65) -> dict:
    """Seeded fixture of the prefill CSA block: ``prefill_attention_swa.make_swa_inputs`` (the
    common weights, raw cache and its ``block_table``) then :func:`csa_block_inputs` for one
    request at ``start_pos`` (tables as ``[n]`` rows).

    Raises:
        BindError: positions the pools cannot hold (see the two builders).
    """
    base = make_swa_inputs(cfg, T, start_pos, num_tokens, seed, block_table=block_table, attn_sink=attn_sink,
                           weight_format=weight_format_of(cfg))
    d = csa_block_inputs(cfg, base, [start_pos], T, num_tokens, seed, state_pages)
    for k in ("state_block_table", "cmp_block_table", "idx_state_block_table", "idx_block_table"):
        d[k] = d[k][0].contiguous()
    return d


def csa_case(entry, d: dict, cfg, mode: str, label: str) -> CaseRun:
    """CaseRun of a CSA block fixture ``d`` (keys :data:`CSA_ARGS` + ``num_tokens``): the
    :data:`CSA_OUTPUTS` are outputs, compare functions from :data:`TOLERANCES` (``x_out`` by
    ``valid_ratio_reldiff`` over the active rows), run tolerances 1e-2. The golden is
    :func:`golden_csa_block` with ``blocking="columns"`` (prefill: the kernel's key blocks)."""
    nt = int(d["num_tokens"])
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=n in CSA_OUTPUTS) for n in CSA_ARGS]
    specs.append(TensorSpec("x_out", list(d["x_hc"].shape), torch.float32, is_output=True))
    specs.append(ScalarSpec("num_tokens", torch.int32, nt))

    def golden(v: dict) -> None:
        for k, t in zip(CSA_OUTPUTS, golden_csa_block(v, cfg, mode, blocking="columns",
                                                      weight_format=weight_format_of(cfg))):
            v[k] = t

    tols = {**TOLERANCES, **BF16_IDX_TOLERANCES} if is_bf16(cfg) else TOLERANCES
    compare = {k: ratio_allclose(*tol) for k, tol in tols.items() if k != "x_out"}
    compare["x_out"] = valid_ratio_reldiff(nt, *TOLERANCES["x_out"])
    return CaseRun(fn=entry, specs=specs, golden=golden, compare=compare, rtol=1e-2, atol=1e-2, label=label)


def build_prefill_attention_csa(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``prefill_attention_csa`` (pypto-lib `prefill_attention_csa.py`). Mode ``"prefill"``; options ``T``
    (default ``prefill_seq``), ``start_pos`` (default 0), ``num_tokens`` (default ``T``),
    ``block_table`` (``"permuted"`` default, or ``"identity"``), ``attn_sink``, ``seed``,
    ``seed_scopes``, ``weight_format`` (``"bf16"``: the unquantised kernels; BF16 index keys
    compared as :data:`BF16_IDX_TOLERANCES`).

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    cfg = get_config(preset)
    if mode != "prefill":
        raise ConfigError(f"prefill_attention_csa: unknown mode {mode!r}; modes: prefill")
    opts = dict(options)
    T = int(opts.pop("T", cfg.prefill_seq))
    start = int(opts.pop("start_pos", 0))
    nt = int(opts.pop("num_tokens", T))
    table = opts.pop("block_table", "permuted")
    sink = float(opts.pop("attn_sink", 0.0))
    seed = int(opts.pop("seed", 0))
    seed_scopes = bool(opts.pop("seed_scopes", False))
    cfg = with_weight_format(cfg, str(opts.pop("weight_format", "int8")))
    if opts:
        raise ConfigError(f"prefill_attention_csa: unknown options {sorted(opts)}")
    check_token_capacity("prefill_attention_csa", cfg, T)  # before any input is built
    d = make_prefill_csa_inputs(cfg, T, start, nt, seed, block_table=table, attn_sink=sink)
    entry = csa_block_kernels(cfg, "prefill", seed_scopes).entry
    label = (f"prefill T={T} start_pos={start} num_tokens={nt} block_table={table}"
             + (" seed_scopes" if seed_scopes else "") + (" weight_format=bf16" if is_bf16(cfg) else ""))
    return csa_case(entry, d, cfg, "prefill", label)


register(KernelCase("prefill_attention_csa", build_prefill_attention_csa, modes=("prefill",), seed_variant=True,
                    description="ratio-4 prefill attention sub-layer: compressor, indexer top-k, sparse attn (pypto-lib `prefill_attention_csa.py`)"))
