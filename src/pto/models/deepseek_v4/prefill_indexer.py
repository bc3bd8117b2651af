"""Lightning indexer, prefill: index queries, head weights, scores, top-k; and the shared core.

Math (pypto-lib `models/deepseek/v4-flash/decode_indexer.py`, `prefill_indexer.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), ``HI = index_n_heads``,
``c = index_head_dim``, ``K = index_topk``, per active token ``t`` at position ``p``:

    q      = dequant(qr_i8 @ wq_b_i8)                 # [HI, c]: i32 * qr_scale[t] * wq_b_scale
    q[:, c-r:] = rope(q[:, c-r:], pos = p)            # compress profile, interleaved
    q8, sq = int8 per (t, h) row of bf16(q) @ hadamard   # sq = dequant scale 1/s
    w      = (x_t @ weights_proj) * HI^-0.5 * c^-0.5  # [HI]
    I[s]   = ks[s] * sum_h w_h * relu(float(q8_h . k8_s) * sq_h)   for s < n_vis = (p + 1) // 4
    top    = the first min(K, n_vis) indices of a stable descending sort of I, then -1;
             a pick >= n_vis (only when a visible score is -inf) is -1 too

``k8`` / ``ks`` are the INT8 key cache rows and scales of the indexer compressor
(:mod:`prefill_indexer_compressor`), logical entry ``s`` of request ``b`` at flat row
``idx_block_table[b, s // block_size] * block_size + s % block_size``. The scale ``ks`` factors
out of the relu because it is positive. **Tie order**: equal scores keep ascending entry
order (the stable sort32 / mrgsort chain, docs/dsl.md), in kernel and golden alike.

Shared core (:func:`indexer_topk_tasks`), prefill and decode (tokens request-major over a
``[B, n]`` table; prefill ``B = 1``), tasks named ``<p>_*``:

1. ``spmd`` ``<p>_q_proj``: INT8 ``qr @ wq_b`` in ``[PT, 256]`` tiles, dequantised (FP32).
2. ``spmd`` ``<p>_q_rope_hadamard_quant``: per block of tokens (``[tokens, HI * c]`` rows of
   the projection): RoPE over the full width (a column select keeps the non-rope channels), BF16,
   Hadamard product of the ``HI`` rows of each token, per-row INT8 codes and dequant scales.
3. ``spmd`` ``<p>_weights_proj``: ``x @ weights_proj`` times the combined scale.
4. (``seed_scopes`` only) ``spmd`` ``<p>_score_init``: ``score_wide`` rows set to the most
   negative finite FP32 (the reference's 8 seed tasks, pypto-lib `prefill_indexer.py`); by default ``score_wide`` is
   created with that ``init_value`` instead (pypto-lib commit 3b6971a3 style), bit-identical results.
5. ``spmd(T)`` ``<p>_score``: per active token, over the key pages its request's widest
   visible row covers (the same pages for every token of a prefill chunk: one ``pl.gather_rows``
   of their rows; BF16 weights: one product per page): INT8 product,
   dequant, relu, head weights, head sum, key scale; columns ``>= n_vis`` masked (``pl.cmp`` /
   ``pl.select``) into ``score_wide [T, L]``. Every step is row-wise, so a key's score does
   not depend on how many pages are computed together.
6. ``spmd(T)`` ``<p>_topk``: ``pl.sort32`` + ``pl.mrgsort`` chain over the ``L``-wide row,
   ``pl.gather(P1010)`` indices, ``-1`` in columns past ``n_vis``, for picks ``>= n_vis``
   and for inactive tokens: the output never names an entry past the causal bound ``(p +
   1) // 4``, which the sparse-attention cores do not re-check. The masked columns hold
   ``-FP32_MAX``, so a pick past the bound needs a visible score of ``-inf`` (an overflowed
   ``ks * sum``); it then sorts after the masked columns and is dropped, not attended.

``L`` = the smallest ``32 * 4^j`` holding the widest visible row rounded up to a key page;
bounded by the declared capacity ``score_capacity`` (``CapacityError`` before any task).

Deviations from the reference (pypto-lib `prefill_indexer.py`): no score cap (the reference scores at most 256
entries, INDEXER_SCORE_CAP, and keeps at most 256 of the top 512); the indexer compressor is
*not* called from inside the indexer (the attention block calls it first; the indexer takes
the finished key cache); cos / sin come from the full tables by position; ``x`` is ``[T, D]``.
"""

import functools

import torch

import pto.language as pl
from pto.errors import BindError, CapacityError
from pto.golden import CaseRun, KernelCase, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (CSA_RATIO, _table_dims, prefill_case_tokens,
                                                              ratio4_specs, rope_rotate_rows)
from pto.models.deepseek_v4.qkv_proj_rope import (int8_quantize_rows, quantize_per_row_int8,
                                                  quantize_weight_per_column, rope_interleaved)
from pto.models.deepseek_v4.rope import rope_tables
from pto.models.deepseek_v4.weight_format import (act_dtype, is_bf16, weight_dtype, weight_format_of,
                                                  with_weight_format)
from pto.models.deepseek_v4.tiling import MATMUL_M_TILE, round_up, token_capacity

__all__ = ["FP32_MAX", "indexer_sort_width", "indexer_score_capacity", "indexer_topk_tasks", "indexer_inline",
           "indexer_entry", "prefill_indexer", "prefill_indexer_entry", "golden_indexer_query", "golden_indexer_scores", "golden_indexer_topk",
           "golden_prefill_indexer", "make_indexer_inputs", "topk_set_compare", "build_prefill_indexer"]

FP32_MAX = float(torch.finfo(torch.float32).max)
IDX_Q_N_TILE = 256  # q-projection output columns per block (pypto-lib `prefill_indexer.py`: 8192 / 256 = 32 tasks)
IDX_Q_T_TILE = 128  # q-projection token rows (fewer for short calls)
IDX_Q_K_TILE = 512  # q-projection reduction chunk
IDX_QROW_TILE = 128  # index-query rows (tokens x heads) per rope/hadamard/quant block
IDX_W_T_TILE = 32  # token rows per weights_proj block (pypto-lib `prefill_indexer.py`: 128 / 32)
IDX_SEED_T_TILE = 16  # token rows per score_init block (pypto-lib `prefill_indexer.py`: 8 blocks of 16 at T = 128)
SORT_RUN = 32  # values per pl.sort32 run
MERGE_WAYS = 4  # runs per pl.mrgsort (format 1)


def indexer_sort_width(n_vis_max: int, page: int) -> int:
    """Sort width ``L``: the smallest ``32 * 4^j >= round_up(max(n_vis_max, 1), page)``."""
    need = round_up(max(n_vis_max, 1), page)
    L = SORT_RUN
    while L < need:
        L *= MERGE_WAYS
    return L


def indexer_score_capacity(cfg: DeepSeekV4Config) -> int:
    """Declared capacity of the score row: :func:`indexer_sort_width` of every entry a request
    can have (``max_position_embeddings // 4``; 8192 at FLASH)."""
    return indexer_sort_width(cfg.max_position_embeddings // CSA_RATIO, cfg.block_size)


# ---- kernel ----
T_DYN = pl.dynamic("T")
ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")
IDX_PAGES_DYN = pl.dynamic("IDX_PAGES")
IDX_TABLE_DYN = pl.dynamic("IDX_TABLE_LEN")
D_DYN = pl.dynamic("D")


def _bind(kernel: str, msg: str) -> BindError:
    return BindError(f"kernel {kernel}: {msg}")


def _visible_rows(pos: list, nt: int, S: int, B: int):
    """How a block of the score / top-k tasks finds its token's visible index keys: returns
    ``vis_of(t, n_vis) -> int``, ``n_vis[t]`` (``max(0, (pos[t] + 1) // CSA_RATIO)``, the
    orchestration's list over the ``nt`` active tokens, ``S`` per request, ``B`` requests).

    Where each request's positions run on by one (``pos[t] = pos[b * S] + t - b * S``, every
    position >= 0: a prefill chunk), the count is computed from ``t`` itself, ``(t + off[b]) //
    CSA_RATIO``, the same int in a plain run; a block template (runtime/blocks.py) keeps it an
    expression of its block index instead of the exact value a list subscript pins (which holds
    for one block only). Otherwise ``n_vis[t]``."""
    offs = []
    for b in range(B):
        t0 = b * S
        if t0 >= nt:
            break
        p0 = pos[t0]
        # comparisons, not an exact list: under the program cache's recording the positions are
        # symbols, and these stay guards on their outcome (any chunk whose positions run on)
        if p0 < 0 or not all(pos[t] == p0 + (t - t0) for t in range(t0 + 1, min(nt, t0 + S))):
            return lambda t, n_vis: n_vis[t]
        offs.append(p0 - t0 + 1)
    if B == 1 or len(offs) == 1:
        off = offs[0] if offs else 0
        return lambda t, n_vis: (t + off) // CSA_RATIO
    return lambda t, n_vis: (t + offs[t // S]) // CSA_RATIO


def indexer_topk_tasks(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos_table, sin_table, hadamard,
                       idx_kv_cache, idx_kv_scale, idx_block_table, position_ids, num_tokens, cmp_topk_indices,
                       cfg, prefix: str, seed_scopes: bool = False):
    """Tasks 1-6 of the indexer core (module docstring); called inside a kernel body.

    Args:
        x: ``[T, D]`` BF16; qr ``[T, q_lora_rank]`` INT8; qr_scale ``[T, 1]`` FP32; wq_b
            ``[q_lora_rank, HI*c]`` INT8; wq_b_scale ``[HI*c]`` FP32; weights_proj ``[D, HI]``
            BF16; cos / sin ``[P, r]`` BF16; hadamard ``[c, c]`` BF16; idx_kv_cache ``[pages,
            bs, 1, c]`` INT8; idx_kv_scale ``[pages, bs, 1, 1]`` FP32; idx_block_table ``[B, n]``
            INT32; position_ids ``[T]`` INT32 (``-1``: inactive row); cmp_topk_indices ``[T, K]``
            INT32 (written: every row).
        prefix: task-name prefix; seed_scopes: seed ``score_wide`` with tasks.

    ``cfg.weight_format == "bf16"`` (weight_format.py): ``qr``, ``wq_b`` and the key cache are
    BF16; ``q_proj`` is BF16 x BF16 -> FP32 with no scale, the rotated query is rounded to BF16
    instead of quantised, scores ``sum_h w_h * relu(q_h . k_s)`` with no query or key scale
    (``qr_scale`` / ``wq_b_scale`` / ``idx_kv_scale`` not read).

    Raises:
        BindError: shapes that do not match ``cfg``, ``T`` not a multiple of ``B``,
            ``num_tokens`` out of range, a visible key page missing from the table.
        CapacityError: a visible row wider than ``indexer_score_capacity(cfg)``.
    """
    kernel = prefix
    D, Lq, HI, c, r, K = (cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim,
                          cfg.qk_rope_head_dim, cfg.index_topk)
    bs = cfg.block_size
    T = pl.tensor.dim(x, 0)
    B = pl.tensor.dim(idx_block_table, 0)
    n_tab = pl.tensor.dim(idx_block_table, 1)
    pages = idx_kv_cache.shape[0]
    for name, ten, want in (("x", x, [T, D]), ("qr", qr, [T, Lq]), ("qr_scale", qr_scale, [T, 1]),
                            ("wq_b", wq_b, [Lq, HI * c]), ("wq_b_scale", wq_b_scale, [HI * c]),
                            ("weights_proj", weights_proj, [D, HI]), ("hadamard", hadamard, [c, c]),
                            ("idx_kv_cache", idx_kv_cache, [pages, bs, 1, c]),
                            ("idx_kv_scale", idx_kv_scale, [pages, bs, 1, 1]),
                            ("cmp_topk_indices", cmp_topk_indices, [T, K])):
        if list(ten.shape) != want:
            raise _bind(kernel, f"parameter {name!r} is {list(ten.shape)}, config {cfg.name!r} needs {want}")
    if T < 1 or B < 1 or T % B:
        raise _bind(kernel, f"T={T} tokens must be >= 1 and a multiple of the B={B} requests")
    S = T // B
    nt = int(num_tokens)
    if not 0 <= nt <= T:
        raise _bind(kernel, f"num_tokens={nt} outside [0, T={T}]")
    # orchestration-level read of the positions (as the reference's visible-length scalars)
    pos = pl.read_values(position_ids, [0], nt)
    n_vis = [max(0, (p + 1) // CSA_RATIO) for p in pos]
    vis_of = _visible_rows(pos, nt, S, B)
    n_vis_max = max(n_vis, default=0)
    cap = indexer_score_capacity(cfg)
    L = indexer_sort_width(n_vis_max, bs)
    if L > cap:
        raise CapacityError(f"kernel {kernel}: {n_vis_max} visible index keys need a {L}-wide score row, above "
                            f"the declared capacity {cap}")
    t_pad = round_up(T, MATMUL_M_TILE)
    bf16 = is_bf16(cfg)
    q_proj = pl.create_tensor([t_pad, HI * c], pl.FP32, capacity=[token_capacity(cfg), None])
    q_i8 = pl.create_tensor([t_pad * HI, c], act_dtype(cfg), capacity=[token_capacity(cfg) * HI, None])
    q_dq = None if bf16 else pl.create_tensor([t_pad * HI, 1], pl.FP32, capacity=[token_capacity(cfg) * HI, None])
    weights = pl.create_tensor([t_pad, HI], pl.FP32, capacity=[token_capacity(cfg), None])
    if seed_scopes:
        score_wide = pl.create_tensor([T, L], pl.FP32, capacity=[token_capacity(cfg), cap])
    else:
        score_wide = pl.create_tensor([T, L], pl.FP32, init_value=-FP32_MAX, capacity=[token_capacity(cfg), cap])

    # 1. q projection (W8A8) and dequant
    PT = min(IDX_Q_T_TILE, t_pad)
    NT = min(IDX_Q_N_TILE, HI * c)
    KT = min(IDX_Q_K_TILE, Lq)
    n_nb = HI * c // NT
    wq_scale_row = pl.reshape(wq_b_scale, [1, HI * c])
    for blk in pl.spmd(-(-T // PT) * n_nb, name_hint=f"{prefix}_q_proj"):
        r0, n0 = (blk // n_nb) * PT, (blk % n_nb) * NT
        rows = min(PT, T - r0)
        acc = None
        for kc in pl.range(Lq // KT):
            a = pl.slice(qr, [PT, KT], [r0, kc * KT], valid_shape=[rows, KT])
            bt = wq_b[kc * KT:(kc + 1) * KT, n0:n0 + NT]
            acc = pl.matmul(a, bt) if acc is None else pl.matmul_acc(acc, a, bt)
        if bf16:  # BF16 x BF16 -> FP32, no scale
            deq = acc
        else:
            deq = pl.row_expand_mul(pl.cast(acc, pl.FP32), pl.slice(qr_scale, [PT, 1], [r0, 0],
                                                                    valid_shape=[rows, 1]))
            deq = pl.col_expand_mul(deq, wq_scale_row[0:1, n0:n0 + NT])
        pl.assemble(q_proj, pl.set_validshape(deq, rows, NT), [r0, n0])

    # 2. RoPE, BF16, Hadamard, per-(token, head) INT8: a block's TT tokens as [TT, HI * c] rows of
    # q_proj (head h in columns h*c ..), RoPE over the full width at once: in column j of head
    # slice jj = j % c >= c - r (rope channel u = jj - (c - r)), x[j] * cos[u >> 1] + x[j ^ 1] *
    # sign(u) * sin[u >> 1] (sign -1 on even channels); the other columns keep x (pl.select)
    TT = max(1, IDX_QROW_TILE // HI)  # tokens per block
    R = TT * HI
    N = HI * c
    j = pl.arange(0, [1, N], pl.INT32)
    u = (j - pl.div(j, c) * c) - (c - r)  # rope channel of a column, negative outside the rope slice
    is_rope = pl.cmp(u, 0, "ge")
    parity = j - pl.div(j, 2) * 2  # of u too: c - r is even
    rope_half = pl.select(is_rope, pl.div(u, 2), 0)  # u >> 1 (0 in nope columns: any valid index)
    rope_partner = pl.select(is_rope, j + 1 - parity * 2, j)  # j ^ 1
    rope_sign = pl.cast(parity * 2 - 1, pl.FP32)  # -1 on even channels, +1 on odd
    k = pl.arange(0, [1, TT * N], pl.INT32)
    rope_cols = pl.reshape(pl.cmp(k - pl.div(k, c) * c, c - r, "ge"), [TT, N])  # is_rope on every row

    def token_rows(table, rows: list, act: int):
        """``[TT, r]`` FP32: row ``i < act`` is ``table[rows[i]]``, then zeros."""
        one = pl.cast(pl.gather_rows(table, rows, 0, r), pl.FP32)  # [act, r], one row per token
        return one if act == TT else pl.assemble(pl.full([TT, r], pl.FP32, 0.0), one, [0, 0])

    for blk in pl.spmd(-(-max(nt, 1) // TT), name_hint=f"{prefix}_q_rope_hadamard_quant"):
        t0 = blk * TT
        act = min(TT, nt - t0)
        if act <= 0:
            continue
        q = pl.fillpad(pl.slice(q_proj, [TT, N], [t0, 0], valid_shape=[act, N]))  # [TT, HI * c]
        positions = pl.read_values(position_ids, [t0], act)  # the block's positions, one call
        rows = [max(0, p) for p in positions]
        cos_f = pl.gather(token_rows(cos_table, rows, act), index=rope_half)  # [TT, N]
        sin_f = pl.gather(token_rows(sin_table, rows, act), index=rope_half)
        rotated = q * cos_f + pl.col_expand_mul(pl.gather(q, index=rope_partner), rope_sign) * sin_f
        q = pl.reshape(pl.cast(pl.select(rope_cols, rotated, q), pl.BF16, mode="rint"), [R, c])
        qh = pl.matmul(q, hadamard[0:c, 0:c])
        if bf16:  # the rotated query in BF16, no scale
            pl.assemble(q_i8, pl.set_validshape(pl.cast(qh, pl.BF16, mode="rint"), act * HI, c), [t0 * HI, 0])
            continue
        codes, s = int8_quantize_rows(qh)
        pl.assemble(q_i8, pl.set_validshape(codes, act * HI, c), [t0 * HI, 0])
        pl.assemble(q_dq, pl.set_validshape(pl.recip(s), act * HI, 1), [t0 * HI, 0])

    # 3. head weights
    WT = min(IDX_W_T_TILE, t_pad)
    w_scale = HI ** -0.5 * c ** -0.5
    for blk in pl.spmd(-(-T // WT), name_hint=f"{prefix}_weights_proj"):
        r0 = blk * WT
        rows = min(WT, T - r0)
        acc = pl.matmul(pl.slice(x, [WT, D], [r0, 0], valid_shape=[rows, D]), weights_proj[0:D, 0:HI])
        pl.assemble(weights, pl.set_validshape(pl.mul(acc, w_scale), rows, HI), [r0, 0])

    # 4. seed form of the score row
    if seed_scopes:
        for blk in pl.spmd(-(-T // IDX_SEED_T_TILE), name_hint=f"{prefix}_score_init"):
            r0 = blk * IDX_SEED_T_TILE
            rows = min(IDX_SEED_T_TILE, T - r0)
            score_wide[r0:r0 + rows, 0:L] = pl.full([rows, L], pl.FP32, -FP32_MAX)

    # 5. scores over the visible key pages: a token's key rows in one row gather and one product /
    # dequant / head sum over all of them; every op is row-wise (exact INT32 dots, elementwise
    # FP32, a row sum over the HI heads), so each key's score is a page-by-page loop's bit for bit
    cache_rows = pl.reshape(idx_kv_cache, [pages * bs, c])
    scale_rows = pl.reshape(idx_kv_scale, [pages * bs, 1])
    page_rows = range(bs)
    # the pages a block scores: those its request's widest visible row covers (prefill: the same
    # pages for every token, so the blocks differ only in their query, weights and bound)
    req_pages = [0] * B
    for t in range(nt):
        b = 0 if B == 1 else t // S
        req_pages[b] = max(req_pages[b], -(-n_vis[t] // bs))
    cols = {n: pl.arange(0, [1, n * bs], pl.INT32) for n in sorted(set(req_pages) - {0})}  # column numbers
    for t in pl.spmd(T, name_hint=f"{prefix}_score"):
        if t >= nt:
            continue
        nv = vis_of(t, n_vis)
        if nv == 0:
            continue
        b = 0 if B == 1 else t // S
        q8 = q_i8[t * HI:(t + 1) * HI, 0:c]  # [HI, c]
        # [1, HI]: q_dq rows t*HI .. as a column tile (the same load), reshaped
        sq = None if bf16 else pl.reshape(q_dq[t * HI:(t + 1) * HI, 0:1], [1, HI])
        w = weights[t:t + 1, 0:HI]
        n_pg = req_pages[b]
        # the request's pages, one call; as exact ints (one gather_rows of int rows; under a block
        # template a guard on the values read, which every block of a prefill chunk shares)
        pages_t = [int(p) for p in pl.read_values(idx_block_table, [b, 0], min(n_pg, n_tab))]
        for pg in range(n_pg):
            if pg >= n_tab or pages_t[pg] < 0:
                raise _bind(kernel, f"request {b} (token {t}) sees index key page {pg}, which its "
                                    "idx_block_table row does not map")
        n_k = n_pg * bs
        if bf16:  # BF16 x BF16 -> FP32 dots page by page (a float GEMM's rounding may depend on M), no scales
            dots = pl.full([n_k, HI], pl.FP32, 0.0)
            for pg in range(n_pg):
                k16 = cache_rows[pages_t[pg] * bs:(pages_t[pg] + 1) * bs, 0:c]
                dots = pl.assemble(dots, pl.matmul(k16, q8, b_trans=True), [pg * bs, 0])
            hs = pl.col_expand_mul(pl.maximum(dots, 0.0), w)
            sc = pl.reshape(pl.row_sum(hs), [1, n_k])
        else:
            rows = [phys * bs + i for phys in pages_t for i in page_rows]  # the request's key rows, page by page
            dots = pl.cast(pl.matmul(pl.gather_rows(cache_rows, rows), q8, b_trans=True), pl.FP32)  # [n_k, HI]
            hs = pl.col_expand_mul(pl.maximum(pl.col_expand_mul(dots, sq), 0.0), w)
            sc = pl.reshape(pl.mul(pl.row_sum(hs), pl.gather_rows(scale_rows, rows)), [1, n_k])
        # the columns past the token's visible count: the most negative finite FP32
        score_wide[t:t + 1, 0:n_k] = pl.select(pl.cmp(cols[n_pg], nv, "lt"), sc, -FP32_MAX)

    # 6. top-k by sort32 + mrgsort
    Kc = min(K, L)
    seed_idx = pl.arange(0, [1, L], pl.UINT32)
    kcol = pl.arange(0, [1, Kc], pl.INT32)
    for t in pl.spmd(T, name_hint=f"{prefix}_topk"):
        nv = vis_of(t, n_vis) if t < nt else 0
        if nv > 0:
            pairs = pl.sort32(score_wide[t:t + 1, 0:L], seed_idx)
            run = 2 * SORT_RUN
            while run < 2 * L:
                pairs = pl.mrgsort(pairs, block_len=run)
                run *= MERGE_WAYS
            idx = pl.gather(pairs if Kc == L else pl.slice(pairs, [1, 2 * Kc], [0, 0]),
                            mask_pattern=pl.MaskPattern.P1010, output_dtype=pl.INT32)
            # -1 in columns k >= n_vis and for picks >= n_vis (never an entry past (p + 1) // 4):
            # both bounds at once, max(idx, k) < n_vis
            out = pl.select(pl.cmp(pl.maximum(idx, kcol), nv, "lt"), idx, -1)
            if Kc < K:
                out = pl.assemble(pl.full([1, K], pl.INT32, -1), out, [0, 0])
        else:
            out = pl.full([1, K], pl.INT32, -1)
        cmp_topk_indices[t:t + 1, 0:K] = out
    return cmp_topk_indices


def indexer_inline(mode: str):
    """The ``@pl.jit.inline`` lightning indexer of ``mode`` (``prefill_indexer`` /
    ``decode_indexer``): one body, the table shape and task prefix per mode."""
    prefix = f"{mode}_idx"

    @pl.jit.inline
    def indexer(
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
        idx_block_table: pl.Tensor[_table_dims(mode, IDX_TABLE_DYN), pl.INT32],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        cmp_topk_indices: pl.Out[pl.Tensor],
        cfg,
        seed_scopes=False,
    ):
        """Lightning indexer over one call (pypto-lib `models/deepseek/v4-flash/prefill_indexer.py` prefill / `decode_indexer.py` decode,
        generalised): shapes as :func:`indexer_topk_tasks` with ``idx_block_table [n]``
        (prefill, one request) or ``[B, n]`` (decode). Every row of ``cmp_topk_indices [T,
        index_topk]`` is written (``-1`` rows for inactive tokens).

        Returns:
            ``cmp_topk_indices``.

        Raises:
            BindError, CapacityError: see :func:`indexer_topk_tasks`.
        """
        table2 = pl.reshape(idx_block_table, [1, pl.tensor.dim(idx_block_table, 0)]) if mode == "prefill" \
            else idx_block_table
        return indexer_topk_tasks(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos_table, sin_table, hadamard,
                                  idx_kv_cache, idx_kv_scale, table2, position_ids, num_tokens, cmp_topk_indices,
                                  cfg, prefix, seed_scopes)

    indexer.__name__ = indexer.__qualname__ = f"{mode}_indexer"
    return indexer


prefill_indexer = indexer_inline("prefill")


@functools.lru_cache(maxsize=None)
def indexer_entry(cfg: DeepSeekV4Config, mode: str, seed_scopes: bool = False):
    """The ``@pl.jit`` test entry ``<mode>_indexer_test`` (parameters of
    :func:`indexer_inline`, model dims static); returns ``cmp_topk_indices``.

    Raises:
        ConfigError: an unknown mode.
    """
    D, Lq, HI, c, r, K, bs = (cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim,
                              cfg.qk_rope_head_dim, cfg.index_topk, cfg.block_size)
    body = indexer_inline(mode)
    WD, AD = weight_dtype(cfg), act_dtype(cfg)  # INT8, or BF16 for weight_format "bf16"

    @pl.jit
    def indexer_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        qr: pl.Tensor[[T_DYN, Lq], AD],
        qr_scale: pl.Tensor[[T_DYN, 1], pl.FP32],
        wq_b: pl.Tensor[[Lq, HI * c], WD],
        wq_b_scale: pl.Tensor[[HI * c], pl.FP32],
        weights_proj: pl.Tensor[[D, HI], pl.BF16],
        cos_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        sin_table: pl.Tensor[[ROPE_ROWS_DYN, r], pl.BF16],
        hadamard: pl.Tensor[[c, c], pl.BF16],
        idx_kv_cache: pl.Tensor[[IDX_PAGES_DYN, bs, 1, c], AD],
        idx_kv_scale: pl.Tensor[[IDX_PAGES_DYN, bs, 1, 1], pl.FP32],
        idx_block_table: pl.Tensor[_table_dims(mode, IDX_TABLE_DYN), pl.INT32],
        position_ids: pl.Tensor[[T_DYN], pl.INT32],
        num_tokens: pl.Scalar[pl.INT32],
        cmp_topk_indices: pl.Out[pl.Tensor[[T_DYN, K], pl.INT32]],
    ):
        return body(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos_table, sin_table, hadamard, idx_kv_cache,
                    idx_kv_scale, idx_block_table, position_ids, num_tokens, cmp_topk_indices, cfg, seed_scopes)

    indexer_test.__name__ = indexer_test.__qualname__ = f"{mode}_indexer_test"
    return indexer_test


def prefill_indexer_entry(cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """:func:`indexer_entry` of mode ``prefill``."""
    return indexer_entry(cfg, "prefill", seed_scopes)
# ---- end kernel ----


def golden_indexer_query(
    qr: torch.Tensor,  # [T, Lq] int8 (float q_res when weight_format="bf16")
    qr_scale: torch.Tensor,  # [T, 1] fp32 (unused for bf16 weights)
    wq_b: torch.Tensor,  # [Lq, HI*c] int8 (float for bf16 weights)
    wq_b_scale: torch.Tensor,  # [HI*c] fp32 (unused for bf16 weights)
    cos: torch.Tensor,  # [T, r] per-token rows
    sin: torch.Tensor,  # [T, r]
    hadamard: torch.Tensor,  # [c, c]
    HI: int,
    weight_format: str = "int8",
    float32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, HI, c] int8 or fp32, [T, HI] fp32)
    """Index queries (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; `prefill_indexer.py`): W8A8 dequant (``int8``) or a float product
    (``bf16``), RoPE on the last ``r`` channels, then BF16, Hadamard and per-row INT8
    (``bf16``: the product rounded to BF16, scale 1; ``float32``: no rounding, no
    quantisation, scale 1). Returns ``(q, dequant scale)``."""
    T = qr.shape[0]
    if weight_format == "int8":
        acc = (qr.double() @ wq_b.double()).float()  # exact INT32 values
        q = acc * qr_scale.float() * wq_b_scale.float()
    elif float32:
        q = qr.float() @ wq_b.float()
    else:
        q = (qr.double() @ wq_b.double()).float()
    c = q.shape[1] // HI
    q = q.view(T, HI, c).clone()
    r = cos.shape[1]
    q[..., c - r:] = rope_interleaved(q[..., c - r:], cos.float(), sin.float())
    if float32:
        return q @ hadamard.float(), torch.ones(T, HI)
    qh = q.to(torch.bfloat16).float().reshape(T * HI, c) @ hadamard.float()
    if weight_format == "bf16":  # the bf16 kernel's BF16 query, unit scale
        return qh.to(torch.bfloat16).view(T, HI, c), torch.ones(T, HI)
    codes, dq = quantize_per_row_int8(qh)
    return codes.view(T, HI, c), dq.view(T, HI)


def golden_indexer_scores(
    q: torch.Tensor,  # [T, HI, c] int8 / fp32
    q_dq: torch.Tensor,  # [T, HI] fp32
    weights: torch.Tensor,  # [T, HI] fp32
    keys: torch.Tensor,  # [T, N, c] int8 / fp32 (each token's request's keys 0 .. N-1)
    key_scale: torch.Tensor,  # [T, N] fp32
    n_vis: torch.Tensor,  # [T] int
) -> torch.Tensor:  # [T, N] fp32, -FP32_MAX where s >= n_vis
    """``I[t, s] = ks[t, s] * sum_h w[t, h] * relu(float(q[t, h] . k[t, s]) * sq[t, h])`` in the
    kernel's operation order (dot in exact integers, or FP64 for float keys, then FP32);
    entries ``s >= n_vis[t]`` are the most negative finite FP32."""
    dots = torch.einsum("thc,tsc->tsh", q.double(), keys.double()).float()
    hs = torch.relu(dots * q_dq[:, None, :]) * weights[:, None, :]
    score = hs.sum(dim=-1) * key_scale
    visible = torch.arange(keys.shape[1])[None, :] < n_vis[:, None]
    return torch.where(visible, score, torch.full_like(score, -FP32_MAX))


def golden_indexer_topk(score: torch.Tensor, n_vis: torch.Tensor, K: int) -> torch.Tensor:  # [T, K] int32
    """First ``min(K, n_vis[t])`` indices of a stable descending sort of each row, then ``-1``;
    an index ``>= n_vis[t]`` among them (a visible score of ``-inf``) is ``-1`` as well."""
    T, N = score.shape
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :K]
    out = torch.full((T, K), -1, dtype=torch.int64)
    out[:, :order.shape[1]] = order
    keep = (torch.arange(K)[None, :] < n_vis[:, None]) & (out < n_vis[:, None])
    return torch.where(keep, out, -1).to(torch.int32)


def golden_prefill_indexer(
    x: torch.Tensor,  # [T, D] bf16
    qr: torch.Tensor,  # [T, Lq] int8 (float for bf16 weights)
    qr_scale: torch.Tensor,  # [T, 1] fp32
    wq_b: torch.Tensor,  # [Lq, HI*c] int8 (float for bf16 weights)
    wq_b_scale: torch.Tensor,  # [HI*c] fp32
    weights_proj: torch.Tensor,  # [D, HI] bf16
    cos_table: torch.Tensor,  # [P, r]
    sin_table: torch.Tensor,  # [P, r]
    hadamard: torch.Tensor,  # [c, c]
    idx_kv_cache: torch.Tensor,  # [pages, bs, 1, c] int8 (fp32 in float32 mode)
    idx_kv_scale: torch.Tensor,  # [pages, bs, 1, 1] fp32
    idx_block_table: torch.Tensor,  # [n] int32 ([B, n] in decode)
    position_ids: torch.Tensor,  # [T] int32, -1 = inactive row
    num_tokens: int,
    cmp_topk_indices: torch.Tensor,  # [T, K] int32 (only its shape is used)
    cfg: DeepSeekV4Config,
    weight_format: str = "int8",
    float32: bool = False,
    return_scores: bool = False,
):
    """Lightning indexer golden (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; `decode_indexer.py` / `prefill_indexer.py`), vectorised over tokens and
    keys; prefill (``[n]`` table) and decode (``[B, n]``, request-major tokens) alike.

    ``weight_format="bf16"`` takes a float ``qr`` (the q LoRA activation) and a float ``wq_b``
    and, as the bf16 kernel, reads no key scale (BF16 keys);
    ``float32=True`` also drops every BF16 rounding and the INT8 queries / keys (an FP32
    ``idx_kv_cache`` with scale 1): the transformers indexer's math up to the Hadamard
    rotation. Rows ``t >= num_tokens`` and rows with no visible key are all ``-1``.

    Returns:
        ``cmp_topk_indices [T, K]`` INT32; with ``return_scores`` also ``(scores [T, N] fp32,
        n_vis [T])`` (``N`` = the widest visible row).

    Raises:
        BindError: ``num_tokens`` outside ``[0, T]``, ``T`` not a multiple of ``B``, or a
            visible key page missing from the table.
    """
    fn = "golden_prefill_indexer"
    T, K, HI, bs = x.shape[0], cfg.index_topk, cfg.index_n_heads, cfg.block_size
    table = idx_block_table.reshape(-1, idx_block_table.shape[-1]).long()
    B = table.shape[0]
    nt = int(num_tokens)
    if not 0 <= nt <= T or T % B:
        raise BindError(f"{fn}: need 0 <= num_tokens <= T and T a multiple of B; got {nt}, T={T}, B={B}")
    pos = position_ids[:nt].long()
    n_vis = ((pos + 1) // CSA_RATIO).clamp(min=0)
    N = int(n_vis.max()) if nt else 0
    out = torch.full((T, K), -1, dtype=torch.int32)
    if N == 0:
        return (out, torch.zeros(T, 0), torch.zeros(T, dtype=torch.long)) if return_scores else out
    p = pos.clamp(min=0)
    q, q_dq = golden_indexer_query(qr[:nt], qr_scale[:nt], wq_b, wq_b_scale, cos_table[p], sin_table[p], hadamard,
                                   HI, weight_format, float32)
    weights = (x[:nt].double() @ weights_proj.double()).float() * (HI ** -0.5 * cfg.index_head_dim ** -0.5)
    if float32:
        weights = (x[:nt].float() @ weights_proj.float()) * (HI ** -0.5 * cfg.index_head_dim ** -0.5)
    req = torch.arange(nt) // (T // B)
    s = torch.arange(N)
    if bool((s // bs >= table.shape[1]).any()):
        raise BindError(f"{fn}: visible index keys up to {N - 1} need table entries past {table.shape[1]}")
    phys = table[req[:, None], (s // bs)[None, :]]  # [nt, N]
    if bool(((phys < 0) & (s[None, :] < n_vis[:, None])).any()):
        raise BindError(f"{fn}: a visible index key page is missing from idx_block_table")
    rows = phys.clamp(min=0) * bs + s % bs
    keys = idx_kv_cache.reshape(-1, idx_kv_cache.shape[-1])[rows]
    kscale = idx_kv_scale.reshape(-1)[rows].float()
    if weight_format == "bf16" and not float32:  # the bf16 kernel reads no key scale
        kscale = torch.ones_like(kscale)
    score = golden_indexer_scores(q, q_dq, weights, keys, kscale, n_vis)
    out[:nt] = golden_indexer_topk(score, n_vis, K)
    if return_scores:
        full = torch.full((T, N), -FP32_MAX)
        full[:nt] = score
        nv = torch.zeros(T, dtype=torch.long)
        nv[:nt] = n_vis
        return out, full, nv
    return out


def topk_set_compare(scores: torch.Tensor, n_vis: torch.Tensor, rel_tol: float = 1e-4):
    """Compare function for top-k index rows against the golden's ``scores [T, N]``: per row the
    selected *sets* must be equal, except that entries whose golden score lies within
    ``rel_tol`` (relative, plus 1e-30) of the k-th selected score may swap (ties within
    rounding of the boundary). Returns ``(ok, detail)`` like the harness compare functions;
    its ``margin`` (pto.golden.compare.margin_of) counts the differing rows against 0."""
    def differing_rows(actual: torch.Tensor, expected: torch.Tensor) -> tuple[list, int]:
        bad, swaps = [], 0
        for t in range(actual.shape[0]):
            a = set(actual[t][actual[t] >= 0].tolist())
            e = set(expected[t][expected[t] >= 0].tolist())
            if len(a) != len(e) or len(a) != len(actual[t][actual[t] >= 0]):
                bad.append(t)
                continue
            if a == e:
                continue
            kth = float(scores[t, list(e)].min())
            diff = [float(scores[t, j]) for j in a ^ e]
            if all(abs(v - kth) <= rel_tol * abs(kth) + 1e-30 for v in diff):
                swaps += 1
            else:
                bad.append(t)
        return bad, swaps

    def compare(actual: torch.Tensor, expected: torch.Tensor, **_run):
        bad, swaps = differing_rows(actual, expected)
        return (not bad), f"{len(bad)} rows differ beyond boundary ties (first {bad[:5]}); {swaps} tie swaps"

    def margin(actual: torch.Tensor, expected: torch.Tensor, **_run) -> dict:
        n_bad = len(differing_rows(actual, expected)[0])
        return {"metric": "rows whose selected set differs beyond boundary ties", "error": float(n_bad),
                "tolerance": 0.0, "margin": 0.0 if n_bad == 0 else float("inf")}

    compare.__name__ = compare.__qualname__ = f"topk_set_compare(rel_tol={rel_tol:g})"
    compare.margin = margin
    return compare


def make_indexer_inputs(cfg: DeepSeekV4Config, starts: list[int], S: int, num_tokens: int, seed: int,
                        pages: int | None = None) -> dict:
    """Seeded inputs of the indexer for ``B = len(starts)`` requests of ``S`` tokens
    (request ``b`` at positions ``starts[b] ..``), with a filled INT8 key cache.

    Draw order from one ``torch.Generator(seed)``: ``x ~ N(0, 1)`` BF16 ``[T, D]``; the q LoRA
    activation ``q_res ~ N(0, 1)`` ``[T, Lq]`` (quantised per row to ``qr`` / ``qr_scale``);
    ``wq_b ~ N(0, Lq^-0.5)`` ``[Lq, HI*c]`` (quantised per column); ``weights_proj ~ N(0,
    D^-0.5)`` BF16 ``[D, HI]``; a Hadamard stand-in ``U(0, 1) c^-0.5`` BF16; keys ``N(0, 1)``
    ``[pages*bs, c]`` quantised per row into ``idx_kv_cache`` / ``idx_kv_scale``. Request ``b``
    owns key pages ``b*n .. b*n+n-1`` (``n = pages // B``, permuted ``(blk*m+1) % n``).

    For ``cfg.weight_format == "bf16"`` the kernel's operands are the BF16 ``q_res``, ``wq_b``
    and keys with unit scales (the same draws).

    Returns:
        dict keyed by the kernel's parameter names plus ``q_res`` and ``wq_b_float`` (the
        unquantised operands for the ``bf16`` golden).

    Raises:
        BindError: a visible row past the key pool.
    """
    from pto.models.deepseek_v4.prefill_attention_swa import permuted_block_table
    B, T = len(starts), len(starts) * S
    D, Lq, HI, c, bs, K = (cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim,
                           cfg.block_size, cfg.index_topk)
    pages = pages or max(B, 64)
    per = pages // B
    if any((s + S) // CSA_RATIO > per * bs for s in starts):
        raise BindError(f"make_indexer_inputs: starts {starts} + {S} tokens see more index keys than {per} pages "
                        f"of {bs} per request")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen).to(torch.bfloat16)
    q_res = torch.randn(T, Lq, generator=gen)
    qr, qr_scale = quantize_per_row_int8(q_res)
    wq_b_float = torch.randn(Lq, HI * c, generator=gen) * Lq ** -0.5
    wq_b, wq_b_scale = quantize_weight_per_column(wq_b_float)
    weights_proj = (torch.randn(D, HI, generator=gen) * D ** -0.5).to(torch.bfloat16)
    hadamard = (torch.rand(c, c, generator=gen) * c ** -0.5).to(torch.bfloat16)
    keys = torch.randn(pages * bs, c, generator=gen)
    k8, ks = quantize_per_row_int8(keys)
    table = torch.stack([permuted_block_table(per, per, offset=1) + b * per for b in range(B)]).to(torch.int32)
    cos, sin = rope_tables(cfg, "compress")
    positions = torch.cat([st + torch.arange(S) for st in starts]).to(torch.int32)
    if is_bf16(cfg):
        bf = torch.bfloat16
        qr, qr_scale, wq_b, wq_b_scale = q_res.to(bf), torch.ones(T, 1), wq_b_float.to(bf), torch.ones(HI * c)
        k8, ks = keys.to(bf), torch.ones(pages * bs, 1)
    return {
        "x": x, "qr": qr, "qr_scale": qr_scale, "wq_b": wq_b, "wq_b_scale": wq_b_scale,
        "weights_proj": weights_proj, "cos_table": cos.to(torch.bfloat16), "sin_table": sin.to(torch.bfloat16),
        "hadamard": hadamard, "idx_kv_cache": k8.view(pages, bs, 1, c), "idx_kv_scale": ks.view(pages, bs, 1, 1),
        "idx_block_table": table, "position_ids": positions, "num_tokens": int(num_tokens),
        "cmp_topk_indices": torch.full((T, K), -1, dtype=torch.int32),
        "q_res": q_res, "wq_b_float": wq_b_float,
    }


_ARG_ORDER = ("x", "qr", "qr_scale", "wq_b", "wq_b_scale", "weights_proj", "cos_table", "sin_table", "hadamard",
              "idx_kv_cache", "idx_kv_scale", "idx_block_table", "position_ids", "num_tokens", "cmp_topk_indices")


def indexer_case(entry, inputs: dict, cfg, label: str) -> CaseRun:
    """CaseRun over indexer fixture ``inputs`` (see :func:`make_indexer_inputs`): the golden
    fills ``cmp_topk_indices`` and the compare function is :func:`topk_set_compare` against
    the golden's own scores (exact sets except boundary ties within rounding)."""
    held = {}

    def golden(v: dict) -> None:
        out, scores, nv = golden_prefill_indexer(**{k: v[k] for k in _ARG_ORDER}, cfg=cfg, return_scores=True,
                                                 weight_format=weight_format_of(cfg))
        held["scores"], held["n_vis"] = scores, nv
        v["cmp_topk_indices"] = out

    def compare(actual, expected, **_run):
        return topk_set_compare(held["scores"], held["n_vis"])(actual, expected)

    def margin(actual, expected, **_run):
        return topk_set_compare(held["scores"], held["n_vis"]).margin(actual, expected)

    compare.__name__ = compare.__qualname__ = "topk_set_compare(golden scores)"
    compare.margin = margin

    return CaseRun(entry, ratio4_specs(inputs, _ARG_ORDER, ("cmp_topk_indices",)), golden, {"cmp_topk_indices": compare}, rtol=1e-3, atol=1e-3, label=label)


def build_prefill_indexer(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None,
                          start_pos: int | None = None, num_tokens: int | None = None, seed: int = 0,
                          seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the prefill indexer; ``start_pos`` defaults to ``4 * index_topk``
    so that late tokens see more entries than ``index_topk`` (a strict subset is selected);
    ``weight_format="bf16"``: the unquantised indexer (same set compare).

    Raises:
        ConfigError: unknown preset or mode, ``T < 1``; BindError: a fixture the config cannot hold.
    """
    cfg, T = prefill_case_tokens("prefill_indexer", preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    start = 4 * cfg.index_topk if start_pos is None else start_pos
    nt = T if num_tokens is None else num_tokens
    inputs = make_indexer_inputs(cfg, [start], T, nt, seed)
    label = (f"{preset} {mode} T={T} start_pos={start} num_tokens={nt}" + (" seed_scopes" if seed_scopes else "")
             + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return indexer_case(prefill_indexer_entry(cfg, seed_scopes), {**inputs, "idx_block_table":
                                                                  inputs["idx_block_table"][0]}, cfg, label)


register(KernelCase("prefill_indexer", build_prefill_indexer, modes=("prefill",), seed_variant=True,
                    description="CSA lightning indexer, prefill: INT8 index scores, sort32/mrgsort top-k (pypto-lib `prefill_indexer.py`)"))
