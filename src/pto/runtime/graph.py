"""The recorded task graph: tasks, blocks, footprints and edges.

A :class:`Task` is one scope launch (``pl.spmd`` / ``pl.at``) or a join node
(``pl.system.task_dummy``); a :class:`Block` is one SPMD instance (or one
barrier phase of it). Edges come from dependency derivation (deps.py) and
explicit ``deps=``. The graph never affects results on the CPU (execution is
eager, in program order); it feeds the race checker, the simulator and the
trace (docs/dsl.md).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from pto.runtime.deps import derive_kinds

__all__ = ["Footprint", "Block", "Task", "TaskGraph", "KIND_NAMES"]

KIND_NAMES = ("read", "write", "atomic_add")


@dataclass(frozen=True)
class Footprint:
    """One GM access box: buffer name and id, kind (read / write /
    atomic_add) and the half-open root 2-D box ``(r0, r1, c0, c1)``."""

    buffer: str
    buffer_id: int
    kind: str
    box: tuple

    def __str__(self) -> str:
        r0, r1, c0, c1 = self.box
        return f"{self.kind} {self.buffer}[{r0}:{r1}, {c0}:{c1}]"


class _TaskRef:
    """The weak link of a :class:`Block` to its task (a base class, so that ``Block.__slots__``
    lists the block's own record: index, phase, counters, footprints)."""

    __slots__ = ("_task",)

    @property
    def task(self):
        """The Task this block belongs to (None once that task is freed)."""
        return self._task()

    @task.setter
    def task(self, task) -> None:
        self._task = task._ref


class Block(_TaskRef):
    """One block of a task: counters for the cost model and its footprints.

    Attributes:
        task: the Task of the block, held weakly (the task holds its blocks, so the graph has no
            reference cycle and is freed by refcount); None once that task is freed.
        idx: block index; phase: barrier phase (0 without syncall).
        ops, flops, bytes: tile ops (matmuls included), floating/integer ops, GM bytes moved.
        ld, st, mm: GM loads (tile loads and scalar reads), GM stores (tile stores, atomic
            assembles and scalar writes) and matmuls issued (per-op latency of the simulator).
        vk: vector tile ops by kind, ``{op name: count}`` (``"add_s"`` for a tile-number
            form; None when none was named), a subset of ``ops`` (the simulator's per-kind
            latency; the rest take the median).
        cube: True when the block issued a matmul (placed on a cube core).
        fp: list of ``(buffer, box, kind)`` (kind 0 read, 1 write, 2 atomic).
    """

    __slots__ = ("idx", "phase", "ops", "flops", "bytes", "ld", "st", "mm", "vk", "cube", "fp")

    def __init__(self, task, idx, phase=0):
        self._task = task._ref
        self.idx = idx
        self.phase = phase
        self.ops = 0
        self.flops = 0
        self.bytes = 0
        self.ld = 0
        self.st = 0
        self.mm = 0
        self.vk = None
        self.cube = False
        self.fp = []


class Task:
    """One task (or join node) of the graph.

    Attributes:
        id: dense id in submission order; name: ``name_hint``; kind:
            ``"spmd"``, ``"at"`` or ``"dummy"``; site: ``file:line``.
        blocks: the Block records; preds: predecessor ids (derived + explicit).
        explicit: ids given by ``deps=``; manual: submitted in a manual scope.
        footprints: coalesced footprints ``(buffer, kind, box)``; wall_ns: CPU wall time.
        buffers: ids of the buffers it touches (creator retention).
        Both are built on first access from ``grouped`` (set when the task
        ends: {buffer: [reads, writes, atomics]}, each None or a list of
        boxes; or the raw ``(buffer, box, kind)`` records of a one-block task
        with at most one box per buffer and kind), which keeps the task
        submission path short.
    """

    __slots__ = ("id", "name", "kind", "site", "n_blocks", "blocks", "_preds", "explicit", "manual", "_fps",
                 "wall_ns", "_bufs", "t0", "grouped", "_lazy", "_ref", "__weakref__")

    def __init__(self, tid, name, kind, site, n_blocks, explicit, manual):
        self.id = tid
        self.name = name
        self.kind = kind
        self.site = site
        self.n_blocks = n_blocks
        self.blocks = []
        self._preds = set()
        self._lazy = None  # a deps.LazyDerivation while the derived part of preds is pending
        self.explicit = explicit if type(explicit) is list else list(explicit)
        self.manual = manual
        self._fps = None
        self.wall_ns = 0
        self._bufs = None
        self.t0 = 0
        self.grouped = None
        self._ref = weakref.ref(self)  # what its blocks hold (Block.task)

    @property
    def preds(self) -> set:
        """Predecessor ids (derived + explicit). A plain run derives them when the first task's
        ``preds`` is read (deps.LazyDerivation), in submission order, as an eager derivation would."""
        p = self._preds
        if p is None:
            lazy = self._lazy
            if lazy.pending:
                lazy.run()
            p = self._preds = lazy.derived.pop(self.id)
            self._lazy = None
        return p

    @preds.setter
    def preds(self, value) -> None:
        """Predecessor ids (derived + explicit)."""
        self._preds = value

    @property
    def footprints(self) -> list:
        """Coalesced footprint records ``(buffer, kind, box)`` of the task (built on first access)."""
        if self._fps is None:
            g = self.grouped
            if type(g) is list:  # raw records: group by buffer in order of first use
                by_buf: dict = {}
                for buf, box, kind in g:
                    kinds = by_buf.get(buf)
                    if kinds is None:
                        kinds = by_buf[buf] = [None, None, None]
                    kinds[kind] = [box]
                g = by_buf
            self._fps = [] if not g else [(buf, k, box) for buf, kinds in g.items() for k in (0, 1, 2)
                                          for box in kinds[k] or ()]
        return self._fps

    @footprints.setter
    def footprints(self, value) -> None:
        """Coalesced footprint records ``(buffer, kind, box)`` of the task (built on first access)."""
        self._fps = value

    @property
    def buffers(self) -> set:
        """Ids of the root buffers the task touched (creator retention)."""
        if self._bufs is None:
            g = self.grouped
            self._bufs = set() if not g else {r[0].id for r in g} if type(g) is list else {buf.id for buf in g}
        return self._bufs

    @buffers.setter
    def buffers(self, value) -> None:
        """Ids of the root buffers the task touched (creator retention)."""
        self._bufs = value

    @property
    def flops(self) -> int:
        """Floating/integer operations of all blocks."""
        return sum(b.flops for b in self.blocks)

    @property
    def bytes(self) -> int:
        """GM bytes moved by all blocks."""
        return sum(b.bytes for b in self.blocks)

    @property
    def ops(self) -> int:
        """Tile ops issued by all blocks."""
        return sum(b.ops for b in self.blocks)

    @property
    def cube(self) -> bool:
        """True when any block issued a matmul (a cube-core task)."""
        return any(b.cube for b in self.blocks)

    def __repr__(self) -> str:
        return f"Task(#{self.id} {self.name!r} {self.kind} blocks={self.n_blocks} preds={sorted(self.preds)})"


class TaskGraph:
    """All tasks of one program in submission order, with their edges."""

    def __init__(self):
        self.tasks: list[Task] = []
        # {task id: {pred id: set of derived edge kinds}}, replayed on first use (deps.derive_kinds)
        self.dep_kinds: dict | None = None

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks)

    def __getitem__(self, tid: int) -> Task:
        return self.tasks[tid]

    @property
    def real_tasks(self) -> list[Task]:
        """Tasks that run on cores (join nodes excluded)."""
        return [t for t in self.tasks if t.kind != "dummy"]

    def edges(self) -> set[tuple[int, int]]:
        """All edges ``(pred, succ)``."""
        return {(p, t.id) for t in self.tasks for p in t.preds}

    def edge_kinds(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """Why each edge ``(pred, succ)`` exists: a sorted tuple of kinds out of
        ``"RAW"``, ``"WAW"``, ``"atomic"`` (atomic add against a plain access; see
        :class:`pto.runtime.deps.DepTracker`), ``"explicit"`` (named in ``deps=``) and
        ``"join"`` (into or out of a ``task_dummy`` join node). The derived kinds come from a
        replay of the derivation on first call (:func:`pto.runtime.deps.derive_kinds`)."""
        if self.dep_kinds is None:
            self.dep_kinds = derive_kinds(self.tasks)
        rec = self.dep_kinds
        tasks = self.tasks
        out = {}
        for t in tasks:
            derived = rec.get(t.id, {})
            for p in t.preds:
                ks = set(derived.get(p, ()))
                if p in t.explicit:
                    ks.add("explicit")
                if t.kind == "dummy" or tasks[p].kind == "dummy":
                    ks.add("join")
                out[(p, t.id)] = tuple(sorted(ks))
        return out

    def named_edges(self) -> set[tuple[str, str]]:
        """Edges as ``(pred name, succ name)`` pairs (for tests and tables)."""
        return {(self.tasks[p].name, self.tasks[s].name) for p, s in self.edges()}

    def succs(self) -> dict[int, list[int]]:
        """Successor lists keyed by task id."""
        out = {t.id: [] for t in self.tasks}
        for t in self.tasks:
            for p in t.preds:
                out[p].append(t.id)
        return out

    def reachable(self, src: int, dst: int) -> bool:
        """True if a path ``src -> ... -> dst`` exists (ids are topological)."""
        if src == dst:
            return True
        if src > dst:
            return False
        seen = {dst}
        stack = [dst]
        while stack:
            n = stack.pop()
            for p in self.tasks[n].preds:
                if p == src:
                    return True
                if p > src and p not in seen:
                    seen.add(p)
                    stack.append(p)
        return False

    def critical_path(self, cost=None) -> tuple[float, list[int]]:
        """Longest path by ``cost(task)`` (default: 1 per real task, 0 per join
        node). Returns (length, task ids along the path)."""
        if cost is None:
            cost = lambda t: 0 if t.kind == "dummy" else 1  # noqa: E731
        best: dict[int, float] = {}
        prev: dict[int, int | None] = {}
        for t in self.tasks:
            c = cost(t)
            p_best, p_arg = 0.0, None
            for p in t.preds:
                if best[p] > p_best or p_arg is None and best[p] >= p_best:
                    p_best, p_arg = best[p], p
            best[t.id] = p_best + c
            prev[t.id] = p_arg
        if not best:
            return 0.0, []
        end = max(best, key=lambda k: best[k])
        path = []
        n = end
        while n is not None:
            path.append(n)
            n = prev[n]
        return best[end], path[::-1]
