"""Dependency derivation, the way the device runtime derives it (DESIGN section 4).

Per root buffer a registry holds the current producers of regions: plain
writers and atomic adders. For a finished task, with its footprints merged
over all blocks:

* read-after-write: every read box waits for every registered producer
  (writer or atomic adder) it overlaps;
* write-after-write: every plain write box waits for every registered
  producer it overlaps, then becomes the producer (entries it covers drop);
* atomic add: waits for the overlapping plain writers only (two atomic adds
  need no order), then registers as an atomic producer;
* write-after-read is not derived;
* in a manual scope, or on a ``manual_dep`` tensor, there is neither lookup
  nor registration.

Creator retention (a task naming a tensor waits for its allocation) is kept
as the task's buffer set: allocation-time initialisation is part of the
allocation, not a task, so it adds no edge.
"""

from __future__ import annotations

__all__ = ["DepTracker", "coalesce"]


def coalesce(boxes: list) -> list:
    """Merge boxes into fewer boxes covering exactly the same union where they
    line up (same column range and touching rows, then same row range and
    touching columns)."""
    if len(boxes) <= 1:
        return list(boxes)
    bs = sorted(set(boxes), key=lambda b: (b[2], b[3], b[0], b[1]))
    out = []
    for b in bs:
        if out:
            p = out[-1]
            if p[2] == b[2] and p[3] == b[3] and b[0] <= p[1]:
                if b[1] > p[1]:
                    out[-1] = (p[0], b[1], p[2], p[3])
                continue
        out.append(b)
    if len(out) <= 1:
        return out
    out.sort(key=lambda b: (b[0], b[1], b[2], b[3]))
    res = []
    for b in out:
        if res:
            p = res[-1]
            if p[0] == b[0] and p[1] == b[1] and b[2] <= p[3]:
                if b[3] > p[3]:
                    res[-1] = (p[0], p[1], p[2], b[3])
                continue
        res.append(b)
    return res


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _covers(a, b) -> bool:
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


class DepTracker:
    """Producer registry of one program (see the module docstring)."""

    def __init__(self):
        self.reg: dict[int, list] = {}  # buffer id -> [(box, task id, kind)]

    def derive(self, tid: int, grouped: dict, manual: bool) -> set:
        """Predecessors of task ``tid`` from ``grouped`` = {buffer: [reads,
        writes, atomics]} (lists of coalesced boxes); registers the task's
        writes unless ``manual``."""
        preds = set()
        if manual:
            return preds
        reg = self.reg
        for buf, (reads, writes, atomics) in grouped.items():
            if buf.untracked:
                continue
            entries = reg.get(buf.id)
            if entries:
                for box in reads:
                    for e in entries:
                        if _overlap(box, e[0]):
                            preds.add(e[1])
                for box in writes:
                    for e in entries:
                        if _overlap(box, e[0]):
                            preds.add(e[1])
                for box in atomics:
                    for e in entries:
                        if e[2] == 1 and _overlap(box, e[0]):
                            preds.add(e[1])
            if writes or atomics:
                if entries is None:
                    entries = reg[buf.id] = []
                for box in writes:
                    entries[:] = [e for e in entries if not _covers(box, e[0])]
                    entries.append((box, tid, 1))
                for box in atomics:
                    entries.append((box, tid, 2))
        preds.discard(tid)
        return preds
