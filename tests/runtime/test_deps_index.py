"""The row-indexed producer registry derives exactly the edges of the plain
list scan it replaced (deps.py), on random footprints."""

import random

from pto.runtime.deps import DepTracker


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _covers(a, b):
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


class _ListTracker:
    """The reference: one flat list of producers per buffer."""

    def __init__(self):
        self.reg = {}

    def derive(self, tid, grouped, manual):
        preds = set()
        if manual:
            return preds
        for buf, (reads, writes, atomics) in grouped.items():
            entries = self.reg.setdefault(buf.id, [])
            for box in reads + writes:
                preds.update(e[1] for e in entries if _overlap(box, e[0]))
            for box in atomics:
                preds.update(e[1] for e in entries if e[2] == 1 and _overlap(box, e[0]))
            for box in writes:
                entries[:] = [e for e in entries if not _covers(box, e[0])]
                entries.append((box, tid, 1))
            for box in atomics:
                entries.append((box, tid, 2))
        preds.discard(tid)
        return preds


class _Buf:
    def __init__(self, bid):
        self.id = bid
        self.untracked = False


def _box(rng, rows, cols):
    r0 = rng.randrange(rows)
    c0 = rng.randrange(cols)
    kind = rng.random()
    if kind < 0.15:
        return (0, rows, 0, cols)
    h = 1 << rng.randrange(6) if kind < 0.7 else rng.randrange(1, rows + 1)
    return (r0, min(rows, r0 + h), c0, min(cols, c0 + rng.randrange(1, cols + 1)))


def test_indexed_registry_matches_the_list_scan():
    rng = random.Random(7)
    bufs = [_Buf(i + 1) for i in range(3)]
    for trial in range(40):
        new, ref = DepTracker(), _ListTracker()
        rows = rng.choice([1, 7, 64, 300])
        for tid in range(120):
            grouped = {}
            for buf in rng.sample(bufs, rng.randrange(1, 3)):
                g = ([], [], [])
                for _ in range(rng.randrange(1, 4)):
                    g[rng.choice([0, 0, 1, 1, 2])].append(_box(rng, rows, 32))
                grouped[buf] = g
            manual = rng.random() < 0.05
            assert new.derive(tid, grouped, manual) == ref.derive(tid, grouped, manual), (trial, tid)


def test_many_disjoint_rows_stay_cheap():
    t = DepTracker()
    buf = _Buf(1)
    for tid in range(5000):
        assert t.derive(tid, {buf: ([], [(tid, tid + 1, 0, 16)], [])}, False) == set()
    assert t.derive(5000, {buf: ([(0, 5000, 0, 16)], [], [])}, False) == set(range(5000))
    assert t.derive(5001, {buf: ([(10, 12, 3, 4)], [], [])}, False) == {10, 11}


def test_raw_records_derive_like_grouped_boxes():
    """derive_raw (one box per buffer and kind, no grouping) == derive."""
    rng = random.Random(11)
    bufs = [_Buf(i + 1) for i in range(4)]
    for trial in range(40):
        grouped_t, raw_t = DepTracker(), DepTracker()
        rows = rng.choice([4, 64, 300])
        for tid in range(100):
            recs = []
            for buf in rng.sample(bufs, rng.randrange(1, 4)):
                for kind in rng.sample([0, 1, 2], rng.randrange(1, 4)):
                    recs.append((buf, _box(rng, rows, 32), kind))
            rng.shuffle(recs)
            grouped = {}
            for buf, box, kind in recs:
                grouped.setdefault(buf, [None, None, None])[kind] = [box]
            manual = rng.random() < 0.05
            assert raw_t.derive_raw(tid, recs, manual) == grouped_t.derive(tid, grouped, manual), (trial, tid)
