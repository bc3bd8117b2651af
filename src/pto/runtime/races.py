"""Race checker (DESIGN section 6).

* Intra-task: two blocks of one task (same barrier phase) whose footprints
  overlap, where at least one writes (plain write or atomic add), except two
  atomic adds.
* Inter-task: a footprint of a new task overlapping a footprint of an earlier
  task, at least one writing (again except atomic/atomic), with no path
  between the two tasks in the derived graph. This finds a missing
  write-after-read edge, a manual scope without ``deps=``, a wrong direction.

Reachability uses ancestor bitsets (Python ints), one per task.
"""

from __future__ import annotations

from pto.errors import RaceError
from pto.runtime.graph import KIND_NAMES

__all__ = ["RaceChecker"]


def _conflict(k1: int, k2: int) -> bool:
    return (k1 != 0 or k2 != 0) and not (k1 == 2 and k2 == 2)


def _ov(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _isect(a, b):
    return (max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3]))


class RaceChecker:
    """Per-program race checker; ``check_task`` runs as each task closes."""

    def __init__(self, program):
        self.program = program
        self.anc: list[int] = []  # ancestor bitset per task id
        self.history: dict[int, list] = {}  # buffer id -> [(box, task id, kind)]

    def _ancestors(self, task) -> int:
        a = 0
        for p in task.preds:
            a |= self.anc[p] | (1 << p)
        return a

    def add_node(self, task) -> None:
        """Register a join node (no footprints)."""
        self.anc.append(self._ancestors(task))

    def check_task(self, task) -> None:
        """Check ``task`` against itself and every earlier task.

        Raises:
            RaceError: naming both tasks, blocks, the buffer and the box.
        """
        self._intra(task)
        anc = self._ancestors(task)
        self.anc.append(anc)
        for buf, kind, box in task.footprints:
            for hbox, htid, hkind in self.history.get(buf.id, ()):
                if _conflict(kind, hkind) and _ov(box, hbox) and not (anc >> htid) & 1:
                    self._report(self.program.graph[htid], task, buf, hbox, box, hkind, kind)
        for buf, kind, box in task.footprints:
            self.history.setdefault(buf.id, []).append((box, task.id, kind))

    def _intra(self, task) -> None:
        if len(task.blocks) < 2:
            return
        per_buf: dict = {}
        for blk in task.blocks:
            for buf, box, kind in blk.fp:
                per_buf.setdefault(buf, []).append((box, blk.idx, blk.phase, kind))
        for buf, items in per_buf.items():
            if all(k == 0 for _, _, _, k in items) or all(k == 2 for _, _, _, k in items):
                continue
            items.sort(key=lambda x: x[0][0])
            n = len(items)
            for i in range(n):
                bi, bli, phi, ki = items[i]
                for j in range(i + 1, n):
                    bj, blj, phj, kj = items[j]
                    if bj[0] >= bi[1]:
                        break
                    if blj != bli and phj == phi and _conflict(ki, kj) and _ov(bi, bj):
                        r0, r1, c0, c1 = _isect(bi, bj)
                        raise RaceError(
                            f"kernel {self.program.name}: blocks {bli} and {blj} of task {task.name!r} "
                            f"(#{task.id}, {task.site}) race on {buf.name!r}: {KIND_NAMES[ki]} vs "
                            f"{KIND_NAMES[kj]} of box rows [{r0}, {r1}) cols [{c0}, {c1})")

    def _blocks_touching(self, task, buf, box, kind):
        for blk in task.blocks:
            for b2, bx, k in blk.fp or ():
                if b2 is buf and k == kind and _ov(bx, box):
                    return blk.idx
        return "?"

    def _report(self, t1, t2, buf, box1, box2, k1, k2):
        r0, r1, c0, c1 = _isect(box1, box2)
        b1 = self._blocks_touching(t1, buf, box2, k1)
        b2 = self._blocks_touching(t2, buf, box1, k2)
        raise RaceError(
            f"kernel {self.program.name}: task {t1.name!r} (#{t1.id} block {b1}, {t1.site}) {KIND_NAMES[k1]} "
            f"and task {t2.name!r} (#{t2.id} block {b2}, {t2.site}) {KIND_NAMES[k2]} overlap on "
            f"{buf.name!r} rows [{r0}, {r1}) cols [{c0}, {c1}) with no path between them in the task graph "
            "(add deps=, an InOut direction, or take it out of the manual scope)")
