"""HCA (ratio-128) KV compressor, prefill: paged FP32 state plus compressed-cache writes.

Math (v4flash-kernels.md A.4; dsv4-math.md 3, 5), ``M = 128``, ``d = head_dim``:

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
"""

from __future__ import annotations

import torch

from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.prefill_attention_swa import permuted_block_table
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved
from pto.models.deepseek_v4.rope import rope_tables

__all__ = [
    "HCA_RATIO",
    "TOLERANCES",
    "hca_state_rows",
    "golden_prefill_compressor_ratio128",
    "make_compressor_inputs",
]

HCA_RATIO = 128  # tokens per compressed entry (ratio-128 layers); also ape rows

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# v4flash-kernels.md A.4 (run-level rtol=atol=1e-3 in the reference harness).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "cmp_kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
# (The pto.language kernel goes here; the golden below is its numerical contract.)
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
    """Ratio-128 compressor golden for any chunk (v4flash-kernels.md A.4, generalised).

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
    """Seeded fixture for :func:`golden_prefill_compressor_ratio128` (v4flash-kernels.md A.4).

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
