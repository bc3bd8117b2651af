"""Decode attention sub-block of ratio-4 (CSA) layers (pypto-lib `models/deepseek/v4-flash/decode_attention_csa.py`).

The decode body of :func:`prefill_attention_csa.csa_block_kernels`: ``B`` requests x ``S``
tokens, ``T = B * S`` request-major rows; per-request block tables ``[B, n]`` for the raw
cache (window), the compressed cache, both compressor states and the index keys; the
metadata tasks of :mod:`decode_metadata` (rope rows, cache write, window indices); the two
ratio-4 compressors (decode_c4_*, decode_idx_c4_*), the indexer (decode_idx_*) and
``decode_sparse_attn_csa`` over the window plus the ``index_topk`` selected rows; ``hc_post``.
``num_tokens`` must be ``T``. Math in :mod:`prefill_attention_csa`.

Deviations from pypto-lib `decode_attention_csa.py`: the indexer compressor is called by the block (not by the indexer);
the indexer's cos / sin are the tables' rows by position (no ``csa_rope_step`` /
``csa_cmp_rope`` tasks); no ``offset`` on the top-k.
"""

from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_attention_swa import make_decode_swa_inputs
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_attention_csa import (attention_csa_inline, csa_block_inputs, csa_block_kernels,
                                                          csa_case, golden_csa_block)
from pto.models.deepseek_v4.weight_format import weight_format_of, with_weight_format

__all__ = ["decode_attention_csa", "golden_decode_attention_csa", "make_decode_csa_inputs",
           "build_decode_attention_csa"]


# ---- kernel ----
decode_attention_csa = attention_csa_inline("decode")  # the shared stable signature; tables [B, n]
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
    base = make_decode_swa_inputs(cfg, starts, S, seed, reverse_tables=reverse_tables, profile="compress",
                                  weight_format=weight_format_of(cfg))
    T = len(starts) * S
    d = csa_block_inputs(cfg, base, starts, S, T, seed, state_pages)
    d["num_tokens"] = T
    return d


def build_decode_attention_csa(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_attention_csa`` (pypto-lib `decode_attention_csa.py`). Mode ``"decode"``; options
    ``start_pos`` (per request; default :func:`decode_compressor_ratio4.decode_start_positions`),
    ``S``, ``seed``, ``reverse_tables``, ``seed_scopes``, ``weight_format`` (``"bf16"``: the
    unquantised kernels).

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
    cfg = with_weight_format(cfg, str(opts.pop("weight_format", "int8")))
    if opts:
        raise ConfigError(f"decode_attention_csa: unknown options {sorted(opts)}")
    d = make_decode_csa_inputs(cfg, starts, None if S is None else int(S), seed, reverse_tables=reverse)
    entry = csa_block_kernels(cfg, "decode", seed_scopes).entry
    B = d["block_table"].shape[0]
    label = (f"decode B={B} S={d['x_hc'].shape[0] // B} start_pos={d['position_ids'][::d['x_hc'].shape[0] // B].tolist()}"
             + (" seed_scopes" if seed_scopes else "") + (" weight_format=bf16" if weight_format_of(cfg) == "bf16"
                                                          else ""))
    return csa_case(entry, d, cfg, "decode", label)


register(KernelCase("decode_attention_csa", build_decode_attention_csa, modes=("decode",), seed_variant=True,
                    description="ratio-4 decode attention sub-layer: compressors, indexer top-k, sparse attn (pypto-lib `decode_attention_csa.py`)"))
