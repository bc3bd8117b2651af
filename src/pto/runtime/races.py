"""Race checker (docs/dsl.md), run in check mode as each task closes.

Eager execution in program order is one valid schedule; the checker proves
the result does not depend on which valid schedule the device picks. Two
accesses *conflict* when their boxes on one root buffer overlap and at least
one writes (plain write or atomic add), except two atomic adds.

* Intra-task: blocks of one task run in any order, so two blocks of the
  same task (and the same ``syncall`` phase) with conflicting footprints
  race.
* Inter-task: a footprint of a new task that conflicts with a footprint of
  an earlier task races unless the earlier task is an ancestor in the
  runtime-visible graph (derived edges plus explicit ``deps=``). This finds
  a missing write-after-read edge (not derived, docs/dsl.md), a manual
  scope without ``deps=``, a ``manual_dep`` tensor without ``deps=`` and a
  wrong direction.

An In argument (``Buffer.readonly``: a store into it is a DslError) is only read, so its
accesses cannot conflict and are not kept; under pypto compatibility a written In argument
becomes InOut during the run, so there every buffer's accesses are kept.

Reachability uses ancestor bitsets (Python ints), one per task. The access
history of a buffer drops entries that a later plain write of a descendant
(or of the same task) covers: any later access that conflicts with a dropped
entry conflicts with that write too, so no race goes unreported.

Every race of a run is reported, not only the first: the checker records
them as tasks close and the program raises one :class:`pto.RaceError` at its
end (see :meth:`RaceChecker.report`). Races are grouped by (task pair, buffer)
for inter-task races and (task, buffer) for races inside a task; each group
names both tasks (name, id, source line), both blocks of its first overlap,
the kinds of access, the buffer and the overlapping box in the buffer's root
2-D coordinates (rows = prod(shape[:-1]), cols = shape[-1]), and how many more
overlaps it holds.
"""

from __future__ import annotations

from pto.errors import RaceError
from pto.language import compat_ops as _compat
from pto.runtime.deps import RowIndex, coalesce
from pto.runtime.graph import KIND_NAMES

__all__ = ["RaceChecker"]

_R, _W, _A = 0, 1, 2


def _conflict(k1: int, k2: int) -> bool:
    return (k1 != _R or k2 != _R) and not (k1 == _A and k2 == _A)


def _ov(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _covers(a, b) -> bool:
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


def _isect(a, b):
    return (max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3]))


def _box_text(box) -> str:
    return f"rows [{box[0]}, {box[1]}) cols [{box[2]}, {box[3]})"


def _buf_text(buf) -> str:
    return f"{buf.name!r} {list(buf.shape)}"


def _hazard(k1: int, k2: int) -> str:
    """Name of the hazard between an earlier access k1 and a later one k2."""
    if k1 == _R:
        return "write-after-read hazard; the runtime never derives such edges"
    if k2 == _R:
        return "read-after-write hazard"
    return "write-after-write hazard"


def _fix(t1, t2, buf) -> str:
    """How to add the missing edge, for the message."""
    edge = f"give {t2.name!r} an edge from {t1.name!r} (deps=[<task id of {t1.name!r}>]"
    if buf.untracked:
        return f"{edge}): {buf.name!r} is a manual_dep tensor, so no edge is derived for it"
    if t1.manual or t2.manual:
        return f"{edge}, or submit the tasks outside pl.manual_scope())"
    return f"{edge}, or a direction that lets the runtime derive it)"


MAX_GROUPS = 20  # race groups described in full in one report; the rest are counted


class RaceChecker:
    """Per-program race checker; ``check_task`` runs as each task closes and records the
    races it finds; :meth:`report` gives the RaceError of all of them.

    Args:
        program: the running ``pto.runtime.Program`` (its graph and name).

    Attributes:
        groups: ``{key: [message of the first overlap, further overlaps]}`` in the order
            found; key ``("inter", earlier task id, task id, buffer id)`` or
            ``("intra", task id, buffer id)``.
    """

    def __init__(self, program):
        self.program = program
        self.anc: list[int] = []  # ancestor bitset per task id
        self.history: dict[int, RowIndex] = {}  # buffer id -> accesses (box, task id, kind), by rows
        self.groups: dict = {}

    @property
    def count(self) -> int:
        """Races found so far (overlapping access pairs, over all groups)."""
        return sum(1 + g[1] for g in self.groups.values())

    def report(self, start: int = 0) -> RaceError | None:
        """A RaceError describing the race groups found from group ``start`` on (None if none):
        the first group's message on the first line, then one line per further group (up to
        ``MAX_GROUPS``), each with the number of further overlaps it holds."""
        groups = list(self.groups.values())[start:]
        if not groups:
            return None
        n = sum(1 + g[1] for g in groups)

        def line(g):
            return g[0] + (f" [and {g[1]} more overlap(s) of these accesses]" if g[1] else "")
        if len(groups) == 1:
            return RaceError(line(groups[0]))
        text = [f"{line(groups[0])} [{n} races in {len(groups)} places in all; every place below]"]
        text += [f"- {line(g)}" for g in groups[1:MAX_GROUPS]]
        if len(groups) > MAX_GROUPS:
            text.append(f"- ... and {len(groups) - MAX_GROUPS} more places "
                        f"({sum(1 + g[1] for g in groups[MAX_GROUPS:])} races)")
        return RaceError("\n  ".join(text))

    def _ancestors(self, task) -> int:
        a = 0
        anc = self.anc
        for p in task.preds:
            a |= anc[p] | (1 << p)
        return a

    def add_node(self, task) -> None:
        """Register a join node (no footprints)."""
        self.anc.append(self._ancestors(task))

    def check_task(self, task) -> None:
        """Check ``task`` against itself and every earlier task; races found are recorded
        in :attr:`groups` (the program raises them at its end)."""
        self._intra(task)
        anc = self._ancestors(task)
        self.anc.append(anc)
        per_buf: dict = {}
        pypto = _compat.mode.pypto
        for buf, kind, box in task.footprints:
            if buf.readonly and not pypto:
                continue  # reads of an In argument nobody may write: nothing can conflict
            per_buf.setdefault(buf, []).append((box, kind))
        history = self.history
        tid = task.id
        for buf, accesses in per_buf.items():
            hist = history.get(buf.id)
            if hist is not None and hist:
                for box, kind in accesses:
                    for hbox, htid, hkind in hist.overlapping(box):
                        if not (anc >> htid) & 1 and _conflict(kind, hkind):
                            key = ("inter", htid, tid, buf.id)
                            g = self.groups.get(key)
                            if g is None:
                                self.groups[key] = [self._report(self.program.graph[htid], task, buf, hbox, box,
                                                                 hkind, kind), 0]
                            else:
                                g[1] += 1
            elif hist is None:
                hist = history[buf.id] = RowIndex()
            for box, kind in accesses:
                hist.add(box, tid, kind)
            for box, kind in accesses:
                if kind != _W:
                    continue
                seen = set()
                for e in hist.overlapping(box):
                    if id(e) in seen or (e[0] is box and e[1] == tid):
                        continue
                    seen.add(id(e))
                    if _covers(box, e[0]) and (e[1] == tid or (anc >> e[1]) & 1):
                        hist.remove(e)

    # ---- intra-task ------------------------------------------------------------
    def _intra(self, task) -> None:
        blocks = task.blocks
        if len(blocks) < 2:
            return
        fps = [blk.fp for blk in blocks if blk.fp]
        # only a buffer with a plain write, or with atomic adds and reads, can race inside a task
        # (reads alone or atomic adds alone cannot): the others are left out before any grouping
        hot = {f[0] for fp in fps for f in fp if f[2] == _W}
        atomic = {f[0] for fp in fps for f in fp if f[2] == _A}
        if atomic - hot:
            hot |= {f[0] for fp in fps for f in fp if f[2] == _R and f[0] in atomic}
        if not hot:
            return
        per_buf: dict = {}
        for blk in blocks:
            fp = blk.fp
            if not fp:
                continue
            mine: dict = {}
            for buf, box, kind in fp:
                if buf in hot:
                    mine.setdefault((buf, kind), []).append(box)
            for (buf, kind), boxes in mine.items():
                lst = per_buf.get(buf)
                if lst is None:
                    lst = per_buf[buf] = []
                for box in (coalesce(boxes) if len(boxes) > 1 else boxes):
                    lst.append((box, blk.idx, blk.phase, kind))
        for buf, items in per_buf.items():
            kinds = {it[3] for it in items}
            if kinds == {_R} or kinds == {_A}:
                continue
            items.sort(key=lambda x: x[0][0])
            n = len(items)
            key = ("intra", task.id, buf.id)
            for i in range(n):
                bi, bli, phi, ki = items[i]
                r1 = bi[1]
                for j in range(i + 1, n):
                    bj, blj, phj, kj = items[j]
                    if bj[0] >= r1:
                        break
                    if blj != bli and phj == phi and _conflict(ki, kj) and _ov(bi, bj):
                        g = self.groups.get(key)
                        if g is not None:
                            g[1] += 1
                            continue
                        lo, hi = (bli, ki), (blj, kj)
                        if blj < bli:
                            lo, hi = hi, lo
                        self.groups[key] = [(
                            f"kernel {self.program.name}: blocks {lo[0]} and {hi[0]} of task {task.name!r} "
                            f"(#{task.id}, {task.site}) race on buffer {_buf_text(buf)}: block {lo[0]} "
                            f"{KIND_NAMES[lo[1]]} and block {hi[0]} {KIND_NAMES[hi[1]]} overlap in "
                            f"{_box_text(_isect(bi, bj))}; the blocks of one task run in any order "
                            "(make their boxes disjoint, use atomic add, or order them with a syncall)"), 0]

    # ---- reporting -------------------------------------------------------------
    @staticmethod
    def _block_pair(t1, t2, buf, k1, k2, box):
        """Blocks of t1 (kind k1) and t2 (kind k2) whose raw boxes on ``buf``
        overlap inside ``box``; returns (block1, block2, intersection)."""
        for b1 in t1.blocks:
            for bb1, bx1, kk1 in b1.fp or ():
                if bb1 is not buf or kk1 != k1 or not _ov(bx1, box):
                    continue
                x1 = _isect(bx1, box)
                for b2 in t2.blocks:
                    for bb2, bx2, kk2 in b2.fp or ():
                        if bb2 is buf and kk2 == k2 and _ov(bx2, x1):
                            return b1.idx, b2.idx, _isect(x1, bx2)
        return "?", "?", box

    def _report(self, t1, t2, buf, box1, box2, k1, k2) -> str:
        """The message of an inter-task race (the first overlap of its group)."""
        b1, b2, box = self._block_pair(t1, t2, buf, k1, k2, _isect(box1, box2))
        return (
            f"kernel {self.program.name}: task {t1.name!r} (#{t1.id}, {t1.site}) block {b1} "
            f"{KIND_NAMES[k1]} and task {t2.name!r} (#{t2.id}, {t2.site}) block {b2} {KIND_NAMES[k2]} "
            f"overlap on buffer {_buf_text(buf)} in {_box_text(box)} with no path between the two tasks in "
            f"the task graph ({_hazard(k1, k2)}); fix: {_fix(t1, t2, buf)}")
