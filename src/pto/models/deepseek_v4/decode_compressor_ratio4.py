"""CSA (ratio-4) main KV compressor, decode step (pypto-lib `models/deepseek/v4-flash/decode_compressor_ratio4.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

The decode step runs the ratio-4 core of :mod:`prefill_compressor_ratio4` over ``T = B * S``
tokens, request-major (request ``b`` owns tokens ``b*S .. b*S+S-1``), with one state block
table row per request (``state_block_table [B, L]``). A request whose step closes a window
(``(pos + 1) % 4 == 0``, at most ``ceil(S / 4)`` per request) writes one compressed row; the
others only scatter their state rows. Math, tasks and contract as in the prefill module;
tasks are named ``decode_c4_*``.

Deviations from the reference (pypto-lib `decode_compressor_ratio4.py`): one ``[B, L]`` table and flat ``[T]`` token metadata
instead of ``[B, S]`` tensors (the same values, row-major); the reference's extra FP32
``kv [B, S, d]`` test output is not produced (the compressed cache row is the result).
"""

import torch

from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (
    CSA_RATIO,
    TOLERANCES,
    compressor_ratio4_entry,
    compressor_ratio4_inline,
    golden_prefill_compressor_ratio4,
    ratio4_case,
    ratio4_fixture,
)

__all__ = ["decode_compressor_ratio4", "decode_compressor_ratio4_entry", "golden_decode_compressor_ratio4",
           "decode_start_positions", "make_decode_compressor_ratio4_inputs", "build_decode_compressor_ratio4"]

# ---- kernel ----
decode_compressor_ratio4 = compressor_ratio4_inline("decode")  # the shared body; table [B, L]


def decode_compressor_ratio4_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None):
    """The ``@pl.jit`` test entry ``decode_compressor_ratio4_test``
    (:func:`prefill_compressor_ratio4.compressor_ratio4_entry` of mode ``decode``)."""
    return compressor_ratio4_entry(cfg, "decode", max_cmp_writes)
# ---- end kernel ----


def golden_decode_compressor_ratio4(*args, **kwargs):
    """Decode CSA compressor golden: :func:`prefill_compressor_ratio4.golden_prefill_compressor_ratio4`
    (same arguments, ``state_block_table [B, L]``, request-major tokens; it handles both table
    shapes). Returns ``(cmp_kv, compress_state)``."""
    return golden_prefill_compressor_ratio4(*args, **kwargs)


def decode_start_positions(cfg: DeepSeekV4Config, B: int) -> list[int]:
    """Per-request start positions of the decode fixtures: ``[0, 3, 6, top - 6]`` repeated
    (``top`` = positions one request's share of the compressed pool covers): a cold step, a
    step closing window 0 (no previous window), one closing window 1, one closing a window
    deep in the cache. The reference's ``csa_decode_start_set`` [8192, 0, 2, 3] (pypto-lib `decode_compressor_ratio4.py`) needs
    a larger pool than one quarter of ``cmp_kv_block_num`` pages per request."""
    top = cfg.cmp_kv_block_num // B * cfg.block_size * CSA_RATIO
    base = [0, 3, 6, top - 6]
    return [base[b % 4] for b in range(B)]


def make_decode_compressor_ratio4_inputs(cfg: DeepSeekV4Config, starts: list[int] | None = None,
                                         num_tokens: int | None = None, seed: int = 0) -> dict:
    """Fixture of :func:`golden_decode_compressor_ratio4`: :func:`ratio4_fixture` for
    ``B = decode_batch`` requests of ``S = decode_seq`` tokens at ``starts`` (default
    :func:`decode_start_positions`) plus a prior ``cmp_kv ~ N(0, 1)`` BF16.

    Raises:
        BindError: see :func:`ratio4_fixture`.
    """
    B, S = cfg.decode_batch, cfg.decode_seq
    starts = decode_start_positions(cfg, B) if starts is None else list(starts)
    nt = B * S if num_tokens is None else num_tokens
    f = ratio4_fixture(cfg, starts, S, cfg.head_dim, nt, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    f["cmp_kv"] = torch.randn(f.pop("cmp_pages"), cfg.block_size, 1, cfg.head_dim, generator=gen).to(torch.bfloat16)
    f.pop("cmp_block_table")
    return f


_ARG_ORDER = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
              "sin_table", "cmp_kv", "position_ids", "num_tokens", "cmp_slot_mapping", "state_slot_mapping")


def build_decode_compressor_ratio4(preset: str = "tiny", mode: str = "decode", *, starts=None,
                                   num_tokens: int | None = None, seed: int = 0,
                                   max_cmp_writes: int | None = None) -> CaseRun:
    """KernelCase builder: the CSA decode compressor at ``preset`` (mode ``decode``: ``B x S``
    tokens, flash 4 x 2), compare functions from ``TOLERANCES``.

    Raises:
        ConfigError: unknown preset or mode; BindError: a fixture the config cannot hold.
    """
    cfg = get_config(preset)
    if mode != "decode":
        raise ConfigError(f"decode_compressor_ratio4: unknown mode {mode!r}; the only mode is 'decode'")
    inputs = make_decode_compressor_ratio4_inputs(cfg, starts, num_tokens, seed)
    entry = decode_compressor_ratio4_entry(cfg, max_cmp_writes)

    return ratio4_case(entry, inputs, _ARG_ORDER, ("cmp_kv", "compress_state"), golden_decode_compressor_ratio4,
                       TOLERANCES, cfg, f"{preset} {mode} starts={inputs['position_ids'][::cfg.decode_seq].tolist()}")


register(KernelCase("decode_compressor_ratio4", build_decode_compressor_ratio4, modes=("decode",),
                    description="CSA ratio-4 overlapping KV compressor, decode step over B requests (pypto-lib `decode_compressor_ratio4.py`)"))
