"""Decode-step metadata: per-request positions, paged-cache rows, window and compressed indices.

Geometry (pypto-lib `models/deepseek/v4-flash/` INT8 conventions "Decode geometry", `decode_attention_swa.py`, `decode_compressor_ratio128.py`, `decode_attention_hca.py`): ``B`` requests of
``S`` tokens each (``S = 1``, or ``S = 2`` for a multi-token-prediction step), token-major
``T = B * S`` rows, token ``t = b * S + s`` belongs to request ``b``. Request ``b`` decodes
positions ``start_pos[b] + s``; a request with ``start_pos[b] < 0`` is *inactive*: its ``S``
rows carry position ``-1`` and every index and slot derived from them is the ``-1`` sentinel.

Every paged tensor is addressed by absolute position through the request's own block table
(``row(p) = table[b, p // page] * page + p % page``; a negative table entry means "no page"):

* ``ori_slot_mapping [T]`` INT64: raw / SWA cache row of the token's own kv (``page =
  block_size``);
* ``swa_indices [T, W]`` INT32: the token's window, keys ``max(0, p - W + 1) .. p`` ascending
  in columns ``0 .. valid - 1`` (``valid = min(W, p + 1)``: at the start of a sequence the
  window is not yet full and the remaining columns are ``-1``; no slot is pinned to page 0);
  the token's own key (written by this step before the attention) is the last valid column;
* ``cmp_indices [T, n_cols]`` INT32: the logical compressed slots a token may attend,
  ``k`` for ``k < min(n_cols, (p + 1) // ratio)`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`: entry ``w`` is visible
  once its window is complete, ``w < floor((t + 1) / ratio)``; within an ``S = 2`` step each
  token sees its own count), ``-1`` elsewhere. The attention lowers slot ``k`` through
  ``cmp_block_table[b]``;
* ``cmp_slot_mapping [T]`` INT64: for a token that closes a window (``(p + 1) % ratio ==
  0``) the compressed-cache row of entry ``p // ratio`` through ``cmp_block_table[b]``,
  else ``-1``;
* ``state_slot_mapping [T]`` INT64: the ratio-128 compressor-state row of the token
  (``page = hca_state_block_size``).

The torch functions below are the host-side builders (and the goldens of the DSL pieces);
:func:`decode_metadata_kernels` holds the in-kernel tasks the decode blocks compose:
``decode_window_indices``, ``decode_cmp_indices``, ``decode_cache_write`` and
``decode_rope_rows``; :func:`decode_block_tables` builds fixture page tables.

Contract for a cache manager: the raw-cache pages of a request must hold positions
``p0 - W + 1 .. p0 + S - 1`` at once during a step (the step writes all ``S`` new keys before
the attention reads the windows), and its compressor-state ring at least one 128-token
window (the compressor scatters and pools in token order).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = [
    "HCA_RATIO",
    "scatter_rows_by_slot",
    "window_row",
    "hca_cmp_cols",
    "decode_positions",
    "page_rows",
    "golden_decode_window_indices",
    "golden_decode_cmp_indices",
    "decode_cmp_slot_mapping",
    "make_decode_metadata",
    "decode_block_tables",
    "decode_metadata_kernels",
]

HCA_RATIO = 128  # tokens per compressed entry of a ratio-128 (HCA) layer
HCA_CMP_TOPK_MAX = 512  # pypto-lib `decode_sparse_attn_hca.py`: CMP_TOPK = min(max_position_embeddings / 128, 512)


def hca_cmp_cols(cfg: DeepSeekV4Config) -> int:
    """Compressed columns of an HCA decode token: ``min(max_position_embeddings // 128, 512)``
    (pypto-lib `decode_sparse_attn_hca.py` ``CMP_TOPK``; 128 at FLASH and tiny) -- every compressed entry a request can have."""
    return max(1, min(cfg.max_position_embeddings // HCA_RATIO, HCA_CMP_TOPK_MAX))


def _int_tensor(fn: str, name: str, t: torch.Tensor, rank: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != rank or t.is_floating_point() or t.dtype == torch.bool:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise BindError(f"{fn}: {name} must be an integer rank-{rank} tensor, got {got}")


def _request_geometry(fn: str, position_ids: torch.Tensor, table: torch.Tensor) -> tuple[int, int]:
    """``(B, S)`` from ``position_ids [T]`` and a per-request ``table [B, n]``."""
    _int_tensor(fn, "position_ids", position_ids, 1)
    _int_tensor(fn, "block table", table, 2)
    T, B = position_ids.shape[0], table.shape[0]
    if B < 1 or T % B:
        raise BindError(f"{fn}: T={T} tokens is not a multiple of the B={B} request rows of the block table")
    return B, T // B


def decode_positions(
    start_pos: torch.Tensor | list,  # [B] int, < 0 = inactive request
    S: int,
) -> torch.Tensor:  # [B*S] int32
    """Token-major positions of a decode step: ``start_pos[b] + s`` at row ``b * S + s``, and
    ``-1`` for both rows of an inactive request (``start_pos[b] < 0``).

    Raises:
        BindError: ``S < 1`` or ``start_pos`` not a rank-1 integer sequence.
    """
    start = torch.as_tensor(start_pos)
    _int_tensor("decode_positions", "start_pos", start, 1)
    if not isinstance(S, int) or S < 1:
        raise BindError(f"decode_positions: S must be a positive int, got {S!r}")
    pos = start.long()[:, None] + torch.arange(S)[None, :]
    pos = torch.where(start.long()[:, None] >= 0, pos, torch.full_like(pos, -1))
    return pos.reshape(-1).to(torch.int32)


def page_rows(
    positions: torch.Tensor,  # [T] int, < 0 = inactive
    table: torch.Tensor,  # [B, n] int32 logical -> physical page, < 0 = none
    page: int,
    n_pages: int,
    what: str = "cache",
) -> torch.Tensor:  # [T] int64
    """Flat rows ``table[t // S, p // page] * page + p % page`` of the tokens' positions;
    ``-1`` for an inactive token or a negative table entry.

    Raises:
        BindError: ``T`` not a multiple of ``B``, a position whose page is past the table,
            or a table entry outside the ``n_pages`` pages of ``what``.
    """
    fn = "page_rows"
    B, S = _request_geometry(fn, positions, table)
    pos = positions.long()
    act = pos >= 0
    blk = torch.where(act, pos // page, torch.zeros_like(pos))
    if bool((blk >= table.shape[1]).any()):
        bad = int(pos[blk >= table.shape[1]].max())
        raise BindError(f"{fn}: position {bad} needs page {bad // page} of {what}, its table has "
                        f"{table.shape[1]} entries")
    phys = table.long()[torch.arange(B * S) // S, blk]
    if bool((act & (phys >= n_pages)).any()):
        raise BindError(f"{fn}: table entry {int(phys[act].max())} is not one of the {n_pages} pages of {what}")
    rows = phys * page + pos % page
    return torch.where(act & (phys >= 0), rows, torch.full_like(rows, -1))


def golden_decode_window_indices(
    position_ids: torch.Tensor,  # [T] int32, < 0 = inactive
    block_table: torch.Tensor,  # [B, n_blocks] int32 raw-cache pages per request
    cfg: DeepSeekV4Config,
) -> torch.Tensor:  # [T, sliding_window] int32
    """Per-token sliding-window rows of a decode step (module docstring; pypto-lib `decode_attention_swa.py`, pypto-lib `prefill_attention_swa.py` step 5).

    Row ``t`` with ``p = position_ids[t] >= 0``: columns ``0 .. valid - 1`` (``valid = min(W,
    p + 1)``) hold the physical raw-cache rows of keys ``p + 1 - valid .. p`` through
    ``block_table[t // S]`` (a negative table entry gives ``-1``), the rest ``-1``; rows of
    inactive tokens are all ``-1``.

    Raises:
        BindError: see :func:`page_rows`.
    """
    fn = "golden_decode_window_indices"
    B, S = _request_geometry(fn, position_ids, block_table)
    T, W, bs = position_ids.shape[0], cfg.sliding_window, cfg.block_size
    pos = position_ids.long()
    valid = torch.where(pos >= 0, torch.clamp(pos + 1, max=W), torch.zeros_like(pos))  # [T]
    col = torch.arange(W)
    keys = (pos + 1 - valid)[:, None] + col[None, :]  # [T, W]
    in_window = col[None, :] < valid[:, None]
    keys = torch.where(in_window, keys, torch.full_like(keys, -1))
    # keys flattened column-major ([W, T]) against the table repeated W times: row w*T + t
    # maps to request (w*T + t) // S = w*B + t // S, i.e. table row t // S
    rows = page_rows(keys.T.reshape(-1), block_table.repeat(W, 1), bs, cfg.ori_kv_block_num, "the raw kv cache")
    rows = rows.reshape(W, T).T
    return torch.where(in_window, rows, torch.full_like(rows, -1)).to(torch.int32)


def golden_decode_cmp_indices(
    position_ids: torch.Tensor,  # [T] int32, < 0 = inactive
    n_cols: int,
    ratio: int = HCA_RATIO,
) -> torch.Tensor:  # [T, n_cols] int32
    """Visible compressed slots per token: ``k`` for ``k < min(n_cols, (p + 1) // ratio)``,
    ``-1`` elsewhere and on inactive rows (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; `decode_attention_hca.py` deterministic top-k).

    Raises:
        BindError: ``position_ids`` not an integer ``[T]`` tensor, or ``n_cols`` / ``ratio``
            not positive.
    """
    _int_tensor("golden_decode_cmp_indices", "position_ids", position_ids, 1)
    if n_cols < 1 or ratio < 1:
        raise BindError(f"golden_decode_cmp_indices: n_cols={n_cols} and ratio={ratio} must be positive")
    pos = position_ids.long()
    n_vis = torch.where(pos >= 0, (pos + 1) // ratio, torch.zeros_like(pos))
    k = torch.arange(n_cols)[None, :]
    return torch.where(k < n_vis[:, None], k, torch.full_like(k, -1)).to(torch.int32)


def decode_cmp_slot_mapping(
    position_ids: torch.Tensor,  # [T] int32
    cmp_block_table: torch.Tensor,  # [B, n] int32 compressed-cache pages per request
    cfg: DeepSeekV4Config,
    ratio: int = HCA_RATIO,
) -> torch.Tensor:  # [T] int64
    """Compressed-cache row written by each token: entry ``p // ratio`` through
    ``cmp_block_table[t // S]`` for a token that closes a window (``(p + 1) % ratio == 0``),
    ``-1`` for every other token (module docstring; pypto-lib `decode_compressor_ratio128.py`).

    Raises:
        BindError: see :func:`page_rows`.
    """
    pos = position_ids.long()
    closes = (pos >= 0) & ((pos + 1) % ratio == 0)
    entry = torch.where(closes, pos // ratio, torch.full_like(pos, -1))
    return page_rows(entry, cmp_block_table, cfg.block_size, cfg.cmp_kv_block_num, "the compressed cache")


def make_decode_metadata(
    cfg: DeepSeekV4Config,
    start_pos: torch.Tensor | list,  # [B] int, < 0 = inactive
    S: int,
    block_table: torch.Tensor,  # [B, max_blocks_per_seq] int32
    cmp_block_table: torch.Tensor | None = None,  # [B, cmp_kv_block_num] int32
    state_block_table: torch.Tensor | None = None,  # [B, max_pos // hca_state_block_size] int32
    ratio: int = HCA_RATIO,
) -> dict:
    """Every host-side index of one decode step, keyed by the kernels' parameter names:
    ``position_ids [T] INT32``, ``ori_slot_mapping [T] INT64``, ``swa_indices [T, W] INT32``
    and, when the tables are given, ``cmp_indices [T, hca_cmp_cols] INT32``,
    ``cmp_slot_mapping [T] INT64`` and ``state_slot_mapping [T] INT64`` (module docstring).

    Raises:
        BindError: see :func:`page_rows` and :func:`decode_positions`.
    """
    pos = decode_positions(start_pos, S)
    out = {"position_ids": pos,
           "ori_slot_mapping": page_rows(pos, block_table, cfg.block_size, cfg.ori_kv_block_num, "the raw kv cache"),
           "swa_indices": golden_decode_window_indices(pos, block_table, cfg)}
    if cmp_block_table is not None:
        out["cmp_indices"] = golden_decode_cmp_indices(pos, hca_cmp_cols(cfg), ratio)
        out["cmp_slot_mapping"] = decode_cmp_slot_mapping(pos, cmp_block_table, cfg, ratio)
    if state_block_table is not None:
        out["state_slot_mapping"] = page_rows(pos, state_block_table, cfg.hca_state_block_size,
                                              cfg.hca_state_block_num, "the compressor state")
    return out


# ---- kernel ----
def window_row(kernel: str, tok: int, pos: int, block_table, table_row: tuple, *, window: int, block_size: int,
               n_blocks: int, n_pages: int):
    """``[1, window]`` INT32 sliding-window row of token ``tok`` at position ``pos >= 0`` (pypto-lib
    `prefill_attention_swa.py` step 5; inside a block): keys ``pos+1-valid .. pos`` with ``valid =
    min(window, pos + 1)`` in columns ``0 .. valid-1``, key ``k`` lowered to ``block_table[*table_row,
    k // block_size] * block_size + k % block_size`` one page segment at a time (``pl.arange_runs``); a
    negative table entry and the remaining columns stay ``-1``. ``table_row`` is ``()`` for a
    prefill table ``[n_blocks]``, ``(request,)`` for a decode table ``[B, n_blocks]``.

    Raises:
        BindError: naming ``kernel``, a position past the block table, or a table entry naming a
            page outside the ``n_pages`` of the cache.
    """
    return pl.arange_runs([1, window], pl.INT32, -1, window_runs(kernel, tok, pos, block_table, table_row,
                                                                 window=window, block_size=block_size,
                                                                 n_blocks=n_blocks, n_pages=n_pages))


def window_runs(kernel: str, tok: int, pos: int, block_table, table_row: tuple, *, window: int, block_size: int,
                n_blocks: int, n_pages: int) -> list:
    """The ``pl.arange_runs`` runs ``[(column, first physical row, length), ...]`` of
    :func:`window_row` (same arguments and errors): the table entries of the token's page
    segments are read here, in one ``pl.read_values``; build the row from them (many tokens:
    :func:`window_runs_many`)."""
    p0, n = _window_pages(kernel, tok, pos, table_row, window, block_size, n_blocks)
    return _window_segments(kernel, tok, pos, pl.read_values(block_table, [*table_row, p0], n), table_row, window,
                            block_size, n_pages)


def window_runs_many(kernel: str, tokens: list, block_table, table_row: tuple, *, window: int, block_size: int,
                     n_blocks: int, n_pages: int) -> list:
    """:func:`window_runs` of every ``(tok, pos)`` of ``tokens`` (each ``pos >= 0``), in order: the
    same table entries read in the same order (one ``pl.read_elements`` for all tokens) and the
    same errors (the first failing token's, after the tokens before it were read), as a list
    of run lists (``pl.arange_rows`` builds the rows)."""
    spans, late = [], None
    for tok, pos in tokens:
        try:
            spans.append(_window_pages(kernel, tok, pos, table_row, window, block_size, n_blocks))
        except BindError as e:  # raised once the tokens before it are done, as one call per token would
            late = e
            break
    phys = pl.read_elements(block_table, [[*table_row, p] for p0, n in spans for p in range(p0, p0 + n)])
    out, k = [], 0
    for (tok, pos), (_, n) in zip(tokens, spans):
        out.append(_window_segments(kernel, tok, pos, phys[k:k + n], table_row, window, block_size, n_pages))
        k += n
    if late is not None:
        raise late
    return out


def _window_pages(kernel: str, tok: int, pos: int, table_row: tuple, window: int, block_size: int,
                  n_blocks: int) -> tuple:
    """``(first page, page count)`` of the window of token ``tok`` at ``pos``: the table entries
    its row reads. Raises the BindError of a position past the block table."""
    if pos // block_size >= n_blocks:
        raise BindError(f"{kernel}: position_ids[{tok}] = {pos} needs page {pos // block_size}, block_table "
                        f"{'rows have' if table_row else 'has'} {n_blocks} entries")
    p0 = (pos + 1 - min(window, pos + 1)) // block_size
    return p0, pos // block_size - p0 + 1


def _window_segments(kernel: str, tok: int, pos: int, pages: list, table_row: tuple, window: int, block_size: int,
                     n_pages: int) -> list:
    """The runs of the window row of token ``tok`` at ``pos`` from its table entries ``pages``
    (:func:`_window_pages`). Raises the BindError of an entry outside the ``n_pages`` pages."""
    valid = min(window, pos + 1)
    key = pos + 1 - valid
    runs = []  # (column, first physical row, length) of each page segment with a page
    col = 0
    for phys in pages:
        off = key % block_size
        seg = min(block_size - off, valid - col)
        if phys >= n_pages:
            entry = [*table_row, key // block_size]
            raise BindError(f"{kernel}: block_table[{', '.join(map(str, entry))}] = {phys} is not a page of the "
                            f"{n_pages}-page kv cache (position_ids[{tok}] = {pos})")
        if phys >= 0:
            runs.append((col, phys * block_size + off, seg))
        key, col = key + seg, col + seg
    return runs  # the row: pl.full(-1), then one pl.arange per segment


def scatter_rows_by_slot(rows, slot_mapping, n: int, cache_flat) -> None:
    """Copy ``rows[t]`` (``rows [T, W]``) to row ``slot_mapping[t]`` of ``cache_flat [R, W]``
    for ``t < n`` inside a block (the raw-cache write of every attention block, pypto-lib
    `prefill_attention_swa.py` step 4): ``-1`` skips a token, a run of consecutive slots is
    one copy, a repeated slot keeps the later token. ``slot_mapping [T]`` INT64.

    The scan reads every token's slot once and the token that ends a run of slots (``-1`` or not
    the next row) once more, as its check and then as the next run's start: one
    ``pl.read_values`` of the ``n`` slots and one ``pl.read_elements`` of those run ends, the
    same element reads as a ``pl.read`` per step."""
    slots = pl.read_values(slot_mapping, [0], n)
    runs = []  # (first token, end token, first slot) of each run of consecutive slots
    tok = 0
    while tok < n:
        slot = slots[tok]
        end = tok + 1
        if slot >= 0:
            while end < n and slots[end] == slot + (end - tok):
                end += 1
            runs.append((tok, end, slot))
        tok = end
    pl.read_elements(slot_mapping, [[end] for _, end, _ in runs if end < n])
    for tok, end, slot in runs:
        pl.assemble(cache_flat, rows[tok:end, :], [slot, 0])


T_DYN = pl.dynamic("T")
B_DYN = pl.dynamic("B")


@functools.lru_cache(maxsize=None)
def decode_metadata_kernels(cfg: DeepSeekV4Config, n_cmp_cols: int | None = None,
                            ratio: int = HCA_RATIO) -> SimpleNamespace:
    """In-kernel decode metadata tasks for ``cfg`` (cached per config).

    ``n_cmp_cols`` (default :func:`hca_cmp_cols`) is the width of ``cmp_indices``; ``ratio``
    the compress ratio of its visibility rule. The request count ``B`` is the first dim of
    the block table and ``S = T // B``.

    Returns:
        namespace with the inline pieces (each one ``at(CORE_GROUP)`` task; returns its id)

        * ``decode_window_indices(position_ids [T] INT32, block_table [B, n_blocks] INT32,
          swa_indices Out [T, W] INT32)`` -- task ``decode_window_indices``, the rows of
          :func:`golden_decode_window_indices` (each page segment one run of ``pl.arange_runs``);
        * ``decode_cmp_indices(position_ids [T] INT32, cmp_indices Out [T, n_cmp_cols] INT32)``
          -- task ``decode_cmp_indices``, :func:`golden_decode_cmp_indices`;
        * ``decode_cache_write(kv [T, head_dim] BF16, ori_slot_mapping [T] INT64, kv_cache
          InOut [pages, block_size, 1, head_dim] BF16)`` -- task ``decode_cache_write``:
          ``kv[t]`` to flat row ``ori_slot_mapping[t]`` where it is ``>= 0``;
        * ``decode_rope_rows(freqs_cos [P, rope_dim] BF16, freqs_sin, position_ids [T] INT32,
          rope_cos_t Out [T, rope_dim] BF16, rope_sin_t Out)`` -- task ``decode_rope_rows``:
          table row ``position_ids[t]``, zeros for an inactive token;

        and the ``@pl.jit`` entries ``decode_window_indices_test`` / ``decode_cmp_indices_test``
        (same parameters, return the output).

    Raises (at run time): ``BindError`` for ``T`` not a multiple of ``B``, a position past
    the block table, or a table entry outside the cache; a slot outside the cache is a
    ``DslError`` of the store.
    """
    W, BS, P, HD, NBLK = cfg.sliding_window, cfg.block_size, cfg.ori_kv_block_num, cfg.head_dim, \
        cfg.max_blocks_per_seq
    NC = hca_cmp_cols(cfg) if n_cmp_cols is None else int(n_cmp_cols)
    MAXPOS, R = cfg.max_position_embeddings, cfg.qk_rope_head_dim

    def geometry(position_ids, table):
        t, b = pl.tensor.dim(position_ids, 0), pl.tensor.dim(table, 0)
        if b < 1 or t % b:
            raise BindError(f"decode metadata: T={t} tokens is not a multiple of the B={b} block-table rows")
        return t, t // b

    @pl.jit.inline
    def decode_window_indices(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                              block_table: pl.Tensor[[B_DYN, NBLK], pl.INT32],
                              swa_indices: pl.Out[pl.Tensor[[T_DYN, W], pl.INT32]]):
        """Task ``decode_window_indices``: per-token window rows (module docstring)."""
        t, s = geometry(position_ids, block_table)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_window_indices") as tid:
            positions = pl.read_values(position_ids, [0], t)  # every token's position, one call
            for tok in pl.range(t):
                pos = positions[tok]
                row = pl.full([1, W], pl.INT32, -1) if pos < 0 else window_row(
                    "decode_window_indices", tok, pos, block_table, (tok // s,), window=W, block_size=BS,
                    n_blocks=NBLK, n_pages=P)
                pl.assemble(swa_indices, row, [tok, 0])
        return tid

    @pl.jit.inline
    def decode_cmp_indices(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                           cmp_indices: pl.Out[pl.Tensor[[T_DYN, NC], pl.INT32]]):
        """Task ``decode_cmp_indices``: ``k`` for ``k < min(NC, (p + 1) // ratio)``, else -1."""
        t = pl.tensor.dim(position_ids, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_cmp_indices") as tid:
            positions = pl.read_values(position_ids, [0], t)  # every token's position, one call
            for tok in pl.range(t):
                pos = positions[tok]
                n_vis = min(NC, (pos + 1) // ratio) if pos >= 0 else 0
                row = pl.arange_runs([1, NC], pl.INT32, -1, [(0, 0, n_vis)] if n_vis > 0 else [])
                pl.assemble(cmp_indices, row, [tok, 0])
        return tid

    @pl.jit.inline
    def decode_cache_write(kv: pl.Tensor[[T_DYN, HD], pl.BF16],
                           ori_slot_mapping: pl.Tensor[[T_DYN], pl.INT64],
                           kv_cache: pl.InOut[pl.Tensor[[P, BS, 1, HD], pl.BF16]]):
        """Task ``decode_cache_write``: ``kv[t]`` to flat cache row ``ori_slot_mapping[t]``
        (``-1`` skips; consecutive slots are one copy; a repeated slot keeps the later token)."""
        t = pl.tensor.dim(kv, 0)
        cache_flat = pl.reshape(kv_cache, [P * BS, HD])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_cache_write") as tid:
            scatter_rows_by_slot(kv, ori_slot_mapping, t, cache_flat)
        return tid

    @pl.jit.inline
    def decode_rope_rows(freqs_cos: pl.Tensor[[MAXPOS, R], pl.BF16],
                         freqs_sin: pl.Tensor[[MAXPOS, R], pl.BF16],
                         position_ids: pl.Tensor[[T_DYN], pl.INT32],
                         rope_cos_t: pl.Out[pl.Tensor[[T_DYN, R], pl.BF16]],
                         rope_sin_t: pl.Out[pl.Tensor[[T_DYN, R], pl.BF16]]):
        """Task ``decode_rope_rows``: row ``t`` = table row ``position_ids[t]`` (an exact
        copy), zeros for an inactive token (pypto-lib `decode_attention_swa.py` ``swa_rope_step``)."""
        t = pl.tensor.dim(position_ids, 0)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="decode_rope_rows") as tid:
            positions = pl.read_values(position_ids, [0], t)  # every token's position, one call
            for tok in pl.range(t):
                pos = positions[tok]
                if pos >= MAXPOS:
                    raise BindError(f"decode_rope_rows: position_ids[{tok}] = {pos} is past the RoPE tables "
                                    f"({MAXPOS} rows)")
                if pos >= 0:
                    rope_cos_t[tok:tok + 1, 0:R] = freqs_cos[pos:pos + 1, 0:R]
                    rope_sin_t[tok:tok + 1, 0:R] = freqs_sin[pos:pos + 1, 0:R]
                else:
                    rope_cos_t[tok:tok + 1, 0:R] = pl.full([1, R], pl.BF16, 0)
                    rope_sin_t[tok:tok + 1, 0:R] = pl.full([1, R], pl.BF16, 0)
        return tid

    @pl.jit
    def decode_window_indices_test(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                                   block_table: pl.Tensor[[B_DYN, NBLK], pl.INT32],
                                   swa_indices: pl.Out[pl.Tensor[[T_DYN, W], pl.INT32]]):
        decode_window_indices(position_ids, block_table, swa_indices)
        return swa_indices

    @pl.jit
    def decode_cmp_indices_test(position_ids: pl.Tensor[[T_DYN], pl.INT32],
                                cmp_indices: pl.Out[pl.Tensor[[T_DYN, NC], pl.INT32]]):
        decode_cmp_indices(position_ids, cmp_indices)
        return cmp_indices

    return SimpleNamespace(n_cmp_cols=NC, decode_window_indices=decode_window_indices,
                           decode_cmp_indices=decode_cmp_indices, decode_cache_write=decode_cache_write,
                           decode_rope_rows=decode_rope_rows,
                           decode_window_indices_test=decode_window_indices_test,
                           decode_cmp_indices_test=decode_cmp_indices_test)
# ---- end kernel ----


def decode_block_tables(
    cfg: DeepSeekV4Config,
    start_pos: torch.Tensor | list,  # [B] int, < 0 = inactive
    S: int,
    *,
    reverse: bool = False,
) -> dict:
    """Fixture page tables of one decode batch (every request owns its own pages).

    * ``block_table [B, max_blocks_per_seq]``: the raw-cache pages of the window keys
      ``max(0, p0 - W + 1) .. p0 + S - 1`` of request ``b`` (``p0 = start_pos[b]``) get
      physical pages in request order from page 0 up (``reverse``: from the last page down);
      every other entry is ``-1`` (pages behind the window are not resident);
    * ``cmp_block_table [B, cmp_kv_block_num]``: request ``b`` owns the ``cmp_kv_block_num
      // B`` physical pages ``b * n + k`` for its logical pages ``k`` (``reverse``: the
      request's pages in reverse order), the rest ``-1``;
    * ``state_block_table [B, max_position_embeddings // hca_state_block_size]``: a ring of
      ``hca_state_block_num // B`` pages per request, logical page ``k`` on ``b * n + k % n``.

    Raises:
        BindError: the pools cannot hold the batch (too many window pages, fewer pages
            than requests, or a state ring shorter than one 128-token window).
    """
    fn = "decode_block_tables"
    start = torch.as_tensor(start_pos).long()
    B, W, bs = start.shape[0], cfg.sliding_window, cfg.block_size
    nblk, P, CP = cfg.max_blocks_per_seq, cfg.ori_kv_block_num, cfg.cmp_kv_block_num
    spage, SP = cfg.hca_state_block_size, cfg.hca_state_block_num
    table = torch.full((B, nblk), -1, dtype=torch.int32)
    order = list(range(P - 1, -1, -1)) if reverse else list(range(P))
    used = 0
    for b, p0 in enumerate(start.tolist()):
        if p0 < 0:
            continue
        for blk in range(max(0, p0 - W + 1) // bs, (p0 + S - 1) // bs + 1):
            if used >= P or blk >= nblk:
                raise BindError(f"{fn}: the raw kv pool ({P} pages) or table ({nblk}) cannot hold the windows")
            table[b, blk] = order[used]
            used += 1
    n_cmp, n_state = CP // B, SP // B
    if n_cmp < 1 or n_state * spage < HCA_RATIO:
        raise BindError(f"{fn}: {B} requests need >= 1 compressed page and {HCA_RATIO // spage} state pages each "
                        f"(pools: {CP} and {SP} pages)")
    cmp_table = torch.full((B, CP), -1, dtype=torch.int32)
    k = torch.arange(n_cmp)
    for b in range(B):
        cmp_table[b, :n_cmp] = (b * n_cmp + (n_cmp - 1 - k if reverse else k)).to(torch.int32)
    blk = torch.arange(cfg.max_position_embeddings // spage)
    state_table = (torch.arange(B)[:, None] * n_state + blk[None, :] % n_state).to(torch.int32)
    return {"block_table": table, "cmp_block_table": cmp_table, "state_block_table": state_table}
