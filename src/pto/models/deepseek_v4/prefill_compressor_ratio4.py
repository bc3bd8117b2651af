"""CSA (ratio-4) KV compressor with overlapping windows, prefill; and the shared ratio-4 core.

Math (pypto-lib `models/deepseek/v4-flash/decode_compressor_ratio4.py`, `prefill_compressor_ratio4.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``m = 4``, ``c`` = entry width
(``head_dim`` for the main compressor, ``index_head_dim`` for the indexer's, pypto-lib `decode_indexer_compressor.py` / pypto-lib `prefill_indexer_compressor.py`):

    [Ca | Cb]  = x_t @ wkv^T ; [Za | Zb] = x_t @ wgate^T                  # FP32, [2c] each
    state[row(p_t)] = [Ca | Cb | Za + ape[p_t % 4, :c] | Zb + ape[p_t % 4, c:]]   # width 4c
    entry w (closed by the token at p = 4w + 3) pools 8 slots per channel:
        slots 0-3 = Ca, Za of positions 4w-4 .. 4w-1  (window w-1; score -inf when w = 0)
        slots 4-7 = Cb, Zb of positions 4w   .. 4w+3  (window w)
        pooled = sum_s softmax_s(Z) * C
        entry  = rmsnorm(pooled) * norm_w ; entry[c-r:] = rope(entry[c-r:], pos = 4w)

RoPE is the ``"compress"`` profile at the window *start* ``4w``. A missing previous window
(``w = 0``, or a negative block-table entry) has zero weight: its scores are ``-inf`` in the
golden and the most negative finite FP32 in the kernel, both give an exact 0 after the exp.

Shared core (:func:`ratio4_compress_tasks`): prefill and decode and both compressors (main
and indexer) run the same tasks; they differ only in how tokens map to requests and what
the finalize step writes. Tokens are request-major: ``state_block_table`` is ``[B, L]``
(prefill: ``B = 1``), token ``t`` belongs to request ``t // (T / B)``. The state page is 4
rows (one window), so window ``w`` of request ``b`` is physical page
``state_block_table[b, w]``. Tasks, with ``W`` write slots (closing tokens):

1. ``at`` ``<p>_write_map``: validates the active tokens and compacts the closing ones (token
   order) into ``write_pos_map`` / ``write_dst_map`` / ``write_req_map [1, W]`` INT32.
2. ``spmd`` ``<p>_kv_score_proj``: ``[PT, 64]`` FP32 tiles of ``x @ wkv^T`` and ``x @ wgate^T``.
3. ``spmd`` ``<p>_state_scatter``: every active token with a state row writes it.
4. ``spmd(W * c / 64)`` ``<p>_softmax_pool``: reads the 8 slots back from the state through the
   table (pooling after the scatter: a chunk's own rows come from the state like earlier
   ones, so chunks of any split give the same bits), softmax per channel over 8 slots.
5. ``at`` ``<p>_rmsnorm_rope``: RMSNorm * ``norm_w`` and RoPE at ``4w`` over the ``W_pad`` rows.
Then the caller's finalize (main: ``<p>_cache_write``, BF16 rint rows into ``cmp_kv``).

Scratch is uninitialised, as in the reference (pypto-lib `decode_compressor_ratio4.py` / pypto-lib `prefill_compressor_ratio4.py`: no seed task, no ``init_value``):
rows of ``pooled_kv_pad [W_pad, c]`` that no window writes (pad rows, slots without a
destination) stay undefined; RMSNorm, RoPE, the Hadamard product and the INT8 quantisation are
row-wise and only rows with a destination are stored, so nothing undefined reaches an output
(check mode verifies it). The ratio-128 compressor zeroes its pad (as pypto-lib's
prefill_compressor_ratio128.py does); here the
zero fill would only add an AICPU fill to the critical path.

Contract (``BindError`` from the write-map task, before any output is written): active
positions distinct and non-negative per request (a row with position -1 and both slots -1 is
an inactive decode request and is skipped); ``state_slot_mapping[t]`` is ``-1`` or
``table[b, p // 4] * 4 + p % 4``; ``cmp_slot_mapping[t] >= 0`` only on a closing token
(``(p + 1) % 4 == 0``), and then every position of its window is in the chunk with a state
row or before the chunk; no two pages of one call share a physical page. ``CapacityError``
when a call closes more windows than the declared ``max_cmp_writes``.

Deviations from the reference kernel (pypto-lib `prefill_compressor_ratio4.py`): any chunk length and start position (the
reference is static T = 128); the pool reads the chunk's own rows back from the state after
the scatter instead of overlaying them from the projections (same values: FP32 both ways),
so no ``pool_dep`` zero-read is needed; the pool is one 8-row column softmax instead of an
online softmax seeded with slot 7 (same math, different rounding order).
"""

import functools
from dataclasses import dataclass

import torch

import pto.language as pl
from pto.errors import BindError, CapacityError, ConfigError
from pto.golden import CaseRun, KernelCase, ScalarSpec, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.prefill_attention_swa import permuted_block_table
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved
from pto.models.deepseek_v4.rope import rope_tables
from pto.models.deepseek_v4.tiling import MATMUL_M_TILE, check_token_capacity, mode_tokens, round_up, token_capacity

__all__ = [
    "CSA_RATIO", "CSA_STATE_PAGE", "CSA_STATE_PAGES", "TOLERANCES", "Ratio4Tiling", "ratio4_tiling",
    "ratio4_compress_tasks", "rope_rotate_rows", "compressor_ratio4_inline", "compressor_ratio4_entry",
    "prefill_compressor_ratio4", "prefill_compressor_ratio4_entry",
    "ratio4_state_rows", "golden_ratio4_pool", "golden_prefill_compressor_ratio4", "ratio4_fixture",
    "make_prefill_compressor_ratio4_inputs", "ratio4_specs", "ratio4_case", "prefill_case_tokens", "build_prefill_compressor_ratio4",
]

CSA_RATIO = 4  # tokens per compressed entry (ratio-4 layers); also ape rows
CSA_STATE_PAGE = 4  # compressor-state page rows: one window (pypto-lib `models/deepseek/v4-flash/config.py`)
CSA_STATE_PAGES = 65  # physical state pages of the fixtures (CSA state 65 pages, reference)
FP32_MAX = float(torch.finfo(torch.float32).max)

# ratio_allclose (atol, rtol, max_error_ratio) per output (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio4.py`; the pypto-lib tests' tolerances)
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")  # requests (prefill: 1)
STATE_PAGES_DYN = pl.dynamic("STATE_PAGES")
STATE_TABLE_DYN = pl.dynamic("STATE_TABLE_LEN")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
CMP_PAGES_DYN = pl.dynamic("CMP_PAGES")
D_DYN = pl.dynamic("D")  # hidden size (checked against cfg)

C4_PROJ_T_TILE = 128  # token rows of a projection tile (fewer for short calls: round_up(T, 16))
C4_PROJ_N_TILE = 64  # kv (and score) columns per projection block
C4_PROJ_K_TILE = 512  # reduction chunk (pypto-lib `prefill_compressor_ratio4.py`: K = 4096 in 8 chunks)
C4_SCATTER_T_TILE = 16  # tokens per state-scatter block
C4_POOL_H_TILE = 64  # channels per softmax-pool block
C4_RMS_TILE = 8  # row granule of the pooled / normed pads


@dataclass(frozen=True)
class Ratio4Tiling:
    """Tile sizes of the ratio-4 core for one entry width.

    Attributes:
        width: entry width ``c`` (``head_dim`` or ``index_head_dim``); the state row is ``4c``.
        proj_n, proj_k: projection block columns (``min(64, 2c)``) and reduction chunk.
        pool_h: channels per pool block (``min(64, c)``).
        max_cmp_writes: declared capacity of closing tokens per call
            (default ``token_capacity(cfg) / 4`` = 32: a 128-token chunk closes at most 32).
        pad_capacity: ``round_up(max_cmp_writes, 8)`` rows of the pooled / normed pads.
    """

    width: int
    proj_n: int
    proj_k: int
    pool_h: int
    max_cmp_writes: int

    @property
    def pad_capacity(self) -> int:
        """Row capacity of the pooled / normed pads."""
        return round_up(self.max_cmp_writes, C4_RMS_TILE)


def ratio4_tiling(cfg: DeepSeekV4Config, width: int, max_cmp_writes: int | None = None) -> Ratio4Tiling:
    """Derive and validate the ratio-4 core's tiles for entry width ``width``.

    Raises:
        ConfigError: ``width`` not a multiple of the pool tile or smaller than the RoPE slice,
            ``hidden_size`` not a multiple of the reduction chunk, ``max_cmp_writes < 1``.
    """
    D, r = cfg.hidden_size, cfg.qk_rope_head_dim

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"ratio-4 compressor: config {cfg.name!r} cannot be tiled: {msg}")

    proj_n, proj_k, pool_h = min(C4_PROJ_N_TILE, 2 * width), min(C4_PROJ_K_TILE, D), min(C4_POOL_H_TILE, width)
    need(width > 0 and (2 * width) % proj_n == 0 and width % pool_h == 0,
         f"entry width {width} is not a multiple of the tiles {proj_n // 2} / {pool_h}")
    need(D % proj_k == 0, f"hidden_size={D} is not a multiple of the reduction chunk {proj_k}")
    need(0 < r <= width and r % 2 == 0, f"qk_rope_head_dim={r} must be even and in (0, {width}]")
    if max_cmp_writes is None:
        max_cmp_writes = token_capacity(cfg) // CSA_RATIO
    need(isinstance(max_cmp_writes, int) and max_cmp_writes >= 1,
         f"max_cmp_writes={max_cmp_writes!r} must be a positive int")
    return Ratio4Tiling(width, proj_n, proj_k, pool_h, max_cmp_writes)


def _bind(kernel: str, msg: str) -> BindError:
    return BindError(f"kernel {kernel}: {msg}")


def _leading(slots: list[int]) -> bool:
    """Whether ascending write-map slot numbers ``slots`` are ``0, 1, ..., len - 1``, not none:
    the slots with a destination come first, as the write map lays them out."""
    return bool(slots) and slots[-1] == len(slots) - 1


def _scan_tokens(kernel, nt, S, pos_t, cmp_t, slot_t, table, n_state_rows, n_cmp_rows, rope_rows, n_writes):
    """Write-map task body: validate the active tokens, return the closing ones as
    ``[(position, cmp destination, request), ...]`` in token order (scalar reads)."""
    m = CSA_RATIO
    L = pl.tensor.dim(table, 1)
    seen, owner, chunk, closing, first = set(), {}, set(), [], {}
    pos, dsts, slots = pl.read_values(pos_t, [0], nt), pl.read_values(cmp_t, [0], nt), pl.read_values(slot_t, [0], nt)
    pos, dsts, slots = [int(v) for v in pos], [int(v) for v in dsts], [int(v) for v in slots]
    # the state page of every token with a state row, read in token order in one call (the reads
    # the checks below would make one by one: pl.read_elements keeps their footprints and loads)
    want = [(t // S, p // m) for t, (p, dst, slot) in enumerate(zip(pos, dsts, slots))
            if slot >= 0 and p >= 0 and p // m < L]
    pages = iter(pl.read_elements(table, want))
    for t, (p, dst, slot) in enumerate(zip(pos, dsts, slots)):
        b = t // S
        if p < 0 and dst < 0 and slot < 0:
            continue  # an inactive request's row (decode_metadata: position -1, no slots)
        if p < 0 or (b, p) in seen:
            raise _bind(kernel, f"token {t}: position {p} is negative or repeats in request {b}")
        seen.add((b, p))
        first[b] = min(first.get(b, p), p)
        closes = (p + 1) % m == 0
        if dst >= 0 and not closes:
            raise _bind(kernel, f"token {t} at position {p} has cmp_slot_mapping {dst} but does not close a "
                                f"{m}-token window")
        if dst >= n_cmp_rows or slot >= n_state_rows:
            raise _bind(kernel, f"token {t}: cmp slot {dst} / state slot {slot} outside its tensor "
                                f"({n_cmp_rows} / {n_state_rows} rows)")
        if slot >= 0:
            blk = p // m
            phys = int(next(pages)) if blk < L else -1
            if phys < 0 or slot != phys * m + p % m:
                raise _bind(kernel, f"state_slot_mapping[{t}] = {slot} is not the state row of position {p} "
                                    f"through state_block_table[{b}] (page {blk} -> {phys})")
            if owner.setdefault(phys, (b, blk)) != (b, blk):
                raise _bind(kernel, f"state pages {owner[phys]} and {(b, blk)} share physical page {phys} "
                                    "in one call")
            chunk.add((b, p))
        if closes:
            closing.append((p, dst, b))
    if len(closing) > n_writes:
        raise CapacityError(f"kernel {kernel}: {len(closing)} active tokens close a window, the write maps "
                            f"hold {n_writes}")
    want = []  # the pages of the windows the pool reads (checked first, then read in one call)
    for p, dst, b in closing:
        if dst < 0:
            continue
        w = p // m
        if 4 * w >= rope_rows:
            raise _bind(kernel, f"window start {4 * w} past the RoPE tables ({rope_rows} rows)")
        for q in range(4 * w, p + 1):
            if q >= first[b] and (b, q) not in chunk:
                raise _bind(kernel, f"position {q} of the window closing at {p} (request {b}) is in this call "
                                    "without a state row (the pool reads it back from the state)")
        want += [(b, blk) for blk in (w - 1, w) if blk >= 0]
    for (b, blk), phys in zip(want, pl.read_elements(table, want)):
        phys = int(phys)
        if phys >= 0 and owner.get(phys, (b, blk)) != (b, blk):
            raise _bind(kernel, f"window page {blk} of request {b} reads physical page {phys}, which "
                                f"this call overwrites with page {owner[phys]}")
    return closing


def rope_rotate_rows(y, cos_w, sin_w, n_nope: int, r: int):
    """``y [M, c]`` FP32 with interleaved RoPE applied to columns ``n_nope ..`` (forward
    rotation, ``cos_w`` / ``sin_w [M, r]`` FP32 full-width rows); returns the new tile."""
    j = pl.arange(0, [1, r], pl.INT32)
    half = pl.cast(pl.cast(j, pl.FP32) * 0.5, pl.INT32, mode="trunc")  # j >> 1
    parity = j - half * 2
    partner = j + 1 - parity * 2  # j ^ 1
    sign = pl.cast(parity * 2 - 1, pl.FP32)  # -1 on even channels, +1 on odd
    rows = y.shape[0]
    x_rope = pl.slice(y, [rows, r], [0, n_nope])
    rotated = (x_rope * pl.gather(cos_w, index=half)
               + pl.col_expand_mul(pl.gather(x_rope, index=partner), sign) * pl.gather(sin_w, index=half))
    return pl.assemble(y, rotated, [0, n_nope])


def ratio4_compress_tasks(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table,
                          position_ids, num_tokens, cmp_slot_mapping, state_slot_mapping, n_cmp_rows: int,
                          cfg, tl: Ratio4Tiling, prefix: str):
    """Tasks 1-5 of the ratio-4 core (module docstring); called inside a kernel body.

    Args:
        x: ``[T, hidden_size]`` BF16 GM tensor; compress_state ``[pages, 4, 4c]`` FP32
            (written); state_block_table ``[B, L]`` INT32; wkv, wgate ``[2c, D]`` BF16; ape
            ``[4, 2c]`` FP32; norm_w ``[c]`` BF16; cos/sin ``[P, r]`` BF16; position_ids,
            cmp_slot_mapping, state_slot_mapping ``[T]`` (INT32, INT64, INT64).
        n_cmp_rows: rows of the destination cache (bounds of ``cmp_slot_mapping``).
        tl: :func:`ratio4_tiling` for width ``c``; prefix: task-name prefix.

    Returns:
        ``(normed_kv_pad [W_pad, c] FP32, write_dst_map [1, W] INT32, W)``: row ``i`` of the
        pad is the finished entry of write slot ``i`` when ``write_dst_map[0, i] >= 0``.

    Raises:
        BindError: shapes that do not match ``cfg`` / ``tl``, ``T`` not a multiple of ``B``,
            ``num_tokens`` outside ``[0, T]``, or a contract violation (write-map task).
        CapacityError: the call can close more windows than ``tl.max_cmp_writes``.
    """
    kernel = prefix
    m, c, D, r = CSA_RATIO, tl.width, cfg.hidden_size, cfg.qk_rope_head_dim
    t_len = pl.tensor.dim(x, 0)
    B = pl.tensor.dim(state_block_table, 0)
    sp, rope_rows = compress_state.shape[0], cos_table.shape[0]
    for name, ten, want in (("x", x, [t_len, D]), ("compress_state", compress_state, [sp, m, 4 * c]),
                            ("wkv", wkv, [2 * c, D]), ("wgate", wgate, [2 * c, D]), ("ape", ape, [m, 2 * c]),
                            ("norm_w", norm_w, [c]), ("cos_table", cos_table, [rope_rows, r]),
                            ("sin_table", sin_table, [rope_rows, r])):
        if list(ten.shape) != want:
            raise _bind(kernel, f"parameter {name!r} is {list(ten.shape)}, config {cfg.name!r} needs {want}")
    if t_len < 1 or B < 1 or t_len % B:
        raise _bind(kernel, f"T={t_len} tokens must be >= 1 and a multiple of the B={B} requests")
    S = t_len // B
    nt = int(num_tokens)
    if not 0 <= nt <= t_len:
        raise _bind(kernel, f"num_tokens={nt} outside [0, T={t_len}]")
    n_writes = B * -(-S // m)  # windows B requests of S consecutive tokens can close
    if n_writes > tl.max_cmp_writes:
        raise CapacityError(f"kernel {kernel}: a call of T={t_len} tokens ({B} requests) can close {n_writes} "
                            f"windows, but the write maps / pooled pad hold max_cmp_writes={tl.max_cmp_writes} "
                            "(declared capacity)")
    w_pad = round_up(n_writes, C4_RMS_TILE)
    state_rows = pl.reshape(compress_state, [sp * m, 4 * c])
    norm_w_row = pl.reshape(norm_w, [1, c])

    write_pos_map = pl.create_tensor([1, n_writes], pl.INT32, capacity=[None, tl.max_cmp_writes])
    write_dst_map = pl.create_tensor([1, n_writes], pl.INT32, capacity=[None, tl.max_cmp_writes])
    write_req_map = pl.create_tensor([1, n_writes], pl.INT32, capacity=[None, tl.max_cmp_writes])
    kv_proj = pl.create_tensor([t_len, 2 * c], pl.FP32)
    score_proj = pl.create_tensor([t_len, 2 * c], pl.FP32)
    pooled_kv_pad = pl.create_tensor([w_pad, c], pl.FP32, capacity=[tl.pad_capacity])  # rows w/o a window: undefined
    normed_kv_pad = pl.create_tensor([w_pad, c], pl.FP32, capacity=[tl.pad_capacity])

    with pl.at(level=pl.Level.CORE_GROUP, name_hint=f"{prefix}_write_map"):
        closing = []
        if nt > 0:
            closing = _scan_tokens(kernel, nt, S, position_ids[0:nt], cmp_slot_mapping[0:nt],
                                   state_slot_mapping[0:nt], state_block_table, sp * m, n_cmp_rows, rope_rows,
                                   n_writes)
        pos_map = pl.write_values(pl.full([1, n_writes], pl.INT32, 0), [0, 0], [p for p, _, _ in closing])
        dst_map = pl.write_values(pl.full([1, n_writes], pl.INT32, -1), [0, 0], [dst for _, dst, _ in closing])
        req_map = pl.write_values(pl.full([1, n_writes], pl.INT32, 0), [0, 0], [b for _, _, b in closing])
        write_pos_map[0:1, 0:n_writes] = pos_map
        write_dst_map[0:1, 0:n_writes] = dst_map
        write_req_map[0:1, 0:n_writes] = req_map

    PH = tl.pool_h
    PT, PN, PK = min(C4_PROJ_T_TILE, round_up(t_len, MATMUL_M_TILE)), tl.proj_n, tl.proj_k
    n_col = 2 * c // PN

    for blk in pl.spmd(-(-t_len // PT) * n_col, name_hint=f"{prefix}_kv_score_proj"):
        r0, c0 = (blk // n_col) * PT, (blk % n_col) * PN
        rows = min(PT, t_len - r0)
        # the block's x rows and its wkv / wgate rows loaded once (BF16), the weight rows side
        # by side in one [2 * PN, D] tile (wkv rows 0..PN-1, wgate rows PN..2PN-1): each K chunk is
        # one [PT, PK] x [PK, 2 * PN] product whose columns 0..PN-1 are kv and PN.. the score
        # (the same FP32 sums, column by column, as two [PT, PN] products)
        x_rows = pl.slice(x, [PT, D], [r0, 0], valid_shape=[rows, D])
        w_rows = pl.slice(wkv, [2 * PN, D], [c0, 0], valid_shape=[PN, D])  # wkv rows, then room for wgate's
        w_rows[PN:2 * PN, 0:D] = wgate[c0:c0 + PN, 0:D]
        w_rows = pl.set_validshape(w_rows, 2 * PN, D)
        acc = None
        for kc in pl.range(D // PK):
            k0 = kc * PK
            if acc is None:
                acc = pl.matmul(x_rows[:, k0:k0 + PK], w_rows[:, k0:k0 + PK], b_trans=True)
            else:
                acc = pl.matmul_acc(acc, x_rows[:, k0:k0 + PK], w_rows[:, k0:k0 + PK], b_trans=True)
        pl.assemble(kv_proj, pl.set_validshape(acc[:, 0:PN], rows, PN), [r0, c0])
        pl.assemble(score_proj, pl.set_validshape(acc[:, PN:2 * PN], rows, PN), [r0, c0])

    ST = C4_SCATTER_T_TILE
    for blk in pl.spmd(-(-t_len // ST), name_hint=f"{prefix}_state_scatter"):
        t0 = blk * ST
        active = min(ST, nt - t0)
        if active <= 0:
            continue
        kv_t = pl.slice(kv_proj, [ST, 2 * c], [t0, 0], valid_shape=[active, 2 * c])
        slot_t = pl.slice(state_slot_mapping, [ST], [t0], valid_shape=[active])
        pos_t = pl.slice(position_ids, [ST], [t0], valid_shape=[active])
        slots, positions = pl.read_values(slot_t, [0], active), pl.read_values(pos_t, [0], active)
        keep = [i for i in range(active) if slots[i] >= 0]  # a token with slot -1 has no state row
        if not keep:
            continue
        dst = [slots[i] for i in keep]
        # the kept tokens' kv rows, then their score rows + ape[pos % 4]: the score rows and the ape
        # rows gathered as [k, 2c] tiles (one GM load per run of consecutive rows), one add, each
        # row stored into its state slot (pl.store_rows: the one-row stores in one call)
        pl.store_rows(state_rows, dst, kv_t, 0, src_rows=keep)
        scored = (pl.gather_rows(score_proj, [t0 + i for i in keep], 0, 2 * c)
                  + pl.gather_rows(ape, [positions[i] % m for i in keep], 0, 2 * c))
        pl.store_rows(state_rows, dst, scored, 2 * c)

    n_head = c // PH
    for blk in pl.spmd(n_writes * n_head, name_hint=f"{prefix}_softmax_pool"):
        i, h0 = blk // n_head, (blk % n_head) * PH
        if pl.read(write_dst_map, [0, i]) < 0:
            continue  # no window, or its destination is -1: the pad row is never stored
        w = pl.read(write_pos_map, [0, i]) // m
        b = pl.read(write_req_map, [0, i])
        kv8 = pl.full([2 * m, PH], pl.FP32, 0.0)
        score8 = pl.full([2 * m, PH], pl.FP32, -FP32_MAX)  # a missing previous window has weight 0
        prev = pl.read(state_block_table, [b, w - 1]) if w >= 1 else -1
        if prev >= 0:  # slots 0-3: window w-1, front halves
            kv8 = pl.assemble(kv8, state_rows[prev * m:prev * m + m, h0:h0 + PH], [0, 0])
            score8 = pl.assemble(score8, state_rows[prev * m:prev * m + m, 2 * c + h0:2 * c + h0 + PH], [0, 0])
        cur = pl.read(state_block_table, [b, w])  # slots 4-7: window w, back halves
        kv8 = pl.assemble(kv8, state_rows[cur * m:cur * m + m, c + h0:c + h0 + PH], [m, 0])
        score8 = pl.assemble(score8, state_rows[cur * m:cur * m + m, 3 * c + h0:3 * c + h0 + PH], [m, 0])
        e = pl.col_expand_expdif(score8, pl.col_max(score8))
        weights = pl.col_expand_div(e, pl.col_sum(e))  # softmax over the 8 slots, per channel
        pooled_kv_pad[i:i + 1, h0:h0 + PH] = pl.col_sum(weights * kv8)

    with pl.at(level=pl.Level.CORE_GROUP, name_hint=f"{prefix}_rmsnorm_rope"):
        pooled = pooled_kv_pad[0:w_pad, 0:c]
        inv = pl.rsqrt(pl.row_sum(pooled * pooled) / float(c) + cfg.rms_norm_eps)  # [w_pad, 1]
        y = pl.col_expand_mul(pl.row_expand_mul(pooled, inv), pl.cast(norm_w_row[0:1, 0:c], pl.FP32))
        cos_w = pl.full([w_pad, r], pl.FP32, 0.0)
        sin_w = pl.full([w_pad, r], pl.FP32, 0.0)
        dsts = pl.read_values(write_dst_map, [0, 0], n_writes)
        kept = [i for i in range(n_writes) if dsts[i] >= 0]
        if _leading(kept):
            # the usual case, the slots with a destination first: their window starts 4w read at
            # once, the table rows gathered as one [k, r] tile each (a GM load per row, as one load
            # per slot) and cast once, set at row 0
            starts = [p + 1 - m for p in pl.read_values(write_pos_map, [0, 0], len(kept))]  # RoPE at 4w
            cos_w = pl.assemble(cos_w, pl.cast(pl.gather_rows(cos_table, starts, 0, r), pl.FP32), [0, 0])
            sin_w = pl.assemble(sin_w, pl.cast(pl.gather_rows(sin_table, starts, 0, r), pl.FP32), [0, 0])
        else:
            for i in kept:
                w0 = pl.read(write_pos_map, [0, i]) + 1 - m  # RoPE at the window start 4w
                cos_w = pl.assemble(cos_w, pl.cast(cos_table[w0:w0 + 1, 0:r], pl.FP32), [i, 0])
                sin_w = pl.assemble(sin_w, pl.cast(sin_table[w0:w0 + 1, 0:r], pl.FP32), [i, 0])
        normed_kv_pad[0:w_pad, 0:c] = rope_rotate_rows(y, cos_w, sin_w, c - r, r)
    return normed_kv_pad, write_dst_map, n_writes


def ratio4_cache_write(normed_kv_pad, write_dst_map, n_writes: int, cmp_kv, width: int, prefix: str):
    """Finalize of the main compressor: ``cmp_kv`` flat row ``dst`` = BF16 (``rint``) of pad
    row ``i`` for every write slot with a destination (one ``at`` task ``<prefix>_cache_write``)."""
    cmp_rows = pl.reshape(cmp_kv, [cmp_kv.shape[0] * cmp_kv.shape[1], width])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint=f"{prefix}_cache_write"):
        kept = [(i, dst) for i, dst in enumerate(pl.read_values(write_dst_map, [0, 0], n_writes)) if dst >= 0]
        if _leading([i for i, _ in kept]):
            # the slots with a destination first (the usual case): their pad rows as one load and
            # one cast, then one row store each
            pl.store_rows(cmp_rows, [dst for _, dst in kept],
                          pl.cast(normed_kv_pad[0:len(kept), 0:width], pl.BF16, mode="rint"))
        else:
            # per kept slot: its pad row loaded and cast (one load, one cast), then one row store each
            pl.store_rows(cmp_rows, [dst for _, dst in kept],
                          [pl.cast(normed_kv_pad[i:i + 1, 0:width], pl.BF16, mode="rint") for i, _ in kept])


def _check_cache(kernel: str, cache, cfg, width: int) -> None:
    want = [cache.shape[0], cfg.block_size, 1, width]
    if list(cache.shape) != want:
        raise _bind(kernel, f"compressed cache is {list(cache.shape)}, config {cfg.name!r} needs {want}")


def _table_dims(mode: str, length=STATE_TABLE_DYN) -> list:
    """Block-table dims of a mode: prefill one request ``[L]``, decode ``[B, L]`` (``L`` the
    dynamic dim ``length``)."""
    if mode not in ("prefill", "decode"):
        raise ConfigError(f"CSA kernels: unknown mode {mode!r}; modes: prefill, decode")
    return [length] if mode == "prefill" else [B_DYN, length]


def compressor_ratio4_inline(mode: str):
    """The ``@pl.jit.inline`` main CSA compressor of ``mode`` (``prefill_compressor_ratio4`` /
    ``decode_compressor_ratio4``): one body, the table shape and task prefix per mode."""
    name, prefix = f"{mode}_compressor_ratio4", f"{mode}_c4"

    @pl.jit.inline
    def compressor_ratio4(
        x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
        compress_state: pl.InOut[pl.Tensor],
        state_block_table: pl.Tensor[_table_dims(mode), pl.INT32],
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
    ):
        """CSA main KV compressor over one call (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio4.py` prefill / `decode_compressor_ratio4.py` decode,
        generalised).

        Shapes (``d = head_dim``): compress_state ``[pages, 4, 4d]`` FP32 (kv a | kv b | score a
        | score b); state_block_table ``[L]`` INT32 (prefill: one request) or ``[B, L]`` (decode:
        one row per request, ``T`` a multiple of ``B``); wkv / wgate ``[2d, D]`` BF16; ape
        ``[4, 2d]`` FP32; norm_w ``[d]`` BF16; cos / sin ``[P, qk_rope_head_dim]`` BF16
        compress tables; cmp_kv ``[cmp_pages, block_size, 1, d]`` BF16. Any ``T >= 1``, any
        start positions. Math, tasks and contract: module docstring
        (:func:`golden_prefill_compressor_ratio4` is the contract).

        Returns:
            ``(cmp_kv, compress_state)``.

        Raises:
            ConfigError, BindError, CapacityError: see :func:`ratio4_compress_tasks`.
        """
        tl = ratio4_tiling(cfg, cfg.head_dim, max_cmp_writes)
        table2 = pl.reshape(state_block_table, [1, pl.tensor.dim(state_block_table, 0)]) if mode == "prefill" \
            else state_block_table
        _check_cache(name, cmp_kv, cfg, cfg.head_dim)
        normed, dst_map, n_writes = ratio4_compress_tasks(
            x, compress_state, table2, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids, num_tokens,
            cmp_slot_mapping, state_slot_mapping, cmp_kv.shape[0] * cmp_kv.shape[1], cfg, tl, prefix)
        ratio4_cache_write(normed, dst_map, n_writes, cmp_kv, cfg.head_dim, prefix)
        return cmp_kv, compress_state

    compressor_ratio4.__name__ = compressor_ratio4.__qualname__ = name
    return compressor_ratio4


prefill_compressor_ratio4 = compressor_ratio4_inline("prefill")


@functools.lru_cache(maxsize=None)
def compressor_ratio4_entry(cfg: DeepSeekV4Config, mode: str, max_cmp_writes: int | None = None):
    """The ``@pl.jit`` test entry ``<mode>_compressor_ratio4_test`` for ``cfg``: parameters as
    :func:`compressor_ratio4_inline` with the model dims static; returns ``(cmp_kv,
    compress_state)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled, or an unknown mode.
    """
    tl = ratio4_tiling(cfg, cfg.head_dim, max_cmp_writes)
    D, d, r, bs = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim, cfg.block_size
    body = compressor_ratio4_inline(mode)

    @pl.jit
    def compressor_ratio4_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, CSA_STATE_PAGE, 4 * d], pl.FP32]],
        state_block_table: pl.Tensor[_table_dims(mode), pl.INT32],
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
        return body(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, cmp_kv,
                    position_ids, num_tokens, cmp_slot_mapping, state_slot_mapping, cfg, tl.max_cmp_writes)

    compressor_ratio4_test.__name__ = compressor_ratio4_test.__qualname__ = f"{mode}_compressor_ratio4_test"
    return compressor_ratio4_test


def prefill_compressor_ratio4_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None):
    """:func:`compressor_ratio4_entry` of mode ``prefill``."""
    return compressor_ratio4_entry(cfg, "prefill", max_cmp_writes)
# ---- end kernel ----


def ratio4_state_rows(
    x: torch.Tensor,  # [T, D] bf16
    wkv: torch.Tensor,  # [2c, D] bf16
    wgate: torch.Tensor,  # [2c, D] bf16
    ape: torch.Tensor,  # [4, 2c] fp32
    positions: torch.Tensor,  # [T] int
    float32: bool = False,
) -> torch.Tensor:  # [T, 4c] fp32
    """State rows ``[x @ wkv^T | x @ wgate^T + ape[pos % 4]]``: projections accumulated in FP64
    and rounded once to FP32 (independent of how many rows are multiplied at once, so a split
    chunk reproduces one call bit for bit); ``ape`` added in FP32. ``float32`` (parity mode)
    multiplies in FP32 as an FP32 model does."""
    if float32:
        kv, score = x.float() @ wkv.float().T, x.float() @ wgate.float().T
    else:
        xd = x.double()
        kv, score = (xd @ wkv.double().T).float(), (xd @ wgate.double().T).float()
    return torch.cat([kv, score + ape.float()[positions.long() % CSA_RATIO]], dim=-1)


def golden_ratio4_pool(
    state_flat: torch.Tensor,  # [rows, 4c] fp32 state after this call's scatter
    table: torch.Tensor,  # [B, L] int state block table
    req: torch.Tensor,  # [W] int request of each closing token
    pos: torch.Tensor,  # [W] int position of each closing token
    norm_w: torch.Tensor,  # [c]
    cos_table: torch.Tensor,  # [P, r]
    sin_table: torch.Tensor,  # [P, r]
    eps: float,
) -> torch.Tensor:  # [W, c] fp32
    """The 8-slot overlapping pool, RMSNorm and RoPE of closing tokens ``(req, pos)``, all at
    once (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; module docstring). Slots 0-3 (window ``w-1``, front halves) have
    score ``-inf`` when ``w = 0`` or their page is negative."""
    c = state_flat.shape[1] // 4
    r = cos_table.shape[1]
    m = CSA_RATIO
    w = pos // m
    lane = torch.arange(m)
    cur = state_flat[(table[req, w].long() * m)[:, None] + lane]  # [W, 4, 4c]
    prev_page = torch.where(w >= 1, table[req, (w - 1).clamp(min=0)].long(), torch.full_like(w, -1))
    prev = state_flat[(prev_page.clamp(min=0) * m)[:, None] + lane]
    has_prev = (prev_page >= 0)[:, None, None]
    kv8 = torch.cat([torch.where(has_prev, prev[..., :c], 0.0), cur[..., c:2 * c]], dim=1)  # [W, 8, c]
    score8 = torch.cat([torch.where(has_prev, prev[..., 2 * c:3 * c], -torch.inf), cur[..., 3 * c:]], dim=1)
    pooled = (torch.softmax(score8, dim=1) * kv8).sum(dim=1)  # [W, c]
    entry = pooled * torch.rsqrt(pooled.square().mean(dim=-1, keepdim=True) + eps) * norm_w.float()
    start = (w * m).long()
    entry[:, c - r:] = rope_interleaved(entry[:, c - r:], cos_table[start].float(), sin_table[start].float())
    return entry


def golden_ratio4_compress(x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table,
                           position_ids, num_tokens, cmp_slot_mapping, state_slot_mapping, cfg, fn: str,
                           float32: bool = False):
    """Shared golden of the ratio-4 core: returns ``(entries [W, c] fp32, dst [W] int64,
    state_out)`` for the closing active tokens with a destination (token order). Tokens are
    request-major over ``state_block_table [B, L]``.

    Raises:
        BindError: ``num_tokens`` outside ``[0, T]``, ``T`` not a multiple of ``B``, shapes
            inconsistent with ``ape``, a destination on a token that does not close a window.
    """
    T = x.shape[0]
    table = state_block_table.reshape(-1, state_block_table.shape[-1]).long()
    B = table.shape[0]
    nt = int(num_tokens)
    if not 0 <= nt <= T or T % B:
        raise BindError(f"{fn}: need 0 <= num_tokens <= T and T a multiple of B, got num_tokens={nt}, T={T}, B={B}")
    c = ape.shape[1] // 2
    if tuple(compress_state.shape[1:]) != (CSA_STATE_PAGE, 4 * c) or tuple(wkv.shape) != (2 * c, x.shape[1]):
        raise BindError(f"{fn}: compress_state {list(compress_state.shape)} / wkv {list(wkv.shape)} do not match "
                        f"entry width {c}")
    pos = position_ids[:nt].long()
    dst = cmp_slot_mapping[:nt].long()
    closes = ((pos + 1) % CSA_RATIO == 0) & (pos >= 0)  # position -1: an inactive decode request
    if bool(((dst >= 0) & ~closes).any()):
        raise BindError(f"{fn}: a cmp_slot_mapping >= 0 on a token that does not close a {CSA_RATIO}-token window")
    rows = ratio4_state_rows(x[:nt], wkv, wgate, ape, pos, float32)
    state_out = compress_state.clone()
    flat = state_out.view(-1, 4 * c)
    slots = state_slot_mapping[:nt].long()
    keep = slots >= 0
    flat[slots[keep]] = rows[keep]
    sel = dst >= 0
    req = torch.arange(nt) // (T // B)
    entries = golden_ratio4_pool(flat, table, req[sel], pos[sel], norm_w, cos_table, sin_table, cfg.rms_norm_eps)
    return entries, dst[sel], state_out


def golden_prefill_compressor_ratio4(
    x: torch.Tensor,  # [T, D] bf16
    compress_state: torch.Tensor,  # [pages, 4, 4*head_dim] fp32
    state_block_table: torch.Tensor,  # [L] int32
    wkv: torch.Tensor,  # [2*head_dim, D] bf16
    wgate: torch.Tensor,  # [2*head_dim, D] bf16
    ape: torch.Tensor,  # [4, 2*head_dim] fp32
    norm_w: torch.Tensor,  # [head_dim] bf16
    cos_table: torch.Tensor,  # [P, r] bf16
    sin_table: torch.Tensor,  # [P, r] bf16
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16 (fp32 in float32 mode)
    position_ids: torch.Tensor,  # [T] int32
    num_tokens: int,
    cmp_slot_mapping: torch.Tensor,  # [T] int64 flat cmp row, -1 = none
    state_slot_mapping: torch.Tensor,  # [T] int64 flat state row, -1 = skip
    cfg: DeepSeekV4Config,
    weight_format: str = "bf16",
    float32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (cmp_kv, compress_state)
    """CSA main compressor golden (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio4.py`), vectorised.

    Active tokens ``t < num_tokens`` scatter their state rows, then every closing token with
    ``cmp_slot_mapping[t] >= 0`` writes entry ``w = pos // 4`` (8-slot pool, RMSNorm,
    RoPE at ``4w``) to that flat row of ``cmp_kv``, cast to ``cmp_kv.dtype``. The compressor has
    no quantised weights, so ``weight_format`` is accepted only for a uniform signature;
    ``float32`` multiplies in FP32 (parity with an FP32 model) instead of the exact FP64 sum.
    The inputs are not modified.

    Returns:
        ``(cmp_kv, compress_state)`` updated copies.

    Raises:
        BindError: see :func:`golden_ratio4_compress`.
    """
    entries, dst, state_out = golden_ratio4_compress(
        x, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, position_ids,
        num_tokens, cmp_slot_mapping, state_slot_mapping, cfg, "golden_prefill_compressor_ratio4", float32)
    cmp_out = cmp_kv.clone()
    cmp_out.view(-1, cmp_kv.shape[-1])[dst] = entries.to(cmp_out.dtype)
    return cmp_out, state_out


def ratio4_fixture(cfg: DeepSeekV4Config, starts: list[int], S: int, width: int, num_tokens: int, seed: int,
                   state_pages: int = CSA_STATE_PAGES, pages_per_req: int | None = None) -> dict:
    """Seeded inputs of the ratio-4 core for ``B = len(starts)`` requests of ``S`` tokens each
    (request ``b`` at positions ``starts[b] ..``), entry width ``width``.

    Draw order from one ``torch.Generator(seed)``: ``x ~ N(0,1)`` ``[B*S, D]``; ``wkv ~ N(0,
    0.0245)``, ``wgate ~ N(0, 0.0388)`` ``[2c, D]``; ``ape ~ N(0, 0.1243)`` ``[4, 2c]``;
    ``norm_w = 0.97 + 0.19 N(0,1)`` (the magnitudes of pypto-lib's
    decode_compressor_ratio4.py); the hidden states of the 8
    positions before each start, whose state rows pre-fill the state (the open window and
    the previous one).

    Tables: request ``b`` owns physical state pages ``b*n .. b*n+n-1`` (``n = pages_per_req``,
    default ``state_pages // B``) as a ring ``(blk*17+3) % n`` over ``max_position_embeddings //
    4`` logical pages: ``state_block_table [B, L]``. Entry ``w`` of request ``b`` goes to flat
    compressed row ``cmp_table[b, w // bs] * bs + w % bs`` with ``cmp_table [B, cmp_pages / B]``
    disjoint permuted pages (``cmp_kv_block_num`` pages); ``cmp_slot_mapping`` holds it for
    active closing tokens, ``state_slot_mapping`` the state row of active tokens.

    Returns:
        dict with ``x, compress_state, state_block_table [B, L], wkv, wgate, ape, norm_w,
        cos_table, sin_table, position_ids, num_tokens, cmp_slot_mapping, state_slot_mapping,
        cmp_block_table [B, n_cmp]`` and ``cmp_pages``.

    Raises:
        BindError: positions past the compressed pool or the RoPE tables, or a ring too small.
    """
    fn = "ratio4_fixture"
    B, m = len(starts), CSA_RATIO
    D, bs = cfg.hidden_size, cfg.block_size
    n = pages_per_req or state_pages // B
    if n < -(-S // m) + 2:
        raise BindError(f"{fn}: {n} state pages per request cannot hold {S} tokens plus the open windows")
    cpages = cfg.cmp_kv_block_num
    per_cmp = cpages // B
    if any(s < 0 or (s + S) // m > per_cmp * bs or s + S > cfg.max_position_embeddings for s in starts):
        raise BindError(f"{fn}: starts {starts} + {S} tokens exceed the compressed pool ({per_cmp} pages of {bs} "
                        "per request) or the RoPE tables")
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    c = width
    x = torch.randn(B * S, D, generator=gen).to(bf16)
    wkv = (torch.randn(2 * c, D, generator=gen) * 0.0245).to(bf16)
    wgate = (torch.randn(2 * c, D, generator=gen) * 0.0388).to(bf16)
    ape = torch.randn(m, 2 * c, generator=gen) * 0.1243
    norm_w = (0.97 + 0.19 * torch.randn(c, generator=gen)).to(bf16)
    L = cfg.max_position_embeddings // m
    table = torch.stack([permuted_block_table(L, n, wrap=True) + b * n for b in range(B)])
    cmp_table = torch.stack([permuted_block_table(per_cmp, per_cmp, offset=1) + b * per_cmp for b in range(B)])
    state = torch.zeros(B * n, m, 4 * c, dtype=torch.float32)
    flat = state.view(-1, 4 * c)
    for b, s in enumerate(starts):
        prev = torch.arange(max(0, s - 2 * m), s)
        x_prev = torch.randn(prev.numel(), D, generator=gen).to(bf16)
        flat[table[b, prev // m].long() * m + prev % m] = ratio4_state_rows(x_prev, wkv, wgate, ape, prev)
    positions = torch.cat([s + torch.arange(S) for s in starts])
    req = torch.arange(B * S) // S
    active = torch.arange(B * S) < num_tokens
    closes = ((positions + 1) % m == 0) & active
    entry = (positions + 1) // m - 1
    cmp_row = cmp_table[req, (entry.clamp(min=0) // bs).clamp(max=per_cmp - 1)].long() * bs + entry % bs
    cos, sin = rope_tables(cfg, "compress")
    return {
        "x": x, "compress_state": state, "state_block_table": table.to(torch.int32),
        "wkv": wkv, "wgate": wgate, "ape": ape, "norm_w": norm_w,
        "cos_table": cos.to(bf16), "sin_table": sin.to(bf16),
        "position_ids": positions.to(torch.int32), "num_tokens": int(num_tokens),
        "cmp_slot_mapping": torch.where(closes, cmp_row, -1).to(torch.int64),
        "state_slot_mapping": torch.where(active, table[req, positions // m].long() * m + positions % m,
                                          -1).to(torch.int64),
        "cmp_block_table": cmp_table.to(torch.int32), "cmp_pages": cpages,
    }


def make_prefill_compressor_ratio4_inputs(cfg: DeepSeekV4Config, T: int, start_pos: int, num_tokens: int,
                                          seed: int, state_pages: int = CSA_STATE_PAGES) -> dict:
    """Fixture of :func:`golden_prefill_compressor_ratio4`: :func:`ratio4_fixture` for one
    request (table ``[L]``, ``state_pages`` physical pages) plus a prior ``cmp_kv ~ N(0, 1)`` BF16 (untouched rows
    recognisable). Keys are the golden's argument names.

    Raises:
        BindError: see :func:`ratio4_fixture`.
    """
    f = ratio4_fixture(cfg, [start_pos], T, cfg.head_dim, num_tokens, seed, state_pages)
    gen = torch.Generator().manual_seed(seed + 1)
    f["state_block_table"] = f["state_block_table"][0]
    f["cmp_kv"] = torch.randn(f.pop("cmp_pages"), cfg.block_size, 1, cfg.head_dim, generator=gen).to(torch.bfloat16)
    f.pop("cmp_block_table")
    return f


_ARG_ORDER = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
              "sin_table", "cmp_kv", "position_ids", "num_tokens", "cmp_slot_mapping", "state_slot_mapping")


def ratio4_specs(inputs: dict, order: tuple, outputs: tuple) -> list:
    """TensorSpec / ScalarSpec list over fixture ``inputs`` in parameter ``order``; the names
    in ``outputs`` are in/out outputs; ``num_tokens`` is an INT32 scalar."""
    specs = []
    for name in order:
        v = inputs[name]
        if name == "num_tokens":
            specs.append(ScalarSpec(name, torch.int32, int(v)))
        else:
            specs.append(TensorSpec(name, list(v.shape), v.dtype, init_value=v, is_output=name in outputs))
    return specs


def ratio4_case(entry, inputs: dict, order: tuple, outputs: tuple, golden_fn, tolerances: dict, cfg,
                label: str) -> CaseRun:
    """CaseRun of a ratio-4 compressor case (main or indexer, prefill or decode): specs by
    :func:`ratio4_specs`; the golden calls ``golden_fn(**inputs in order, cfg=cfg)`` and stores
    its results under ``outputs`` in order; ``ratio_allclose(*tol)`` per ``tolerances`` entry;
    run tolerances 1e-3."""
    def golden(v: dict) -> None:
        for k, t in zip(outputs, golden_fn(**{n: v[n] for n in order}, cfg=cfg)):
            v[k] = t

    compare = {k: ratio_allclose(*tol) for k, tol in tolerances.items()}
    return CaseRun(entry, ratio4_specs(inputs, order, outputs), golden, compare, rtol=1e-3, atol=1e-3, label=label)


def prefill_case_tokens(kernel: str, preset: str, mode: str, T: int | None) -> tuple[DeepSeekV4Config, int]:
    """``(cfg, T)`` of a prefill-only KernelCase builder (``T`` defaults to ``prefill_seq``).

    Raises:
        ConfigError: an unknown preset, a mode other than ``"prefill"``, or ``T < 1``.
        CapacityError: ``T`` above the token capacity (:func:`check_token_capacity`).
    """
    if mode != "prefill":
        raise ConfigError(f"{kernel}: unknown mode {mode!r}; the only mode is 'prefill'")
    cfg, T = mode_tokens(preset, mode, T)
    check_token_capacity(kernel, cfg, T)  # before any input is built
    return cfg, T


def build_prefill_compressor_ratio4(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None,
                                    start_pos: int = 0, num_tokens: int | None = None, seed: int = 0,
                                    max_cmp_writes: int | None = None) -> CaseRun:
    """KernelCase builder: the CSA prefill compressor at ``preset`` (mode ``prefill``, ``T =
    prefill_seq`` by default), compare functions from ``TOLERANCES``.

    Raises:
        ConfigError: unknown preset or mode, ``T < 1``, a config that cannot be tiled.
        BindError: a fixture the config cannot hold.
    """
    cfg, T = prefill_case_tokens("prefill_compressor_ratio4", preset, mode, T)
    nt = T if num_tokens is None else num_tokens
    entry = prefill_compressor_ratio4_entry(cfg, max_cmp_writes)
    inputs = make_prefill_compressor_ratio4_inputs(cfg, T, start_pos, nt, seed)

    return ratio4_case(entry, inputs, _ARG_ORDER, ("cmp_kv", "compress_state"), golden_prefill_compressor_ratio4,
                       TOLERANCES, cfg, f"{preset} {mode} T={T} start_pos={start_pos} num_tokens={nt}")


register(KernelCase("prefill_compressor_ratio4", build_prefill_compressor_ratio4, modes=("prefill",),
                    description="CSA ratio-4 overlapping KV compressor, prefill: paged state, pooled 8-slot windows (pypto-lib `prefill_compressor_ratio4.py`)"))
