"""HCA (ratio-128) KV compressor, prefill: paged FP32 state plus compressed-cache writes.

Math (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``M = 128``, ``d = head_dim``:

    kv_t    = x_t @ wkv^T ; score_t = x_t @ wgate^T                     # FP32, [d] each
    state[row(p_t)] = [kv_t | score_t + ape[p_t % M]]                   # row width 2d
    for a token with (p_t + 1) % M == 0 (it closes window w0 = p_t + 1 - M .. p_t):
        S, K   = score / kv parts of the M rows of positions w0 .. p_t
        pooled = sum_j softmax_j(S[:, c]) * K[j, c]                     # per channel c
        entry  = rmsnorm(pooled) * norm_w ; entry[n:] = rope(entry[n:], pos = w0)
        cmp_kv[cmp_slot_mapping[t]] = bf16(entry)

The RoPE profile is ``"compress"`` (theta 1.6e5 + YaRN) at the window *start* ``w0``.

Generalised chunking (the reference kernel asserts one aligned chunk of exactly 128 tokens;
this golden takes any ``T >= 1`` and any positions):

* The window slots of a closing token come from this chunk's active tokens where the chunk
  has that position, and otherwise from the *input* ``compress_state`` through
  ``state_block_table`` (row ``table[p // page] * page + p % page``; a negative entry gives a
  zero row, i.e. kv 0 and score 0). Rows are FP32 both ways, so where a position comes from
  does not change a single bit.
* A chunk closing **no** window writes no ``cmp_kv`` row and only scatters its state rows; a
  chunk closing **several** windows writes one row per closing token, each window pooled
  independently (later windows normally lie entirely inside the chunk).
* Hence splitting a chunk anywhere gives the same result as one call: e.g. 100 then 156
  tokens equals one call of 256 tokens, for both ``cmp_kv`` and ``compress_state``.
* After all pooling, every active token ``t`` with ``state_slot_mapping[t] >= 0`` writes its
  state row (token order; ``compress_state`` rows of other positions are kept).

The state table may be a ring (logical pages ``b`` and ``b + pages`` on one physical page):
that is exact as long as a chunk plus the open part of its first window spans at most
``pages * page`` positions. ``state_slot_mapping`` must agree with ``state_block_table`` for a
kernel that pools from the state after scattering to match this golden.

Kernel (:func:`prefill_compressor_ratio128`, test entry from
:func:`prefill_compressor_ratio128_entry`): the pypto-lib `prefill_compressor_ratio128.py` task structure (write map, kv/score
projection, state scatter, softmax pool, rmsnorm_rope, finalize) over a chunk of any length:
``W = ceil(T / 128)`` write slots (the most windows ``T`` consecutive tokens can close),
bounded by the declared capacity ``max_cmp_writes`` (``CapacityError`` at allocation, before
any task runs). It pools from the state after scattering, so the write-map task checks the
agreement above (and every case the golden rejects) and raises ``BindError`` instead of
diverging from the golden. The pooled pad ``[round_up(W, 8), head_dim]`` is zeroed at
allocation (``init_value=0``); ``seed_scopes=True`` keeps the former zero-fill task.
"""

import functools
from dataclasses import dataclass

import torch

import pto.language as pl
from pto.errors import BindError, CapacityError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ScalarSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.prefill_attention_swa import permuted_block_table
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved
from pto.models.deepseek_v4.rope import rope_tables

__all__ = [
    "HCA_RATIO",
    "TOLERANCES",
    "CompressorTiling",
    "compressor_tiling",
    "pooled_rmsnorm_rope",
    "prefill_compressor_ratio128",
    "prefill_compressor_ratio128_entry",
    "hca_state_rows",
    "golden_prefill_compressor_ratio128",
    "make_compressor_inputs",
    "compressor_specs",
    "build_prefill_compressor_ratio128",
]

HCA_RATIO = 128  # tokens per compressed entry (ratio-128 layers); also ape rows

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py` (run-level rtol=atol=1e-3 in the reference harness).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")  # runtime chunk length (tokens)
STATE_PAGES_DYN = pl.dynamic("STATE_PAGES")  # physical compressor-state pages
STATE_TABLE_DYN = pl.dynamic("STATE_TABLE_LEN")  # logical state pages in the block table
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")  # positions in the cos / sin tables
CMP_PAGES_DYN = pl.dynamic("CMP_PAGES")  # compressed-cache pages
D_DYN = pl.dynamic("D")  # hidden size (checked against cfg)
HD_DYN = pl.dynamic("HEAD_DIM")  # head_dim (checked against cfg)
HD2_DYN = pl.dynamic("STATE_WIDTH")  # 2 * head_dim (checked against cfg)
PAGE_DYN = pl.dynamic("STATE_PAGE")  # hca_state_block_size (checked against cfg)
RD_DYN = pl.dynamic("ROPE_DIM")  # qk_rope_head_dim (checked against cfg)
BS_DYN = pl.dynamic("BLOCK_SIZE")  # compressed-cache page rows (checked against cfg)
APE_DYN = pl.dynamic("APE_ROWS")  # 128 (checked)

HCA_C128_PROJ_T_TILE = 128  # token rows of a projection tile (the prefill tile; tail rows via valid_shape)
HCA_C128_PROJ_N_TILE = 64  # kv and score columns per projection block (pypto-lib `prefill_compressor_ratio128.py`: 32; see compressor_tiling)
HCA_C128_PROJ_K_TILE = 512  # reduction chunk of the projections (pypto-lib `prefill_compressor_ratio128.py`: 8 chunks of 512 at D = 4096)
HCA_C128_SCATTER_T_TILE = 16  # tokens per state-scatter block
HCA_C128_POOL_H_TILE = 64  # channels per softmax-pool block (pypto-lib `prefill_compressor_ratio128.py`: 64-column head blocks)
HCA_C128_RMS_TILE = 8  # row granule of the pooled / normed pads (pypto-lib `prefill_compressor_ratio128.py`: the 8-row RMS tile)

_NAME = "prefill_compressor_ratio128"


@dataclass(frozen=True)
class CompressorTiling:
    """Tile sizes of :func:`prefill_compressor_ratio128` for one config.

    Attributes:
        proj_t, proj_n, proj_k: projection tile rows (tokens), kv (and score) columns per block
            (``min(64, head_dim)``) and reduction chunk (``min(512, hidden_size)``). pypto-lib `prefill_compressor_ratio128.py` uses
            32-column blocks (16 at FLASH); 64 columns with the wkv and wgate rows in one
            product quarter the CPU matmul calls (CPU wall about 2x lower) at the price of 8
            instead of 16 blocks (simulated a2a3 makespan 60 instead of 47 us at FLASH).
        scatter_t: tokens per state-scatter block.
        pool_h: channels per softmax-pool block (``min(64, head_dim)``).
        rms_rows: row granule of the pooled / normed pads.
        page: compressor-state page rows (``hca_state_block_size``).
        pages_per_window: state pages one 128-token window spans (``128 // page``).
        max_cmp_writes: declared capacity: compressed rows one call may write, i.e. windows
            a chunk may close; a chunk of ``T`` tokens can close up to ``ceil(T / 128)``.
        pad_capacity: capacity of the pad rows, ``round_up(max_cmp_writes, rms_rows)``.
    """

    proj_t: int
    proj_n: int
    proj_k: int
    scatter_t: int
    pool_h: int
    rms_rows: int
    page: int
    pages_per_window: int
    max_cmp_writes: int

    @property
    def pad_capacity(self) -> int:
        """Row capacity of the pooled / normed pads: ``round_up(max_cmp_writes, rms_rows)``."""
        return _round_up(self.max_cmp_writes, self.rms_rows)


def pooled_rmsnorm_rope(pooled, norm_w_row, cos_w, sin_w, *, eps: float, n_nope: int):
    """RMSNorm then forward interleaved RoPE of pooled compressed rows (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py` step 5;
    shared by the prefill and decode ratio-128 compressors; call it inside a block).

    ``pooled [M, d]`` FP32 rows, ``norm_w_row [1, d]`` BF16 tensor view (gamma), ``cos_w /
    sin_w [M, r]`` FP32 rows of the window starts (zero for a row without a window):
    ``y = pooled * rsqrt(mean(pooled^2) + eps) * gamma``; the trailing ``r`` channels (from
    ``n_nope``) become ``y[j] * cos[j >> 1] + y[j ^ 1] * (-1 even / +1 odd) * sin[j >> 1]``.
    Returns the ``[M, d]`` FP32 tile; rows are independent."""
    m, d = pooled.shape
    r = cos_w.shape[1]
    inv = pl.rsqrt(pl.row_sum(pooled * pooled) / float(d) + eps)  # [M, 1]
    y = pl.col_expand_mul(pl.row_expand_mul(pooled, inv), pl.cast(norm_w_row[0:1, 0:d], pl.FP32))
    j = pl.arange(0, [1, r], pl.INT32)
    half = pl.cast(pl.cast(j, pl.FP32) * 0.5, pl.INT32, mode="trunc")  # j >> 1
    parity = j - half * 2  # j & 1
    partner = j + 1 - parity * 2  # j ^ 1
    sign = pl.cast(parity * 2 - 1, pl.FP32)  # -1 on even channels, +1 on odd
    x_rope = pl.slice(y, [m, r], [0, n_nope])
    rotated = (x_rope * pl.gather(cos_w, index=half)
               + pl.col_expand_mul(pl.gather(x_rope, index=partner), sign) * pl.gather(sin_w, index=half))
    return pl.assemble(y, rotated, [0, n_nope])

def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def compressor_tiling(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None) -> CompressorTiling:
    """Derive and validate the tile sizes of the ratio-128 prefill compressor for ``cfg``.

    Args:
        cfg: model config (``hidden_size``, ``head_dim``, ``qk_rope_head_dim``,
            ``hca_state_block_size``, ``hca_state_block_num``).
        max_cmp_writes: declared write capacity (windows one call may close). Default: the
            windows the state ring holds, ``hca_state_block_num * hca_state_block_size //
            128`` (4 at FLASH and tiny: chunks up to 512 tokens).

    Returns:
        A :class:`CompressorTiling`.

    Raises:
        ConfigError: ``head_dim`` not a multiple of the projection / pool tiles,
            ``hidden_size`` not a multiple of the reduction chunk, a state page that does not
            divide 128, a RoPE slice wider than the head, a state ring smaller than one window
            (default capacity), or ``max_cmp_writes < 1``.
    """
    D, d, r = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim
    page = cfg.hca_state_block_size

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{_NAME}: config {cfg.name!r} cannot be tiled: {msg}")

    proj_n = min(HCA_C128_PROJ_N_TILE, d)
    proj_k = min(HCA_C128_PROJ_K_TILE, D)
    pool_h = min(HCA_C128_POOL_H_TILE, d)
    need(d > 0 and d % proj_n == 0, f"head_dim={d} is not a multiple of the projection tile {proj_n}")
    need(D > 0 and D % proj_k == 0, f"hidden_size={D} is not a multiple of the reduction chunk {proj_k}")
    need(d % pool_h == 0, f"head_dim={d} is not a multiple of the pool tile {pool_h}")
    need(page > 0 and HCA_RATIO % page == 0,
         f"hca_state_block_size={page} must divide the window of {HCA_RATIO} tokens")
    need(0 < r <= d and r % 2 == 0, f"qk_rope_head_dim={r} must be even and in (0, head_dim={d}]")
    if max_cmp_writes is None:
        max_cmp_writes = cfg.hca_state_block_num * page // HCA_RATIO
        need(max_cmp_writes >= 1, f"the state ring ({cfg.hca_state_block_num} pages x {page} rows) "
                                  f"holds less than one {HCA_RATIO}-token window")
    need(isinstance(max_cmp_writes, int) and max_cmp_writes >= 1,
         f"max_cmp_writes={max_cmp_writes!r} must be a positive int")
    return CompressorTiling(proj_t=HCA_C128_PROJ_T_TILE, proj_n=proj_n, proj_k=proj_k,
                            scatter_t=HCA_C128_SCATTER_T_TILE, pool_h=pool_h, rms_rows=HCA_C128_RMS_TILE,
                            page=page, pages_per_window=HCA_RATIO // page, max_cmp_writes=max_cmp_writes)


def _bind(msg: str) -> BindError:
    return BindError(f"kernel {_NAME}: {msg}")


def _scan_chunk(tl, nt, pos_t, cmp_t, slot_t, state_block_table, n_state_rows, n_cmp_rows, rope_rows,
                n_writes):
    """Write-map task body: validate the active tokens and list the closing ones.

    Returns ``[(position, cmp destination), ...]`` of the active tokens that close a window,
    in token order. Runs inside the write-map task (scalar loads of the token metadata and
    the state block table); see :func:`prefill_compressor_ratio128` for the rules.
    """
    M, page = HCA_RATIO, tl.page
    table_len = pl.tensor.dim(state_block_table, 0)
    seen, owner, tokens, closing = set(), {}, [], []
    rows = zip(pl.read_values(pos_t, [0], nt), pl.read_values(cmp_t, [0], nt), pl.read_values(slot_t, [0], nt))
    for t, (p, dst, slot) in enumerate(rows):
        p, dst, slot = int(p), int(dst), int(slot)
        if p < 0:
            raise _bind(f"token {t} has negative position {p}")
        if p in seen:
            raise _bind(f"active position_ids repeat position {p} (token {t})")
        seen.add(p)
        closes = (p + 1) % M == 0
        if dst >= 0 and not closes:
            raise _bind(f"token {t} at position {p} has cmp_slot_mapping {dst} but does not close a "
                        f"{M}-token window (only tokens with (pos + 1) % {M} == 0 may carry one)")
        if dst >= n_cmp_rows:
            raise _bind(f"cmp_slot_mapping[{t}] = {dst} outside cmp_kv ({n_cmp_rows} rows)")
        if slot >= n_state_rows:
            raise _bind(f"state_slot_mapping[{t}] = {slot} outside compress_state ({n_state_rows} rows)")
        if slot >= 0:
            blk = p // page
            phys = int(pl.read(state_block_table, [blk])) if blk < table_len else -1
            if phys < 0 or slot != phys * page + p % page:
                raise _bind(f"state_slot_mapping[{t}] = {slot} is not the state row of position {p} "
                            f"through state_block_table (page {blk} -> {phys}); the pool reads the "
                            "window back through the table")
            if owner.setdefault(phys, blk) != blk:
                raise _bind(f"positions of state pages {owner[phys]} and {blk} share physical page {phys} "
                            "in one call: the chunk is longer than the state ring")
        tokens.append((t, p, slot))
        if closes:
            closing.append((p, dst))
    if len(closing) > n_writes:
        raise CapacityError(f"kernel {_NAME}: {len(closing)} active tokens close a window but write_pos_map "
                            f"holds {n_writes} (ceil(T / {M}) for T consecutive positions)")
    pooled = {p // M for p, dst in closing if dst >= 0}
    for t, p, slot in tokens:
        if slot < 0 and p // M in pooled:
            raise _bind(f"token {t} at position {p} has state_slot_mapping -1 but its window closes in "
                        "this call (the pool reads the window back from the state)")
    for p, dst in closing:
        if dst < 0:
            continue
        w0 = p + 1 - M
        if w0 >= rope_rows:
            raise _bind(f"window start {w0} past the RoPE tables ({rope_rows} rows)")
        if p // page >= table_len:
            raise _bind(f"window ending at {p} needs state page {p // page}, state_block_table has "
                        f"{table_len} entries")
        for blk in range(w0 // page, w0 // page + tl.pages_per_window):
            phys = int(pl.read(state_block_table, [blk]))
            if phys >= 0 and owner.get(phys, blk) != blk:
                raise _bind(f"window page {blk} reads physical page {phys}, which this call overwrites "
                            f"with page {owner[phys]}: the chunk plus its open window exceed the state ring")
    return closing


@pl.jit.inline
def prefill_compressor_ratio128(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, PAGE_DYN, HD2_DYN], pl.FP32]],
    state_block_table: pl.Tensor[[STATE_TABLE_DYN], pl.INT32],
    wkv: pl.Tensor[[HD_DYN, D_DYN], pl.BF16],
    wgate: pl.Tensor[[HD_DYN, D_DYN], pl.BF16],
    ape: pl.Tensor[[APE_DYN, HD_DYN], pl.FP32],
    norm_w: pl.Tensor[[HD_DYN], pl.BF16],
    cos_table: pl.Tensor[[ROPE_ROWS_DYN, RD_DYN], pl.BF16],
    sin_table: pl.Tensor[[ROPE_ROWS_DYN, RD_DYN], pl.BF16],
    cmp_kv: pl.InOut[pl.Tensor[[CMP_PAGES_DYN, BS_DYN, 1, HD_DYN], pl.BF16]],
    position_ids: pl.Tensor[[T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    cfg,
    max_cmp_writes=None,
    seed_scopes=False,
):
    """Ratio-128 (HCA) KV compressor over one prefill chunk (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`, generalised).

    Math: see the module docstring (:func:`golden_prefill_compressor_ratio128` is the
    contract). Any chunk length ``T >= 1`` and any positions: a window whose closing token
    (``(pos + 1) % 128 == 0``) is not in this chunk stays open in ``compress_state`` and is
    pooled by the call that brings its closing token; a chunk may close 0, 1 or several
    windows, at most ``ceil(T / 128)`` for consecutive positions.

    Tasks (in submission order; ``W = ceil(T / 128)`` write slots, ``W_pad = round_up(W, 8)``):

    1. ``at`` ``prefill_hca_c128_write_map``: validates the active tokens (below) and
       compacts the closing ones, in token order, into ``write_pos_map`` /
       ``write_dst_map [1, W]`` INT32 (seeded 0 / -1 in the task); a closing token with
       destination -1 gets a slot whose destination stays -1.
    2. (``seed_scopes`` only) ``at`` ``prefill_hca_c128_norm_pad_init``: zero-fills the pooled
       and the normed pads (the task the allocation-time zero fill replaced).
    3. ``spmd(ceil(T/128) * head_dim/64)`` ``prefill_hca_c128_kv_score_proj``: ``[128, 64]``
       FP32 tiles of ``x @ wkv^T`` and ``x @ wgate^T`` (BF16 operands, K chunks of 512; the
       64 wkv and 64 wgate rows of a block side by side in one ``[128, 128]`` product).
    4. ``spmd(ceil(T/16))`` ``prefill_hca_c128_state_scatter_pre``: for active tokens with a
       state row: ``state[row] = [kv | score + ape[pos % 128]]``.
    5. ``spmd(W * head_dim/64)`` ``prefill_hca_c128_softmax_pool``: slot ``i`` with a
       destination reads the 128 state rows of its window through the block table (a
       negative entry gives zero rows), softmax over the 128 positions per channel, weighted
       sum of kv into ``pooled_kv_pad[i]``. Slots without a destination write nothing.
    6. ``at`` ``prefill_hca_c128_rmsnorm_rope``: RMSNorm (``rsqrt(mean(x^2) + eps)``) times
       ``norm_w`` over all ``W_pad`` rows, interleaved RoPE on the last ``qk_rope_head_dim``
       channels at the window start ``pos + 1 - 128`` (cos / sin rows only for slots with a
       destination, zero otherwise), into ``normed_kv_pad``.
    7. ``at`` ``prefill_hca_c128_kv_finalize``: ``cmp_kv`` row ``dst`` = BF16 (``rint``) of
       ``normed_kv_pad[i]`` for every slot with a destination.

    Scratch: ``pooled_kv_pad [W_pad, head_dim]`` FP32 is created with ``init_value=0``: rows no
    window wrote (unused slots, slots whose destination is -1, pad rows) stay zero and
    normalise to zero. ``normed_kv_pad`` (same shape) is uninitialised: the rmsnorm_rope task
    writes every element. With ``seed_scopes=True`` both are uninitialised and task 2 zeroes
    them (the pre-change kernel, bit-identical results).

    Contract (the write-map task raises ``BindError``, before any output is touched, where the
    golden raises or where pooling from the state would differ from it): active positions
    distinct and non-negative; ``cmp_slot_mapping[t] >= 0`` only for a token that closes a
    window (the golden's rule; inactive tokens ``t >= num_tokens`` are ignored whatever their
    mappings say); slots inside their tensors; ``state_slot_mapping[t]`` either -1 or the row
    ``table[pos // page] * page + pos % page`` of its position; every active token of a
    window pooled in this call has a state row; no two pages of this call (chunk and pooled
    windows) share a physical page (a chunk plus the open part of its first window must fit
    the state ring); pooled windows lie inside the state table and the RoPE tables.

    Args:
        x: ``[T, hidden_size]`` BF16 normed hidden states.
        compress_state: ``[state_pages, page, 2*head_dim]`` FP32 (InOut): kv | score + ape.
        state_block_table: ``[n]`` INT32 logical state page -> physical page (-1 = none).
        wkv, wgate: ``[head_dim, hidden_size]`` BF16 (used as ``x @ w^T``).
        ape: ``[128, head_dim]`` FP32 per-slot score bias.
        norm_w: ``[head_dim]`` BF16 RMSNorm weight.
        cos_table, sin_table: ``[P, qk_rope_head_dim]`` BF16 compress-profile tables (full
            width, halves duplicated).
        cmp_kv: ``[cmp_pages, block_size, 1, head_dim]`` BF16 compressed cache (InOut).
        position_ids: ``[T]`` INT32 absolute positions.
        num_tokens: active prefix, ``0 <= num_tokens <= T``.
        cmp_slot_mapping: ``[T]`` INT64 flat ``cmp_kv`` row per token, -1 = no write.
        state_slot_mapping: ``[T]`` INT64 flat state row per token, -1 = skip.
        cfg: model config; tile sizes from :func:`compressor_tiling`.
        max_cmp_writes: declared write capacity (default: :func:`compressor_tiling`).
        seed_scopes: keep the zero-fill task instead of allocation-time initialisation.

    Returns:
        ``(cmp_kv, compress_state)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
        BindError: argument shapes that do not match ``cfg``, ``T < 1``, ``num_tokens`` out
            of range, or (from the write-map task) a contract violation listed above.
        CapacityError: ``ceil(T / 128)`` above ``max_cmp_writes`` (before any allocation or
            task; the scratch allocations declare the same bound as ``capacity=``).
    """
    tl = compressor_tiling(cfg, max_cmp_writes)
    D, d, r, page, M = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim, tl.page, HCA_RATIO
    n_nope = d - r
    t_len = pl.tensor.dim(x, 0)
    sp, rope_rows = compress_state.shape[0], cos_table.shape[0]
    for name, ten, want in (("x", x, [t_len, D]), ("compress_state", compress_state, [sp, page, 2 * d]),
                            ("wkv", wkv, [d, D]), ("wgate", wgate, [d, D]), ("ape", ape, [M, d]),
                            ("norm_w", norm_w, [d]), ("cos_table", cos_table, [rope_rows, r]),
                            ("sin_table", sin_table, [rope_rows, r]),
                            ("cmp_kv", cmp_kv, [cmp_kv.shape[0], cfg.block_size, 1, d])):
        if list(ten.shape) != want:
            raise _bind(f"parameter {name!r} is {list(ten.shape)}, config {cfg.name!r} needs {want}")
    if t_len < 1:
        raise _bind(f"chunk length T={t_len} must be >= 1")
    nt = int(num_tokens)
    if not 0 <= nt <= t_len:
        raise _bind(f"num_tokens={nt} outside [0, T={t_len}]")
    n_state_rows = sp * page
    n_cmp_rows = cmp_kv.shape[0] * cmp_kv.shape[1]
    n_writes = -(-t_len // M)  # windows T consecutive tokens can close
    if n_writes > tl.max_cmp_writes:
        raise CapacityError(f"kernel {_NAME}: a chunk of T={t_len} tokens can close {n_writes} windows, but "
                            f"write_pos_map / write_dst_map / pooled_kv_pad hold max_cmp_writes="
                            f"{tl.max_cmp_writes} (declared capacity); split the chunk or declare more")
    w_pad = _round_up(n_writes, tl.rms_rows)
    state_rows = pl.reshape(compress_state, [n_state_rows, 2 * d])
    cmp_rows = pl.reshape(cmp_kv, [n_cmp_rows, d])
    norm_w_row = pl.reshape(norm_w, [1, d])

    write_pos_map = pl.create_tensor([1, n_writes], pl.INT32, capacity=[None, tl.max_cmp_writes])
    write_dst_map = pl.create_tensor([1, n_writes], pl.INT32, capacity=[None, tl.max_cmp_writes])
    kv_proj = pl.create_tensor([t_len, d], pl.FP32)
    score_proj = pl.create_tensor([t_len, d], pl.FP32)
    if seed_scopes:
        pooled_kv_pad = pl.create_tensor([w_pad, d], pl.FP32, capacity=[tl.pad_capacity])
    else:
        # kept as the reference (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`; pypto-lib commit 3b6971a3: init=0), though not load-bearing: rows are
        # normalised one by one and only rows with a destination are written out (drop_init passes)
        pooled_kv_pad = pl.create_tensor([w_pad, d], pl.FP32, init_value=0, capacity=[tl.pad_capacity])
    normed_kv_pad = pl.create_tensor([w_pad, d], pl.FP32, capacity=[tl.pad_capacity])

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_hca_c128_write_map"):
        closing = []
        if nt > 0:
            closing = _scan_chunk(tl, nt, position_ids[0:nt], cmp_slot_mapping[0:nt],
                                  state_slot_mapping[0:nt], state_block_table, n_state_rows, n_cmp_rows,
                                  rope_rows, n_writes)
        pos_map = pl.write_values(pl.full([1, n_writes], pl.INT32, 0), [0, 0], [p for p, _ in closing])
        dst_map = pl.write_values(pl.full([1, n_writes], pl.INT32, -1), [0, 0], [dst for _, dst in closing])
        write_pos_map[0:1, 0:n_writes] = pos_map
        write_dst_map[0:1, 0:n_writes] = dst_map

    if seed_scopes:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_hca_c128_norm_pad_init"):
            for hb in pl.pipeline(d // tl.pool_h, stage=2):
                zero = pl.full([w_pad, tl.pool_h], pl.FP32, 0.0)
                pooled_kv_pad[0:w_pad, hb * tl.pool_h:(hb + 1) * tl.pool_h] = zero
                normed_kv_pad[0:w_pad, hb * tl.pool_h:(hb + 1) * tl.pool_h] = zero

    PT, PN, PK = tl.proj_t, tl.proj_n, tl.proj_k
    n_col = d // PN

    def kv_gate_rows(c0):  # [2*PN, D] BF16: the block's wkv rows above its wgate rows, all K chunks
        w_t = pl.assemble(pl.full([2 * PN, D], pl.BF16, 0), wkv[c0:c0 + PN, 0:D], [0, 0])
        return pl.assemble(w_t, wgate[c0:c0 + PN, 0:D], [PN, 0])

    for b in pl.spmd(-(-t_len // PT) * n_col, name_hint="prefill_hca_c128_kv_score_proj"):
        r0, c0 = (b // n_col) * PT, (b % n_col) * PN
        rows = min(PT, t_len - r0)
        # the block's x rows and weight rows loaded once; each K chunk is a [*, PK] sub-tile of them
        x_rows, w_rows = pl.slice(x, [PT, D], [r0, 0], valid_shape=[rows, D]), kv_gate_rows(c0)
        acc = pl.matmul(pl.slice(x_rows, [PT, PK], [0, 0]), pl.slice(w_rows, [2 * PN, PK], [0, 0]),
                        b_trans=True)  # [PT, 2*PN] FP32: kv | score
        for kc in pl.range(1, D // PK):
            acc = pl.matmul_acc(acc, pl.slice(x_rows, [PT, PK], [0, kc * PK]),
                                pl.slice(w_rows, [2 * PN, PK], [0, kc * PK]), b_trans=True)
        pl.assemble(kv_proj, pl.set_validshape(pl.slice(acc, [PT, PN], [0, 0]), rows, PN), [r0, c0])
        pl.assemble(score_proj, pl.set_validshape(pl.slice(acc, [PT, PN], [0, PN]), rows, PN), [r0, c0])

    ST = tl.scatter_t
    for b in pl.spmd(-(-t_len // ST), name_hint="prefill_hca_c128_state_scatter_pre"):
        t0 = b * ST
        active = min(ST, nt - t0)
        if active <= 0:
            continue
        kv_t = pl.slice(kv_proj, [ST, d], [t0, 0], valid_shape=[active, d])
        score_t = pl.slice(score_proj, [ST, d], [t0, 0], valid_shape=[active, d])
        slot_t = pl.slice(state_slot_mapping, [ST], [t0], valid_shape=[active])
        pos_t = pl.slice(position_ids, [ST], [t0], valid_shape=[active])
        slots, positions = pl.read_values(slot_t, [0], active), pl.read_values(pos_t, [0], active)
        keep = [i for i in range(active) if slots[i] >= 0]  # a token with slot -1 has no state row
        dst = [slots[i] for i in keep]
        # per kept token: its kv row, then its score row + ape[pos % 128] (one load and one add
        # per token), each one row store into its state slot (pl.store_rows: the one-row stores
        # in one call)
        pl.store_rows(state_rows, dst, kv_t, 0, src_rows=keep)
        pl.store_rows(state_rows, dst, [score_t[i:i + 1, :] + ape[positions[i] % M:positions[i] % M + 1, 0:d]
                                        for i in keep], d)

    PH = tl.pool_h
    n_head = d // PH
    for b in pl.spmd(n_writes * n_head, name_hint="prefill_hca_c128_softmax_pool"):
        i, h0 = b // n_head, (b % n_head) * PH
        if pl.read(write_dst_map, [0, i]) < 0:
            continue  # no window, or its destination is -1: the pad row keeps its zero
        blk0 = (pl.read(write_pos_map, [0, i]) + 1 - M) // page
        kv_w = pl.full([M, PH], pl.FP32, 0.0)
        score_w = pl.full([M, PH], pl.FP32, 0.0)
        pages_w = pl.read_values(state_block_table, [blk0], tl.pages_per_window)  # the window's pages, one call
        for g in pl.range(tl.pages_per_window):
            phys = pages_w[g]
            if phys >= 0:  # a missing page contributes kv 0, score 0 (as the golden)
                row0 = phys * page
                kv_w = pl.assemble(kv_w, state_rows[row0:row0 + page, h0:h0 + PH], [g * page, 0])
                score_w = pl.assemble(score_w, state_rows[row0:row0 + page, d + h0:d + h0 + PH],
                                      [g * page, 0])
        e = pl.col_expand_expdif(score_w, pl.col_max(score_w))
        weights = pl.col_expand_div(e, pl.col_sum(e))  # softmax over the 128 window slots, per channel
        pooled_kv_pad[i:i + 1, h0:h0 + PH] = pl.col_sum(weights * kv_w)

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_hca_c128_rmsnorm_rope"):
        cos_w = pl.full([w_pad, r], pl.FP32, 0.0)
        sin_w = pl.full([w_pad, r], pl.FP32, 0.0)
        dsts = pl.read_values(write_dst_map, [0, 0], n_writes)
        for i in pl.range(n_writes):
            if dsts[i] >= 0:
                w0 = pl.read(write_pos_map, [0, i]) + 1 - M  # RoPE at the window start
                cos_w = pl.assemble(cos_w, pl.cast(cos_table[w0:w0 + 1, 0:r], pl.FP32), [i, 0])
                sin_w = pl.assemble(sin_w, pl.cast(sin_table[w0:w0 + 1, 0:r], pl.FP32), [i, 0])
        normed_kv_pad[0:w_pad, 0:d] = pooled_rmsnorm_rope(pooled_kv_pad[0:w_pad, 0:d], norm_w_row, cos_w, sin_w,
                                                          eps=cfg.rms_norm_eps, n_nope=n_nope)

    with pl.at(level=pl.Level.CORE_GROUP, name_hint="prefill_hca_c128_kv_finalize"):
        kept = [(i, dst) for i, dst in enumerate(pl.read_values(write_dst_map, [0, 0], n_writes)) if dst >= 0]
        # per kept slot: its pad row loaded and cast (one load, one cast), then one row store each
        pl.store_rows(cmp_rows, [dst for _, dst in kept],
                      [pl.cast(normed_kv_pad[i:i + 1, 0:d], pl.BF16, mode="rint") for i, _ in kept])
    return cmp_kv, compress_state


@functools.lru_cache(maxsize=None)
def prefill_compressor_ratio128_entry(cfg: DeepSeekV4Config, max_cmp_writes: int | None = None,
                                      seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``prefill_compressor_ratio128_test`` for ``cfg``.

    Parameters as :func:`prefill_compressor_ratio128` (same names and order, without
    ``cfg`` and the options), with the model dims static from ``cfg`` and ``T``, the state
    pool, its table, the RoPE tables and the compressed pool dynamic. Returns
    ``(cmp_kv, compress_state)``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled (:func:`compressor_tiling`).
    """
    tl = compressor_tiling(cfg, max_cmp_writes)
    D, d, r, page, bs = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim, tl.page, cfg.block_size

    @pl.jit
    def prefill_compressor_ratio128_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        compress_state: pl.InOut[pl.Tensor[[STATE_PAGES_DYN, page, 2 * d], pl.FP32]],
        state_block_table: pl.Tensor[[STATE_TABLE_DYN], pl.INT32],
        wkv: pl.Tensor[[d, D], pl.BF16],
        wgate: pl.Tensor[[d, D], pl.BF16],
        ape: pl.Tensor[[HCA_RATIO, d], pl.FP32],
        norm_w: pl.Tensor[[d], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        cmp_kv: pl.InOut[pl.Tensor[[CMP_PAGES_DYN, bs, 1, d], pl.BF16]],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
    ):
        return prefill_compressor_ratio128(x, compress_state, state_block_table, wkv, wgate, ape, norm_w,
                                           cos_table, sin_table, cmp_kv, position_ids, num_tokens,
                                           cmp_slot_mapping, state_slot_mapping, cfg, tl.max_cmp_writes,
                                           seed_scopes)

    return prefill_compressor_ratio128_test
# ---- end kernel ----


def _check(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...], kind: str) -> None:
    """Raise BindError unless ``t`` has ``shape`` and dtype kind float / int."""
    ok = t.is_floating_point() if kind == "float" else t.dtype in (torch.int32, torch.int64)
    if tuple(t.shape) != tuple(shape) or not ok:
        raise BindError(f"{fn}: {name} must be a {kind} tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def hca_state_rows(
    x: torch.Tensor,  # [T, D] bf16
    wkv: torch.Tensor,  # [head_dim, D] bf16
    wgate: torch.Tensor,  # [head_dim, D] bf16
    ape: torch.Tensor,  # [128, head_dim] fp32
    positions: torch.Tensor,  # [T] int
) -> torch.Tensor:  # [T, 2*head_dim] fp32
    """State rows ``[x @ wkv^T | x @ wgate^T + ape[pos % 128]]`` in FP32.

    The projections accumulate in FP64 and round once to FP32 (the exact sum, independent of
    how many rows are multiplied at once, so a split chunk reproduces a single call bit for
    bit); ``ape`` is added in FP32.
    """
    xd = x.double()
    kv = (xd @ wkv.double().T).float()
    score = (xd @ wgate.double().T).float() + ape.float()[positions.long() % HCA_RATIO]
    return torch.cat([kv, score], dim=-1)


def golden_prefill_compressor_ratio128(
    x: torch.Tensor,  # [T, D] bf16 (attention-normed hidden)
    compress_state: torch.Tensor,  # [state_pages, hca_state_block_size, 2*head_dim] fp32
    state_block_table: torch.Tensor,  # [n_state_blocks] int32, -1 = no page
    wkv: torch.Tensor,  # [head_dim, D] bf16
    wgate: torch.Tensor,  # [head_dim, D] bf16
    ape: torch.Tensor,  # [128, head_dim] fp32
    norm_w: torch.Tensor,  # [head_dim] bf16
    cos_table: torch.Tensor,  # [P, rope_dim] bf16, compress profile
    sin_table: torch.Tensor,  # [P, rope_dim] bf16, compress profile
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    position_ids: torch.Tensor,  # [T] int32 absolute positions
    num_tokens: int,
    cmp_slot_mapping: torch.Tensor,  # [T] int64 flat cmp_kv row, -1 = no write
    state_slot_mapping: torch.Tensor,  # [T] int64 flat state row, -1 = skip
    cfg: DeepSeekV4Config,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([cmp_pages, block_size, 1, head_dim] bf16, state fp32)
    """Ratio-128 compressor golden for any chunk (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`, generalised).

    See the module docstring for the math and the chunking rules. Only active tokens
    (``t < num_tokens``) are used. A closing token (``(pos + 1) % 128 == 0``) with
    ``cmp_slot_mapping[t] >= 0`` writes flat row ``cmp_slot_mapping[t]`` of ``cmp_kv``;
    RMSNorm uses ``cfg.rms_norm_eps``; RoPE is interleaved on the trailing
    ``qk_rope_head_dim`` channels with table row ``pos + 1 - 128``. The inputs are not
    modified.

    Args:
        x: ``[T, D]`` BF16 normed hidden states.
        compress_state: ``[pages, page, 2*head_dim]`` FP32; columns ``0:d`` kv, ``d:2d``
            score + ape.
        state_block_table: ``[n]`` INT32 logical state page -> physical page.
        wkv, wgate: ``[head_dim, D]`` BF16 (``x @ w^T``).
        ape: ``[128, head_dim]`` FP32 position bias per window slot.
        norm_w: ``[head_dim]`` compressor RMSNorm weight.
        cos_table, sin_table: ``[P, rope_dim]`` compress-profile tables (full width).
        cmp_kv: ``[cmp_pages, block_size, 1, head_dim]`` BF16 compressed cache.
        position_ids: ``[T]`` distinct absolute positions of the active tokens.
        num_tokens: active prefix, ``0 <= num_tokens <= T``.
        cmp_slot_mapping: ``[T]`` INT64 flat compressed row per token (``-1`` = none).
        state_slot_mapping: ``[T]`` INT64 flat state row per token (``-1`` = skip).
        cfg: model config (``head_dim``, ``hidden_size``, ``qk_rope_head_dim``,
            ``hca_state_block_size``, ``block_size``, ``rms_norm_eps``).

    Returns:
        ``(cmp_kv, compress_state)`` updated copies, same shapes / dtypes as the inputs.

    Raises:
        BindError: bad shapes / dtypes, ``num_tokens`` out of range, repeated active
            positions, a slot outside its tensor, a window row whose page index is past the
            state table, a window start past the RoPE tables, or a ``cmp_slot_mapping >= 0``
            on a token that does not close a window.
    """
    fn = "golden_prefill_compressor_ratio128"
    D, d, r, page, bs = (cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim,
                         cfg.hca_state_block_size, cfg.block_size)
    n, M = cfg.nope_head_dim, HCA_RATIO
    if x.dim() != 2:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    T = x.shape[0]
    _check(fn, "x", x, (T, D), "float")
    if compress_state.dim() != 3:
        raise BindError(f"{fn}: compress_state must be [pages, {page}, {2 * d}], "
                        f"got {list(compress_state.shape)}")
    _check(fn, "compress_state", compress_state, (compress_state.shape[0], page, 2 * d), "float")
    if state_block_table.dim() != 1:
        raise BindError(f"{fn}: state_block_table must be rank 1, got {list(state_block_table.shape)}")
    _check(fn, "state_block_table", state_block_table, tuple(state_block_table.shape), "int")
    _check(fn, "wkv", wkv, (d, D), "float")
    _check(fn, "wgate", wgate, (d, D), "float")
    _check(fn, "ape", ape, (M, d), "float")
    _check(fn, "norm_w", norm_w, (d,), "float")
    if cos_table.dim() != 2:
        raise BindError(f"{fn}: cos_table must be [P, {r}], got {list(cos_table.shape)}")
    _check(fn, "cos_table", cos_table, (cos_table.shape[0], r), "float")
    _check(fn, "sin_table", sin_table, tuple(cos_table.shape), "float")
    if cmp_kv.dim() != 4:
        raise BindError(f"{fn}: cmp_kv must be [cmp_pages, {bs}, 1, {d}], got {list(cmp_kv.shape)}")
    _check(fn, "cmp_kv", cmp_kv, (cmp_kv.shape[0], bs, 1, d), "float")
    for name, t in (("position_ids", position_ids), ("cmp_slot_mapping", cmp_slot_mapping),
                    ("state_slot_mapping", state_slot_mapping)):
        _check(fn, name, t, (T,), "int")
    nt = int(num_tokens)
    if not 0 <= nt <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")

    pos = position_ids[:nt].long()
    pos_list = pos.tolist()
    if len(set(pos_list)) != nt:
        raise BindError(f"{fn}: active position_ids repeat a position")
    if nt and min(pos_list) < 0:
        raise BindError(f"{fn}: negative position {min(pos_list)}")
    state_in = compress_state.reshape(-1, 2 * d).float()
    state_out = compress_state.clone()
    state_out_flat = state_out.view(-1, 2 * d)
    cmp_out = cmp_kv.clone()
    cmp_flat = cmp_out.view(-1, d)
    cmp_slots = cmp_slot_mapping[:nt].long().tolist()
    state_slots = state_slot_mapping[:nt].long().tolist()
    for name, slots, limit in (("cmp_slot_mapping", cmp_slots, cmp_flat.shape[0]),
                               ("state_slot_mapping", state_slots, state_out_flat.shape[0])):
        if slots and max(slots) >= limit:
            raise BindError(f"{fn}: {name} value {max(slots)} outside its tensor ({limit} rows)")

    rows = hca_state_rows(x[:nt], wkv, wgate, ape, pos)  # [nt, 2d] fp32
    chunk_row = {p: t for t, p in enumerate(pos_list)}
    table = state_block_table.long()
    eps = cfg.rms_norm_eps
    for t, p in enumerate(pos_list):
        if cmp_slots[t] < 0:
            continue
        if (p + 1) % M:
            raise BindError(f"{fn}: token {t} at position {p} has cmp_slot_mapping "
                            f"{cmp_slots[t]} but does not close a {M}-token window")
        w0 = p + 1 - M
        if w0 >= cos_table.shape[0]:
            raise BindError(f"{fn}: window start {w0} past the RoPE tables ({cos_table.shape[0]} rows)")
        window = torch.zeros(M, 2 * d, dtype=torch.float32)
        for j, wp in enumerate(range(w0, p + 1)):
            if wp in chunk_row:
                window[j] = rows[chunk_row[wp]]
                continue
            blk = wp // page
            if blk >= table.shape[0]:
                raise BindError(f"{fn}: window position {wp} needs state page {blk}, "
                                f"state_block_table has {table.shape[0]} entries")
            phys = int(table[blk])
            if phys >= 0:
                window[j] = state_in[phys * page + wp % page]
        weights = torch.softmax(window[:, d:], dim=0)  # [M, d], per channel over slots
        pooled = (weights * window[:, :d]).sum(dim=0)  # [d]
        entry = pooled * torch.rsqrt(pooled.square().mean() + eps) * norm_w.float()
        entry[n:] = rope_interleaved(entry[None, None, n:], cos_table[w0:w0 + 1],
                                     sin_table[w0:w0 + 1])[0, 0]
        cmp_flat[cmp_slots[t]] = entry.to(cmp_out.dtype)

    for t in range(nt):
        if state_slots[t] >= 0:
            state_out_flat[state_slots[t]] = rows[t].to(state_out.dtype)
    return cmp_out, state_out


def make_compressor_inputs(
    cfg: DeepSeekV4Config,
    T: int,
    start_pos: int,
    num_tokens: int,
    seed: int,
) -> dict:
    """Seeded fixture for :func:`golden_prefill_compressor_ratio128` (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`).

    Token ``t`` sits at position ``start_pos + t``. Draw order from one
    ``torch.Generator(seed)``: ``x ~ N(0,1)`` ``[T, D]``; ``wkv ~ N(0, 0.0246)``,
    ``wgate ~ N(0, 0.0316)`` ``[head_dim, D]``; ``ape ~ N(0, 0.034)`` ``[128, head_dim]``;
    ``norm_w = 0.1 + 0.055 * N(0,1)`` (real-checkpoint magnitudes); then the hidden states of
    the (up to) 128 positions before ``start_pos``, whose state rows
    (:func:`hca_state_rows`) pre-fill ``compress_state`` (this covers the open part of the
    current window); then the prior ``cmp_kv`` contents ``~ N(0,1)`` (so untouched rows are
    recognisable). BF16: x, wkv, wgate, norm_w, cmp_kv, cos/sin; FP32: ape, state.

    Tables: ``state_block_table [max_position_embeddings // hca_state_block_size]`` is the
    ring ``permuted_block_table(..., hca_state_block_num, wrap=True)`` (``(blk*17+3) % pages``
    for 64 pages); compressed entry ``w = (pos + 1) // 128 - 1`` goes to flat row
    ``cmp_table[w // block_size] * block_size + w % block_size`` with ``cmp_table =
    permuted_block_table(cmp_kv_block_num, cmp_kv_block_num, offset=1)``. ``cmp_slot_mapping``
    is that row for active closing tokens, else -1; ``state_slot_mapping`` is the state row
    of active tokens, else -1. cos/sin: compress profile, ``[max_position_embeddings,
    rope_dim]``.

    Returns:
        dict keyed by the golden's argument names (``num_tokens`` int).

    Raises:
        BindError: ``T`` not positive, ``num_tokens`` outside ``[0, T]``, negative
            ``start_pos``, a chunk longer than the state ring, or positions past the
            compressed pool / RoPE tables.
    """
    fn = "make_compressor_inputs"
    if T <= 0 or not 0 <= num_tokens <= T or start_pos < 0:
        raise BindError(f"{fn}: need T > 0, 0 <= num_tokens <= T, start_pos >= 0; got T={T}, "
                        f"num_tokens={num_tokens}, start_pos={start_pos}")
    D, d, M = cfg.hidden_size, cfg.head_dim, HCA_RATIO
    page, spages = cfg.hca_state_block_size, cfg.hca_state_block_num
    bs, cpages = cfg.block_size, cfg.cmp_kv_block_num
    if start_pos % M + T > spages * page:
        raise BindError(f"{fn}: chunk of {T} tokens plus {start_pos % M} open window rows exceeds "
                        f"the state ring ({spages} pages x {page} rows)")
    if start_pos + T > cfg.max_position_embeddings:
        raise BindError(f"{fn}: positions up to {start_pos + T - 1} exceed "
                        f"max_position_embeddings={cfg.max_position_embeddings}")
    if (start_pos + T) // M > cpages * bs:
        raise BindError(f"{fn}: {(start_pos + T) // M} compressed entries exceed the pool "
                        f"({cpages} pages x {bs} rows)")
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    x = torch.randn(T, D, generator=gen).to(bf16)
    wkv = (torch.randn(d, D, generator=gen) * 0.0246).to(bf16)
    wgate = (torch.randn(d, D, generator=gen) * 0.0316).to(bf16)
    ape = torch.randn(M, d, generator=gen) * 0.034
    norm_w = (0.1 + 0.055 * torch.randn(d, generator=gen)).to(bf16)

    state_table = permuted_block_table(cfg.max_position_embeddings // page, spages, wrap=True)
    cmp_table = permuted_block_table(cpages, cpages, offset=1)

    def state_row(p: torch.Tensor) -> torch.Tensor:
        return state_table.long()[p // page] * page + p % page

    state = torch.zeros(spages, page, 2 * d, dtype=torch.float32)
    prev = torch.arange(max(0, start_pos - M), start_pos)
    x_prev = torch.randn(prev.numel(), D, generator=gen).to(bf16)
    state.view(-1, 2 * d)[state_row(prev)] = hca_state_rows(x_prev, wkv, wgate, ape, prev)
    cmp_kv = torch.randn(cpages, bs, 1, d, generator=gen).to(bf16)

    positions = start_pos + torch.arange(T)
    active = torch.arange(T) < num_tokens
    closes = ((positions + 1) % M == 0) & active
    entry = ((positions + 1) // M - 1).clamp(min=0)  # compressed entry index (closing tokens)
    cmp_row = cmp_table.long()[(entry // bs).clamp(max=cpages - 1)] * bs + entry % bs
    cmp_slot_mapping = torch.where(closes, cmp_row, torch.full_like(cmp_row, -1))
    state_slot_mapping = torch.where(active, state_row(positions), torch.full_like(positions, -1))
    cos, sin = rope_tables(cfg, "compress")
    return {
        "x": x, "compress_state": state, "state_block_table": state_table,
        "wkv": wkv, "wgate": wgate, "ape": ape, "norm_w": norm_w,
        "cos_table": cos.to(bf16), "sin_table": sin.to(bf16), "cmp_kv": cmp_kv,
        "position_ids": positions.to(torch.int32), "num_tokens": int(num_tokens),
        "cmp_slot_mapping": cmp_slot_mapping.to(torch.int64),
        "state_slot_mapping": state_slot_mapping.to(torch.int64),
    }


# ---- registration ----
_ARG_ORDER = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
              "sin_table", "cmp_kv", "position_ids", "num_tokens", "cmp_slot_mapping", "state_slot_mapping")


def compressor_specs(inputs: dict) -> list:
    """TensorSpec / ScalarSpec list (kernel parameter order) over a fixture dict from
    :func:`make_compressor_inputs`; ``cmp_kv`` and ``compress_state`` are in/out outputs."""
    specs = []
    for name in _ARG_ORDER:
        v = inputs[name]
        if name == "num_tokens":
            specs.append(ScalarSpec(name, torch.int32, int(v)))
        else:
            specs.append(TensorSpec(name, list(v.shape), v.dtype, init_value=v,
                                    is_output=name in ("cmp_kv", "compress_state")))
    return specs


def build_prefill_compressor_ratio128(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None,
                                      start_pos: int = 0, num_tokens: int | None = None, seed: int = 0,
                                      seed_scopes: bool = False,
                                      max_cmp_writes: int | None = None) -> CaseRun:
    """KernelCase builder: the ratio-128 prefill compressor at ``preset``.

    Mode ``"prefill"``: ``T = cfg.prefill_seq`` (128) tokens at positions ``start_pos ..``,
    ``num_tokens`` active (default ``T``); fixture :func:`make_compressor_inputs` (``seed``).
    Compare functions from ``TOLERANCES``: ``cmp_kv`` ratio_allclose(1e-4, 1/128, 0),
    ``compress_state`` ratio_allclose(1e-3, 1e-3, 0); run tolerances 1e-3.

    Raises:
        ConfigError: unknown preset or mode, ``T < 1``, or a config that cannot be tiled.
        BindError: a fixture the config cannot hold (see :func:`make_compressor_inputs`).
    """
    from pto.models.deepseek_v4.config import get_config
    cfg = get_config(preset)
    if mode != "prefill":
        raise ConfigError(f"{_NAME}: unknown mode {mode!r}; the only mode is 'prefill'")
    T = cfg.prefill_seq if T is None else T
    if not isinstance(T, int) or T < 1:
        raise ConfigError(f"{_NAME}: token count T must be a positive int, got {T!r}")
    nt = T if num_tokens is None else num_tokens
    entry = prefill_compressor_ratio128_entry(cfg, max_cmp_writes, seed_scopes)
    inputs = make_compressor_inputs(cfg, T, start_pos, nt, seed)

    def golden(v: dict) -> None:
        v["cmp_kv"], v["compress_state"] = golden_prefill_compressor_ratio128(
            **{k: v[k] for k in _ARG_ORDER}, cfg=cfg)

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
    label = f"{preset} {mode} T={T} start_pos={start_pos} num_tokens={nt}"
    label += " seed_scopes" if seed_scopes else ""
    return CaseRun(entry, compressor_specs(inputs), golden, compare, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase(_NAME, build_prefill_compressor_ratio128, modes=("prefill",), seed_variant=True,
                    description="HCA ratio-128 KV compressor, prefill: paged state, pooled pad init=0 (pypto-lib `prefill_compressor_ratio128.py`)"))
