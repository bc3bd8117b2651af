"""Lightning indexer, decode step (v4flash-kernels.md B.12; dsv4-math.md 6.3-6.4).

The indexer core of :mod:`prefill_indexer` over one decode step of ``B`` requests
(request-major tokens, ``idx_block_table [B, n]``; position ``-1`` marks an inactive request's
row, which gets an all ``-1`` top-k row); tasks are named ``decode_idx_*``. Math, tie order and
tasks as in the prefill module. Deviations (B.12): the visible length is ``(pos + 1) // 4``
per token (the reference also bounds it by ``kv_seq_lens / 4``, equal after this step's
compressor ran); no ``offset``; the indexer compressor runs in the attention block, before.
"""

import functools

import pto.language as pl
from pto.errors import ConfigError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_compressor_ratio4 import decode_start_positions
from pto.models.deepseek_v4.prefill_indexer import (
    golden_prefill_indexer,
    indexer_case,
    indexer_topk_tasks,
    make_indexer_inputs,
)

__all__ = ["decode_indexer", "decode_indexer_entry", "golden_decode_indexer", "build_decode_indexer"]

# ---- kernel ----
T_DYN = pl.dynamic("T")
D_DYN = pl.dynamic("D")
B_DYN = pl.dynamic("B")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
IDX_PAGES_DYN = pl.dynamic("IDX_PAGES")
IDX_TABLE_DYN = pl.dynamic("IDX_TABLE_LEN")


@pl.jit.inline
def decode_indexer(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    qr: pl.Tensor,
    qr_scale: pl.Tensor,
    wq_b: pl.Tensor,
    wq_b_scale: pl.Tensor,
    weights_proj: pl.Tensor,
    cos_table: pl.Tensor,
    sin_table: pl.Tensor,
    hadamard: pl.Tensor,
    idx_kv_cache: pl.Tensor,
    idx_kv_scale: pl.Tensor,
    idx_block_table: pl.Tensor[[B_DYN, IDX_TABLE_DYN], pl.INT32],
    position_ids: pl.Tensor[[T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    cmp_topk_indices: pl.Out[pl.Tensor],
    cfg,
    seed_scopes=False,
):
    """Lightning indexer over one decode step (B.12, generalised): shapes as
    :func:`prefill_indexer.indexer_topk_tasks` with ``idx_block_table [B, n]``.

    Returns:
        ``cmp_topk_indices [T, index_topk]`` INT32.

    Raises:
        BindError, CapacityError: see :func:`prefill_indexer.indexer_topk_tasks`.
    """
    return indexer_topk_tasks(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos_table, sin_table, hadamard,
                              idx_kv_cache, idx_kv_scale, idx_block_table, position_ids, num_tokens, cmp_topk_indices,
                              cfg, "decode_idx", seed_scopes)


@functools.lru_cache(maxsize=None)
def decode_indexer_entry(cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``decode_indexer_test`` (parameters of :func:`decode_indexer`,
    model dims static); returns ``cmp_topk_indices``."""
    D, Lq, HI, c, r, K, bs = (cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim,
                              cfg.qk_rope_head_dim, cfg.index_topk, cfg.block_size)

    @pl.jit
    def decode_indexer_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        qr: pl.Tensor[[T_DYN, Lq], pl.INT8],
        qr_scale: pl.Tensor[[T_DYN, 1], pl.FP32],
        wq_b: pl.Tensor[[Lq, HI * c], pl.INT8],
        wq_b_scale: pl.Tensor[[HI * c], pl.FP32],
        weights_proj: pl.Tensor[[D, HI], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        hadamard: pl.Tensor[[c, c], pl.BF16],
        idx_kv_cache: pl.Tensor[[IDX_PAGES_DYN, bs, 1, c], pl.INT8],
        idx_kv_scale: pl.Tensor[[IDX_PAGES_DYN, bs, 1, 1], pl.FP32],
        idx_block_table: pl.Tensor[[B_DYN, IDX_TABLE_DYN], pl.INT32],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        cmp_topk_indices: pl.Out[pl.Tensor[[T_DYN, K], pl.INT32]],
    ):
        return decode_indexer(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos_table, sin_table, hadamard,
                              idx_kv_cache, idx_kv_scale, idx_block_table, position_ids, num_tokens, cmp_topk_indices,
                              cfg, seed_scopes)

    return decode_indexer_test
# ---- end kernel ----


def golden_decode_indexer(*args, **kwargs):
    """Decode indexer golden: :func:`prefill_indexer.golden_prefill_indexer` (same arguments,
    ``idx_block_table [B, n]``; it handles both table shapes)."""
    return golden_prefill_indexer(*args, **kwargs)


def build_decode_indexer(preset: str = "tiny", mode: str = "decode", *, starts=None, num_tokens: int | None = None,
                         seed: int = 0, seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: the decode indexer over ``decode_batch x decode_seq`` tokens at
    ``starts`` (default :func:`decode_compressor_ratio4.decode_start_positions`: from a cold
    request with no visible entry to one seeing far more than ``index_topk``).

    Raises:
        ConfigError: unknown preset or mode; BindError: a fixture the config cannot hold.
    """
    cfg = get_config(preset)
    if mode != "decode":
        raise ConfigError(f"decode_indexer: unknown mode {mode!r}; the only mode is 'decode'")
    B, S = cfg.decode_batch, cfg.decode_seq
    starts = decode_start_positions(cfg, B) if starts is None else list(starts)
    nt = B * S if num_tokens is None else num_tokens
    inputs = make_indexer_inputs(cfg, starts, S, nt, seed)
    label = f"{preset} {mode} starts={starts} num_tokens={nt}" + (" seed_scopes" if seed_scopes else "")
    return indexer_case(decode_indexer_entry(cfg, seed_scopes), inputs, cfg, label)


register(KernelCase("decode_indexer", build_decode_indexer, modes=("decode",), seed_variant=True,
                    description="CSA lightning indexer, decode step: INT8 index scores, sort32/mrgsort top-k (B.12)"))
