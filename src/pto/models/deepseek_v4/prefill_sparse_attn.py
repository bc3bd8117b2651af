"""Prefill sparse attention core with an attention sink, plus the grouped INT8 o-projection.

Math (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), per active token ``t`` (``t < num_tokens``):

    keys_t  = [ori_kv rows swa_indices[t, :] >= 0] ++ [cmp_kv rows of cmp_indices[t, :] >= 0]
    s_h,j   = (q[t, h] . k_j) * head_dim^-0.5                     # FP32
    o_h     = sum_j exp(s_h,j - m) * k_j / (sum_j exp(s_h,j - m) + exp(sink_h - m))
    o[..., n:] = inverse_rope(o[..., n:], cos[t], sin[t])         # rotate by -pos*w
    o_r[g]  = o[t, heads of g].flatten() @ wo_a[g]^T               # [G, o_lora]
    out     = sum_g dequant(int8(o_r[g]) @ wo_b[:, g]^T) * wo_b_scale  -> BF16

K = V = the gathered 512-wide (``head_dim``) rows; one shared kv head for all query heads
(MQA). The softmax runs as an online merge over key tiles of ``key_tile`` rows: per tile
``m_i = max s``, ``p = exp(s - m_i)`` (FP32), ``l_i = sum p`` (FP32), ``o_i = bf16(p) @ kv``;
tiles merge with ``alpha = exp(m - m_new)``, ``beta = exp(m_i - m_new)``; finally
``o = o / (l + exp(sink - m))``. A token with no valid key gets a zero row (never NaN).

Two goldens of the tiling (``golden_attention_core(blocking=...)``): ``"packed"`` tiles the
packed list of valid keys, as the reference golden does (pypto-lib `prefill_sparse_attn.py`; the plain math, used for parity);
``"columns"`` runs the kernel's fixed column blocks (window, then compressed) and is what the
registered case compares against. They differ only for a token whose window is not full while
compressed keys are visible (start_pos 0, ratio 4: tokens 3 .. window-2), where the BF16
probabilities round against other block maxima: about 7e-4 relative L2 in the attention core,
each order about 1e-3 from FP32 probabilities, but after the INT8 o-projection 22-30 % of
``attn_out`` elements leave the tolerance, so only the kernel's order gives a sharp comparison.

Compressed slots are *logical*: slot ``s`` lives on page ``cmp_block_table[s // block_size]``
at row ``s % block_size`` (page size ``cfg.block_size``); a slot whose page index is past the
table or whose table entry is negative is skipped, as in the reference golden. ``swa_indices``
are *physical* flat rows of ``ori_kv``. Any negative index is invalid.

Quantisation (``weight_format="int8"``): ``wo_a`` BF16 grouped GEMM with FP32 accumulate;
``o_r`` quantised per token per group (``quantize_per_row_int8`` over ``o_lora``); ``wo_b`` INT8
per output row with scale ``wo_b_scale [D]``; integer GEMM, dequantised per group and summed in
group order. ``weight_format="bf16"``: ``o_r`` rounded to BF16 and multiplied by a float ``wo_b``
(no quantisation, ``wo_b_scale`` ignored).

``float32=True`` (parity mode, for comparisons with an FP32 model such as the transformers
oracle): no BF16 rounding anywhere -- FP32 probabilities in PV, FP32 attention output
(no ``o_packed`` rounding), FP32 ``o_r`` before ``wo_b``, FP32 result.

Not modelled by default: the reference kernel's bias columns only cover the first 256
compressed candidates (``cmp_indices[:, :256]``); pass ``cmp_candidate_limit=256`` to
reproduce that. The DSL kernel below does the same (``SparseAttnTiling.cmp_cols``: 256 at
FLASH, every column at tiny), and its registered case passes that limit to the golden. Where
the golden skips a compressed slot past the table or on a negative page, the kernel raises
``BindError`` (the reference kernel does not check; callers guarantee valid slots).
"""

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ScalarSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.qkv_proj_rope import (
    int8_quantize_rows,
    quantize_per_row_int8,
    quantize_weight_per_column,
    rope_interleaved,
    rotate_interleaved,
)
from pto.models.deepseek_v4.rope import profile_for_ratio, rope_tables
from pto.models.deepseek_v4.weight_format import is_bf16, weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import check_num_tokens, check_token_capacity, token_capacity

__all__ = [
    "SparseAttnTiling",
    "sparse_attn_tiling",
    "prefill_sparse_attn_kernels",
    "prefill_sparse_attn",
    "build_case",
    "ATTN_KEY_TILE_MAX",
    "TOLERANCES",
    "attn_key_tile",
    "quantize_wo_b",
    "gather_key_rows",
    "golden_attention_core",
    "golden_grouped_o_proj",
    "golden_prefill_sparse_attn",
    "make_sparse_attn_inputs",
    "invalid_bias",
    "rope_index_rows",
    "gather_key_block",
    "gather_tile_block",
    "bias_block",
    "key_block_stats",
    "merge_key_blocks",
    "quant_o_r_tile",
    "proj_b_act_task",
]

# Largest key tile of the online softmax (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py` ATTN_TILE = 128).
ATTN_KEY_TILE_MAX = 128

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-3 in the reference harness).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "attn_out": (1e-4, 1 / 128, 0.005),
}

# ---- kernel ----
# FP32_NEG_INF of the reference: the most negative finite FP32, the additive mask of an
# invalid key (pypto-lib `models/deepseek/v4-flash/` INT8 conventions); exp(s + NEG_INF - m) is exactly 0.
FP32_MAX = float(torch.finfo(torch.float32).max)
GATHER_TOK_TILE = 4  # tokens per gather_kv block (pypto-lib `prefill_sparse_attn.py` step 1)
BIAS_TOK_TILE = 16  # token rows per build_bias block (pypto-lib `prefill_sparse_attn.py` step 2)
ROPE_TOK_TILE = 64  # token rows per rope_cs / rope block (pypto-lib `prefill_sparse_attn.py` steps 5-6)
ROPE_HEAD_TILE_MAX = 4  # heads per rope block (pypto-lib `prefill_sparse_attn.py` step 6)
PROJ_A_N_TILE_MAX = 128  # o_lora columns per proj_a_mm task (pypto-lib `prefill_sparse_attn.py` step 7)
QUANT_TOK_TILE = 32  # token rows per quant task (pypto-lib `prefill_sparse_attn.py` step 7: 4 chunks of 32 at T = 128)
PROJ_B_D_SPLIT = 4  # output-column chunks of proj_b_mm (pypto-lib `prefill_sparse_attn.py` step 7: 4 x 1024 at FLASH)
ACT_COL_TILE_MAX = 512  # output columns per proj_b_act block (pypto-lib `prefill_sparse_attn.py` step 8)
ACT_TOK_TILE = 32  # token rows per proj_b_act block (pypto-lib `prefill_sparse_attn.py` step 8)

T_DYN = pl.dynamic("T")


@dataclass(frozen=True)
class SparseAttnTiling:
    """Tile sizes of :func:`prefill_sparse_attn_kernels`, derived from a config.

    Attributes:
        key_tile: key rows per online-softmax block (:func:`attn_key_tile`; 128 at FLASH).
        swa_blocks: key blocks holding the window columns (``sliding_window / key_tile``).
        max_compressed: compressed candidates a prefill token can have,
            ``max(1, min(index_topk, window + window // 2))`` (192 at FLASH, pypto-lib `prefill_sparse_attn.py`).
        sparse_pad: key columns per token, ``round_up(window + max_compressed, key_tile)``
            (384 at FLASH); ``key_blocks = sparse_pad / key_tile``.
        cmp_cols: leading ``cmp_indices`` columns the kernel attends,
            ``min(index_topk, sparse_pad - window)`` (256 at FLASH, all 16 at tiny).
        rope_head_tile, proj_a_n_tile, proj_b_n_tile, act_col_tile: see the constants.
    """

    key_tile: int
    swa_blocks: int
    max_compressed: int
    sparse_pad: int
    cmp_cols: int
    rope_head_tile: int
    proj_a_n_tile: int
    proj_b_n_tile: int
    act_col_tile: int

    @property
    def key_blocks(self) -> int:
        """Key blocks per token (``sparse_pad // key_tile``; 3 at FLASH, 2 at tiny)."""
        return self.sparse_pad // self.key_tile


def sparse_attn_tiling(cfg: DeepSeekV4Config, max_compressed: int | None = None) -> SparseAttnTiling:
    """Derive and validate the kernel's tile sizes (see :class:`SparseAttnTiling`).

    ``max_compressed`` overrides the compressed candidates per token (default the reference's
    ``min(index_topk, window + window // 2)``); ``index_topk`` attends every selected row (CSA
    layers: 640 key columns at FLASH, 5 blocks).

    Raises:
        ConfigError: a window that is not a multiple of the key tile, heads per group not a
            multiple of the rope head tile, ``o_lora_rank`` not a multiple of the proj_a
            tile, ``hidden_size`` not divisible into the proj_b / proj_b_act tiles, or an odd
            ``qk_rope_head_dim``.
    """
    W, kt = cfg.sliding_window, attn_key_tile(cfg)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"prefill_sparse_attn: config {cfg.name!r} cannot be tiled: {msg}")

    need(kt > 0 and W % kt == 0, f"sliding_window={W} is not a multiple of the key tile {kt}")
    need(cfg.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={cfg.qk_rope_head_dim} must be even")
    max_cmp = max(1, min(cfg.index_topk, W + W // 2)) if max_compressed is None else max(1, int(max_compressed))
    pad = -(-(W + max_cmp) // kt) * kt
    hpg = cfg.heads_per_group
    rht = min(ROPE_HEAD_TILE_MAX, hpg)
    need(hpg % rht == 0, f"heads_per_group={hpg} is not a multiple of the rope head tile {rht}")
    na = min(PROJ_A_N_TILE_MAX, cfg.o_lora_rank)
    need(cfg.o_lora_rank % na == 0, f"o_lora_rank={cfg.o_lora_rank} is not a multiple of {na}")
    D = cfg.hidden_size
    need(D % PROJ_B_D_SPLIT == 0, f"hidden_size={D} is not divisible into {PROJ_B_D_SPLIT} proj_b chunks")
    act = min(ACT_COL_TILE_MAX, D)
    need(D % act == 0, f"hidden_size={D} is not a multiple of the proj_b_act column tile {act}")
    return SparseAttnTiling(key_tile=kt, swa_blocks=W // kt, max_compressed=max_cmp, sparse_pad=pad,
                            cmp_cols=min(cfg.index_topk, pad - W), rope_head_tile=rht, proj_a_n_tile=na,
                            proj_b_n_tile=D // PROJ_B_D_SPLIT, act_col_tile=act)


def invalid_bias(idx):
    """Additive mask tile of an index tile (pypto-lib `prefill_sparse_attn.py` step 2).

    ``idx [M, N]`` INT32 key indices (any negative value is invalid) -> ``[M, N]`` FP32: 0 where
    ``idx >= 0``, ``-FP32_MAX`` where ``idx < 0`` -- the reference's ``(clamp(idx + 1, 0, 1) - 1)
    * 3.4e38``, so ``exp(s + bias - m)`` is exactly 0 on an invalid key. Shared by the prefill
    and decode sparse-attention cores. Raises DslError for a non-integer tile (``pl.add``)."""
    valid = pl.minimum(pl.maximum(pl.add(idx, 1), 0), 1)
    return pl.mul(pl.cast(pl.sub(valid, 1), pl.FP32), FP32_MAX)


def rope_index_rows(r: int):
    """Index rows of the interleaved inverse RoPE ("RoPE tables" in pypto-lib `models/deepseek/v4-flash/`).

    Returns ``(pair, swap, sign)``, each ``[1, r]``: ``pair = j >> 1`` INT32 (the cos / sin
    column of channel ``j``), ``swap = j ^ 1`` INT32 (its partner channel), ``sign`` FP32 ``+1``
    on even and ``-1`` on odd ``j``; built from ``pl.arange`` with ``trunc`` casts. ``r`` is the
    (even) ``qk_rope_head_dim``. Shared by the prefill and decode sparse-attention cores."""
    j = pl.arange(0, [1, r], dtype=pl.INT32)
    pair = pl.cast(pl.mul(pl.cast(j, pl.FP32), 0.5), pl.INT32, mode="trunc")
    parity = pl.sub(j, pl.mul(pair, 2))
    sign = pl.sub(pl.full([1, r], pl.INT32, 1), pl.mul(parity, 2))
    return pair, pl.add(j, sign), pl.cast(sign, pl.FP32)


# ---- block bodies shared with decode_sparse_attn (same ops in the same order) ----
def _gather_rows(src_flat, rows: list, n_stage: int, head_dim: int):
    """The ``[n_stage, head_dim]`` stage whose row ``i`` is flat row ``rows[i]`` of ``src_flat``
    (``-1``, and rows past ``len(rows)``, are zero): every valid row in one ``pl.gather_rows``
    (read footprints per run), placed in a zeroed stage by runs of consecutive stage rows. A
    single run covering the whole stage is the gathered tile itself (no zeroed stage is made:
    the assemble would overwrite every element)."""
    if len(rows) == n_stage and min(rows) >= 0:  # every row valid: the gathered tile is the stage
        return pl.gather_rows(src_flat, rows, cols=head_dim)
    cols = [k for k, r in enumerate(rows) if r >= 0]
    if not cols:
        return pl.full([n_stage, head_dim], pl.BF16, 0)
    got = pl.gather_rows(src_flat, [rows[k] for k in cols], cols=head_dim)  # [len(cols), head_dim]
    if len(cols) == n_stage:  # every row valid (so one run from row 0)
        return got
    stage = pl.full([n_stage, head_dim], pl.BF16, 0)
    if cols[-1] - cols[0] == len(cols) - 1:  # one run of consecutive columns
        return pl.assemble(stage, got, [cols[0], 0])
    i = 0
    while i < len(cols):
        j = i + 1
        while j < len(cols) and cols[j] == cols[i] + (j - i):
            j += 1
        stage = pl.assemble(stage, pl.slice(got, [j - i, head_dim], [i, 0]), [cols[i], 0])
        i = j
    return stage


def _cmp_rows(kernel: str, tok: int, c0: int, slots: list, cmp_block_table, table_row: tuple, *,
              cmp_pages: int, block_size: int, pages: dict | None = None) -> list:
    """Flat ``cmp_kv`` rows of the logical ``slots`` (``cmp_indices[tok, c0 ..]``; ``-1`` for a
    negative slot): ``cmp_block_table[*table_row, slot // block_size] * block_size + slot %
    block_size``, each page's entry read once (``pl.read``: cheaper than ``pl.read_elements``
    for the few pages of a key block; ``pages``: the entries already read, page -> entry, shared
    by the tokens of one block). Raises BindError for a slot past the table or on an entry that
    is not a page of ``cmp_kv`` (the message names ``kernel``)."""
    rows = []
    pages = {} if pages is None else pages
    for k, slot in enumerate(slots):
        if slot < 0:
            rows.append(-1)
            continue
        page = slot // block_size
        if page >= cmp_pages:
            raise BindError(f"{kernel}: cmp_indices[{tok}, {c0 + k}] = {slot} is past the compressed "
                            f"block table ({cmp_pages} pages of {block_size})")
        if page not in pages:
            pages[page] = pl.read(cmp_block_table, [*table_row, page])
        phys = pages[page]
        if not 0 <= phys < cmp_pages:
            entry = "cmp_block_table[" + "".join(f"{r}, " for r in table_row)
            raise BindError(f"{kernel}: cmp_indices[{tok}, {c0 + k}] = {slot} maps to {entry}{page}] = "
                            f"{phys}, not a page of cmp_kv")
        rows.append(phys * block_size + slot % block_size)
    return rows


def _key_block_columns(kb: int, *, key_tile: int, swa_blocks: int, n_cmp: int) -> tuple:
    """``(swa, c0, n)`` of key block ``kb``: whether it holds window columns, its first column
    (of ``swa_indices`` or of ``cmp_indices``) and its column count (``<= 0`` for a padding
    block past the ``n_cmp`` attended compressed columns)."""
    swa = kb < swa_blocks
    c0 = kb * key_tile if swa else (kb - swa_blocks) * key_tile
    return swa, c0, key_tile if swa else min(key_tile, n_cmp - c0)


def gather_key_block(kernel: str, tok: int, kb: int, swa_indices, cmp_indices, ori_flat, cmp_flat, cmp_block_table,
                     table_row: tuple, sparse_kv, *, key_tile: int, key_blocks: int, swa_blocks: int, n_cmp: int,
                     head_dim: int, cmp_pages: int, block_size: int, part: tuple = (0, 1)) -> None:
    """Gather key block ``kb`` of token ``tok`` into ``sparse_kv`` rows ``(tok * key_blocks + kb)
    * key_tile ..`` (inside a block of the core's gather task); with ``part = (p, parts)`` only
    its rows ``p * key_tile / parts ..`` (one of ``parts`` blocks sharing the key block: the
    same bytes in ``parts`` stores).

    Blocks ``kb < swa_blocks`` take ``key_tile`` window columns of ``swa_indices [T, W]`` INT32
    (physical flat rows of ``ori_flat``); the others take compressed columns of ``cmp_indices
    [T, >= n_cmp]`` (logical slots, lowered through ``cmp_block_table[*table_row, slot //
    block_size]``). A ``[key_tile, head_dim]`` BF16 stage holds the valid rows (gathered in one
    ``pl.gather_rows``, placed in a zeroed stage by runs; a block whose every row is valid stores
    the gathered tile itself); a block past ``n_cmp`` or whose every index is ``-1`` (its index
    row is read once, ``pl.read_values``) writes nothing (the core's ``qk_pv`` skips it by its
    bias row).

    Raises:
        BindError: a compressed slot past the table (``cmp_pages`` pages), or one whose table
            entry is not a page of ``cmp_kv``; the message names ``kernel``.
    """
    swa, c0, n = _key_block_columns(kb, key_tile=key_tile, swa_blocks=swa_blocks, n_cmp=n_cmp)
    if n <= 0:
        return  # padding block past the attended compressed columns
    idx = pl.slice(swa_indices if swa else cmp_indices, [1, n], [tok, c0])
    vals = pl.read_values(idx, [0, 0], n)  # the block's index columns as numbers, one conversion
    if max(vals) < 0:
        return
    p, parts = part
    sub = key_tile // parts
    r0, r1 = p * sub, min(n, (p + 1) * sub)  # this part's index columns (none past n: zero rows)
    if r1 <= r0:
        stage = pl.full([sub, head_dim], pl.BF16, 0)
    elif swa:
        stage = _gather_rows(ori_flat, vals[r0:r1], sub, head_dim)
    else:  # logical slots lowered through the block table (each page's entry read once)
        rows = _cmp_rows(kernel, tok, c0 + r0, vals[r0:r1], cmp_block_table, table_row, cmp_pages=cmp_pages,
                         block_size=block_size)
        stage = _gather_rows(cmp_flat, rows, sub, head_dim)
    pl.assemble(sparse_kv, stage, [(tok * key_blocks + kb) * key_tile + r0, 0])


def gather_tile_block(kernel: str, t0: int, t1: int, kb: int, t: int, swa_indices, cmp_indices, ori_flat, cmp_flat,
                      cmp_block_table, sparse_kv, *, key_tile: int, swa_blocks: int, n_cmp: int, head_dim: int,
                      cmp_pages: int, block_size: int) -> None:
    """Key block ``kb`` of the tokens ``t0 .. t1 - 1`` (one block of prefill's ``gather_kv``) into
    the key-block-major ``sparse_kv``: token ``tok``'s rows ``(kb * t + tok) * key_tile ..``, so
    the tokens of one block are one run of ``(t1 - t0) * key_tile`` rows.

    The block's index columns (window columns of ``swa_indices`` for ``kb < swa_blocks``, else
    compressed columns of ``cmp_indices`` lowered through ``cmp_block_table``, each page's entry
    read once per block) are one ``[t1 - t0, n]`` tile read row by row (``pl.read_values``);
    every valid row of the tokens is gathered in one ``pl.gather_rows`` into a ``[(t1 - t0) *
    key_tile, head_dim]`` BF16 stage whose invalid and padding rows are zero, stored at once.
    A block past ``n_cmp`` or whose every index is ``-1`` writes nothing (``qk_pv`` skips a
    token's key block by its bias row, so a token whose own columns are all ``-1`` reads none
    of its zero rows either).

    Args (``T = t`` the chunk's tokens, ``NB`` key blocks per token, ``KT = key_tile``):
        swa_indices: ``[T, W]`` INT32, physical flat rows of ``ori_flat [P*BS, head_dim]`` BF16.
        cmp_indices: ``[T, >= n_cmp]`` INT32 logical slots of ``cmp_flat [CP*BS, head_dim]``
            BF16 through ``cmp_block_table [CP]`` INT32 (pages of ``block_size`` rows).
        sparse_kv: ``[T*NB*KT, head_dim]`` BF16 scratch, written in place.

    Raises:
        BindError: a compressed slot past the table (``cmp_pages`` pages), or one whose table
            entry is not a page of ``cmp_kv``; the message names ``kernel``.
    """
    swa, c0, n = _key_block_columns(kb, key_tile=key_tile, swa_blocks=swa_blocks, n_cmp=n_cmp)
    m = t1 - t0
    if n <= 0 or m <= 0:
        return  # padding block past the attended compressed columns, or no active token
    idx = pl.slice(swa_indices if swa else cmp_indices, [m, n], [t0, c0])
    rows, pages, pad = [], {}, [-1] * (key_tile - n)
    for r in range(m):
        vals = pl.read_values(idx, [r, 0], n)
        if max(vals) < 0:
            rows += [-1] * key_tile
            continue
        if not swa:  # logical slots lowered through the block table (each page's entry read once)
            vals = _cmp_rows(kernel, t0 + r, c0, vals, cmp_block_table, (), cmp_pages=cmp_pages,
                             block_size=block_size, pages=pages)
        rows += vals + pad if pad else vals
    if max(rows) < 0:
        return
    stage = _gather_rows(ori_flat if swa else cmp_flat, rows, m * key_tile, head_dim)
    pl.assemble(sparse_kv, stage, [(kb * t + t0) * key_tile, 0])


def bias_block(b: int, t: int, swa_indices, cmp_indices, sparse_bias, *, window: int, n_cmp: int,
               key_pad: int) -> None:
    """Block ``b`` of the core's bias task: rows ``b * BIAS_TOK_TILE ..`` of ``sparse_bias [T,
    key_pad]`` FP32 -- :func:`invalid_bias` of the window columns, of the ``n_cmp`` compressed
    columns, and ``-FP32_MAX`` on the padding columns."""
    t0 = b * BIAS_TOK_TILE
    rows = min(BIAS_TOK_TILE, t - t0)
    sw = pl.slice(swa_indices, [BIAS_TOK_TILE, window], [t0, 0], valid_shape=[rows, window])
    pl.assemble(sparse_bias, invalid_bias(sw), [t0, 0])
    if n_cmp:
        cm = pl.slice(cmp_indices, [BIAS_TOK_TILE, n_cmp], [t0, 0], valid_shape=[rows, n_cmp])
        pl.assemble(sparse_bias, invalid_bias(cm), [t0, window])
    if key_pad > window + n_cmp:
        pl.assemble(sparse_bias, pl.full([rows, key_pad - window - n_cmp], pl.FP32, -FP32_MAX),
                    [t0, window + n_cmp])


def key_block_stats(load_q, tok: int, kb: int, sparse_kv, sparse_bias, blk_m, blk_l, blk_o, *, scale: float,
                    key_tile: int, key_blocks: int, heads: int, head_dim: int, tokens: int | None = None) -> None:
    """Online-softmax statistics of key block ``kb`` of token ``tok``, every head at once:
    ``s = q @ kv^T * scale + bias`` FP32 ``[H, KT]``, ``m = row_max s``, ``p = exp(s - m)``,
    ``l = row_sum p``, ``o = bf16(p) @ kv`` into rows ``(tok * key_blocks + kb) * heads ..`` of
    ``blk_m / blk_l [.., 1]`` and ``blk_o [.., head_dim]``. ``load_q()`` returns the token's
    ``[H, head_dim]`` BF16 query tile (called only for a block with a valid key). A fully
    masked block (its bias row all ``-FP32_MAX``) is not loaded: it stores ``(-FP32_MAX, 0,
    0)``, which the merge weighs by ``exp(-FP32_MAX - m) = 0`` (alone: ``o / inf = 0``). The
    block's keys are ``sparse_kv`` rows ``(tok * key_blocks + kb) * key_tile ..`` (token-major), or
    with ``tokens`` (the chunk's token count: prefill's key-block-major ``gather_kv``) rows
    ``(kb * tokens + tok) * key_tile ..``."""
    hr = (tok * key_blocks + kb) * heads
    bias = sparse_bias[tok:tok + 1, kb * key_tile:(kb + 1) * key_tile]
    if pl.read(pl.row_max(bias), [0, 0]) < 0:
        blk_m[hr:hr + heads, 0:1] = pl.full([heads, 1], pl.FP32, -FP32_MAX)
        blk_l[hr:hr + heads, 0:1] = pl.full([heads, 1], pl.FP32, 0.0)
        blk_o[hr:hr + heads, 0:head_dim] = pl.full([heads, head_dim], pl.FP32, 0.0)
        return
    r0 = ((tok * key_blocks + kb) if tokens is None else (kb * tokens + tok)) * key_tile
    kv = sparse_kv[r0:r0 + key_tile, 0:head_dim]
    s = pl.col_expand_add(pl.mul(pl.matmul(load_q(), kv, b_trans=True), scale), bias)  # [H, KT] FP32
    m = pl.row_max(s)
    p = pl.exp(pl.row_expand_sub(s, m))
    blk_m[hr:hr + heads, 0:1] = m
    blk_l[hr:hr + heads, 0:1] = pl.row_sum(p)
    blk_o[hr:hr + heads, 0:head_dim] = pl.matmul(pl.cast(p, pl.BF16, mode="rint"), kv)


def merge_key_blocks(tok: int, blk_m, blk_l, blk_o, sink_row, *, key_blocks: int, heads: int):
    """Merge token ``tok``'s key blocks in order (``alpha = exp(m - m_new)``, ``beta = exp(m_b -
    m_new)``) and normalise with the sink in the denominator: ``o / (l + exp(sink - m))``;
    returns the ``[H, head_dim]`` FP32 tile. ``sink_row [1, H]`` FP32 (a view of ``attn_sink``: its
    ``[1, H]`` load is the footprint and bytes of the ``[H, 1]`` column, reshaped as a tile)."""
    h0 = tok * key_blocks * heads
    hd = blk_o.shape[1]  # explicit int bounds below: the subscripts' fast path (same loads as [a:b, :])
    m, l, o = blk_m[h0:h0 + heads, 0:1], blk_l[h0:h0 + heads, 0:1], blk_o[h0:h0 + heads, 0:hd]
    for kb in pl.range(1, key_blocks):
        hr = h0 + kb * heads
        m_b = blk_m[hr:hr + heads, 0:1]
        m_new = pl.maximum(m, m_b)
        alpha, beta = pl.exp(pl.sub(m, m_new)), pl.exp(pl.sub(m_b, m_new))
        l = pl.add(pl.mul(alpha, l), pl.mul(beta, blk_l[hr:hr + heads, 0:1]))
        o = pl.add(pl.row_expand_mul(o, alpha), pl.row_expand_mul(blk_o[hr:hr + heads, 0:hd], beta))
        m = m_new
    sink = pl.reshape(sink_row[0:1, 0:heads], [heads, 1])
    return pl.row_expand_div(o, pl.add(l, pl.exp(pl.sub(sink, m))))


def quant_o_r_tile(o_r, o_r_i8, act_scale_dq, t: int, t0: int, g: int, *, o_lora: int, tok_tile: int,
                   bf16: bool = False) -> None:
    """Per-(token, group) INT8 quantisation of ``o_r`` rows ``t0 .. t0 + tok_tile`` (clipped to
    ``t``), group ``g``'s ``o_lora`` columns (``int8_quantize_rows``): codes into ``o_r_i8``,
    the dequant scale ``1 / s`` into column ``g`` of ``act_scale_dq [T, G]``. ``bf16``
    (weight_format "bf16"): the rows rounded to BF16 (``rint``) into a BF16 ``o_r_i8``, no
    scale written."""
    rows = min(tok_tile, t - t0)
    x = pl.slice(o_r, [tok_tile, o_lora], [t0, g * o_lora], valid_shape=[rows, o_lora])
    if bf16:
        pl.assemble(o_r_i8, pl.cast(x, pl.BF16, mode="rint"), [t0, g * o_lora])
        return
    codes, s_q = int8_quantize_rows(x)
    pl.assemble(o_r_i8, codes, [t0, g * o_lora])
    pl.assemble(act_scale_dq, pl.set_validshape(pl.recip(s_q), rows, 1), [t0, g])


def proj_b_act_task(partials, act_scale_dq, wo_b_scale_row, attn_out, t: int, deps: list, *, groups: int,
                    hidden: int, col_tile: int, tok_tile: int):
    """The ``proj_b_act`` task, ``spmd((D / col_tile) * ceil(T / tok_tile))`` after ``deps``:
    ``sum_g float(partials[:, g*D + c]) * act_scale_dq[:, g]`` in group order, ``* wo_b_scale``,
    BF16 (``rint``) into ``attn_out [T, D]``. Returns the task id. ``act_scale_dq=None``
    (weight_format "bf16": FP32 ``partials``): the plain group sum, no scale applied."""
    n_at = -(-t // tok_tile)
    task = pl.spmd((hidden // col_tile) * n_at, name_hint="proj_b_act", deps=deps)
    for b in task:
        ci, ti = divmod(b, n_at)
        c0, t0 = ci * col_tile, ti * tok_tile
        rows = min(tok_tile, t - t0)
        acc = None
        for g in pl.range(groups):
            part = pl.slice(partials, [tok_tile, col_tile], [t0, g * hidden + c0], valid_shape=[rows, col_tile])
            if act_scale_dq is None:
                term = part
            else:
                s_g = pl.slice(act_scale_dq, [tok_tile, 1], [t0, g], valid_shape=[rows, 1])
                term = pl.row_expand_mul(pl.cast(part, pl.FP32, mode="rint"), s_g)
            acc = term if acc is None else pl.add(acc, term)
        if act_scale_dq is not None:
            acc = pl.col_expand_mul(acc, wo_b_scale_row[:, c0:c0 + col_tile])
        pl.assemble(attn_out, pl.cast(acc, pl.BF16, mode="rint"), [t0, c0])
    return task.tid


@functools.lru_cache(maxsize=None)
def prefill_sparse_attn_kernels(cfg: DeepSeekV4Config, max_compressed: int | None = None) -> SimpleNamespace:
    """Build the prefill sparse-attention DSL kernel for ``cfg`` (cached per config and
    ``max_compressed``, see :func:`sparse_attn_tiling`).

    Tasks (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`; ``NB = key_blocks``, ``KT = key_tile``, ``T`` dynamic):

    1. ``gather_kv`` ``spmd(ceil(T/4) * NB)``: block = (4 tokens, key block); the active
       tokens' ``[KT, head_dim]`` stages of the valid rows (raw rows from ``swa_indices``;
       compressed slots lowered through ``cmp_block_table``, each page's entry read once per
       block), gathered in one ``pl.gather_rows`` and placed in a zeroed ``[4*KT, head_dim]``
       stage by runs of consecutive rows, stored at once into the key-block-major
       ``sparse_kv`` (token ``t``'s block ``kb`` at rows ``(kb*T + t)*KT``); a ``-1`` column
       copies nothing (the row stays zero); a block whose every index is ``-1`` is not
       written at all (:func:`gather_tile_block`).
    2. ``build_bias`` ``spmd(ceil(T/16))``: additive mask ``[T, sparse_pad]``.
    3. ``qk_pv`` ``spmd(T)``: per active token and key block, all heads at once: scores,
       ``* softmax_scale``, ``+ bias``, row max, ``exp``, row sum, BF16 probabilities @ kv;
       ``(m, l, o)`` per block to scratch. A fully masked block (its bias row is all
       ``-FP32_MAX``) is not loaded: it stores ``(-FP32_MAX, 0, 0)``, which the merge weighs by
       ``exp(-FP32_MAX - m) = 0`` exactly as the computed block (bit-identical results).
    4. ``merge_norm`` ``spmd(T)``: online-softmax merge of the blocks in order, sink in the
       denominator, ``o / (l + exp(sink - m))``; nope part BF16 into ``o_packed``
       (group-major: row ``g*T + t``), rope part FP32 to a stage; inactive tokens zero.
    5. ``rope_cs`` ``spmd(ceil(T/64))``: interleaved cos and sign-folded sin rows.
    6. ``rope`` ``spmd((H/rope_head_tile) * ceil(T/64))``: inverse RoPE into ``o_packed``.
    7. ``pl.manual_scope()``: ``proj_a_mm`` (``G * o_lora/proj_a_n_tile`` tasks, deps =
       merge and rope), ``quant`` (``ceil(T/32) * G``, deps = the group's proj_a tasks),
       ``proj_b_mm`` (``4 * G``, deps = the group's quant tasks).
    8. ``proj_b_act`` ``spmd((D/act_col_tile) * ceil(T/32))``, deps = every proj_b task:
       ``sum_g float(partial_g) * act_scale[t, g]``, ``* wo_b_scale``, BF16.

    Returns:
        namespace with ``tiling`` (:class:`SparseAttnTiling`), the inline body
        ``prefill_sparse_attn(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
        attn_sink, num_tokens, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale, attn_out)`` (returns
        ``attn_out``) and the ``@pl.jit`` entry ``prefill_sparse_attn_test`` (``pl.jit.entry`` of
        that body, same parameters).

    Scratch (uninitialised; rows scale with the runtime ``T``, bounded by
    ``tiling.token_capacity(cfg)`` = 128 tokens): ``sparse_kv [T*sparse_pad, head_dim]``,
    ``sparse_bias [T, sparse_pad]``, per-block ``(m, l, o)`` ``[T*NB*H, 1 | 1 | head_dim]``,
    ``attn_rope_stage [T*H, rope_dim]``, ``o_packed [G*T, o_group_in]``, cos / sin rows
    ``[T, rope_dim]``, ``o_r`` / ``o_r_i8 [T, G*o_lora]``, ``act_scale_dq [T, G]``,
    ``partials [T, G*D]`` INT32. ``cfg.weight_format == "bf16"`` (weight_format.py): ``wo_b``
    and ``o_r_i8`` BF16 (``quant`` rounds ``o_r`` to BF16), ``proj_b_mm`` BF16 x BF16 -> FP32
    ``partials``, ``proj_b_act`` sums the groups with no scale (``wo_b_scale`` not read).

    Raises:
        ConfigError: from :func:`sparse_attn_tiling`. At run time the body raises
            ``CapacityError`` for ``T`` above the capacity (before any task) and
            ``BindError`` for a compressed slot past the table or on a negative page.
    """
    tl = sparse_attn_tiling(cfg, max_compressed)
    H, HD, R, N = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.nope_head_dim
    BS, P, CP, W, TOPK = cfg.block_size, cfg.ori_kv_block_num, cfg.cmp_kv_block_num, cfg.sliding_window, \
        cfg.index_topk
    G, HPG, LO, GIN, D = cfg.o_groups, cfg.heads_per_group, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    KT, NB, NBS, PAD, NCMP = tl.key_tile, tl.key_blocks, tl.swa_blocks, tl.sparse_pad, tl.cmp_cols
    HT, NA, DN, CT = tl.rope_head_tile, tl.proj_a_n_tile, tl.proj_b_n_tile, tl.act_col_tile
    scale = cfg.softmax_scale
    cap = token_capacity(cfg)  # bound of the runtime token count (CapacityError before any task)
    WD, bf16 = weight_dtype(cfg), is_bf16(cfg)

    @pl.jit.inline
    def prefill_sparse_attn(q: pl.Tensor[[T_DYN, H, HD], pl.BF16],
                            ori_kv: pl.Tensor[[P, BS, 1, HD], pl.BF16],
                            swa_indices: pl.Tensor[[T_DYN, W], pl.INT32],
                            cmp_kv: pl.Tensor[[CP, BS, 1, HD], pl.BF16],
                            cmp_block_table: pl.Tensor[[CP], pl.INT32],
                            cmp_indices: pl.Tensor[[T_DYN, TOPK], pl.INT32],
                            attn_sink: pl.Tensor[[H], pl.FP32],
                            num_tokens: pl.Scalar[pl.INT32],
                            rope_cos: pl.Tensor[[T_DYN, R], pl.BF16],
                            rope_sin: pl.Tensor[[T_DYN, R], pl.BF16],
                            wo_a: pl.Tensor[[G, LO, GIN], pl.BF16],
                            wo_b: pl.Tensor[[D, G * LO], WD],
                            wo_b_scale: pl.Tensor[[D], pl.FP32],
                            attn_out: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
        """Sparse attention with sink, inverse RoPE and the grouped INT8 o-projection (pypto-lib `prefill_sparse_attn.py`)."""
        t = pl.tensor.dim(q, 0)
        active = check_num_tokens("prefill_sparse_attn", num_tokens, t)
        ori_flat = pl.reshape(ori_kv, [P * BS, HD])
        cmp_flat = pl.reshape(cmp_kv, [CP * BS, HD])
        sink_row = pl.reshape(attn_sink, [1, H])
        wo_b_scale_row = pl.reshape(wo_b_scale, [1, D])

        sparse_kv = pl.create_tensor([t * PAD, HD], pl.BF16, capacity=cap * PAD)
        sparse_bias = pl.create_tensor([t, PAD], pl.FP32, capacity=cap)
        blk_m = pl.create_tensor([t * NB * H, 1], pl.FP32, capacity=cap * NB * H)
        blk_l = pl.create_tensor([t * NB * H, 1], pl.FP32, capacity=cap * NB * H)
        blk_o = pl.create_tensor([t * NB * H, HD], pl.FP32, capacity=cap * NB * H)
        attn_rope_stage = pl.create_tensor([t * H, R], pl.FP32, capacity=cap * H)
        o_packed = pl.create_tensor([G * t, GIN], pl.BF16, capacity=G * cap)
        rope_cos_il = pl.create_tensor([t, R], pl.FP32, capacity=cap)
        rope_sin_signed = pl.create_tensor([t, R], pl.FP32, capacity=cap)
        o_r = pl.create_tensor([t, G * LO], pl.FP32, capacity=cap)
        o_r_i8 = pl.create_tensor([t, G * LO], WD, capacity=cap)
        act_scale_dq = None if bf16 else pl.create_tensor([t, G], pl.FP32, capacity=cap)
        partials = pl.create_tensor([t, G * D], pl.FP32 if bf16 else pl.INT32, capacity=cap)
        stage3 = pl.reshape(attn_rope_stage, [t, H, R])
        o_head_rows = pl.reshape(o_packed, [G * t * HPG, HD])

        # 1. gather the key rows of every active token, one key block per block; a block whose
        #    every index is -1 is left unwritten (qk_pv skips it by its bias row)
        geo = dict(key_tile=KT, swa_blocks=NBS, n_cmp=NCMP, head_dim=HD, cmp_pages=CP, block_size=BS)
        for b in pl.spmd(-(-t // GATHER_TOK_TILE) * NB, name_hint="gather_kv"):
            tile, kb = divmod(b, NB)
            t0 = tile * GATHER_TOK_TILE
            gather_tile_block("prefill_sparse_attn", t0, min(t0 + GATHER_TOK_TILE, active), kb, t, swa_indices,
                              cmp_indices, ori_flat, cmp_flat, cmp_block_table, sparse_kv, **geo)

        # 2. additive mask: 0 for a valid column, -FP32_MAX for -1 and for the padding columns
        for b in pl.spmd(-(-t // BIAS_TOK_TILE), name_hint="build_bias"):
            bias_block(b, t, swa_indices, cmp_indices, sparse_bias, window=W, n_cmp=NCMP, key_pad=PAD)

        # 3. per active token and key block, every head at once: (m, l, o) of the block
        q_rows = pl.reshape(q, [t * H, HD])  # q[tok, :, :] as a 2-D window: the same load, its fast path
        for tok in pl.spmd(t, name_hint="qk_pv"):
            if tok < active:
                qt = q_rows[tok * H:(tok + 1) * H, 0:HD]  # [H, HD]
                for kb in pl.range(NB):
                    key_block_stats(lambda: qt, tok, kb, sparse_kv, sparse_bias, blk_m, blk_l, blk_o, scale=scale,
                                    key_tile=KT, key_blocks=NB, heads=H, head_dim=HD, tokens=t)

        # 4. merge the key blocks (golden order), attention sink, split nope / rope parts
        merge = pl.spmd(t, name_hint="merge_norm")
        for tok in merge:
            if tok < active:
                o = merge_key_blocks(tok, blk_m, blk_l, blk_o, sink_row, key_blocks=NB, heads=H)
                nope = pl.cast(pl.slice(o, [H, N], [0, 0]), pl.BF16, mode="rint")
                rope = pl.slice(o, [H, R], [0, N])
            else:
                nope = pl.full([H, N], pl.BF16, 0)
                rope = pl.full([H, R], pl.FP32, 0.0)
            for g in pl.range(G):  # group g's heads into rows (g*T + tok)*HPG .. of the [G*T*HPG, HD] view
                pl.assemble(o_head_rows, pl.slice(nope, [HPG, N], [g * HPG, 0]), [(g * t + tok) * HPG, 0])
            pl.assemble(attn_rope_stage, rope, [tok * H, 0])
        merge_tid = merge.tid

        # 5. interleaved cos and sign-folded sin rows (inverse rotation); inactive rows zero
        for b in pl.spmd(-(-t // ROPE_TOK_TILE), name_hint="rope_cs"):
            t0 = b * ROPE_TOK_TILE
            rows, act_rows = min(ROPE_TOK_TILE, t - t0), max(0, min(ROPE_TOK_TILE, active - t0))
            pair, _, sign = rope_index_rows(R)
            cos = pl.fillpad(pl.slice(rope_cos, [ROPE_TOK_TILE, R], [t0, 0], valid_shape=[act_rows, R]))
            sin = pl.fillpad(pl.slice(rope_sin, [ROPE_TOK_TILE, R], [t0, 0], valid_shape=[act_rows, R]))
            cos_il = pl.gather(pl.cast(cos, pl.FP32), index=pair)
            sin_signed = pl.col_expand_mul(pl.gather(pl.cast(sin, pl.FP32), index=pair), sign)
            pl.assemble(rope_cos_il, pl.set_validshape(cos_il, rows, R), [t0, 0])
            pl.assemble(rope_sin_signed, pl.set_validshape(sin_signed, rows, R), [t0, 0])

        # 6. inverse RoPE of the rope part: out[j] = x[j]*cos[j>>1] + x[j^1]*sign[j]*sin[j>>1]
        n_rt = -(-t // ROPE_TOK_TILE)
        rope_task = pl.spmd((H // HT) * n_rt, name_hint="rope")
        for b in rope_task:
            ht, tt = divmod(b, n_rt)
            t0 = tt * ROPE_TOK_TILE
            rows = min(ROPE_TOK_TILE, t - t0)
            _, swap, _ = rope_index_rows(R)
            cos = pl.slice(rope_cos_il, [ROPE_TOK_TILE, R], [t0, 0], valid_shape=[rows, R])
            sin = pl.slice(rope_sin_signed, [ROPE_TOK_TILE, R], [t0, 0], valid_shape=[rows, R])
            x3 = pl.slice(stage3, [ROPE_TOK_TILE, HT, R], [t0, ht * HT, 0], valid_shape=[rows, HT, R])
            for hh in pl.range(HT):
                g, hp = divmod(ht * HT + hh, HPG)
                x = pl.reshape(pl.slice(x3, [ROPE_TOK_TILE, 1, R], [0, hh, 0]), [ROPE_TOK_TILE, R])
                y = rotate_interleaved(x, cos, sin, swap)
                y = pl.set_validshape(pl.cast(y, pl.BF16, mode="rint"), rows, R)
                pl.assemble(o_packed, y, [g * t + t0, hp * HD + N])
        rope_tid = rope_task.tid

        # 7. grouped o-projection, ordered by explicit task ids only
        proj_a_tids = [[] for _ in range(G)]
        quant_tids = [[] for _ in range(G)]
        proj_b_tids = []
        n_qt = -(-t // QUANT_TOK_TILE)
        with pl.manual_scope():
            for g in pl.parallel(G):
                for nf in pl.range(LO // NA):
                    with pl.at(level=pl.Level.CORE_GROUP, name_hint="proj_a_mm",
                               deps=[merge_tid, rope_tid]) as tid:
                        acc = pl.matmul(o_packed[g * t:(g + 1) * t, 0:GIN], wo_a[g, nf * NA:(nf + 1) * NA, :],
                                        b_trans=True)  # [T, NA] FP32
                        pl.assemble(o_r, acc, [0, g * LO + nf * NA])
                    proj_a_tids[g].append(tid)
            for tc in pl.parallel(n_qt):
                for g in pl.range(G):
                    with pl.at(level=pl.Level.CORE_GROUP, name_hint="quant", deps=proj_a_tids[g]) as tid:
                        quant_o_r_tile(o_r, o_r_i8, act_scale_dq, t, tc * QUANT_TOK_TILE, g, o_lora=LO,
                                       tok_tile=QUANT_TOK_TILE, bf16=bf16)
                    quant_tids[g].append(tid)
            for dc in pl.parallel(PROJ_B_D_SPLIT):
                for g in pl.range(G):
                    with pl.at(level=pl.Level.CORE_GROUP, name_hint="proj_b_mm", deps=quant_tids[g]) as tid:
                        acc = pl.matmul(o_r_i8[:, g * LO:(g + 1) * LO],
                                        wo_b[dc * DN:(dc + 1) * DN, g * LO:(g + 1) * LO], b_trans=True)
                        pl.assemble(partials, acc, [0, g * D + dc * DN])  # exact INT32 (FP32 for bf16)
                    proj_b_tids.append(tid)

        # 8. dequantise, sum over groups in order, per-row weight scale, BF16
        proj_b_act_task(partials, act_scale_dq, wo_b_scale_row, attn_out, t, proj_b_tids, groups=G, hidden=D,
                        col_tile=CT, tok_tile=ACT_TOK_TILE)
        return attn_out

    prefill_sparse_attn_test = pl.jit.entry(prefill_sparse_attn, name="prefill_sparse_attn_test")

    return SimpleNamespace(tiling=tl, prefill_sparse_attn=prefill_sparse_attn,
                           prefill_sparse_attn_test=prefill_sparse_attn_test)


@pl.jit.inline
def prefill_sparse_attn(q: pl.Tensor, ori_kv: pl.Tensor, swa_indices: pl.Tensor, cmp_kv: pl.Tensor,
                        cmp_block_table: pl.Tensor, cmp_indices: pl.Tensor, attn_sink: pl.Tensor,
                        num_tokens: pl.Scalar[pl.INT32], rope_cos: pl.Tensor, rope_sin: pl.Tensor, wo_a: pl.Tensor,
                        wo_b: pl.Tensor, wo_b_scale: pl.Tensor, attn_out: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``prefill_sparse_attn(q, ori_kv, swa_indices, cmp_kv,
    cmp_block_table, cmp_indices, attn_sink, num_tokens, rope_cos, rope_sin, wo_a, wo_b,
    wo_b_scale, attn_out, cfg) -> attn_out``: the body of :func:`prefill_sparse_attn_kernels`
    for ``cfg`` (shapes and errors there)."""
    return prefill_sparse_attn_kernels(cfg).prefill_sparse_attn(
        q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink, num_tokens, rope_cos, rope_sin,
        wo_a, wo_b, wo_b_scale, attn_out)
# ---- end kernel ----


def attn_key_tile(cfg: DeepSeekV4Config) -> int:
    """Key rows per online-softmax tile: ``min(ATTN_KEY_TILE_MAX, cfg.sliding_window)``.

    128 at FLASH (one window per tile, pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`), 64 at tiny.
    """
    return min(ATTN_KEY_TILE_MAX, cfg.sliding_window)


def _check(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...], kind: str) -> None:
    """Raise BindError unless ``t`` has ``shape`` and dtype kind float / int8 / int."""
    if kind == "float":
        ok = t.is_floating_point()
    elif kind == "int8":
        ok = t.dtype == torch.int8
    else:
        ok = t.dtype in (torch.int32, torch.int64)
    if tuple(t.shape) != tuple(shape) or not ok:
        raise BindError(f"{fn}: {name} must be a {kind} tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def quantize_wo_b(
    wo_b: torch.Tensor,  # [D, G*o_lora] float
) -> tuple[torch.Tensor, torch.Tensor]:  # ([D, G*o_lora] int8, [D] fp32)
    """INT8 per-output-row quantisation of ``wo_b`` (pypto-lib `models/deepseek/v4-flash/` INT8 conventions, `prefill_sparse_attn.py`).

    Row ``d`` is output channel ``d``: ``scale[d] = max(max|wo_b[d, :]|, 1e-4) / 127``,
    codes ``clamp(round_half_even(wo_b / scale), -127, 127)``; the same rule as
    ``quantize_weight_per_column`` applied to ``wo_b^T``.

    Args:
        wo_b: ``[D, G*o_lora]`` float weight (``out = o_r @ wo_b^T``).

    Returns:
        ``(codes [D, G*o_lora] int8, scale [D] fp32)``.

    Raises:
        BindError: ``wo_b`` not a float rank-2 tensor.
    """
    if wo_b.dim() != 2 or not wo_b.is_floating_point():
        raise BindError(f"quantize_wo_b: wo_b must be a float [D, G*o_lora] tensor, "
                        f"got {wo_b.dtype} {list(wo_b.shape)}")
    codes_t, scale = quantize_weight_per_column(wo_b.t())
    return codes_t.t().contiguous(), scale


def gather_key_rows(
    swa_row: torch.Tensor,  # [window] int
    cmp_row: torch.Tensor,  # [n_cmp] int
    ori_flat: torch.Tensor,  # [pages*block_size, head_dim]
    cmp_flat: torch.Tensor,  # [cmp_pages*block_size, head_dim]
    cmp_block_table: torch.Tensor,  # [cmp_table_len] int
    block_size: int,
) -> torch.Tensor:  # [n_valid, head_dim], dtype of the caches
    """Gather one token's valid key rows: raw window rows first, then compressed rows.

    Order follows the index columns (swa columns, then cmp columns); negative entries are
    skipped. Compressed slot ``s`` maps to flat row
    ``cmp_block_table[s // block_size] * block_size + s % block_size``; slots whose page
    index is ``>= len(cmp_block_table)`` or whose table entry is negative are skipped.

    Raises:
        BindError: a raw row or a lowered compressed row outside its cache.
    """
    swa = swa_row.long()
    swa = swa[swa >= 0]
    if swa.numel() and int(swa.max()) >= ori_flat.shape[0]:
        raise BindError(f"gather_key_rows: swa index {int(swa.max())} outside ori_kv "
                        f"({ori_flat.shape[0]} rows)")
    slots = cmp_row.long()
    slots = slots[slots >= 0]
    page = slots // block_size
    slots, page = slots[page < cmp_block_table.shape[0]], page[page < cmp_block_table.shape[0]]
    phys_page = cmp_block_table.long()[page]
    keep = phys_page >= 0
    cmp_rows = phys_page[keep] * block_size + slots[keep] % block_size
    if cmp_rows.numel() and int(cmp_rows.max()) >= cmp_flat.shape[0]:
        raise BindError(f"gather_key_rows: compressed row {int(cmp_rows.max())} outside cmp_kv "
                        f"({cmp_flat.shape[0]} rows); check cmp_block_table")
    return torch.cat([ori_flat.index_select(0, swa), cmp_flat.index_select(0, cmp_rows)], dim=0)


def _online_softmax_with_sink(
    qh: torch.Tensor,  # [H, d] fp32
    tiles: list,  # of [n_i, d] fp32 (bf16 values) key tiles, in merge order
    sink: torch.Tensor,  # [H] fp32
    scale: float,
    bf16_probs: bool = True,
) -> torch.Tensor:  # [H, d] fp32
    """Online softmax over the key ``tiles`` with a sink column: per tile FP32 scores, max and
    exp, BF16 (or FP32) probabilities for PV, merged in order; no key at all gives zeros."""
    H, d = qh.shape
    tiles = [kt for kt in tiles if kt.shape[0]]
    if not tiles:
        return torch.zeros(H, d, dtype=torch.float32)
    m = torch.full((H,), -math.inf, dtype=torch.float32)
    l = torch.zeros(H, dtype=torch.float32)
    o = torch.zeros(H, d, dtype=torch.float32)
    for kt in tiles:
        s = (qh @ kt.T) * scale  # [H, nt]
        m_i = s.amax(dim=-1)
        p = torch.exp(s - m_i[:, None])
        l_i = p.sum(dim=-1)
        o_i = (p.to(torch.bfloat16).float() if bf16_probs else p) @ kt
        m_new = torch.maximum(m, m_i)
        alpha, beta = torch.exp(m - m_new), torch.exp(m_i - m_new)
        l = alpha * l + beta * l_i
        o = alpha[:, None] * o + beta[:, None] * o_i
        m = m_new
    return o / (l + torch.exp(sink - m))[:, None]


def _key_tiles(swa_row, cmp_row, ori_flat, cmp_flat, cmp_block_table, block_size: int, tile: int,
               blocking: str) -> list:
    """One token's key tiles: ``"packed"`` tiles the list of valid keys (window, then
    compressed) every ``tile`` rows, as the reference golden does (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`);
    ``"columns"`` keeps the kernel's fixed column blocks (window columns, then compressed
    columns, ``tile`` index columns each) and drops the invalid keys inside each block."""
    if blocking == "packed":
        keys = gather_key_rows(swa_row, cmp_row, ori_flat, cmp_flat, cmp_block_table, block_size)
        return [keys[k0:k0 + tile] for k0 in range(0, keys.shape[0], tile)]
    none = cmp_row[:0]
    return ([gather_key_rows(swa_row[c0:c0 + tile], none, ori_flat, cmp_flat, cmp_block_table, block_size)
             for c0 in range(0, swa_row.shape[0], tile)]
            + [gather_key_rows(swa_row[:0], cmp_row[c0:c0 + tile], ori_flat, cmp_flat, cmp_block_table, block_size)
               for c0 in range(0, cmp_row.shape[0], tile)])


def _check_core_args(fn, q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                     attn_sink, num_tokens, rope_cos, rope_sin, cfg) -> None:
    """Shape / dtype validation shared by the attention goldens (raises BindError)."""
    H, hd, r, bs = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.block_size
    if q.dim() != 3:
        raise BindError(f"{fn}: q must be [T, {H}, {hd}], got {list(q.shape)}")
    T = q.shape[0]
    _check(fn, "q", q, (T, H, hd), "float")
    if ori_kv.dim() != 4:
        raise BindError(f"{fn}: ori_kv must be [pages, {bs}, 1, {hd}], got {list(ori_kv.shape)}")
    _check(fn, "ori_kv", ori_kv, (ori_kv.shape[0], bs, 1, hd), "float")
    if swa_indices.dim() != 2:
        raise BindError(f"{fn}: swa_indices must be [T, window], got {list(swa_indices.shape)}")
    _check(fn, "swa_indices", swa_indices, (T, swa_indices.shape[1]), "int")
    if cmp_kv.dim() != 4:
        raise BindError(f"{fn}: cmp_kv must be [cmp_pages, {bs}, 1, {hd}], got {list(cmp_kv.shape)}")
    _check(fn, "cmp_kv", cmp_kv, (cmp_kv.shape[0], bs, 1, hd), "float")
    if cmp_block_table.dim() != 1:
        raise BindError(f"{fn}: cmp_block_table must be rank 1, got {list(cmp_block_table.shape)}")
    _check(fn, "cmp_block_table", cmp_block_table, tuple(cmp_block_table.shape), "int")
    if cmp_indices.dim() != 2:
        raise BindError(f"{fn}: cmp_indices must be [T, topk], got {list(cmp_indices.shape)}")
    _check(fn, "cmp_indices", cmp_indices, (T, cmp_indices.shape[1]), "int")
    _check(fn, "attn_sink", attn_sink, (H,), "float")
    _check(fn, "rope_cos", rope_cos, (T, r), "float")
    _check(fn, "rope_sin", rope_sin, (T, r), "float")
    if not 0 <= int(num_tokens) <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")


def golden_attention_core(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, window] int32, physical flat rows, -1 invalid
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor,  # [cmp_pages] int32, logical page -> physical page
    cmp_indices: torch.Tensor,  # [T, index_topk] int32, logical compressed slots, -1 invalid
    attn_sink: torch.Tensor,  # [H] fp32
    num_tokens: int,
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16 per-token rows (full-width duplicated)
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    cfg: DeepSeekV4Config,
    *,
    key_tile: int | None = None,
    cmp_candidate_limit: int | None = None,
    out_bf16: bool = True,
    float32: bool = False,
    blocking: str = "packed",
) -> torch.Tensor:  # [T, H, head_dim] bf16 (fp32 if not out_bf16 or float32)
    """Sparse attention with sink and inverse RoPE, before the o-projection (pypto-lib `prefill_sparse_attn.py` steps 1-6).

    Per active token: :func:`gather_key_rows`, scores ``q . k * cfg.softmax_scale`` in FP32,
    online softmax over tiles of keys with BF16-rounded probabilities for PV (see the module
    docstring): ``blocking="packed"`` tiles the packed valid keys every ``key_tile`` rows (the
    reference golden's order, pypto-lib `prefill_sparse_attn.py`), ``"columns"`` runs the kernel's fixed column blocks
    (``key_tile`` window columns per block, then ``key_tile`` compressed columns per block,
    invalid keys dropped inside each block: the target-order emulation, since the BF16
    rounding of the probabilities depends on the block maxima). The two agree exactly when
    every block is full or the valid keys already fall into the same tiles (a full window).
    Then the sink in the denominator, then inverse interleaved RoPE
    (``rope_interleaved(..., inverse=True)``: ``e' = e*cos + o*sin``, ``o' = o*cos - e*sin``)
    on the trailing ``qk_rope_head_dim`` channels with the token's own cos/sin row. The kernel
    stores the result BF16 (``o_packed``), hence ``out_bf16``. Rows ``t >= num_tokens`` are
    zero; a token with no valid key gets a zero row.

    Args:
        q: ``[T, H, head_dim]`` roped, per-head-normed queries (BF16; FP32 allowed).
        ori_kv: ``[pages, block_size, 1, head_dim]`` raw / SWA paged cache.
        swa_indices: ``[T, window]`` INT32/INT64 physical flat rows of ``ori_kv``; < 0 invalid.
        cmp_kv: ``[cmp_pages, block_size, 1, head_dim]`` compressed paged cache.
        cmp_block_table: ``[n]`` INT32 logical -> physical compressed page (< 0 = none).
        cmp_indices: ``[T, topk]`` INT32 logical compressed slots; < 0 invalid.
        attn_sink: ``[H]`` FP32 per-head sink logits.
        num_tokens: active prefix, ``0 <= num_tokens <= T``.
        rope_cos, rope_sin: ``[T, rope_dim]`` per-token rows (layer's profile).
        cfg: model config (``head_dim``, heads, ``qk_rope_head_dim``, ``block_size``,
            ``softmax_scale``, ``sliding_window``).
        key_tile: gathered rows per softmax tile; default :func:`attn_key_tile`.
        cmp_candidate_limit: only the first N columns of ``cmp_indices`` are considered
            (the reference kernel uses 256); default all.
        out_bf16: round to BF16 (RNE) as the kernel stores it; ``False`` keeps FP32.
        float32: parity mode: FP32 probabilities in the PV product (no BF16 rounding) and
            an FP32 result (implies ``out_bf16=False``).
        blocking: ``"packed"`` (default) or ``"columns"``, see above.

    Returns:
        ``[T, H, head_dim]`` attention output after inverse RoPE.

    Raises:
        BindError: wrong shapes / dtypes, ``num_tokens`` out of range, an index outside
            its cache, or an unknown ``blocking``.
    """
    fn = "golden_attention_core"
    _check_core_args(fn, q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                     attn_sink, num_tokens, rope_cos, rope_sin, cfg)
    T, H, hd = q.shape
    n = cfg.nope_head_dim
    tile = attn_key_tile(cfg) if key_tile is None else int(key_tile)
    if tile <= 0:
        raise BindError(f"{fn}: key_tile must be positive, got {key_tile}")
    if blocking not in ("packed", "columns"):
        raise BindError(f"{fn}: blocking must be 'packed' or 'columns', got {blocking!r}")
    ori_flat = ori_kv.reshape(-1, hd).float()
    cmp_flat = cmp_kv.reshape(-1, hd).float()
    cmp_cols = cmp_indices if cmp_candidate_limit is None else cmp_indices[:, :cmp_candidate_limit]
    sink = attn_sink.float()
    out = torch.zeros(T, H, hd, dtype=torch.float32)
    for t in range(int(num_tokens)):
        tiles = _key_tiles(swa_indices[t], cmp_cols[t], ori_flat, cmp_flat, cmp_block_table, cfg.block_size,
                           tile, blocking)
        out[t] = _online_softmax_with_sink(q[t].float(), tiles, sink, cfg.softmax_scale, bf16_probs=not float32)
    nt = int(num_tokens)
    if nt:
        out[:nt, :, n:] = rope_interleaved(out[:nt, :, n:], rope_cos[:nt], rope_sin[:nt], inverse=True)
    return out.to(torch.bfloat16) if out_bf16 and not float32 else out


def golden_grouped_o_proj(
    o: torch.Tensor,  # [T, H, head_dim] bf16 (attention output after inverse RoPE)
    wo_a: torch.Tensor,  # [o_groups, o_lora, o_group_in] bf16
    wo_b: torch.Tensor,  # [D, o_groups*o_lora] int8 ("int8") | float ("bf16")
    wo_b_scale: torch.Tensor | None,  # [D] fp32 ("int8"); ignored for "bf16"
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
    float32: bool = False,
) -> torch.Tensor:  # [T, D] bf16 (fp32 if not out_bf16 or float32)
    """Grouped output projection (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py` step 7-8; transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``o`` is viewed ``[T, G, (H/G)*head_dim]`` (group g = consecutive heads, head-major);
    ``o_r[t, g] = o[t, g] @ wo_a[g]^T`` in FP32. ``"int8"``: ``codes, s = quantize_per_row_int8
    (o_r)`` per (token, group); ``out = sum_g float(codes[t, g] @ wo_b[:, g]^T) * s[t, g]``
    (integer GEMM exact, groups summed in order, FP32) then ``* wo_b_scale``. ``"bf16"``:
    ``out = bf16(o_r).flatten() @ wo_b^T`` in FP32 (with ``float32``: ``o_r`` not rounded).

    Args:
        o: ``[T, H, head_dim]`` float (the kernel's BF16 ``o_packed``).
        wo_a: ``[G, o_lora, o_group_in]`` float.
        wo_b: ``[D, G*o_lora]`` INT8 codes per output row, or float for ``"bf16"``.
        wo_b_scale: ``[D]`` FP32 (``"int8"`` only).
        cfg: model config.
        weight_format: ``"int8"`` or ``"bf16"``.
        out_bf16: BF16 (RNE) output; ``False`` keeps FP32.
        float32: parity mode: no BF16 rounding of ``o_r`` (``"bf16"`` format) and an FP32
            result (implies ``out_bf16=False``).

    Returns:
        ``[T, D]`` projection output.

    Raises:
        BindError: unknown ``weight_format`` or wrong shapes / dtypes.
    """
    fn = "golden_grouped_o_proj"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    G, Lo, gin, D = cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    H, hd = cfg.num_attention_heads, cfg.head_dim
    if o.dim() != 3:
        raise BindError(f"{fn}: o must be [T, {H}, {hd}], got {list(o.shape)}")
    T = o.shape[0]
    _check(fn, "o", o, (T, H, hd), "float")
    _check(fn, "wo_a", wo_a, (G, Lo, gin), "float")
    _check(fn, "wo_b", wo_b, (D, G * Lo), "int8" if weight_format == "int8" else "float")
    o_r = torch.einsum("tgk,gok->tgo", o.float().reshape(T, G, gin), wo_a.float())  # [T, G, Lo]
    if weight_format == "bf16":
        o_r_in = o_r if float32 else o_r.to(torch.bfloat16).float()
        out = o_r_in.reshape(T, G * Lo) @ wo_b.float().T
    else:
        if wo_b_scale is None:
            raise BindError(f"{fn}: wo_b_scale [{D}] is required for weight_format='int8'")
        _check(fn, "wo_b_scale", wo_b_scale, (D,), "float")
        codes, act_scale = quantize_per_row_int8(o_r)  # [T, G, Lo] int8, [T, G, 1]
        w = wo_b.double().reshape(D, G, Lo)
        out = torch.zeros(T, D, dtype=torch.float32)
        for g in range(G):
            partial = (codes[:, g].double() @ w[:, g].T).float()  # exact integer sums
            out = out + partial * act_scale[:, g]
        out = out * wo_b_scale.float()
    return out.to(torch.bfloat16) if out_bf16 and not float32 else out


def golden_prefill_sparse_attn(
    q: torch.Tensor,  # [T, H, head_dim] bf16
    ori_kv: torch.Tensor,  # [pages, block_size, 1, head_dim] bf16
    swa_indices: torch.Tensor,  # [T, window] int32 physical rows, -1 invalid
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    cmp_block_table: torch.Tensor,  # [cmp_pages] int32
    cmp_indices: torch.Tensor,  # [T, index_topk] int32 logical slots, -1 invalid
    attn_sink: torch.Tensor,  # [H] fp32
    num_tokens: int,
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    wo_a: torch.Tensor,  # [o_groups, o_lora, o_group_in] bf16
    wo_b: torch.Tensor,  # [D, o_groups*o_lora] int8 (bf16 for weight_format="bf16")
    wo_b_scale: torch.Tensor | None,  # [D] fp32
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
    key_tile: int | None = None,
    cmp_candidate_limit: int | None = None,
    float32: bool = False,
    blocking: str = "packed",
) -> torch.Tensor:  # [T, D] bf16 (fp32 if not out_bf16 or float32)
    """Prefill sparse attention + grouped o-projection golden (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`).

    :func:`golden_attention_core` (BF16, as the kernel's ``o_packed``) followed by
    :func:`golden_grouped_o_proj`; rows ``t >= num_tokens`` of the result are zero.
    Arguments are those of the two parts (same names); see their docstrings.
    ``float32=True`` (parity mode) is passed to both parts: no BF16 rounding of the
    probabilities, of ``o_packed``, of ``o_r`` or of the result.

    Returns:
        ``attn_out [T, D]`` BF16 (FP32 when ``out_bf16`` is False).

    Raises:
        BindError: see the two parts.
    """
    o = golden_attention_core(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices,
                              attn_sink, num_tokens, rope_cos, rope_sin, cfg, key_tile=key_tile,
                              cmp_candidate_limit=cmp_candidate_limit, out_bf16=True,
                              float32=float32, blocking=blocking)
    out = golden_grouped_o_proj(o, wo_a, wo_b, wo_b_scale, cfg, weight_format=weight_format,
                                out_bf16=out_bf16, float32=float32)
    out[int(num_tokens):] = 0
    return out


def make_sparse_attn_inputs(
    cfg: DeepSeekV4Config,
    T: int,
    num_tokens: int,
    seed: int,
    *,
    compress_ratio: int = 4,
    weight_format: str = "int8",
    start_pos: int | None = None,
) -> dict[str, torch.Tensor | int]:
    """Seeded standalone fixture for :func:`golden_prefill_sparse_attn`.

    Token ``t`` sits at position ``pos = start_pos + t`` with an identity raw block table.
    ``start_pos=None`` (default) is ``sliding_window``: every token has a full window,
    ``swa_indices[t]`` holds its ``window`` keys ``pos-window+1 .. pos`` as physical rows (every
    column valid), and the compressed candidates are ``n_cmp = 0`` for ratio 0, else
    ``min(index_topk, max(1, T // ratio))`` distinct random logical slots below ``n_cmp * 2``
    per token (rest -1). An explicit ``start_pos`` gives the causal layout of a chunk that
    starts there: ``valid = min(window, pos + 1)`` keys ``pos+1-valid .. pos`` in columns
    ``0 .. valid-1`` (rest -1, as :func:`build_window_indices` of the SWA layer), and the
    compressed entries visible at ``pos`` (``(pos + 1) // ratio`` of them, at most
    ``index_topk``, a random subset in random order) in the leading columns; so with
    ``start_pos=0`` and ratio 4, tokens 3 .. window-2 have a partial window and visible
    compressed entries. Compressed slots go through the permuted table
    ``cmp_block_table[b] = (b * 5 + 1) % cmp_pages`` (5 is coprime with every pool size
    used). ``q``, ``ori_kv``, ``cmp_kv`` ~ N(0, 1) (the kernels see RMS-normed rows);
    ``attn_sink`` ~ U(-1, 1); ``wo_a`` / ``wo_b`` ~ U(-1, 1) * fan_in^-0.5, ``wo_b``
    quantised per row for ``"int8"``; cos/sin rows from the ratio's RoPE profile, BF16.
    Rows ``t >= num_tokens`` of ``q`` are zero.

    Returns:
        dict keyed by the golden's argument names (``num_tokens`` as int).

    Raises:
        BindError: ``T`` not positive, ``num_tokens`` outside ``[0, T]``, pools too small.
        ConfigError: unknown compress ratio.
    """
    fn = "make_sparse_attn_inputs"
    if T <= 0 or not 0 <= num_tokens <= T:
        raise BindError(f"{fn}: need T > 0 and 0 <= num_tokens <= T, got T={T}, num_tokens={num_tokens}")
    profile = profile_for_ratio(compress_ratio)
    H, hd, bs, W = cfg.num_attention_heads, cfg.head_dim, cfg.block_size, cfg.sliding_window
    G, Lo, gin, D = cfg.o_groups, cfg.o_lora_rank, cfg.o_group_in, cfg.hidden_size
    pages, cpages = cfg.ori_kv_block_num, cfg.cmp_kv_block_num
    if start_pos is None and W + T > pages * bs:
        raise BindError(f"{fn}: window {W} + T {T} positions exceed the raw pool ({pages * bs} rows)")
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    q = torch.randn(T, H, hd, generator=gen)
    q[num_tokens:] = 0
    ori_kv = torch.randn(pages, bs, 1, hd, generator=gen)
    cmp_kv = torch.randn(cpages, bs, 1, hd, generator=gen)
    cmp_indices = torch.full((T, cfg.index_topk), -1, dtype=torch.int32)
    if start_pos is None:
        pos = W + torch.arange(T)
        swa = (pos[:, None] - W + 1 + torch.arange(W)[None, :]).to(torch.int32)  # identity table
        n_cmp = 0 if compress_ratio == 0 else min(cfg.index_topk, max(1, T // compress_ratio))
        if 2 * n_cmp > cpages * bs:
            raise BindError(f"{fn}: {2 * n_cmp} compressed slots exceed the pool ({cpages * bs})")
        for t in range(T):
            if n_cmp:
                cmp_indices[t, :n_cmp] = torch.randperm(2 * n_cmp, generator=gen)[:n_cmp].to(torch.int32)
    else:
        if start_pos < 0 or start_pos + T > pages * bs:
            raise BindError(f"{fn}: start_pos={start_pos} + T={T} positions outside the raw pool ({pages * bs} rows)")
        pos = start_pos + torch.arange(T)
        valid = torch.clamp(pos + 1, max=W)
        col = torch.arange(W)[None, :]
        swa = torch.where(col < valid[:, None], pos[:, None] + 1 - valid[:, None] + col, -1).to(torch.int32)
        if compress_ratio and (start_pos + T) // compress_ratio > cpages * bs:
            raise BindError(f"{fn}: {(start_pos + T) // compress_ratio} compressed slots exceed the pool "
                            f"({cpages * bs})")
        for t in range(T):
            n_vis = 0 if compress_ratio == 0 else (int(pos[t]) + 1) // compress_ratio
            n = min(cfg.index_topk, n_vis)
            if n:
                cmp_indices[t, :n] = torch.randperm(n_vis, generator=gen)[:n].to(torch.int32)
    cmp_block_table = ((torch.arange(cpages) * 5 + 1) % cpages).to(torch.int32)
    attn_sink = torch.rand(H, generator=gen) * 2 - 1
    wo_a = (torch.rand(G, Lo, gin, generator=gen) * 2 - 1) * gin ** -0.5
    wo_b_f = (torch.rand(D, G * Lo, generator=gen) * 2 - 1) * (G * Lo) ** -0.5
    if weight_format == "int8":
        wo_b, wo_b_scale = quantize_wo_b(wo_b_f)
    elif weight_format == "bf16":
        wo_b, wo_b_scale = wo_b_f.to(bf16), torch.ones(D, dtype=torch.float32)
    else:
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    cos_tab, sin_tab = rope_tables(cfg, profile, max_pos=int(pos[-1]) + 1)
    return {
        "q": q.to(bf16), "ori_kv": ori_kv.to(bf16), "swa_indices": swa,
        "cmp_kv": cmp_kv.to(bf16), "cmp_block_table": cmp_block_table, "cmp_indices": cmp_indices,
        "attn_sink": attn_sink, "num_tokens": int(num_tokens),
        "rope_cos": cos_tab[pos].to(bf16), "rope_sin": sin_tab[pos].to(bf16),
        "wo_a": wo_a.to(bf16), "wo_b": wo_b, "wo_b_scale": wo_b_scale,
    }


_SPEC_ORDER = ("q", "ori_kv", "swa_indices", "cmp_kv", "cmp_block_table", "cmp_indices", "attn_sink",
               "num_tokens", "rope_cos", "rope_sin", "wo_a", "wo_b", "wo_b_scale")


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of the ``prefill_sparse_attn`` case (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`).

    Mode ``"prefill"`` (``T = prefill_seq``, 128). Options: ``T``, ``num_tokens`` (default
    ``T``), ``compress_ratio`` (0, 4 or 128: how many compressed candidates the fixture gives
    each token, default 4), ``start_pos`` (default: full windows; an int gives the causal
    partial-window layout, see :func:`make_sparse_attn_inputs`), ``seed`` (default 0),
    ``weight_format`` (``"int8"``; ``"bf16"``: the unquantised o-projection, same tolerance). Inputs
    from :func:`make_sparse_attn_inputs`; the golden is :func:`golden_prefill_sparse_attn` with
    the kernel's column blocking (``blocking="columns"``), limited to the ``cmp_cols`` candidate
    columns the kernel attends (all of them at tiny); ``attn_out`` compares with
    ``ratio_allclose`` at :data:`TOLERANCES`.

    Raises:
        ConfigError: unknown preset, mode, option or compress ratio, or an untileable config.
        BindError: ``T`` / ``num_tokens`` out of range.
        CapacityError: ``T`` above the token capacity (before any input is built).
    """
    cfg = get_config(preset)
    if mode != "prefill":
        raise ConfigError(f"prefill_sparse_attn: unknown mode {mode!r}; modes: prefill")
    opts = dict(options)
    T = int(opts.pop("T", cfg.prefill_seq))
    num_tokens = int(opts.pop("num_tokens", T))
    ratio = int(opts.pop("compress_ratio", 4))
    start_pos = opts.pop("start_pos", None)
    start_pos = None if start_pos is None else int(start_pos)
    seed = int(opts.pop("seed", 0))
    wf = str(opts.pop("weight_format", "int8"))
    if opts:
        raise ConfigError(f"prefill_sparse_attn: unknown options {sorted(opts)}")
    cfg = with_weight_format(cfg, wf)
    check_token_capacity("prefill_sparse_attn", cfg, T)  # before any input is built
    k = prefill_sparse_attn_kernels(cfg)
    d = make_sparse_attn_inputs(cfg, T, num_tokens, seed, compress_ratio=ratio, start_pos=start_pos,
                                weight_format=wf)
    specs = []
    for name in _SPEC_ORDER:
        v = d[name]
        specs.append(ScalarSpec(name, torch.int32, v) if name == "num_tokens"
                     else TensorSpec(name, list(v.shape), v.dtype, v))
    specs.append(TensorSpec("attn_out", [T, cfg.hidden_size], torch.bfloat16, is_output=True))
    limit = k.tiling.cmp_cols

    def golden(v: dict) -> None:
        v["attn_out"] = golden_prefill_sparse_attn(*(v[n] for n in _SPEC_ORDER), cfg, cmp_candidate_limit=limit,
                                                   blocking="columns", weight_format=wf)

    return CaseRun(fn=k.prefill_sparse_attn_test, specs=specs, golden=golden,
                   compare={"attn_out": ratio_allclose(*TOLERANCES["attn_out"])}, rtol=1e-3, atol=1e-3,
                   label=f"prefill T={T} num_tokens={num_tokens} compress_ratio={ratio}"
                         + (" weight_format=bf16" if wf == "bf16" else ""))


register(KernelCase("prefill_sparse_attn", build_case, modes=("prefill",),
                    description="prefill sparse attention + sink + inverse RoPE + grouped INT8 o-proj, "
                                "pypto-lib's prefill_sparse_attn.py"))
