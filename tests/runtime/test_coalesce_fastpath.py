"""deps.coalesce: its one-range fast path (boxes sharing one column range or one row range)
gives exactly the boxes of the general two-sort algorithm, on random lists."""

import random

from pto.runtime.deps import _coalesce_sorted, coalesce


def _two_sorts(boxes):
    """The general algorithm, written out: merge touching rows of equal column ranges, then
    touching columns of equal row ranges."""
    if len(boxes) <= 1:
        return list(boxes)
    out = []
    for b in sorted(set(boxes), key=lambda b: (b[2], b[3], b[0], b[1])):
        if out and out[-1][2:] == b[2:] and b[0] <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b[1]), b[2], b[3])
        else:
            out.append(b)
    res = []
    for b in sorted(out):
        if res and res[-1][:2] == b[:2] and b[2] <= res[-1][3]:
            res[-1] = (b[0], b[1], res[-1][2], max(res[-1][3], b[3]))
        else:
            res.append(b)
    return res


def test_coalesce_matches_the_two_sort_algorithm():
    rng = random.Random(11)
    fast = 0
    for _ in range(20000):
        mode = rng.random()
        boxes = []
        for _ in range(rng.randrange(0, 12)):
            if mode < 0.4:  # one column range (now and then a stray one)
                r = rng.randrange(12)
                boxes.append((r, r + rng.randrange(1, 4), 2, 5) if rng.random() < 0.97 else (r, r + 1, 2, 6))
            elif mode < 0.8:  # one row range
                c = rng.randrange(12)
                boxes.append((3, 4, c, c + rng.randrange(1, 4)) if rng.random() < 0.97 else (3, 5, c, c + 1))
            else:
                r, c = rng.randrange(8), rng.randrange(8)
                boxes.append((r, r + rng.randrange(1, 4), c, c + rng.randrange(1, 4)))
        if rng.random() < 0.3:
            boxes.sort()
        fast += len(boxes) > 1 and _coalesce_sorted(boxes) is not None
        assert coalesce(boxes) == _two_sorts(boxes), boxes
    assert fast > 5000


def test_coalesce_one_range_examples():
    # gathered rows in any order, one column range: runs of consecutive rows
    assert coalesce([(5, 6, 0, 8), (1, 2, 0, 8), (2, 3, 0, 8), (9, 10, 0, 8), (5, 6, 0, 8)]) == [
        (1, 3, 0, 8), (5, 6, 0, 8), (9, 10, 0, 8)]
    # column tiles of one row block, touching and overlapping
    assert coalesce([(0, 4, 8, 16), (0, 4, 0, 8), (0, 4, 20, 24), (0, 4, 14, 18)]) == [(0, 4, 0, 18), (0, 4, 20, 24)]
