"""Decode attention sub-block of ratio-4 (CSA) layers (v4flash-kernels.md B.14).

The decode body of :func:`prefill_attention_csa.csa_block_kernels`: ``B`` requests x ``S``
tokens, ``T = B * S`` request-major rows; per-request block tables ``[B, n]`` for the raw
cache (window), the compressed cache, both compressor states and the index keys; the
metadata tasks of :mod:`decode_metadata` (rope rows, cache write, window indices); the two
ratio-4 compressors (decode_c4_*, decode_idx_c4_*), the indexer (decode_idx_*) and
``decode_sparse_attn_csa`` over the window plus the ``index_topk`` selected rows; ``hc_post``.
``num_tokens`` must be ``T``. Math in :mod:`prefill_attention_csa`.

Deviations from B.14: the indexer compressor is called by the block (not by the indexer);
the indexer's cos / sin are the tables' rows by position (no ``csa_rope_step`` /
``csa_cmp_rope`` tasks); no ``offset`` on the top-k.
"""

import torch

import pto.language as pl
from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_attention_swa import make_decode_swa_inputs
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_attention_csa import (csa_block_inputs, csa_block_kernels, csa_case,
                                                          golden_csa_block)

__all__ = ["decode_attention_csa", "golden_decode_attention_csa", "make_decode_csa_inputs",
           "build_decode_attention_csa"]


# ---- kernel ----
@pl.jit.inline
def decode_attention_csa(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
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
    """Stable inline signature ``decode_attention_csa(<CSA_ARGS>, x_out, num_tokens, cfg,
    seed_scopes=False) -> (kv_cache, cmp_kv, compress_state, idx_kv_cache, idx_kv_scale,
    idx_compress_state, x_out)``: the decode body of
    :func:`prefill_attention_csa.csa_block_kernels` (tables ``[B, n]``, ``num_tokens == T``)."""
    return csa_block_kernels(cfg, "decode", seed_scopes).csa_block(
        x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv,
        freqs_cos, freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
        wo_b_scale, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w, compress_state, state_block_table, cmp_kv,
        cmp_block_table, cmp_slot_mapping, state_slot_mapping, idx_wkv, idx_wgate, idx_ape, idx_norm_w,
        idx_compress_state, idx_state_block_table, idx_state_slot_mapping, hadamard, idx_kv_cache, idx_kv_scale,
        idx_block_table, idx_slot_mapping, idx_wq_b, idx_wq_b_scale, idx_weights_proj, x_out, num_tokens)
# ---- end kernel ----


def golden_decode_attention_csa(inputs: dict, cfg: DeepSeekV4Config, **kw):
    """Decode CSA block golden: :func:`prefill_attention_csa.golden_csa_block` with
    ``mode="decode"`` (decode metadata goldens, ``golden_decode_sparse_attn``, ``golden_hc_post``)."""
    return golden_csa_block(inputs, cfg, "decode", **kw)


def make_decode_csa_inputs(cfg: DeepSeekV4Config, starts: list[int] | None = None, S: int | None = None,
                           seed: int = 0, *, reverse_tables: bool = False, state_pages: int = 65) -> dict:
    """Seeded fixture of the decode CSA block: ``decode_attention_swa.make_decode_swa_inputs``
    (compress profile; common weights, raw cache, ``block_table``, window metadata) for
    ``starts`` (default :func:`decode_compressor_ratio4.decode_start_positions`) then
    :func:`prefill_attention_csa.csa_block_inputs` (compressors, indexer, their tables
    ``[B, n]`` and slot mappings); ``num_tokens = T``.

    Raises:
        BindError: pools too small for the batch.
    """
    S = cfg.decode_seq if S is None else S
    starts = decode_start_positions(cfg, cfg.decode_batch) if starts is None else list(starts)
    base = make_decode_swa_inputs(cfg, starts, S, seed, reverse_tables=reverse_tables, profile="compress")
    T = len(starts) * S
    d = csa_block_inputs(cfg, base, starts, S, T, seed, state_pages)
    d["num_tokens"] = T
    return d


def build_decode_attention_csa(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_attention_csa`` (B.14). Mode ``"decode"``; options
    ``start_pos`` (per request; default :func:`decode_compressor_ratio4.decode_start_positions`),
    ``S``, ``seed``, ``reverse_tables``, ``seed_scopes``.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    cfg = get_config(preset)
    if mode != "decode":
        raise ConfigError(f"decode_attention_csa: unknown mode {mode!r}; modes: decode")
    opts = dict(options)
    starts = opts.pop("start_pos", None)
    S = opts.pop("S", None)
    seed = int(opts.pop("seed", 0))
    reverse = bool(opts.pop("reverse_tables", False))
    seed_scopes = bool(opts.pop("seed_scopes", False))
    if opts:
        raise ConfigError(f"decode_attention_csa: unknown options {sorted(opts)}")
    d = make_decode_csa_inputs(cfg, starts, None if S is None else int(S), seed, reverse_tables=reverse)
    entry = csa_block_kernels(cfg, "decode", seed_scopes).entry
    B = d["block_table"].shape[0]
    label = (f"decode B={B} S={d['x_hc'].shape[0] // B} start_pos={d['position_ids'][::d['x_hc'].shape[0] // B].tolist()}"
             + (" seed_scopes" if seed_scopes else ""))
    return csa_case(entry, d, cfg, "decode", label)


register(KernelCase("decode_attention_csa", build_decode_attention_csa, modes=("decode",), seed_variant=True,
                    description="ratio-4 decode attention sub-layer: compressors, indexer top-k, sparse attn (B.14)"))
