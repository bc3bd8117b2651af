"""HCA (ratio-128) KV compressor, decode step: paged FP32 state, at most one entry per request.

Math (pypto-lib `models/deepseek/v4-flash/decode_compressor_ratio128.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``M = 128``, ``d = head_dim``, decode
geometry of decode_metadata.py (``T = B * S`` token-major rows, token ``t`` of request
``b = t // S`` at position ``p = position_ids[t]``, ``-1`` = inactive):

    state[row_b(p)] = [x_t @ wkv^T | x_t @ wgate^T + ape[p % M]]      # FP32, every active token
    for a token with (p + 1) % M == 0 (closes window w0 = p + 1 - M .. p, entry p // M):
        pooled = sum_j softmax_j(score[j, c]) * kv[j, c]              # the window's M state rows
        entry  = rmsnorm(pooled) * norm_w ; entry[n:] = rope(entry[n:], pos = w0)   # compress profile
        kv[t] = entry (FP32) ; cmp_kv[cmp_slot_mapping[t]] = bf16(entry)

``row_b(p) = state_block_table[b, p // page] * page + p % page`` (``page =
hca_state_block_size``); the window rows are read through the same table, after this step's
rows are scattered (with ``S = 2`` the closing token may be the second of its request, and
the first token's row is part of its window). A window row on a negative table entry is a
zero row (kv 0, score 0), as in prefill_compressor_ratio128. Only tokens with
``cmp_slot_mapping[t] >= 0`` write: ``kv`` rows of every other token keep the caller's values
(``kv`` is a ``pl.PartialOut``); ``kv`` rows are token-major ``[T, d]`` (pypto-lib `decode_compressor_ratio128.py`: ``kv[b, 0]``).

Deviations from pypto-lib `decode_compressor_ratio128.py`, one a line:

* a window row on a missing state page is kv 0, score 0 (pypto-lib `decode_compressor_ratio128.py`: score ``-FP32_MAX``), as the
  prefill compressor, so prefill-then-decode equals one longer prefill in every case;
* the window's RoPE rows are read from the full compress tables at ``p + 1 - 128`` (pypto-lib `decode_compressor_ratio128.py`: the
  caller passes per-request half tables);
* 128-column projection blocks (pypto-lib `decode_compressor_ratio128.py`: 64), see ``DECODE_PROJ_N_TILE``;
* the pool copies runs of consecutive state pages at once and pools all channels in one tile
  (pypto-lib `decode_compressor_ratio128.py`: 128-column head tiles; the softmax is per channel, so the bits are the same).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.decode_metadata import HCA_RATIO, decode_block_tables, make_decode_metadata
from pto.models.deepseek_v4.decode_sparse_attn import decode_case_options
from pto.models.deepseek_v4.prefill_compressor_ratio128 import compressor_tiling, hca_state_rows, pooled_rmsnorm_rope
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved
from pto.models.deepseek_v4.rope import rope_tables
from pto.models.deepseek_v4.tiling import MATMUL_M_TILE, round_up, token_capacity

__all__ = [
    "decode_compressor_ratio128_kernels",
    "decode_compressor_ratio128",
    "golden_decode_compressor_ratio128",
    "make_decode_compressor_inputs",
    "build_case",
    "TOLERANCES",
    "COMPRESSOR_ARGS",
]

# pypto-lib `models/deepseek/v4-flash/decode_compressor_ratio128.py`; the pypto-lib tests' tolerances (run-level rtol=atol=1e-3): ratio_allclose (atol, rtol, max_error_ratio).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "kv": (1e-4, 1 / 128, 0.0),
    "compress_state": (1e-3, 1e-3, 0.0),
    "cmp_kv": (1e-4, 1 / 128, 0.0),
}

_NAME = "decode_compressor_ratio128"

# ---- kernel ----
T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")
RMS_ROWS = 8  # row granule of the pooled / normed scratch (pypto-lib `decode_compressor_ratio128.py` pads B*S to 16 rows)
# kv and score columns per projection block. deviation: pypto-lib `decode_compressor_ratio128.py` uses 64 (8 blocks at FLASH); 128 halves
# the CPU matmul calls (kernel wall 17.4 -> 14.1 ms at FLASH, one process) for a longer simulated
# projection (a2a3 makespan 62.5 -> 79.4 us)
DECODE_PROJ_N_TILE = 128


@functools.lru_cache(maxsize=None)
def decode_compressor_ratio128_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the ratio-128 decode compressor for ``cfg`` (cached per config).

    Tasks (pypto-lib `decode_compressor_ratio128.py`; ``T`` dynamic, tile sizes from ``prefill_compressor_ratio128.compressor_tiling``):

    1. ``decode_hca_c128_kv_score_proj`` ``spmd(head_dim / 128)`` (deps ``late_dep``):
       two ``[round_up(T, 16), 128]`` FP32 tiles ``x @ wkv^T`` and ``x @ wgate^T`` (BF16 operands,
       K chunks of ``proj_k``), the projection of prefill_compressor_ratio128.
    2. ``decode_hca_c128_scatter_softmax_pool`` ``at``: in token order, each active token's
       state row, and right after a token that closes a window and has a compressed
       destination (so a later token's row, the next window's, cannot overwrite a ring page
       the window still needs): the window's 128 state rows
       through ``state_block_table[b]`` (zero rows on a negative entry), softmax over the 128
       slots per channel (all channels in one tile), weighted sum into ``pooled`` row ``t``;
       consecutive physical pages are copied as one run.
    3. ``decode_hca_c128_rmsnorm_rope_cache_write`` ``at``: RMSNorm times ``norm_w`` over the
       ``round_up(T, 8)`` pooled rows (rows of tokens that do not compress are left undefined
       and never stored: rows are independent), interleaved RoPE at ``p + 1 - 128``, then for
       each compressing token ``kv[t]`` (FP32) and ``cmp_kv`` row ``cmp_slot_mapping[t]`` (BF16
       ``rint``).

    No scratch is initialised at allocation (pypto-lib `decode_compressor_ratio128.py` has none), so there is no seed variant.

    Returns:
        namespace with the inline body ``decode_compressor_ratio128(x, kv, compress_state,
        state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, cmp_kv, position_ids,
        cmp_slot_mapping, state_slot_mapping, late_dep)`` returning ``(kv, cmp_kv,
        compress_state)`` and the ``@pl.jit`` entry ``decode_compressor_ratio128_test`` (same
        parameters without ``late_dep``). Shapes: ``x [T, D]`` BF16, ``kv [T, head_dim]`` FP32
        (written only on compressing rows), ``compress_state [hca_state_block_num, page,
        2*head_dim]`` FP32 (InOut), ``state_block_table [B, max_pos // page]`` INT32, ``wkv /
        wgate [head_dim, D]`` BF16, ``ape [128, head_dim]`` FP32, ``norm_w [head_dim]`` BF16,
        ``cos_table / sin_table [max_pos, rope_dim]`` BF16 (compress profile), ``cmp_kv
        [cmp_kv_block_num, block_size, 1, head_dim]`` BF16 (InOut), ``position_ids [T]``
        INT32, ``cmp_slot_mapping / state_slot_mapping [T]`` INT64 (``-1`` = none).

    Raises:
        ConfigError: ``cfg`` cannot be tiled. At run time (``BindError``, from the pool task
            before any state row is written): ``T`` not a multiple of ``B``; a compressed
            destination on a token that does not close a window, or outside ``cmp_kv``; a
            state slot that is not the row of its position through the request's table, or
            outside the state; a window past the state table or the RoPE tables.
            ``CapacityError`` for ``T`` above ``token_capacity(cfg)``.
    """
    tl = compressor_tiling(cfg, 1)
    D, d, r, page, M = cfg.hidden_size, cfg.head_dim, cfg.qk_rope_head_dim, tl.page, HCA_RATIO
    n_nope = d - r
    SP, CP, BS, MAXPOS = cfg.hca_state_block_num, cfg.cmp_kv_block_num, cfg.block_size, cfg.max_position_embeddings
    NST = MAXPOS // page
    PN, PK = min(DECODE_PROJ_N_TILE, d), tl.proj_k
    cap = token_capacity(cfg)

    def bind(msg: str) -> BindError:
        return BindError(f"kernel {_NAME}: {msg}")

    def scan(t, s_req, position_ids, cmp_slot_mapping, state_slot_mapping, state_block_table):
        """Validate the step's metadata; returns ``[(tok, req, pos, state_slot)]`` of the
        active tokens and ``[(tok, req, pos, dst)]`` of the compressing ones."""
        active, closing = [], []
        for tok in range(t):
            p = pl.read(position_ids, [tok])
            dst, slot = pl.read(cmp_slot_mapping, [tok]), pl.read(state_slot_mapping, [tok])
            req = tok // s_req
            if p < 0:
                if dst >= 0 or slot >= 0:
                    raise bind(f"inactive token {tok} (position -1) has cmp slot {dst} / state slot {slot}")
                continue
            if dst >= 0 and (p + 1) % M:
                raise bind(f"token {tok} at position {p} has cmp_slot_mapping {dst} but does not close a "
                           f"{M}-token window")
            if dst >= CP * BS:
                raise bind(f"cmp_slot_mapping[{tok}] = {dst} outside cmp_kv ({CP * BS} rows)")
            if p // page >= NST:
                raise bind(f"position_ids[{tok}] = {p} is past the state table ({NST} pages of {page})")
            if slot >= 0:
                phys = pl.read(state_block_table, [req, p // page])
                if phys < 0 or phys >= SP or slot != phys * page + p % page:
                    raise bind(f"state_slot_mapping[{tok}] = {slot} is not the state row of position {p} through "
                               f"state_block_table[{req}] (page {p // page} -> {phys})")
            active.append((tok, req, p, slot))
            if dst >= 0:
                if p + 1 - M >= MAXPOS:
                    raise bind(f"window start {p + 1 - M} past the RoPE tables ({MAXPOS} rows)")
                closing.append((tok, req, p, dst))
        return active, closing

    @pl.jit.inline
    def decode_compressor_ratio128(x: pl.Tensor[[T_DYN, D], pl.BF16],
                                   kv: pl.PartialOut[pl.Tensor[[T_DYN, d], pl.FP32]],
                                   compress_state: pl.InOut[pl.Tensor[[SP, page, 2 * d], pl.FP32]],
                                   state_block_table: pl.Tensor[[B_DYN, NST], pl.INT32],
                                   wkv: pl.Tensor[[d, D], pl.BF16],
                                   wgate: pl.Tensor[[d, D], pl.BF16],
                                   ape: pl.Tensor[[M, d], pl.FP32],
                                   norm_w: pl.Tensor[[d], pl.BF16],
                                   cos_table: pl.Tensor[[MAXPOS, r], pl.BF16],
                                   sin_table: pl.Tensor[[MAXPOS, r], pl.BF16],
                                   cmp_kv: pl.InOut[pl.Tensor[[CP, BS, 1, d], pl.BF16]],
                                   position_ids: pl.Tensor[[T_DYN], pl.INT32],
                                   cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                                   state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                                   late_dep: pl.Scalar[pl.TASK_ID]):
        """Ratio-128 decode compressor (pypto-lib `decode_compressor_ratio128.py`); returns ``(kv, cmp_kv, compress_state)``."""
        t = pl.tensor.dim(x, 0)
        n_req = pl.tensor.dim(state_block_table, 0)
        if n_req < 1 or t % n_req:
            raise bind(f"T={t} tokens is not a multiple of the B={n_req} rows of state_block_table")
        s_req = t // n_req
        t_mm, t_pad = round_up(t, MATMUL_M_TILE), round_up(t, RMS_ROWS)
        state_rows = pl.reshape(compress_state, [SP * page, 2 * d])
        cmp_rows = pl.reshape(cmp_kv, [CP * BS, d])
        norm_w_row = pl.reshape(norm_w, [1, d])
        kv_proj = pl.create_tensor([t, d], pl.FP32, capacity=cap)
        score_proj = pl.create_tensor([t, d], pl.FP32, capacity=cap)
        pooled_kv = pl.create_tensor([t_pad, d], pl.FP32, capacity=cap)

        for b in pl.spmd(d // PN, name_hint="decode_hca_c128_kv_score_proj", deps=[late_dep]):
            c0 = b * PN
            acc_kv = acc_score = None
            for kc in pl.range(D // PK):  # [t_mm, PN] FP32 tiles, K chunks of PK
                xt = pl.slice(x, [t_mm, PK], [0, kc * PK], valid_shape=[t, PK])
                w_kv, w_score = wkv[c0:c0 + PN, kc * PK:(kc + 1) * PK], wgate[c0:c0 + PN, kc * PK:(kc + 1) * PK]
                if acc_kv is None:
                    acc_kv, acc_score = pl.matmul(xt, w_kv, b_trans=True), pl.matmul(xt, w_score, b_trans=True)
                else:
                    acc_kv = pl.matmul_acc(acc_kv, xt, w_kv, b_trans=True)
                    acc_score = pl.matmul_acc(acc_score, xt, w_score, b_trans=True)
            pl.assemble(kv_proj, pl.set_validshape(acc_kv, t, PN), [0, c0])
            pl.assemble(score_proj, pl.set_validshape(acc_score, t, PN), [0, c0])

        closing = []
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_hca_c128_scatter_softmax_pool") as pool_tid:
            active, closing = scan(t, s_req, position_ids, cmp_slot_mapping, state_slot_mapping, state_block_table)
            closes = {c[0] for c in closing}
            # in token order: a row after a closing token (the next window, possibly on a ring page
            # of the closing one) is written after the pool read the window
            for tok, req, p, slot in active:
                if slot >= 0:
                    state_rows[slot:slot + 1, 0:d] = kv_proj[tok:tok + 1, 0:d]
                    state_rows[slot:slot + 1, d:2 * d] = score_proj[tok:tok + 1, 0:d] + ape[p % M:p % M + 1, 0:d]
                if tok in closes:
                    blk0 = (p + 1 - M) // page
                    phys = [pl.read(state_block_table, [req, blk0 + g]) for g in range(tl.pages_per_window)]
                    window = pl.full([M, 2 * d], pl.FP32, 0.0)
                    g = 0
                    while g < len(phys):  # runs of consecutive physical pages, one copy each
                        if phys[g] < 0:  # a missing page contributes kv 0, score 0 (as prefill)
                            g += 1
                            continue
                        g1 = g + 1
                        while g1 < len(phys) and phys[g1] == phys[g] + (g1 - g):
                            g1 += 1
                        row0 = phys[g] * page
                        window = pl.assemble(window, state_rows[row0:row0 + (g1 - g) * page, 0:2 * d],
                                             [g * page, 0])
                        g = g1
                    # deviation: all head_dim channels in one tile (pypto-lib `decode_compressor_ratio128.py`: 128-column head tiles); the
                    # softmax is per channel, so the result is the same bit for bit
                    kv_w, score_w = pl.slice(window, [M, d], [0, 0]), pl.slice(window, [M, d], [0, d])
                    e = pl.col_expand_expdif(score_w, pl.col_max(score_w))
                    weights = pl.col_expand_div(e, pl.col_sum(e))  # softmax over the 128 slots, per channel
                    pooled_kv[tok:tok + 1, 0:d] = pl.col_sum(weights * kv_w)

        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_hca_c128_rmsnorm_rope_cache_write",
                   deps=[pool_tid]):
            if closing:
                cos_w = pl.full([t_pad, r], pl.FP32, 0.0)
                sin_w = pl.full([t_pad, r], pl.FP32, 0.0)
                for tok, _, p, _ in closing:
                    w0 = p + 1 - M  # RoPE at the window start
                    cos_w = pl.assemble(cos_w, pl.cast(cos_table[w0:w0 + 1, 0:r], pl.FP32), [tok, 0])
                    sin_w = pl.assemble(sin_w, pl.cast(sin_table[w0:w0 + 1, 0:r], pl.FP32), [tok, 0])
                normed = pooled_rmsnorm_rope(pooled_kv[0:t_pad, 0:d], norm_w_row, cos_w, sin_w, eps=cfg.rms_norm_eps,
                                             n_nope=n_nope)
                for tok, _, _, dst in closing:
                    row = pl.slice(normed, [1, d], [tok, 0])
                    kv[tok:tok + 1, 0:d] = row
                    cmp_rows[dst:dst + 1, 0:d] = pl.cast(row, pl.BF16, mode="rint")
        return kv, cmp_kv, compress_state

    @pl.jit
    def decode_compressor_ratio128_test(x: pl.Tensor[[T_DYN, D], pl.BF16],
                                        kv: pl.PartialOut[pl.Tensor[[T_DYN, d], pl.FP32]],
                                        compress_state: pl.InOut[pl.Tensor[[SP, page, 2 * d], pl.FP32]],
                                        state_block_table: pl.Tensor[[B_DYN, NST], pl.INT32],
                                        wkv: pl.Tensor[[d, D], pl.BF16],
                                        wgate: pl.Tensor[[d, D], pl.BF16],
                                        ape: pl.Tensor[[M, d], pl.FP32],
                                        norm_w: pl.Tensor[[d], pl.BF16],
                                        cos_table: pl.Tensor[[MAXPOS, r], pl.BF16],
                                        sin_table: pl.Tensor[[MAXPOS, r], pl.BF16],
                                        cmp_kv: pl.InOut[pl.Tensor[[CP, BS, 1, d], pl.BF16]],
                                        position_ids: pl.Tensor[[T_DYN], pl.INT32],
                                        cmp_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                                        state_slot_mapping: pl.Tensor[[T_DYN], pl.INT64]):
        late_dep = pl.system.task_dummy(deps=[])
        return decode_compressor_ratio128(x, kv, compress_state, state_block_table, wkv, wgate, ape, norm_w,
                                          cos_table, sin_table, cmp_kv, position_ids, cmp_slot_mapping,
                                          state_slot_mapping, late_dep)

    return SimpleNamespace(tiling=tl, decode_compressor_ratio128=decode_compressor_ratio128,
                           decode_compressor_ratio128_test=decode_compressor_ratio128_test)


@pl.jit.inline
def decode_compressor_ratio128(x: pl.Tensor, kv: pl.PartialOut[pl.Tensor], compress_state: pl.InOut[pl.Tensor],
                               state_block_table: pl.Tensor, wkv: pl.Tensor, wgate: pl.Tensor, ape: pl.Tensor,
                               norm_w: pl.Tensor, cos_table: pl.Tensor, sin_table: pl.Tensor,
                               cmp_kv: pl.InOut[pl.Tensor], position_ids: pl.Tensor, cmp_slot_mapping: pl.Tensor,
                               state_slot_mapping: pl.Tensor, late_dep: pl.Scalar[pl.TASK_ID], cfg):
    """Stable inline signature ``decode_compressor_ratio128(x, kv, compress_state,
    state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, cmp_kv, position_ids,
    cmp_slot_mapping, state_slot_mapping, late_dep, cfg) -> (kv, cmp_kv, compress_state)``:
    the body of :func:`decode_compressor_ratio128_kernels` (shapes and errors there)."""
    return decode_compressor_ratio128_kernels(cfg).decode_compressor_ratio128(
        x, kv, compress_state, state_block_table, wkv, wgate, ape, norm_w, cos_table, sin_table, cmp_kv,
        position_ids, cmp_slot_mapping, state_slot_mapping, late_dep)
# ---- end kernel ----


def golden_decode_compressor_ratio128(
    x: torch.Tensor,  # [T, D] bf16 (attention-normed hidden)
    kv: torch.Tensor,  # [T, head_dim] fp32 (caller's values; rows of compressing tokens replaced)
    compress_state: torch.Tensor,  # [state_pages, page, 2*head_dim] fp32
    state_block_table: torch.Tensor,  # [B, max_pos // page] int32
    wkv: torch.Tensor,  # [head_dim, D] bf16
    wgate: torch.Tensor,  # [head_dim, D] bf16
    ape: torch.Tensor,  # [128, head_dim] fp32
    norm_w: torch.Tensor,  # [head_dim] bf16
    cos_table: torch.Tensor,  # [P, rope_dim] bf16, compress profile
    sin_table: torch.Tensor,  # [P, rope_dim] bf16
    cmp_kv: torch.Tensor,  # [cmp_pages, block_size, 1, head_dim] bf16
    position_ids: torch.Tensor,  # [T] int32, -1 = inactive
    cmp_slot_mapping: torch.Tensor,  # [T] int64, -1 = no write
    state_slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
    cfg: DeepSeekV4Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (kv, cmp_kv, compress_state) new tensors
    """Ratio-128 decode compressor golden over whole tensors (module docstring; pypto-lib `decode_compressor_ratio128.py`).

    State rows ``prefill_compressor_ratio128.hca_state_rows`` (FP64 projections rounded once
    to FP32) scattered at ``state_slot_mapping >= 0``; every token with ``cmp_slot_mapping >=
    0`` pools its window's 128 rows: the input state through ``state_block_table[t // S]``
    (zero rows on a negative entry) overlaid with this step's rows of its request up to and
    including itself (the kernel scatters and pools in token order), softmax over the slots
    per channel, weighted sum, RMSNorm (``cfg.rms_norm_eps``) times ``norm_w``, interleaved
    RoPE at ``p + 1 - 128``.

    Raises:
        BindError: ``T`` not a multiple of ``B``, a destination on a token that does not close
            a window, a slot outside its tensor, or a window past the tables.
    """
    fn = "golden_decode_compressor_ratio128"
    d, page, n, M = cfg.head_dim, cfg.hca_state_block_size, cfg.nope_head_dim, HCA_RATIO
    T, B = x.shape[0], state_block_table.shape[0]
    if B < 1 or T % B:
        raise BindError(f"{fn}: T={T} is not a multiple of the B={B} rows of state_block_table")
    S = T // B
    pos = position_ids.long()
    dst, slot = cmp_slot_mapping.long(), state_slot_mapping.long()
    if bool(((dst >= 0) & ((pos < 0) | ((pos + 1) % M != 0))).any()):
        raise BindError(f"{fn}: a cmp_slot_mapping >= 0 on a token that does not close a {M}-token window")
    state_out = compress_state.clone()
    flat = state_out.view(-1, 2 * d)
    cmp_out, kv_out = cmp_kv.clone(), kv.clone()
    if bool((slot >= flat.shape[0]).any()) or bool((dst >= cmp_out.numel() // d).any()):
        raise BindError(f"{fn}: a slot outside compress_state or cmp_kv")
    rows = hca_state_rows(x, wkv, wgate, ape, pos.clamp(min=0))  # [T, 2d]
    w = slot >= 0
    flat[slot[w]] = rows[w]
    c = torch.nonzero(dst >= 0).flatten()
    if c.numel() == 0:
        return kv_out, cmp_out, state_out
    w0 = pos[c] + 1 - M  # [n_c]
    if bool((w0 >= cos_table.shape[0]).any()):
        raise BindError(f"{fn}: window start {int(w0.max())} past the RoPE tables ({cos_table.shape[0]} rows)")
    wpos = w0[:, None] + torch.arange(M)[None, :]  # [n_c, M]
    blk = wpos // page
    if bool((blk >= state_block_table.shape[1]).any()):
        raise BindError(f"{fn}: a window row is past state_block_table ({state_block_table.shape[1]} pages)")
    phys = state_block_table.long()[(c // S)[:, None], blk]
    state_in = compress_state.reshape(-1, 2 * d).float()
    window = torch.where((phys >= 0)[..., None], state_in[(phys.clamp(min=0) * page + wpos % page)],
                         torch.zeros(()))  # [n_c, M, 2d] the window as it was before this step
    # overlaid with this step's rows of the same request up to the closing token (token order:
    # a later token's row, e.g. the next window's first on a ring page of this one, is not seen)
    req = torch.arange(T) // S
    seen = ((req[None, :] == (c // S)[:, None]) & (slot[None, :] >= 0) & (pos[None, :] >= w0[:, None])
            & (pos[None, :] <= pos[c][:, None]))  # [n_c, T]
    ci, ti = torch.nonzero(seen, as_tuple=True)
    window[ci, pos[ti] - w0[ci]] = rows[ti]
    weights = torch.softmax(window[..., d:], dim=1)
    pooled = (weights * window[..., :d]).sum(dim=1)  # [n_c, d]
    entry = pooled * torch.rsqrt(pooled.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps) * norm_w.float()
    entry[:, n:] = rope_interleaved(entry[:, None, n:], cos_table[w0], sin_table[w0])[:, 0]
    kv_out[c] = entry.to(kv_out.dtype)
    cmp_out.view(-1, d)[dst[c]] = entry.to(cmp_out.dtype)
    return kv_out, cmp_out, state_out


COMPRESSOR_ARGS = ("x", "kv", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
                   "sin_table", "cmp_kv", "position_ids", "cmp_slot_mapping", "state_slot_mapping")


def make_decode_compressor_inputs(
    cfg: DeepSeekV4Config,
    start_pos: tuple | list,
    S: int,
    seed: int,
    *,
    reverse_tables: bool = False,
) -> dict:
    """Seeded fixture of the decode compressor: ``B = len(start_pos)`` requests of ``S`` tokens.

    Tables from ``decode_metadata.decode_block_tables``, slots from ``make_decode_metadata``;
    weights at real-checkpoint magnitudes as ``prefill_compressor_ratio128`` (``x ~ N(0,1)``,
    ``wkv ~ N(0, 0.0246)``, ``wgate ~ N(0, 0.0316)``, ``ape ~ N(0, 0.034)``, ``norm_w = 0.1 +
    0.055 N(0,1)``); each active request's state holds the rows of the (up to) 127 positions
    before its first one (its open window, from random hidden states); ``cmp_kv ~ N(0, 1)`` (so
    untouched rows are recognisable); ``kv`` is a sentinel ``-7.0`` (unwritten rows keep it).

    Returns:
        dict keyed by :data:`COMPRESSOR_ARGS` (plus the tables).

    Raises:
        BindError: the pools cannot hold the batch.
    """
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    D, d, M, page = cfg.hidden_size, cfg.head_dim, HCA_RATIO, cfg.hca_state_block_size
    B = len(start_pos)
    T = B * S
    tables = decode_block_tables(cfg, start_pos, S, reverse=reverse_tables)
    meta = make_decode_metadata(cfg, start_pos, S, tables["block_table"], tables["cmp_block_table"],
                                tables["state_block_table"])
    x = torch.randn(T, D, generator=gen).to(bf16)
    wkv = (torch.randn(d, D, generator=gen) * 0.0246).to(bf16)
    wgate = (torch.randn(d, D, generator=gen) * 0.0316).to(bf16)
    ape = torch.randn(M, d, generator=gen) * 0.034
    norm_w = (0.1 + 0.055 * torch.randn(d, generator=gen)).to(bf16)
    state = torch.zeros(cfg.hca_state_block_num, page, 2 * d)
    st = tables["state_block_table"].long()
    for b, p0 in enumerate(start_pos):
        prev = torch.arange(max(0, p0 - p0 % M), max(0, p0))  # the open part of the current window
        if p0 > 0 and prev.numel():
            x_prev = torch.randn(prev.numel(), D, generator=gen).to(bf16)
            state.view(-1, 2 * d)[st[b, prev // page] * page + prev % page] = hca_state_rows(x_prev, wkv, wgate, ape,
                                                                                             prev)
    cos, sin = rope_tables(cfg, "compress")
    return {"x": x, "kv": torch.full((T, d), -7.0), "compress_state": state,
            "state_block_table": tables["state_block_table"], "wkv": wkv, "wgate": wgate, "ape": ape,
            "norm_w": norm_w, "cos_table": cos.to(bf16), "sin_table": sin.to(bf16),
            "cmp_kv": torch.randn(cfg.cmp_kv_block_num, cfg.block_size, 1, d, generator=gen).to(bf16),
            "position_ids": meta["position_ids"], "cmp_slot_mapping": meta["cmp_slot_mapping"],
            "state_slot_mapping": meta["state_slot_mapping"], "cmp_block_table": tables["cmp_block_table"]}


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """Registry builder of ``decode_compressor_ratio128`` (pypto-lib `decode_compressor_ratio128.py`).

    Mode ``"decode"``. Options: ``start_pos`` (per request; default FLASH ``(8192, 127, 128,
    255)``, tiny ``(300, 127, 1, 0)``), ``S`` (default ``decode_seq``), ``seed``,
    ``reverse_tables``. Golden :func:`golden_decode_compressor_ratio128`; compare functions
    from :data:`TOLERANCES`; run tolerances 1e-3.

    Raises:
        ConfigError: unknown preset, mode or option. BindError: pools too small.
    """
    o = decode_case_options(_NAME, preset, mode, options)
    cfg, start, S, seed, reverse = o.cfg, o.start_pos, o.S, o.seed, o.reverse_tables
    k = decode_compressor_ratio128_kernels(cfg)
    d = make_decode_compressor_inputs(cfg, start, S, seed, reverse_tables=reverse)
    outs = ("kv", "compress_state", "cmp_kv")
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=n in outs) for n in COMPRESSOR_ARGS]

    def golden(v: dict) -> None:
        v["kv"], v["cmp_kv"], v["compress_state"] = golden_decode_compressor_ratio128(
            *(v[n] for n in COMPRESSOR_ARGS), cfg)

    compare = {n: ratio_allclose(*TOLERANCES[n]) for n in outs}
    return CaseRun(fn=k.decode_compressor_ratio128_test, specs=specs, golden=golden, compare=compare, rtol=1e-3,
                   atol=1e-3, label=f"decode B={len(start)} S={S} start_pos={list(start)}")


register(KernelCase(_NAME, build_case, modes=("decode",),
                    description="HCA ratio-128 KV compressor, decode step: paged state, one entry per closing request (pypto-lib `decode_compressor_ratio128.py`)"))
