"""Prefill attention sub-block of ratio-0 (sliding-window-only) layers.

Chain (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), one request, ``T`` token rows of which
the first ``num_tokens`` are active:

    x_mixed, post, comb = hc_pre(x_hc)                       # [T, D] bf16, [T, 4], [T, 16]
    x_normed            = rms_norm(x_mixed, attn_norm_w)
    cos_t, sin_t        = table rows at position_ids          # main RoPE profile
    q, kv               = qkv_proj_rope(x_normed, ...)        # [T, H, d], [T, d] bf16
    kv_cache[ori_slot_mapping[t]] = kv[t]                     # t < num_tokens, slot >= 0
    swa_indices         = window rows pos-W+1 .. pos via block_table
    attn_out            = prefill_sparse_attn(q, kv_cache, swa_indices, no compressed keys)
    x_out               = hc_post_prefill(attn_out, x_hc, post, comb)   # rows >= num_tokens = 0

The window of token ``t`` includes the keys this chunk writes (its own included), because
the cache scatter runs before the attention. Unlike the reference kernel (which asserts
``sliding_window == block_size`` and ``T == sliding_window``), the golden and the DSL kernel
below take any ``T`` (up to the token capacity), start position, window and page size.
"""

import functools
import math
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import (CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_allclose, register,
                        valid_ratio_reldiff)
from pto.models.deepseek_v4.attention_front import attention_front, golden_attention_front
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.decode_metadata import scatter_rows_by_slot, window_runs_many
from pto.models.deepseek_v4.hc_post import golden_hc_post_prefill, hc_post_kernels
from pto.models.deepseek_v4.hc_pre import HC_BASE_REF, HC_SCALE_REF
from pto.models.deepseek_v4.prefill_sparse_attn import (golden_prefill_sparse_attn, prefill_sparse_attn_kernels,
                                                        quantize_wo_b)
from pto.models.deepseek_v4.qkv_proj_rope import materialize_rope_rows, quantize_weight_per_column
from pto.models.deepseek_v4.rope import golden_materialize_rope_rows, rope_tables
from pto.models.deepseek_v4.weight_format import weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import check_num_tokens, check_token_capacity, token_capacity

__all__ = [
    "prefill_attention_swa_kernels",
    "prefill_attention_swa",
    "build_case",
    "TOLERANCES",
    "permuted_block_table",
    "build_window_indices",
    "golden_prefill_attention_swa",
    "make_swa_inputs",
]

# pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-2 in the reference harness).
#   kv_cache: ratio_allclose (atol, rtol, max_error_ratio)
#   x_out:    valid_ratio_reldiff (diff_thd, pct_thd, max_diff_hd) -- rows >= num_tokens
#             must be exactly zero, then ratio_reldiff on the active rows.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "kv_cache": (1e-4, 1e-2, 0.005),
    "x_out": (3e-3, 0.005, 1.0),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")


@functools.lru_cache(maxsize=None)
def prefill_attention_swa_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the ratio-0 prefill attention sub-layer for ``cfg`` (cached per config / variant).

    Composition (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`; ``T`` dynamic, ``num_tokens`` active rows):
    ``attention_front`` (``hc_pre`` -> ``rms_norm`` -> ``late_dep = task_dummy(deps=[rms_tid])``
    -> ``materialize_rope_rows`` -> ``qkv_proj_rope(..., late_dep)``) ->
    ``at "prefill_swa_cache_write"`` (``kv[t]`` to flat cache row ``ori_slot_mapping[t]`` for
    ``t < num_tokens``, ``-1`` skips; consecutive slots copied as one run) ->
    ``at "prefill_swa_window_indices"`` (the ``[T, W]`` rows through ``block_table``, all tokens in
    one set of tile ops) ->
    ``prefill_sparse_attn`` with the dummy compressed metadata -> ``hc_post_prefill``.

    Dummy compressed metadata: ``cmp_block_table [cmp_kv_block_num] INT32`` with
    ``init_value=0``, ``cmp_indices [T, index_topk] INT32`` with ``init_value=-1`` (the invalid
    sentinel: nothing is gathered, every compressed column is masked) and ``cmp_kv`` left
    uninitialised (never read). ``seed_scopes=True`` keeps the former variant: both created
    uninitialised and filled by the tasks ``prefill_swa_dummy_cmp_table`` and
    ``prefill_swa_empty_cmp_meta`` (bit-identical results, two more tasks).

    Returns:
        namespace with the inline pieces ``swa_cache_write(kv, ori_slot_mapping, num_tokens,
        kv_cache)`` and ``swa_window_indices(position_ids, block_table, num_tokens, swa_indices)``
        (each one task; return its id), the entry ``swa_window_indices_test`` (same
        parameters), the inline body ``prefill_attention_swa(x_hc, hc_attn_fn, hc_attn_scale,
        hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
        freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
        wo_b_scale, x_out, num_tokens)`` returning ``(kv_cache, x_out)``, the ``@pl.jit`` entry
        ``prefill_attention_swa_test`` (``pl.jit.entry`` of that body, same parameters) and
        ``seed_scopes``.

    Raises:
        ConfigError: the config cannot be tiled by one of the composed kernels. At run time:
            ``CapacityError`` for ``T`` above ``tiling.token_capacity(cfg)`` (128), ``BindError``
            for a negative position or one past the block table.
    """
    D, HC, H, HD, R = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    LQ, G, LO, GIN, W = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.sliding_window
    BS, P, CP, TOPK = cfg.block_size, cfg.ori_kv_block_num, cfg.cmp_kv_block_num, cfg.index_topk
    MAXPOS, NBLK, MIX = cfg.max_position_embeddings, cfg.max_blocks_per_seq, cfg.mix_hc
    cap = token_capacity(cfg)  # bound of the runtime token count (CapacityError before any task)

    attn = prefill_sparse_attn_kernels(cfg).prefill_sparse_attn
    hc_post_prefill = hc_post_kernels(cfg).hc_post_prefill

    @pl.jit.inline
    def swa_cache_write(kv: pl.Tensor[[T_DYN, HD], pl.BF16],
                        ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                        num_tokens: pl.Scalar[pl.INT32],
                        kv_cache: pl.InOut[pl.Tensor[[P, BS, 1, HD], pl.BF16]]):
        """``at "prefill_swa_cache_write"``: ``kv[t]`` to flat cache row ``ori_slot_mapping[t]``
        for ``t < num_tokens`` (``-1`` skips; a run of consecutive slots is one copy; a repeated
        slot keeps the later token). Returns the task id."""
        active = check_num_tokens("prefill_attention_swa", num_tokens, pl.tensor.dim(kv, 0))
        cache_flat = pl.reshape(kv_cache, [P * BS, HD])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_swa_cache_write") as tid:
            scatter_rows_by_slot(kv, ori_slot_mapping, active, cache_flat)
        return tid

    @pl.jit.inline
    def swa_window_indices(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                           block_table: pl.Tensor[[NBLK], pl.INT32],
                           num_tokens: pl.Scalar[pl.INT32],
                           swa_indices: pl.Out[pl.Tensor[[T_DYN, W], pl.INT32]]):
        """``at "prefill_swa_window_indices"``: row ``t < num_tokens`` holds the physical cache
        rows of keys ``max(0, pos-W+1) .. pos`` (``pos = position_ids[t]``) through
        ``block_table``, ``-1`` elsewhere; rows ``>= num_tokens`` are all ``-1``. Returns the
        task id."""
        t = pl.tensor.dim(position_ids, 0)
        active = check_num_tokens("prefill_attention_swa", num_tokens, t)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_swa_window_indices") as tid:
            positions = pl.read_values(position_ids, [0], active)  # the active tokens' positions, one call
            lo_pos, hi_pos = (min(positions), max(positions)) if positions else (0, 0)
            lo_page, hi_page = max(0, lo_pos + 1 - W) // BS, hi_pos // BS
            fast = lo_pos >= 0 and hi_page < NBLK  # no position error
            if active and fast:  # no table entry past the pool among the pages any window can read
                fast = max(pl.read_values(block_table, [lo_page], hi_page - lo_page + 1)) < P
            if active and fast:
                _window_rows_tile(position_ids, block_table, active, swa_indices)
            elif active:
                _window_rows_by_runs(positions, block_table, active, swa_indices)
            if active < t:  # an inactive token's row is all -1
                swa_indices[active:t, 0:W] = pl.full([t - active, W], pl.INT32, -1)
        return tid

    def _window_rows_tile(position_ids, block_table, active: int, swa_indices) -> None:
        """Rows ``0 .. active-1`` of ``swa_indices`` in tile ops on all tokens at once (every
        active position is in ``[0, NBLK * BS)`` and every table entry a window can read is
        below ``P``): key ``k = max(pos - W + 1, 0) + j`` of column ``j`` is valid while
        ``k <= pos``; its row is ``table[k // BS] * BS + k % BS`` where the entry is ``>= 0``,
        ``-1`` elsewhere."""
        pos = pl.slice(pl.reshape(position_ids, [pl.tensor.dim(position_ids, 0), 1]), [active, 1], [0, 0])
        start = pl.maximum(pos - (W - 1), 0)
        keys = pl.col_expand_add(pl.row_expand_add(pl.full([active, W], pl.INT32, 0), start),
                                 pl.arange(0, [1, W], pl.INT32))  # [a, W]
        valid = pl.row_expand_sub(keys, pos) <= 0
        page = keys / BS  # keys >= 0: the quotient is the floor
        if (W - 1) // BS >= NBLK:  # an invalid column's key can pass the table (its value is not used)
            page = pl.minimum(page, NBLK - 1)
        table = pl.reshape(block_table, [1, NBLK])[0:1, 0:NBLK]
        phys = pl.reshape(pl.gather(table, index=pl.reshape(page, [1, active * W])), [active, W])
        rows = (phys - page) * BS + keys  # phys * BS + k % BS
        ok = pl.select(valid, phys >= 0, False)
        swa_indices[0:active, 0:W] = pl.select(ok, rows, -1)

    def _window_rows_by_runs(positions: list, block_table, active: int, swa_indices) -> None:
        """Rows ``0 .. active-1`` of ``swa_indices`` token by token as page segments, raising the
        first failing token's error (a negative position, a position past the block table, a
        table entry outside the pool) after the tokens before it were read."""
        tokens, late = [], None
        for tok in range(active):
            pos = positions[tok]
            if pos < 0:  # raised once the tokens before it are done
                late = BindError(f"prefill_attention_swa: position_ids[{tok}] = {pos} is negative")
                break
            tokens.append((tok, pos))
        # per active token the page segments of its row, its table entries read in token order
        runs = window_runs_many("prefill_attention_swa", tokens, block_table, (), window=W, block_size=BS,
                                n_blocks=NBLK, n_pages=P)
        if late is not None:
            raise late
        # per token pl.full(-1) and one pl.arange per segment (pl.arange_rows: the rows in one
        # call), then row tok into swa_indices[tok], one store per row
        pl.store_rows(swa_indices, list(range(active)), pl.arange_rows([1, W], pl.INT32, -1, runs))

    @pl.jit
    def swa_window_indices_test(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                                block_table: pl.Tensor[[NBLK], pl.INT32],
                                num_tokens: pl.Scalar[pl.INT32],
                                swa_indices: pl.Out[pl.Tensor[[T_DYN, W], pl.INT32]]):
        swa_window_indices(position_ids, block_table, num_tokens, swa_indices)
        return swa_indices

    @pl.jit.inline
    def prefill_attention_swa(x_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
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
                              block_table: pl.Tensor[[NBLK], pl.INT32],
                              ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                              position_ids: pl.Tensor[[T_DYN], pl.INT32],
                              attn_sink: pl.Tensor[[H], pl.FP32],
                              wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                              wo_b: pl.Tensor[[D, G * LO], weight_dtype(cfg)],
                              wo_b_scale: pl.Tensor[[D], pl.FP32],
                              x_out: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]],
                              num_tokens: pl.Scalar[pl.INT32]):
        """Ratio-0 prefill attention sub-layer (pypto-lib `prefill_attention_swa.py`); returns ``(kv_cache, x_out)``."""
        t = pl.tensor.dim(x_hc, 0)
        check_num_tokens("prefill_attention_swa", num_tokens, t)
        # the seed variant of this block covers the dummy compressed metadata only (the front
        # keeps its allocation-time fills)
        f = attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                            gamma_cq, gamma_ckv,
                            lambda cos_t, sin_t: materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens,
                                                                       cos_t, sin_t),
                            cfg, False)
        swa_indices = pl.create_tensor([t, W], pl.INT32, capacity=cap)
        attn_out = pl.create_tensor([t, D], pl.BF16, capacity=cap)
        if seed_scopes:
            cmp_block_table = pl.create_tensor([CP], pl.INT32)
            cmp_indices = pl.create_tensor([t, TOPK], pl.INT32, capacity=cap)
        else:
            cmp_block_table = pl.create_tensor([CP], pl.INT32, init_value=0)
            cmp_indices = pl.create_tensor([t, TOPK], pl.INT32, init_value=-1, capacity=cap)
        cmp_kv = pl.create_tensor([CP, BS, 1, HD], pl.BF16)  # never read: every cmp index is -1

        swa_cache_write(f.kv, ori_slot_mapping, num_tokens, kv_cache)
        swa_window_indices(position_ids, block_table, num_tokens, swa_indices)

        if seed_scopes:
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_swa_dummy_cmp_table"):
                pl.assemble(cmp_block_table, pl.full([CP], pl.INT32, 0), [0])
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_swa_empty_cmp_meta"):
                pl.assemble(cmp_indices, pl.full([t, TOPK], pl.INT32, -1), [0, 0])

        attn(f.q, kv_cache, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, num_tokens,
             f.rope_cos_t, f.rope_sin_t, wo_a, wo_b, wo_b_scale, attn_out)
        hc_post_prefill(attn_out, x_hc, f.post, f.comb, x_out, num_tokens)
        return kv_cache, x_out

    prefill_attention_swa_test = pl.jit.entry(prefill_attention_swa, name="prefill_attention_swa_test")

    return SimpleNamespace(prefill_attention_swa=prefill_attention_swa,
                           prefill_attention_swa_test=prefill_attention_swa_test, swa_cache_write=swa_cache_write,
                           swa_window_indices=swa_window_indices, swa_window_indices_test=swa_window_indices_test,
                           seed_scopes=seed_scopes)


@pl.jit.inline
def prefill_attention_swa(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
                          attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor,
                          wkv: pl.Tensor, gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor,
                          freqs_sin: pl.Tensor, kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor,
                          ori_slot_mapping: pl.Tensor, position_ids: pl.Tensor, attn_sink: pl.Tensor,
                          wo_a: pl.Tensor, wo_b: pl.Tensor, wo_b_scale: pl.Tensor, x_out: pl.Out[pl.Tensor],
                          num_tokens: pl.Scalar[pl.INT32], cfg, seed_scopes: bool = False):
    """Stable inline signature ``prefill_attention_swa(x_hc, hc_attn_fn, hc_attn_scale,
    hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
    freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
    wo_b_scale, x_out, num_tokens, cfg, seed_scopes=False) -> (kv_cache, x_out)``: the body of
    :func:`prefill_attention_swa_kernels` (shapes, variants and errors there)."""
    return prefill_attention_swa_kernels(cfg, seed_scopes).prefill_attention_swa(
        x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
        gamma_ckv, freqs_cos, freqs_sin, kv_cache, block_table, ori_slot_mapping, position_ids, attn_sink, wo_a,
        wo_b, wo_b_scale, x_out, num_tokens)
# ---- end kernel ----


def permuted_block_table(
    n_entries: int, pages: int, *, offset: int = 3, wrap: bool = False,
) -> torch.Tensor:  # [n_entries] int32
    """A non-identity logical -> physical page table ``(b * m + offset) % pages``.

    ``m`` is the first multiplier >= 17 coprime with ``pages`` (17 itself for 64 or 128
    pages, the reference fixtures' ``(blk*17+3) % pages``), so entries ``0 .. pages-1`` are a
    permutation of the pool. Entries ``b >= pages`` are ``-1`` (no page), or with ``wrap``
    continue the same formula, making the pool a ring in which logical pages ``b`` and
    ``b + pages`` share a physical page (the ratio-128 compressor state table).

    Raises:
        BindError: ``pages`` not positive or ``n_entries`` negative.
    """
    if pages <= 0 or n_entries < 0:
        raise BindError(f"permuted_block_table: need pages > 0 and n_entries >= 0, got "
                        f"pages={pages}, n_entries={n_entries}")
    mult = 17
    while math.gcd(mult, pages) != 1:
        mult += 1
    blk = torch.arange(n_entries)
    table = (blk * mult + offset) % pages
    if not wrap:
        table = torch.where(blk < pages, table, torch.full_like(blk, -1))
    return table.to(torch.int32)


def build_window_indices(
    positions: torch.Tensor,  # [T] int32 absolute positions
    num_tokens: int,
    block_table: torch.Tensor,  # [n_blocks] int32 logical page -> physical page, -1 = none
    cfg: DeepSeekV4Config,
) -> torch.Tensor:  # [T, sliding_window] int32
    """Per-token sliding-window key rows (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py` step 5).

    For ``t < num_tokens`` with ``pos = positions[t]``: ``valid = min(W, pos + 1)`` keys
    ``pos + 1 - valid .. pos`` (ascending) fill columns ``0 .. valid-1``; key ``k`` becomes
    physical row ``block_table[k // block_size] * block_size + k % block_size`` when that
    table entry is ``>= 0``, else ``-1``. Remaining columns and all rows ``t >= num_tokens``
    are ``-1``. ``W = cfg.sliding_window``, page size ``cfg.block_size``.

    Args:
        positions: ``[T]`` integer absolute positions.
        num_tokens: active prefix, ``0 <= num_tokens <= T``.
        block_table: ``[n_blocks]`` integer page table.
        cfg: model config.

    Returns:
        ``[T, W]`` INT32 physical rows, ``-1`` invalid.

    Raises:
        BindError: bad ranks, ``num_tokens`` out of range, a negative position, a key
            whose page index is past the end of ``block_table``, or a table entry that is not
            a page of the ``cfg.ori_kv_block_num``-page cache.
    """
    fn = "build_window_indices"
    if positions.dim() != 1 or positions.is_floating_point():
        raise BindError(f"{fn}: positions must be an integer [T] tensor, got "
                        f"{positions.dtype} {list(positions.shape)}")
    if block_table.dim() != 1 or block_table.is_floating_point():
        raise BindError(f"{fn}: block_table must be an integer [n_blocks] tensor, got "
                        f"{block_table.dtype} {list(block_table.shape)}")
    T, W, bs = positions.shape[0], cfg.sliding_window, cfg.block_size
    if not 0 <= int(num_tokens) <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")
    out = torch.full((T, W), -1, dtype=torch.int32)
    nt = int(num_tokens)
    if nt == 0:
        return out
    pos = positions[:nt].long()
    if int(pos.min()) < 0:
        raise BindError(f"{fn}: negative position {int(pos.min())}")
    if int(pos.max()) // bs >= block_table.shape[0]:
        raise BindError(f"{fn}: position {int(pos.max())} needs page {int(pos.max()) // bs}, "
                        f"block_table has {block_table.shape[0]} entries")
    valid = torch.clamp(pos + 1, max=W)  # [nt]
    col = torch.arange(W)
    keys = (pos + 1 - valid)[:, None] + col[None, :]  # [nt, W]
    in_window = col[None, :] < valid[:, None]
    keys = torch.where(in_window, keys, torch.zeros_like(keys))
    phys = block_table.long()[keys // bs]
    bad = in_window & (phys >= cfg.ori_kv_block_num)
    if bool(bad.any()):
        raise BindError(f"{fn}: block_table entry {int(phys[bad].max())} is not a page of the "
                        f"{cfg.ori_kv_block_num}-page kv cache")
    rows = torch.where(phys >= 0, phys * bs + keys % bs, torch.full_like(keys, -1))
    out[:nt] = torch.where(in_window, rows, torch.full_like(rows, -1)).to(torch.int32)
    return out


def golden_prefill_attention_swa(
    inputs: dict,
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    return_intermediates: bool = False,
    float32: bool = False,
):
    """Golden of the ratio-0 prefill attention block (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`).

    Chains the sub-goldens (module docstring): ``golden_materialize_rope_rows`` (main-profile
    ``freqs_cos/sin`` rows at ``position_ids``; inactive rows zero) -> ``golden_attention_front``
    (``golden_hc_pre`` -> ``golden_rms_norm`` with ``cfg.rms_norm_eps`` -> ``golden_qkv_proj_rope``)
    -> scatter ``kv[t]`` into a clone of ``kv_cache`` at flat row ``ori_slot_mapping[t]``
    (``t < num_tokens`` and slot ``>= 0``) -> :func:`build_window_indices` ->
    ``golden_prefill_sparse_attn`` with a zero ``cmp_kv [cmp_kv_block_num, block_size, 1,
    head_dim]``, a zero ``cmp_block_table [cmp_kv_block_num]`` and all ``-1``
    ``cmp_indices [T, index_topk]`` -> ``golden_hc_post_prefill``.

    Args:
        inputs: dict as built by :func:`make_swa_inputs`:
            ``x_hc [T, hc, D] fp32``, ``hc_attn_fn [mix_hc, hc_dim] fp32``,
            ``hc_attn_scale [3] fp32``, ``hc_attn_base [mix_hc] fp32``,
            ``attn_norm_w [D] bf16``, ``wq_a [D, q_lora] bf16``,
            ``wq_b [q_lora, H*d] int8 (bf16)``, ``wq_b_scale [H*d] fp32``,
            ``wkv [D, d] bf16``, ``gamma_cq [q_lora] bf16``, ``gamma_ckv [d] bf16``,
            ``freqs_cos / freqs_sin [P, rope_dim] bf16`` (main profile),
            ``kv_cache [pages, block_size, 1, d] bf16``, ``block_table [n_blocks] int32``,
            ``ori_slot_mapping [T] int64``, ``position_ids [T] int32``, ``attn_sink [H] fp32``,
            ``wo_a [G, o_lora, o_group_in] bf16``, ``wo_b [D, G*o_lora] int8 (bf16)``,
            ``wo_b_scale [D] fp32``, ``num_tokens`` int. Inputs are not modified.
        cfg: model config.
        weight_format: ``"int8"`` (W8A8 q-b and o-b projections) or ``"bf16"``.
        return_intermediates: also return a dict of the intermediate tensors
            (``x_mixed, post, comb, x_normed, rope_cos, rope_sin, q, kv, swa_indices,
            attn_out``).
        float32: parity mode for comparisons with an FP32 model (the transformers oracle,
            tests/parity): every sub-golden keeps FP32 -- ``x_mixed``, ``x_normed``, ``q``,
            ``kv`` and ``attn_out`` are not rounded to BF16 and the sparse attention runs
            with ``float32=True``. Pass FP32 tables / cache to keep them unrounded too.

    Returns:
        ``(kv_cache, x_out)``: the updated cache ``[pages, block_size, 1, d]`` BF16 and
        ``x_out [T, hc, D]`` FP32 with rows ``>= num_tokens`` zero; plus the intermediates
        dict when requested.

    Raises:
        BindError: a missing input key, bad shapes / dtypes, or a slot outside the cache.
    """
    fn = "golden_prefill_attention_swa"
    needed = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a",
              "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin",
              "kv_cache", "block_table", "ori_slot_mapping", "position_ids", "attn_sink",
              "wo_a", "wo_b", "wo_b_scale", "num_tokens")
    missing = [k for k in needed if k not in inputs]
    if missing:
        raise BindError(f"{fn}: inputs missing {missing}")
    i = inputs
    num_tokens = int(i["num_tokens"])
    x_hc = i["x_hc"]
    T = x_hc.shape[0]
    if not 0 <= num_tokens <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")
    hd, r = cfg.head_dim, cfg.qk_rope_head_dim

    zeros_rows = torch.zeros(T, r, dtype=i["freqs_cos"].dtype)
    rope_cos, rope_sin = golden_materialize_rope_rows(i["freqs_cos"], i["freqs_sin"],
                                                      i["position_ids"], num_tokens,
                                                      zeros_rows, zeros_rows)
    f = golden_attention_front(i, rope_cos, rope_sin, cfg, weight_format=weight_format, float32=float32)
    x_mixed, post, comb, x_normed, q, kv = (f[k] for k in ("x_mixed", "post", "comb", "x_normed", "q", "kv"))

    kv_cache = i["kv_cache"].clone()
    flat = kv_cache.view(-1, hd)
    slots = i["ori_slot_mapping"][:num_tokens].long()
    if slots.numel() and int(slots.max()) >= flat.shape[0]:
        raise BindError(f"{fn}: ori_slot_mapping value {int(slots.max())} outside kv_cache "
                        f"({flat.shape[0]} rows)")
    for t in range(num_tokens):  # in token order: a repeated slot keeps the last token's row
        if int(slots[t]) >= 0:
            flat[int(slots[t])] = kv[t].to(kv_cache.dtype)

    swa_indices = build_window_indices(i["position_ids"], num_tokens, i["block_table"], cfg)
    cmp_kv = torch.zeros(cfg.cmp_kv_block_num, cfg.block_size, 1, hd, dtype=kv_cache.dtype)
    cmp_block_table = torch.zeros(cfg.cmp_kv_block_num, dtype=torch.int32)
    cmp_indices = torch.full((T, cfg.index_topk), -1, dtype=torch.int32)
    attn_out = golden_prefill_sparse_attn(q, kv_cache, swa_indices, cmp_kv, cmp_block_table,
                                          cmp_indices, i["attn_sink"], num_tokens, rope_cos,
                                          rope_sin, i["wo_a"], i["wo_b"], i["wo_b_scale"], cfg,
                                          weight_format=weight_format, float32=float32)
    x_out = golden_hc_post_prefill(attn_out, x_hc, post, comb, num_tokens)
    if not return_intermediates:
        return kv_cache, x_out
    mids = {"x_mixed": x_mixed, "post": post, "comb": comb, "x_normed": x_normed,
            "rope_cos": rope_cos, "rope_sin": rope_sin, "q": q, "kv": kv,
            "swa_indices": swa_indices, "attn_out": attn_out}
    return kv_cache, x_out, mids


def make_swa_inputs(
    cfg: DeepSeekV4Config,
    T: int,
    start_pos: int,
    num_tokens: int,
    seed: int,
    *,
    block_table: str = "identity",
    attn_sink: float | torch.Tensor = 0.0,
    weight_format: str = "int8",
) -> dict:
    """Seeded fixture for :func:`golden_prefill_attention_swa` (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`).

    Token ``t`` sits at position ``start_pos + t`` (tail rows too). Draw order from one
    ``torch.Generator(seed)``: ``x_hc ~ N(0,1)*0.05`` (rows ``>= num_tokens`` then zeroed),
    ``hc_attn_fn``, ``wq_a``, ``wq_b``, ``wkv``, ``wo_a``, ``wo_b`` each ``U(-1,1) *
    fan_in^-0.5``, then the pre-filled cache rows ``~ N(0,1)``. ``hc_attn_scale`` /
    ``hc_attn_base`` are the real layer-0 values ``HC_SCALE_REF`` / ``HC_BASE_REF`` of
    ``hc_pre``; ``attn_norm_w``, ``gamma_cq``, ``gamma_ckv`` are 1; ``attn_sink`` is the given
    value (scalar broadcast to ``[H]`` or an ``[H]`` tensor). ``wq_b`` is quantised per output
    column and ``wo_b`` per output row for ``"int8"`` (BF16 with unit scales for ``"bf16"``).
    ``freqs_cos/sin`` are the main-profile tables ``[max_position_embeddings, rope_dim]``
    BF16. ``block_table [max_blocks_per_seq]``: ``"identity"`` (page b -> b) or
    ``"permuted"`` (:func:`permuted_block_table`); entries past the pool are -1.
    ``kv_cache [ori_kv_block_num, block_size, 1, head_dim]`` is zero except the rows of the
    last ``sliding_window`` positions before ``start_pos``. ``ori_slot_mapping[t]`` is the
    flat cache row of token ``t`` for ``t < num_tokens``, else -1.

    Returns:
        dict keyed as :func:`golden_prefill_attention_swa` expects (``num_tokens`` int).

    Raises:
        BindError: ``T`` not positive, ``num_tokens`` outside ``[0, T]``, negative
            ``start_pos``, positions past the cache pool, unknown ``block_table`` or
            ``weight_format``, or an ``attn_sink`` tensor of the wrong shape.
        ConfigError: ``hc_mult != 4`` (the reference hc base has 24 values).
    """
    fn = "make_swa_inputs"
    if T <= 0 or not 0 <= num_tokens <= T or start_pos < 0:
        raise BindError(f"{fn}: need T > 0, 0 <= num_tokens <= T, start_pos >= 0; got T={T}, "
                        f"num_tokens={num_tokens}, start_pos={start_pos}")
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    if len(HC_BASE_REF) != cfg.mix_hc:
        raise ConfigError(f"{fn}: config {cfg.name!r} has mix_hc={cfg.mix_hc}; the reference "
                          f"hc base has {len(HC_BASE_REF)} values")
    D, hc, H, hd = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim
    Lq, G, Lo, gin = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in
    bs, pages, W = cfg.block_size, cfg.ori_kv_block_num, cfg.sliding_window
    if start_pos + T > pages * bs:
        raise BindError(f"{fn}: positions up to {start_pos + T - 1} exceed the raw cache pool "
                        f"({pages} pages x {bs} rows)")
    n_blocks = cfg.max_blocks_per_seq
    if block_table == "identity":
        blk = torch.arange(n_blocks)
        table = torch.where(blk < pages, blk, torch.full_like(blk, -1)).to(torch.int32)
    elif block_table == "permuted":
        table = permuted_block_table(n_blocks, pages)
    else:
        raise BindError(f"{fn}: block_table must be 'identity' or 'permuted', got {block_table!r}")

    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16

    def uniform_fan_in(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2 - 1) * shape[-1] ** -0.5

    x_hc = torch.randn(T, hc, D, generator=gen) * 0.05
    x_hc[num_tokens:] = 0
    hc_fn = uniform_fan_in(cfg.mix_hc, cfg.hc_dim)
    wq_a = uniform_fan_in(Lq, D).T.contiguous()  # stored [D, q_lora], fan-in D
    wq_b_f = uniform_fan_in(H * hd, Lq).T.contiguous()  # stored [q_lora, H*d], fan-in q_lora
    wkv = uniform_fan_in(hd, D).T.contiguous()  # stored [D, d]
    wo_a = uniform_fan_in(G, Lo, gin)
    wo_b_f = uniform_fan_in(D, G * Lo)

    def row_of(p: torch.Tensor) -> torch.Tensor:
        return table.long()[p // bs] * bs + p % bs

    kv_cache = torch.zeros(pages, bs, 1, hd)
    prev = torch.arange(max(0, start_pos - W), start_pos)
    kv_cache.view(-1, hd)[row_of(prev)] = torch.randn(prev.numel(), hd, generator=gen)
    positions = start_pos + torch.arange(T)
    slot_mapping = torch.full((T,), -1, dtype=torch.int64)
    slot_mapping[:num_tokens] = row_of(positions[:num_tokens])

    if isinstance(attn_sink, torch.Tensor):
        if tuple(attn_sink.shape) != (H,):
            raise BindError(f"{fn}: attn_sink tensor must be [{H}], got {list(attn_sink.shape)}")
        sink = attn_sink.float().clone()
    else:
        sink = torch.full((H,), float(attn_sink), dtype=torch.float32)
    if weight_format == "int8":
        wq_b, wq_b_scale = quantize_weight_per_column(wq_b_f)
        wo_b, wo_b_scale = quantize_wo_b(wo_b_f)
    else:
        wq_b, wq_b_scale = wq_b_f.to(bf16), torch.ones(H * hd, dtype=torch.float32)
        wo_b, wo_b_scale = wo_b_f.to(bf16), torch.ones(D, dtype=torch.float32)
    cos, sin = rope_tables(cfg, "main")
    return {
        "x_hc": x_hc,
        "hc_attn_fn": hc_fn,
        "hc_attn_scale": torch.tensor(HC_SCALE_REF, dtype=torch.float32),
        "hc_attn_base": torch.tensor(HC_BASE_REF, dtype=torch.float32),
        "attn_norm_w": torch.ones(D, dtype=bf16),
        "wq_a": wq_a.to(bf16), "wq_b": wq_b, "wq_b_scale": wq_b_scale, "wkv": wkv.to(bf16),
        "gamma_cq": torch.ones(Lq, dtype=bf16), "gamma_ckv": torch.ones(hd, dtype=bf16),
        "freqs_cos": cos.to(bf16), "freqs_sin": sin.to(bf16),
        "kv_cache": kv_cache.to(bf16), "block_table": table,
        "ori_slot_mapping": slot_mapping, "position_ids": positions.to(torch.int32),
        "attn_sink": sink,
        "wo_a": wo_a.to(bf16), "wo_b": wo_b, "wo_b_scale": wo_b_scale,
        "num_tokens": int(num_tokens),
    }


_SPEC_ORDER = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale",
               "wkv", "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "block_table",
               "ori_slot_mapping", "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of the ``prefill_attention_swa`` case (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`).

    Mode ``"prefill"`` (``T = prefill_seq``, 128). Options: ``T``, ``start_pos`` (default 0),
    ``num_tokens`` (default ``T``), ``block_table`` (``"identity"`` or ``"permuted"``),
    ``seed_scopes`` (the two-fill-task variant), ``attn_sink`` (scalar, default 0), ``seed``,
    ``weight_format`` (``"int8"``; ``"bf16"``: the unquantised kernels, same tolerances).
    Inputs from :func:`make_swa_inputs`; the golden is :func:`golden_prefill_attention_swa`.
    Compare: ``x_out`` with ``valid_ratio_reldiff(num_tokens, *TOLERANCES["x_out"])`` (rows
    ``>= num_tokens`` exactly zero), ``kv_cache`` with ``ratio_allclose(*TOLERANCES["kv_cache"])``;
    run tolerances ``rtol = atol = 1e-2``.

    Raises:
        ConfigError: unknown preset, mode or option, or an untileable config.
        BindError: inconsistent ``T`` / ``start_pos`` / ``num_tokens``.
        CapacityError: ``T`` above the token capacity (before any input is built).
    """
    cfg = get_config(preset)
    if mode != "prefill":
        raise ConfigError(f"prefill_attention_swa: unknown mode {mode!r}; modes: prefill")
    opts = dict(options)
    T = int(opts.pop("T", cfg.prefill_seq))
    start_pos = int(opts.pop("start_pos", 0))
    num_tokens = int(opts.pop("num_tokens", T))
    table = opts.pop("block_table", "identity")
    seed_scopes = bool(opts.pop("seed_scopes", False))
    sink = opts.pop("attn_sink", 0.0)
    seed = int(opts.pop("seed", 0))
    wf = str(opts.pop("weight_format", "int8"))
    if opts:
        raise ConfigError(f"prefill_attention_swa: unknown options {sorted(opts)}")
    cfg = with_weight_format(cfg, wf)
    check_token_capacity("prefill_attention_swa", cfg, T)  # before any input is built
    k = prefill_attention_swa_kernels(cfg, seed_scopes)
    d = make_swa_inputs(cfg, T, start_pos, num_tokens, seed, block_table=table, attn_sink=sink, weight_format=wf)
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=(n == "kv_cache")) for n in _SPEC_ORDER]
    specs.append(TensorSpec("x_out", [T, cfg.hc_mult, cfg.hidden_size], torch.float32, is_output=True))
    specs.append(ScalarSpec("num_tokens", torch.int32, num_tokens))

    def golden(v: dict) -> None:
        v["kv_cache"], v["x_out"] = golden_prefill_attention_swa(v, cfg, weight_format=wf)

    compare = {"x_out": valid_ratio_reldiff(num_tokens, *TOLERANCES["x_out"]),
               "kv_cache": ratio_allclose(*TOLERANCES["kv_cache"])}
    label = (f"prefill T={T} start_pos={start_pos} num_tokens={num_tokens} block_table={table}"
             + (" seed_scopes" if seed_scopes else "") + (" weight_format=bf16" if wf == "bf16" else ""))
    return CaseRun(fn=k.prefill_attention_swa_test, specs=specs, golden=golden, compare=compare, rtol=1e-2,
                   atol=1e-2, label=label)


register(KernelCase("prefill_attention_swa", build_case, modes=("prefill",), seed_variant=True,
                    description="ratio-0 prefill attention sub-layer (hc_pre .. sparse attn .. hc_post), "
                                "pypto-lib's prefill_attention_swa.py"))
