"""The paged cache of a DeepSeek-V4 deployment: page pools, block tables and the per-layer
cache tensors the prefill / decode kernels read and write (README.md).

Every cache kind has one page pool (a page count of :class:`DeploymentConfig`) shared by all
requests; a request owns pages through its block table of that kind, one table per kind
shared by every layer (each layer has its own tensor of the pool's shape, indexed by the
same physical page ids). Rows are addressed by absolute position: ``row(p) =
table[p // page] * page + p % page``; ``-1`` in a table means "no page".

=============  =====================  ==================  =====================================
kind           pool (pages x rows)    per-layer tensor    logical page of position ``p``
=============  =====================  ==================  =====================================
``swa_kv``     ori_kv_block_num x     ``[P, bs, 1, d]``   ``p // bs``; pages wholly before the
               block_size             BF16, every layer   window of the next token are returned
``csa_cmp``    cmp_kv_block_num x bs  ``[CP, bs, 1, d]``  entry ``p // 4``, page ``entry // bs``
                                      (+ INT8 indexer     (CSA layers)
                                      keys ``[CP, bs, 1,
                                      dI]`` and their
                                      FP32 row scales)
``hca_cmp``    cmp_kv_block_num x bs  ``[CP, bs, 1, d]``  entry ``p // 128`` (HCA layers)
``csa_state``  csa_state_block_num    ``[SP, 4, 4d]`` FP32 a ring of ``prefill_seq // 4 + 2``
               x 4                    (+ indexer          pages per request: window ``p // 4``
                                      ``[SP, 4, 4dI]``)   on ring slot ``(p // 4) % n``
``hca_state``  hca_state_block_num    ``[SP, 8, 2d]`` FP32 a ring of ``2 * 128 / 8`` pages per
               x hca_state_block_size                     request: window ``w`` on half ``w % 2``
=============  =====================  ==================  =====================================

Rings: a compressor only needs the open window (and, for CSA, the previous one) of state,
but one prefill chunk may write rows of several windows before it pools them, so a ring
covers a chunk's windows plus the window before it.

An exhausted pool is a :class:`pto.CapacityError` naming the cache kind, the request and the
page counts; nothing is allocated then (never a silent wrap onto another request's pages).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pto.errors import BindError, CapacityError
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig, kernel_config

__all__ = ["PagePool", "Cache", "RequestPages", "CACHE_KINDS"]

CSA_RATIO, HCA_RATIO = 4, 128
CSA_STATE_PAGE = 4  # one ratio-4 window per state page (prefill_compressor_ratio4.CSA_STATE_PAGE)
CACHE_KINDS = ("swa_kv", "csa_cmp", "hca_cmp", "csa_state", "hca_state")


class PagePool:
    """A fixed set of ``pages`` physical pages of ``page_rows`` rows; lowest free page first.

    Raises:
        CapacityError: (from :meth:`alloc`) fewer free pages than asked, naming the pool.
    """

    def __init__(self, name: str, pages: int, page_rows: int):
        self.name, self.pages, self.page_rows = name, pages, page_rows
        self._free = list(range(pages))

    @property
    def free_pages(self) -> int:
        """Pages not owned by any request."""
        return len(self._free)

    def alloc(self, n: int, who: str) -> list[int]:
        """``n`` pages for ``who`` (a request label used in the error)."""
        if n > len(self._free):
            raise CapacityError(f"cache {self.name!r}: {who} needs {n} more page(s) of "
                                f"{self.page_rows} rows but only {len(self._free)} of "
                                f"{self.pages} are free")
        got, self._free = self._free[:n], self._free[n:]
        return got

    def release(self, pages) -> None:
        """Return ``pages`` to the pool."""
        self._free = sorted(set(self._free).union(pages))


@dataclass
class RequestPages:
    """One request's pages: ``pos`` tokens written; per kind, logical page -> physical page
    (``swa_kv`` / ``*_cmp``) or the ring of physical pages (``*_state``)."""

    rid: int
    pos: int = 0
    pages: dict[str, dict[int, int]] = field(default_factory=dict)
    rings: dict[str, list[int]] = field(default_factory=dict)


class Cache:
    """The cache of one deployment (see the module docstring for the layout).

    Args:
        cfg: model config (layer schedule, widths).
        dep: deployment config (pools, max requests, max context).
        dtype: storage of the kv / compressed tensors (BF16 as the kernels use it).
        mtp_layers: multi-token-prediction layers after the main ones; each is a
            sliding-window layer with its own ``kv`` tensor (``layers[num_hidden_layers + k]``)
            on the shared ``swa_kv`` tables.

    Attributes:
        layers: per layer, a dict of tensors: ``kv`` (all layers), ``cmp_kv`` (CSA / HCA),
            ``state`` (CSA / HCA compressor state), ``idx_kv`` (``idx_dtype``: INT8 for the
            W8A8 kernels, BF16 for weight_format "bf16"), ``idx_kv_scale`` and
            ``idx_state`` (CSA).
        pools: kind -> :class:`PagePool`.

    Raises:
        CapacityError: a pool cannot hold even one request's state ring.
    """

    def __init__(self, cfg: DeepSeekV4Config, dep: DeploymentConfig, dtype=torch.bfloat16, mtp_layers: int = 0,
                 idx_dtype=torch.int8):
        dep.validate(cfg)
        self.cfg, self.dep = cfg, dep
        d, dI = cfg.head_dim, cfg.index_head_dim
        bs = dep.block_size
        self.ctx = -(-dep.max_context // bs) * bs  # table lengths cover whole pages (kernel_config)
        self.csa_ring = dep.prefill_seq // CSA_RATIO + 2
        self.hca_ring = 2 * HCA_RATIO // dep.hca_state_block_size
        self.pools = {
            "swa_kv": PagePool("swa_kv", dep.ori_kv_block_num, bs),
            "csa_cmp": PagePool("csa_cmp", dep.cmp_kv_block_num, bs),
            "hca_cmp": PagePool("hca_cmp", dep.cmp_kv_block_num, bs),
            "csa_state": PagePool("csa_state", dep.csa_state_block_num, CSA_STATE_PAGE),
            "hca_state": PagePool("hca_state", dep.hca_state_block_num, dep.hca_state_block_size),
        }
        ratios = set(cfg.compress_ratios)
        for kind, ring, ratio in (("csa_state", self.csa_ring, CSA_RATIO),
                                  ("hca_state", self.hca_ring, HCA_RATIO)):
            if ratio in ratios and self.pools[kind].pages < ring:
                raise CapacityError(f"cache {kind!r}: {self.pools[kind].pages} pages cannot hold one "
                                    f"request's ring of {ring} pages")
        self.layers: list[dict[str, torch.Tensor]] = []
        for ratio in tuple(cfg.compress_ratios) + (0,) * mtp_layers:  # the MTP layers: sliding-window
            t = {"kv": torch.zeros(dep.ori_kv_block_num, bs, 1, d, dtype=dtype)}
            if ratio:
                t["cmp_kv"] = torch.zeros(dep.cmp_kv_block_num, bs, 1, d, dtype=dtype)
            if ratio == CSA_RATIO:
                t["state"] = torch.zeros(dep.csa_state_block_num, CSA_STATE_PAGE, 4 * d)
                t["idx_kv"] = torch.zeros(dep.cmp_kv_block_num, bs, 1, dI, dtype=idx_dtype)
                t["idx_kv_scale"] = torch.zeros(dep.cmp_kv_block_num, bs, 1, 1)
                t["idx_state"] = torch.zeros(dep.csa_state_block_num, CSA_STATE_PAGE, 4 * dI)
            elif ratio == HCA_RATIO:
                t["state"] = torch.zeros(dep.hca_state_block_num, dep.hca_state_block_size, 2 * d)
            self.layers.append(t)
        self.requests: dict[int, RequestPages] = {}
        self._next_rid = 0

    # ---- requests -------------------------------------------------------------------------
    def _kinds(self) -> list[str]:
        r = set(self.cfg.compress_ratios)
        return ["swa_kv"] + (["csa_cmp", "csa_state"] if CSA_RATIO in r else []) + \
            (["hca_cmp", "hca_state"] if HCA_RATIO in r else [])

    def add_request(self) -> int:
        """A new empty request (its state rings allocated); returns its id.

        Raises:
            CapacityError: ``max_requests`` requests are live, or a state pool is exhausted.
        """
        if len(self.requests) >= self.dep.max_requests:
            raise CapacityError(f"cache: {len(self.requests)} requests are live, the deployment's "
                                f"max_requests={self.dep.max_requests}")
        rid = self._next_rid
        req = RequestPages(rid, pages={k: {} for k in self._kinds()})
        got: list[tuple[str, list[int]]] = []
        try:
            for kind, n in (("csa_state", self.csa_ring), ("hca_state", self.hca_ring)):
                if kind in req.pages:
                    got.append((kind, self.pools[kind].alloc(n, f"request {rid}")))
        except CapacityError:
            for kind, pages in got:
                self.pools[kind].release(pages)
            raise
        req.rings = dict(got)
        self._next_rid += 1
        self.requests[rid] = req
        return rid

    def release(self, rid: int) -> None:
        """Free every page of request ``rid`` (unknown ids are a BindError)."""
        req = self._req(rid)
        for kind, table in req.pages.items():
            self.pools[kind].release(table.values())
        for kind, ring in req.rings.items():
            self.pools[kind].release(ring)
        del self.requests[rid]

    def _req(self, rid: int) -> RequestPages:
        if rid not in self.requests:
            raise BindError(f"cache: no live request {rid!r}")
        return self.requests[rid]

    def _needed(self, kind: str, pos0: int, end: int) -> tuple[set[int], set[int]]:
        """(logical pages positions ``pos0 .. end-1`` need, pages no longer needed after)."""
        bs = self.dep.block_size
        if kind == "swa_kv":
            lo = max(0, pos0 - self.cfg.sliding_window + 1)
            need = set(range(lo // bs, (end - 1) // bs + 1))
            keep_from = max(0, end - self.cfg.sliding_window) // bs  # the next token's window
            return need, set(range(0, keep_from))
        ratio = CSA_RATIO if kind == "csa_cmp" else HCA_RATIO
        n_entries = end // ratio
        return set(range(0, -(-n_entries // bs))), set()

    def reserve(self, rid: int, n_tokens: int) -> None:
        """Pages for request ``rid``'s next ``n_tokens`` positions (all kinds, all or none).

        Raises:
            CapacityError: the request would pass ``max_context``, or a pool is exhausted
                (naming the cache kind); nothing is allocated then.
        """
        req = self._req(rid)
        end = req.pos + n_tokens
        if end > self.dep.max_context:
            raise CapacityError(f"cache: request {rid} would hold {end} tokens, more than the "
                                f"deployment's max_context={self.dep.max_context}")
        plan = {}
        for kind, table in req.pages.items():
            if kind.endswith("_state"):
                continue
            need, _ = self._needed(kind, req.pos, end)
            plan[kind] = sorted(need - set(table))
        done: list[tuple[str, list[int], list[int]]] = []
        try:
            for kind, logical in plan.items():
                phys = self.pools[kind].alloc(len(logical), f"request {rid}")
                done.append((kind, logical, phys))
        except CapacityError:
            for kind, _, phys in done:
                self.pools[kind].release(phys)
            raise
        for kind, logical, phys in done:
            req.pages[kind].update(zip(logical, phys))

    def commit(self, rid: int, n_tokens: int) -> None:
        """Record that ``n_tokens`` positions were written; return SWA pages that fall wholly
        before the next token's window to the pool."""
        req = self._req(rid)
        req.pos += n_tokens
        table = req.pages["swa_kv"]
        _, drop = self._needed("swa_kv", req.pos, req.pos + 1)
        gone = [table.pop(b) for b in sorted(drop) if b in table]
        self.pools["swa_kv"].release(gone)

    # ---- tables and slot mappings ----------------------------------------------------------
    def block_table(self, rid: int, kind: str = "swa_kv") -> torch.Tensor:
        """INT32 block table of request ``rid`` for ``kind``: ``[max_blocks_per_seq]`` for
        ``swa_kv``, ``[cmp_kv_block_num]`` for ``*_cmp``, ``[ctx / page]`` ring tables for
        ``*_state`` (``ctx`` = ``max_context`` rounded up to a page); ``-1`` where no page is
        owned."""
        return torch.tensor(self._table_list(rid, kind), dtype=torch.int32)

    def _table_list(self, rid: int, kind: str) -> list[int]:
        """:meth:`block_table` as a Python list (the same entries; built without per-entry
        tensor writes)."""
        req = self._req(rid)
        dep = self.dep
        if kind.endswith("_state"):
            page = CSA_STATE_PAGE if kind == "csa_state" else dep.hca_state_block_size
            n = -(-self.ctx // page)
            ring = req.rings[kind]
            if kind == "csa_state":  # one window per page: logical page = window
                return [ring[w % len(ring)] for w in range(n)]
            per_window = HCA_RATIO // page  # ring slots follow the window, then the page in it
            return [ring[((b // per_window) % 2) * per_window + b % per_window] for b in range(n)]
        n = dep.max_blocks_per_seq if kind == "swa_kv" else dep.cmp_kv_block_num
        t = [-1] * n
        for b, p in req.pages[kind].items():
            if b < n:
                t[b] = p
        return t

    def slot_mapping(self, rid: int, positions: torch.Tensor, kind: str = "swa_kv") -> torch.Tensor:
        """INT64 cache row of each position (``-1`` without a page): raw rows for
        ``swa_kv``, state rows for ``*_state``; for ``*_cmp`` the entry row of a position
        that closes a window (``(p + 1) % ratio == 0``), ``-1`` elsewhere. A negative position
        (an inactive decode token) maps to ``-1``. Computed in Python ints from the block
        table (the rows fit an INT64)."""
        table = self._table_list(rid, kind)
        nt = len(table)
        if kind.endswith("_cmp"):
            ratio = CSA_RATIO if kind == "csa_cmp" else HCA_RATIO
            page = self.dep.block_size
        else:
            ratio = 0
            page = {"swa_kv": self.dep.block_size, "csa_state": CSA_STATE_PAGE,
                    "hca_state": self.dep.hca_state_block_size}[kind]
        out = []
        for p in positions.reshape(-1).tolist():
            p = int(p)
            if p < 0:  # an inactive token
                out.append(-1)
                continue
            if ratio:
                closes = (p + 1) % ratio == 0
                key = p // ratio if closes else 0
            else:
                closes, key = True, p
            blk = key // page  # floor division, as torch's on INT64
            phys = table[blk] if blk < nt else -1
            out.append(phys * page + key % page if closes and phys >= 0 else -1)
        return torch.tensor(out, dtype=torch.int64).reshape(positions.shape)

    def kv_rows(self, layer: int, rid: int, positions: torch.Tensor) -> torch.Tensor:
        """``[n, d]`` FP32 raw kv rows of ``positions`` from layer ``layer``'s SWA cache.

        Raises:
            BindError: a position without a page (released or never written).
        """
        rows = self.slot_mapping(rid, positions, "swa_kv")
        if bool((rows < 0).any()):
            bad = int(positions[(rows < 0).nonzero()[0, 0]])
            raise BindError(f"cache: request {rid} holds no swa_kv page for position {bad}")
        flat = self.layers[layer]["kv"].reshape(-1, self.cfg.head_dim)
        return flat[rows].float()
