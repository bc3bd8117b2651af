"""Lightning-indexer key compressor, decode step (v4flash-kernels.md B.11; dsv4-math.md 6.2).

The ratio-4 core of :mod:`prefill_compressor_ratio4` at width ``index_head_dim`` over one
decode step of ``B`` requests (request-major tokens, ``state_block_table [B, L]``), then the
Hadamard and INT8 key-cache finalize of :mod:`prefill_indexer_compressor`; tasks are named
``decode_idx_c4_*``. Math and contract as in those modules. Deviation (B.11): no FP32
``kv [B, S, c]`` test output; flat ``[T]`` token metadata.
"""

import functools

import pto.language as pl
from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (
    CSA_RATIO,
    CSA_STATE_PAGE,
    ratio4_compress_tasks,
    ratio4_fixture,
    ratio4_specs,
    ratio4_tiling,
)
from pto.models.deepseek_v4.prefill_indexer_compressor import (
    _ARG_ORDER,
    _OUTPUTS,
    TOLERANCES,
    _check_idx_cache,
    golden_prefill_indexer_compressor,
    indexer_cache_inputs,
    indexer_cache_write,
)

__all__ = ["decode_indexer_compressor", "decode_indexer_compressor_entry", "golden_decode_indexer_compressor",
           "make_decode_indexer_compressor_inputs", "build_decode_indexer_compressor"]

# ---- kernel ----
T_DYN = pl.dynamic("T")
D_DYN = pl.dynamic("D")
B_DYN = pl.dynamic("B")
STATE_PAGES_DYN = pl.dynamic("STATE_PAGES")
STATE_TABLE_DYN = pl.dynamic("STATE_TABLE_LEN")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
IDX_PAGES_DYN = pl.dynamic("IDX_PAGES")


@pl.jit.inline
def decode_indexer_compressor(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    compress_state: pl.InOut[pl.Tensor],
    state_block_table: pl.Tensor[[B_DYN, STATE_TABLE_DYN], pl.INT32],
    wkv: pl.Tensor,
    wgate: pl.Tensor,
    ape: pl.Tensor,
    norm_w: pl.Tensor,
    cos_table: pl.Tensor,
    sin_table: pl.Tensor,
    hadamard: pl.Tensor,
    idx_kv_cache: pl.InOut[pl.Tensor],
    idx_kv_scale: pl.InOut[pl.Tensor],
    position_ids: pl.Tensor[[T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    idx_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    cfg,
    max_cmp_writes=None,
    seed_scopes=False,
):
    """Indexer key compressor over one decode step (B.11, generalised): shapes as
    :func:`prefill_indexer_compressor.prefill_indexer_compressor` with ``state_block_table
    [B, L]``.

    Returns:
        ``(idx_kv_cache, idx_kv_scale, compress_state)``.

    Raises:
        ConfigError, BindError, CapacityError: see
        :func:`prefill_compressor_ratio4.ratio4_compress_tasks`.
    """
    c = cfg.index_head_dim
    tl = ratio4_tiling(cfg, c, max_cmp_writes)
    _check_idx_cache("decode_indexer_compressor", idx_kv_cache, idx_kv_scale, cfg)
    normed, dst_map, n_writes = ratio4_compress_tasks(
        x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids,
        num_tokens, idx_slot_mapping, state_slot_mapping, idx_kv_cache.shape[0] * idx_kv_cache.shape[1], cfg, tl,
        "decode_idx_c4", seed_scopes)
    indexer_cache_write(normed, dst_map, n_writes, hadamard, idx_kv_cache, idx_kv_scale, c, tl.pad_capacity,
                        "decode_idx_c4")
    return idx_kv_cache, idx_kv_scale, compress_state


@functools.lru_cache(maxsize=None)
def decode_indexer_compressor_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None,
                                    seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``decode_indexer_compressor_test`` (parameters of
    :func:`decode_indexer_compressor`, model dims static).

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
    """
    c = cfg.index_head_dim
    tl = ratio4_tiling(cfg, c, max_cmp_writes)
    D, r, bs = cfg.hidden_size, cfg.qk_rope_head_dim, cfg.block_size

    @pl.jit
    def decode_indexer_compressor_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, CSA_STATE_PAGE, 4 * c], pl.FP32]],
        state_block_table: pl.Tensor[[B_DYN, STATE_TABLE_DYN], pl.INT32],
        wkv: pl.Tensor[[2 * c, D], pl.BF16],
        wgate: pl.Tensor[[2 * c, D], pl.BF16],
        ape: pl.Tensor[[CSA_RATIO, 2 * c], pl.FP32],
        norm_w: pl.Tensor[[c], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        hadamard: pl.Tensor[[c, c], pl.BF16],
        idx_kv_cache: pl.InOut[pl.Tensor[[IDX_PAGES_DYN, bs, 1, c], pl.INT8]],
        idx_kv_scale: pl.InOut[pl.Tensor[[IDX_PAGES_DYN, bs, 1, 1], pl.FP32]],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        idx_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    ):
        return decode_indexer_compressor(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table,
                                         sin_table, hadamard, idx_kv_cache, idx_kv_scale, position_ids, num_tokens,
                                         idx_slot_mapping, state_slot_mapping, cfg, tl.max_cmp_writes, seed_scopes)

    return decode_indexer_compressor_test
# ---- end kernel ----


def golden_decode_indexer_compressor(*args, **kwargs):
    """Decode indexer compressor golden: :func:`prefill_indexer_compressor.golden_prefill_indexer_compressor`
    (same arguments; ``state_block_table [B, L]``), which handles both table shapes."""
    return golden_prefill_indexer_compressor(*args, **kwargs)


def make_decode_indexer_compressor_inputs(cfg: DeepSeekV4Config, starts=None, num_tokens=None, seed: int = 0) -> dict:
    """Fixture for ``B = decode_batch`` requests of ``S = decode_seq`` tokens at ``starts``
    (default :func:`decode_compressor_ratio4.decode_start_positions`): :func:`ratio4_fixture`
    at width ``index_head_dim`` then :func:`prefill_indexer_compressor.indexer_cache_inputs`.

    Raises:
        BindError: see :func:`ratio4_fixture`.
    """
    B, S = cfg.decode_batch, cfg.decode_seq
    starts = decode_start_positions(cfg, B) if starts is None else list(starts)
    nt = B * S if num_tokens is None else num_tokens
    return indexer_cache_inputs(ratio4_fixture(cfg, starts, S, cfg.index_head_dim, nt, seed), cfg, seed)


def build_decode_indexer_compressor(preset: str = "tiny", mode: str = "decode", *, starts=None,
                                    num_tokens: int | None = None, seed: int = 0, seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: the decode indexer compressor (``B x S`` tokens); compare functions
    from ``TOLERANCES``.

    Raises:
        ConfigError: unknown preset or mode; BindError: a fixture the config cannot hold.
    """
    cfg = get_config(preset)
    if mode != "decode":
        raise ConfigError(f"decode_indexer_compressor: unknown mode {mode!r}; the only mode is 'decode'")
    inputs = make_decode_indexer_compressor_inputs(cfg, starts, num_tokens, seed)
    entry = decode_indexer_compressor_entry(cfg, None, seed_scopes)

    def golden(v: dict) -> None:
        out = golden_decode_indexer_compressor(**{k: v[k] for k in _ARG_ORDER}, cfg=cfg)
        for k, t in zip(_OUTPUTS, out):
            v[k] = t

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
    label = f"{preset} {mode} starts={inputs['position_ids'][::cfg.decode_seq].tolist()}"
    return CaseRun(entry, ratio4_specs(inputs, _ARG_ORDER, _OUTPUTS), golden, compare, rtol=1e-3, atol=1e-3,
                   label=label + (" seed_scopes" if seed_scopes else ""))


register(KernelCase("decode_indexer_compressor", build_decode_indexer_compressor, modes=("decode",),
                    seed_variant=True,
                    description="CSA indexer key compressor, decode step: ratio-4 pool, Hadamard, INT8 keys (B.11)"))
