"""CSA (ratio-4) main KV compressor, decode step (v4flash-kernels.md B.10; dsv4-math.md 6.1).

The decode step runs the ratio-4 core of :mod:`prefill_compressor_ratio4` over ``T = B * S``
tokens, request-major (request ``b`` owns tokens ``b*S .. b*S+S-1``), with one state block
table row per request (``state_block_table [B, L]``). A request whose step closes a window
(``(pos + 1) % 4 == 0``, at most ``ceil(S / 4)`` per request) writes one compressed row; the
others only scatter their state rows. Math, tasks and contract as in the prefill module;
tasks are named ``decode_c4_*``.

Deviations from the reference (B.10): one ``[B, L]`` table and flat ``[T]`` token metadata
instead of ``[B, S]`` tensors (the same values, row-major); the reference's extra FP32
``kv [B, S, d]`` test output is not produced (the compressed cache row is the result).
"""

import functools

import torch

import pto.language as pl
from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (
    CSA_RATIO,
    CSA_STATE_PAGE,
    TOLERANCES,
    _check_cache,
    golden_ratio4_compress,
    ratio4_cache_write,
    ratio4_compress_tasks,
    ratio4_fixture,
    ratio4_specs,
    ratio4_tiling,
)

__all__ = ["decode_compressor_ratio4", "decode_compressor_ratio4_entry", "golden_decode_compressor_ratio4",
           "decode_start_positions", "make_decode_compressor_ratio4_inputs", "build_decode_compressor_ratio4"]

# ---- kernel ----
T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")
STATE_PAGES_DYN = pl.dynamic("STATE_PAGES")
STATE_TABLE_DYN = pl.dynamic("STATE_TABLE_LEN")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
CMP_PAGES_DYN = pl.dynamic("CMP_PAGES")
D_DYN = pl.dynamic("D")


@pl.jit.inline
def decode_compressor_ratio4(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    compress_state: pl.InOut[pl.Tensor],
    state_block_table: pl.Tensor[[B_DYN, STATE_TABLE_DYN], pl.INT32],
    wkv: pl.Tensor,
    wgate: pl.Tensor,
    ape: pl.Tensor,
    norm_w: pl.Tensor,
    cos_table: pl.Tensor,
    sin_table: pl.Tensor,
    cmp_kv: pl.InOut[pl.Tensor],
    position_ids: pl.Tensor[[T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    cfg,
    max_cmp_writes=None,
    seed_scopes=False,
):
    """CSA main KV compressor over one decode step of ``B`` requests (B.10, generalised).

    Shapes as :func:`prefill_compressor_ratio4` except ``state_block_table [B, L]`` (one row per
    request; ``T`` a multiple of ``B``). ``num_tokens < T`` leaves the tail tokens inactive.

    Returns:
        ``(cmp_kv, compress_state)``.

    Raises:
        ConfigError, BindError, CapacityError: see
        :func:`prefill_compressor_ratio4.ratio4_compress_tasks`.
    """
    tl = ratio4_tiling(cfg, cfg.head_dim, max_cmp_writes)
    _check_cache("decode_compressor_ratio4", cmp_kv, cfg, cfg.head_dim)
    normed, dst_map, n_writes = ratio4_compress_tasks(
        x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids,
        num_tokens, cmp_slot_mapping, state_slot_mapping, cmp_kv.shape[0] * cmp_kv.shape[1], cfg, tl, "decode_c4",
        seed_scopes)
    ratio4_cache_write(normed, dst_map, n_writes, cmp_kv, cfg.head_dim, "decode_c4")
    return cmp_kv, compress_state


@functools.lru_cache(maxsize=None)
def decode_compressor_ratio4_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None,
                                   seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``decode_compressor_ratio4_test`` for ``cfg`` (parameters of
    :func:`decode_compressor_ratio4`, model dims static); returns ``(cmp_kv, compress_state)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
    """
    tl = ratio4_tiling(cfg, cfg.head_dim, max_cmp_writes)
    D, d, r, bs = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim, cfg.block_size

    @pl.jit
    def decode_compressor_ratio4_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, CSA_STATE_PAGE, 4 * d], pl.FP32]],
        state_block_table: pl.Tensor[[B_DYN, STATE_TABLE_DYN], pl.INT32],
        wkv: pl.Tensor[[2 * d, D], pl.BF16],
        wgate: pl.Tensor[[2 * d, D], pl.BF16],
        ape: pl.Tensor[[CSA_RATIO, 2 * d], pl.FP32],
        norm_w: pl.Tensor[[d], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        cmp_kv: pl.InOut[pl.Tensor[[CMP_PAGES_DYN, bs, 1, d], pl.BF16]],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    ):
        return decode_compressor_ratio4(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table,
                                        sin_table, cmp_kv, position_ids, num_tokens, cmp_slot_mapping,
                                        state_slot_mapping, cfg, tl.max_cmp_writes, seed_scopes)

    return decode_compressor_ratio4_test
# ---- end kernel ----


def golden_decode_compressor_ratio4(
    x: torch.Tensor,  # [B*S, D] bf16
    compress_state: torch.Tensor,  # [pages, 4, 4*head_dim] fp32
    state_block_table: torch.Tensor,  # [B, L] int32
    wkv: torch.Tensor,  # [2*head_dim, D] bf16
    wgate: torch.Tensor,  # [2*head_dim, D] bf16
    ape: torch.Tensor,  # [4, 2*head_dim] fp32
    norm_w: torch.Tensor,  # [head_dim] bf16
    cos_table: torch.Tensor,  # [P, r] bf16
    sin_table: torch.Tensor,  # [P, r] bf16
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim]
    position_ids: torch.Tensor,  # [B*S] int32
    num_tokens: int,
    cmp_slot_mapping: torch.Tensor,  # [B*S] int64
    state_slot_mapping: torch.Tensor,  # [B*S] int64
    cfg: DeepSeekV4Config,
    weight_format: str = "bf16",
    float32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (cmp_kv, compress_state)
    """Decode CSA compressor golden: the prefill golden's math with one table row per request
    (dsv4-math.md 6.1). ``weight_format`` / ``float32`` as in
    :func:`prefill_compressor_ratio4.golden_prefill_compressor_ratio4`.

    Raises:
        BindError: see :func:`prefill_compressor_ratio4.golden_ratio4_compress`.
    """
    entries, dst, state_out = golden_ratio4_compress(
        x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids,
        num_tokens, cmp_slot_mapping, state_slot_mapping, cfg, "golden_decode_compressor_ratio4", float32)
    cmp_out = cmp_kv.clone()
    cmp_out.view(-1, cmp_kv.shape[-1])[dst] = entries.to(cmp_out.dtype)
    return cmp_out, state_out


def decode_start_positions(cfg: DeepSeekV4Config, B: int) -> list[int]:
    """Per-request start positions of the decode fixtures: ``[0, 3, 6, top - 6]`` repeated
    (``top`` = positions one request's share of the compressed pool covers): a cold step, a
    step closing window 0 (no previous window), one closing window 1, one closing a window
    deep in the cache. The reference's ``csa_decode_start_set`` [8192, 0, 2, 3] (B.10) needs
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
                                   num_tokens: int | None = None, seed: int = 0, seed_scopes: bool = False,
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
    entry = decode_compressor_ratio4_entry(cfg, max_cmp_writes, seed_scopes)

    def golden(v: dict) -> None:
        v["cmp_kv"], v["compress_state"] = golden_decode_compressor_ratio4(**{k: v[k] for k in _ARG_ORDER}, cfg=cfg)

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
    label = f"{preset} {mode} starts={inputs['position_ids'][::cfg.decode_seq].tolist()}"
    return CaseRun(entry, ratio4_specs(inputs, _ARG_ORDER, ("cmp_kv", "compress_state")), golden, compare,
                   rtol=1e-3, atol=1e-3, label=label + (" seed_scopes" if seed_scopes else ""))


register(KernelCase("decode_compressor_ratio4", build_decode_compressor_ratio4, modes=("decode",),
                    seed_variant=True,
                    description="CSA ratio-4 overlapping KV compressor, decode step over B requests (B.10)"))
