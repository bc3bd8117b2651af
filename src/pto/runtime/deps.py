"""Dependency derivation, the way the device runtime derives it (docs/dsl.md).

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

__all__ = ["DepTracker", "KindTracker", "LazyDerivation", "RowIndex", "coalesce", "EDGE_KINDS", "derive_kinds",
           "derive_task", "group_footprints"]

EDGE_KINDS = ("RAW", "WAW", "atomic", "explicit", "join")  # see TaskGraph.edge_kinds


def coalesce(boxes: list) -> list:
    """Merge boxes into fewer boxes covering exactly the same union where they
    line up (same column range and touching rows, then same row range and
    touching columns)."""
    if len(boxes) <= 1:
        return list(boxes)
    fast = _coalesce_sorted(boxes)
    if fast is not None:
        return fast
    # sorted by (c0, c1, r0, r1): the boxes as column-first tuples, sorted as tuples (no key calls)
    out = []
    for c0, c1, r0, r1 in sorted([(b[2], b[3], b[0], b[1]) for b in set(boxes)]):
        if out:
            p = out[-1]
            if p[2] == c0 and p[3] == c1 and r0 <= p[1]:
                if r1 > p[1]:
                    out[-1] = (p[0], r1, c0, c1)
                continue
        out.append((r0, r1, c0, c1))
    if len(out) <= 1:
        return out
    out.sort()  # by (r0, r1, c0, c1)
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


def group_footprints(block_fps: list) -> dict:
    """A task's footprints grouped from its blocks' raw records ``block_fps`` (one list of
    ``(buffer, box, kind)`` per block): ``{buffer: [reads, writes, atomics]}``, each None or a
    list of boxes in record order, coalesced (:func:`coalesce`) where a kind has several."""
    grouped: dict = {}
    several = False  # some (buffer, kind) has more than one box: coalesce
    for fp in block_fps:
        for buf, box, kind in fp:
            g = grouped.get(buf)
            if g is None:
                g = grouped[buf] = [None, None, None]
                g[kind] = [box]
                continue
            boxes = g[kind]
            if boxes is None:
                g[kind] = [box]
            else:
                boxes.append(box)
                several = True
    if several:
        for g in grouped.values():
            for boxes in g:
                if boxes and len(boxes) > 1:
                    boxes[:] = coalesce(boxes)
    return grouped


def _coalesce_sorted(boxes: list):
    """:func:`coalesce` of boxes that all share one column range, or all share one row range
    (rows of a window, gathered rows, column tiles of one row block): one tuple sort and one
    merging pass; None for any other list. Such boxes sort by their other range alone (the
    order the general path's two sorts give them), duplicates are absorbed by merging, and the
    merged boxes are disjoint in that range, so the general second pass leaves them alone."""
    first, second = boxes[0], boxes[1]
    if second[2] == first[2] and second[3] == first[3]:
        lo, hi, k0, k1 = 0, 1, 2, 3  # one column range: merge the row ranges
    elif second[0] == first[0] and second[1] == first[1]:
        lo, hi, k0, k1 = 2, 3, 0, 1  # one row range: merge the column ranges
    else:
        return None
    f0, f1 = first[k0], first[k1]
    bs = sorted(boxes)
    spans = []
    s0, s1 = bs[0][lo], bs[0][hi]
    for b in bs:
        if b[k0] != f0 or b[k1] != f1:
            return None
        if b[lo] <= s1:
            if b[hi] > s1:
                s1 = b[hi]
        else:
            spans.append((s0, s1))
            s0, s1 = b[lo], b[hi]
    spans.append((s0, s1))
    if lo == 0:
        return [(a, b, f0, f1) for a, b in spans]
    return [(f0, f1, a, b) for a, b in spans]


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _covers(a, b) -> bool:
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


class RowIndex:
    """The registered producers of one root buffer, indexed by rows so that a
    lookup costs the number of nearby entries, not the number of entries.

    An entry ``(box, task id, kind)`` of row height ``h`` lives at level
    ``floor(log2(h))`` in every bucket of ``2**level`` rows it touches (at most
    three). A lookup visits, per level, the buckets its box touches, or every
    bucket of the level when that is fewer."""

    __slots__ = ("levels",)

    def __init__(self):
        self.levels: dict = {}  # level -> {bucket index: [entry, ...]}

    def __bool__(self) -> bool:
        return bool(self.levels)

    def add(self, box, tid: int, kind: int) -> None:
        """Register entry ``(box, tid, kind)`` (kind 0 read, 1 write, 2 atomic add) in every bucket it touches."""
        e = (box, tid, kind)
        r0, r1 = box[0], box[1]
        lv = (r1 - r0).bit_length() - 1
        bk = self.levels.get(lv)
        if bk is None:
            bk = self.levels[lv] = {}
        b0, b1 = r0 >> lv, (r1 - 1) >> lv
        if b0 == b1:
            lst = bk.get(b0)
            if lst is None:
                bk[b0] = [e]
            else:
                lst.append(e)
            return
        for b in range(b0, b1 + 1):
            lst = bk.get(b)
            if lst is None:
                bk[b] = [e]
            else:
                lst.append(e)

    def overlapping(self, box) -> list:
        """Entries whose box overlaps ``box`` (an entry may appear more than once)."""
        out = []
        r0, r1, c0, c1 = box
        for lv, bk in self.levels.items():
            b0, b1 = r0 >> lv, (r1 - 1) >> lv
            if b0 == b1:
                lst = bk.get(b0)
                if lst is None:
                    continue
                lists = (lst,)
            elif b1 - b0 < len(bk):
                lists = [bk[b] for b in range(b0, b1 + 1) if b in bk]
            else:
                lists = bk.values()
            for lst in lists:
                for e in lst:
                    eb = e[0]
                    if r0 < eb[1] and eb[0] < r1 and c0 < eb[3] and eb[2] < c1:
                        out.append(e)
        return out

    def remove(self, e) -> None:
        """Drop entry ``e`` (the very tuple stored by :meth:`add`)."""
        eb = e[0]
        lv = (eb[1] - eb[0]).bit_length() - 1
        bk = self.levels[lv]
        for b in range(eb[0] >> lv, ((eb[1] - 1) >> lv) + 1):
            lst = bk[b]
            lst.remove(e)
            if not lst:
                del bk[b]
        if not bk:
            del self.levels[lv]

    def write(self, box, tid: int, preds: set) -> None:
        """A plain write of ``box`` by task ``tid``: the tasks of the entries it
        overlaps join ``preds``, the entries it covers drop, it registers."""
        seen = None
        for e in (self.overlapping(box) if self.levels else ()):
            preds.add(e[1])
            if not _covers(box, e[0]):
                continue
            if seen is None:
                seen = set()
            elif id(e) in seen:
                continue
            seen.add(id(e))
            self.remove(e)
        r0, r1 = box[0], box[1]
        lv = (r1 - r0).bit_length() - 1
        b0, b1 = r0 >> lv, (r1 - 1) >> lv
        if b0 == b1:  # the common case of add(box, tid, 1), inline
            bk = self.levels.get(lv)
            if bk is None:
                self.levels[lv] = {b0: [(box, tid, 1)]}
                return
            lst = bk.get(b0)
            if lst is None:
                bk[b0] = [(box, tid, 1)]
            else:
                lst.append((box, tid, 1))
            return
        self.add(box, tid, 1)


# the kind of a derived edge by (access kind of the waiting task, kind of the registered producer):
# access kinds 0 read, 1 write, 2 atomic add; None: no edge (two atomic adds)
_EDGE_KIND = {(0, 1): "RAW", (0, 2): "atomic", (1, 1): "WAW", (1, 2): "atomic", (2, 1): "atomic"}


class DepTracker:
    """Producer registry of one program (see the module docstring).

    :class:`KindTracker` also records why each edge exists; a program's own tracker does
    not (a run pays nothing for it).
    """

    def __init__(self):
        self.reg: dict[int, RowIndex] = {}  # buffer id -> registered producers

    def derive_raw(self, tid: int, fps: list, manual: bool) -> set:
        """:meth:`derive` for footprint records ``(buffer, box, kind)`` with at
        most one box per (buffer, kind), so no grouping or coalescing is needed:
        every lookup first, then the writes, then the atomic adds, which per
        buffer is the order :meth:`derive` uses."""
        preds = set()
        if manual:
            return preds
        reg = self.reg
        writes = atomics = False
        for buf, box, kind in fps:
            if kind == 1:
                writes = True
                continue
            if kind == 2:
                atomics = True
            if buf.untracked:
                continue
            entries = reg.get(buf.id)
            if entries is not None and entries.levels:
                for e in entries.overlapping(box):
                    if kind == 0 or e[2] == 1:
                        preds.add(e[1])
        if writes:
            for buf, box, kind in fps:
                if kind == 1 and not buf.untracked:
                    entries = reg.get(buf.id)
                    if entries is None:
                        entries = reg[buf.id] = RowIndex()
                    entries.write(box, tid, preds)
        if atomics:
            for buf, box, kind in fps:
                if kind == 2 and not buf.untracked:
                    entries = reg.get(buf.id)
                    if entries is None:
                        entries = reg[buf.id] = RowIndex()
                    entries.add(box, tid, 2)
        preds.discard(tid)
        return preds

    def derive(self, tid: int, grouped: dict, manual: bool) -> set:
        """Predecessors of task ``tid`` from ``grouped`` = {buffer: [reads,
        writes, atomics]} (lists of coalesced boxes, or None for none);
        registers the task's writes unless ``manual``."""
        preds = set()
        if manual:
            return preds
        reg = self.reg
        for buf, (reads, writes, atomics) in grouped.items():
            if buf.untracked:
                continue
            entries = reg.get(buf.id)
            if entries is not None and entries.levels:
                for box in reads or ():
                    for e in entries.overlapping(box):
                        preds.add(e[1])
                for box in atomics or ():
                    for e in entries.overlapping(box):
                        if e[2] == 1:
                            preds.add(e[1])
            if writes or atomics:
                if entries is None:
                    entries = reg[buf.id] = RowIndex()
                for box in writes or ():
                    # lookup and registration in one pass: an entry dropped by an earlier write box
                    # of this task was already made a predecessor by that box
                    entries.write(box, tid, preds)
                for box in atomics or ():
                    entries.add(box, tid, 2)
        preds.discard(tid)
        return preds


class KindTracker(DepTracker):
    """A :class:`DepTracker` that also records why each derived edge exists, in ``kinds``:
    {task id: {predecessor id: set of kinds}}, kinds ``"RAW"`` (a read waits for a plain
    writer), ``"WAW"`` (a plain write waits for a plain writer) and ``"atomic"`` (an atomic
    add and a plain access of one region: an atomic add waiting for a plain writer, a plain
    read or write waiting for an atomic adder). Used by :func:`derive_kinds` to replay a
    finished graph."""

    def __init__(self):
        super().__init__()
        self.kinds: dict = {}

    def _record_kinds(self, tid: int, records) -> None:
        """Classify the edges task ``tid`` is about to get from footprint ``records``
        (``(buffer, box, access kind)``): the same lookups as the derivation, made before
        it registers anything, so every derived predecessor gets its kinds."""
        out: dict = {}
        reg = self.reg
        for buf, box, kind in records:
            if buf.untracked:
                continue
            entries = reg.get(buf.id)
            if entries is None or not entries.levels:
                continue
            for e in entries.overlapping(box):
                k = _EDGE_KIND.get((kind, e[2]))
                if k is not None and e[1] != tid:
                    ks = out.get(e[1])
                    if ks is None:
                        out[e[1]] = {k}
                    else:
                        ks.add(k)
        self.kinds[tid] = out

    def derive_raw(self, tid: int, fps: list, manual: bool) -> set:
        """:meth:`DepTracker.derive_raw`, recording the kinds first."""
        if not manual:
            self._record_kinds(tid, fps)
        return super().derive_raw(tid, fps, manual)

    def derive(self, tid: int, grouped: dict, manual: bool) -> set:
        """:meth:`DepTracker.derive`, recording the kinds first."""
        if not manual:
            self._record_kinds(tid, [(buf, box, k) for buf, boxes in grouped.items() for k in (0, 1, 2)
                                     for box in boxes[k] or ()])
        return super().derive(tid, grouped, manual)


def derive_task(tracker: DepTracker, task) -> set:
    """The predecessors of the finished ``task`` (derived from ``task.grouped`` through
    ``tracker``, which registers its writes, plus its explicit ``deps=``)."""
    g = task.grouped
    if not g:
        preds = set()
    elif type(g) is list:
        preds = tracker.derive_raw(task.id, g, task.manual)
    else:
        preds = tracker.derive(task.id, g, task.manual)
    if task.explicit:
        preds.update(task.explicit)
    return preds


class LazyDerivation:
    """Derivation on demand (a plain run: no check mode): finished tasks wait with
    ``task._preds`` None, their ``(id, grouped, manual, explicit)`` in ``pending``; the first read
    of any such task's ``preds`` derives every pending task in submission order through the
    program's tracker into ``derived`` ({task id: preds}), from where each task takes its own on
    its first read. ``pending`` holds the tasks' footprints, not the tasks, so tasks and this
    record form no reference cycle (a graph is freed by refcount). Derivation is a function of
    the footprints, the order and the manual flags only, so the edges equal an eager derivation's."""

    __slots__ = ("tracker", "pending", "derived")

    def __init__(self, tracker: DepTracker):
        self.tracker = tracker
        self.pending: list = []
        self.derived: dict = {}

    def add(self, task) -> None:
        """Queue the finished ``task`` (its ``grouped`` footprints are set and stay as they are)."""
        task._preds = None
        task._lazy = self
        self.pending.append((task.id, task.grouped, task.manual, task.explicit))

    def run(self) -> None:
        """Derive the preds of every pending task, in order, into ``derived`` (as :func:`derive_task`)."""
        pending, self.pending = self.pending, []
        tracker = self.tracker
        derived = self.derived
        for tid, g, manual, explicit in pending:
            if not g:
                preds = set()
            elif type(g) is list:
                preds = tracker.derive_raw(tid, g, manual)
            else:
                preds = tracker.derive(tid, g, manual)
            if explicit:
                preds.update(explicit)
            derived[tid] = preds


def derive_kinds(tasks) -> dict:
    """The kinds of every derived edge of a finished graph: {task id: {predecessor id: set
    of kinds}} (see :class:`KindTracker`). Derivation is a function of the tasks' footprints
    (``Task.grouped``), their order and their manual flags only, so a replay through a fresh
    :class:`KindTracker` gives the run's derived edges exactly, with their kinds,
    and a run pays nothing for it."""
    tracker = KindTracker()
    for t in tasks:
        g = t.grouped
        if not g:
            continue
        if type(g) is list:
            tracker.derive_raw(t.id, g, t.manual)
        else:
            tracker.derive(t.id, g, t.manual)
    return tracker.kinds
