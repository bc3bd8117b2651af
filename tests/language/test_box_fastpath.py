"""GMTensor fast paths (2-D subscript parsing and footprint boxes) give exactly
what the general code gives, on random views and windows."""

import random

import torch

from pto.language.tensor_ops import GMTensor
from pto.runtime.heap import Buffer


def _views(rng):
    for _ in range(300):
        shape = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))] + [rng.randrange(1, 9)]
        root = torch.zeros(shape)
        buf = Buffer(1, "x", "test", "arg", root, None)
        v = root
        if v.dim() >= 2 and rng.random() < 0.7:
            v = v.reshape(-1, shape[-1])
            r0 = rng.randrange(v.shape[0])
            c0 = rng.randrange(v.shape[1])
            v = v[r0:rng.randrange(r0 + 1, v.shape[0] + 1), c0:rng.randrange(c0 + 1, v.shape[1] + 1)]
            if rng.random() < 0.2:
                v = v.t()
        yield GMTensor(v, buf, "x")


def _views_rank1_rank3(rng):
    """Rank-1, narrow-row rank-2 and rank-3 views (windows of a root, split dims, the fast paths' kinds)."""
    for _ in range(600):
        rows, cols = rng.randrange(1, 7), rng.randrange(1, 13)
        root = torch.zeros(rows, cols) if rng.random() < 0.8 else torch.zeros(rows * cols)
        buf = Buffer(1, "x", "test", "arg", root, None)
        flat = root.reshape(-1)
        pick = rng.random()
        if pick < 0.25:  # a rank-1 window
            a = rng.randrange(flat.numel())
            v = flat[a:rng.randrange(a + 1, flat.numel() + 1)]
        elif pick < 0.4 and root.dim() == 2:  # rows narrower than a root row: [rows, cols] as [rows * k, cols / k]
            k = rng.choice([k for k in range(1, cols + 1) if cols % k == 0])
            v = root.reshape(rows * k, cols // k)
            r0, c0 = rng.randrange(v.shape[0]), rng.randrange(v.shape[1])
            v = v[r0:rng.randrange(r0 + 1, v.shape[0] + 1), c0:rng.randrange(c0 + 1, v.shape[1] + 1)]
        elif pick < 0.6 and root.dim() == 2:  # [rows, cols] split into [rows, k, cols / k]: row, column, column
            ks = [k for k in range(1, cols + 1) if cols % k == 0]
            k = rng.choice(ks)
            v = root.reshape(rows, k, cols // k)
            v = v[rng.randrange(rows):, rng.randrange(k):, rng.randrange(cols // k):]
        else:  # rows split into [a, b, cols]: row, row, column (sometimes the two row dims swapped)
            ks = [k for k in range(1, rows + 1) if rows % k == 0]
            k = rng.choice(ks)
            v = flat.reshape(k, rows // k, cols)
            if rng.random() < 0.3:
                v = v.transpose(0, 1)
            v = v[rng.randrange(v.shape[0]):, rng.randrange(v.shape[1]):, rng.randrange(cols):]
        if v.numel():
            yield GMTensor(v, buf, "x")


def _compare_with_general(views, rng, windows: int, non_empty: float) -> int:
    """Compare each view's boxes with the general loop's on ``windows`` random windows (a
    window is non-empty with probability about ``non_empty``); returns how many windows a fast
    path could have served."""
    checked = 0
    for g in views:
        ref = GMTensor(g.data, g.buf, "x")
        ref._rows = ref._fast = None  # force the general loop
        for _ in range(windows):
            starts = [rng.randrange(n + (rng.random() >= non_empty)) for n in g.shape]
            stops = [rng.randrange(min(a + (rng.random() < non_empty), n), n + 1) for a, n in zip(starts, g.shape)]
            assert g.box(starts, stops) == ref.box(starts, stops), (g.data.shape, g.data.stride(), starts, stops)
            checked += g._rows is not None or g._fast is not None
    return checked


def test_box_fast_path_rank1_rank3_matches_general_path():
    rng = random.Random(7)
    assert _compare_with_general(_views_rank1_rank3(rng), rng, 30, 0.95) > 10000


def test_box_fast_path_matches_general_path():
    rng = random.Random(3)
    assert _compare_with_general(_views(rng), rng, 20, 0.5) > 1000


def test_parse_fast_path_matches_general_path():
    rng = random.Random(5)
    for g in _views(rng):
        if len(g.shape) != 2:
            continue
        for _ in range(20):
            a0, a1 = rng.randrange(g.shape[0] + 1), rng.randrange(g.shape[1] + 1)
            key = (slice(a0, rng.randrange(a0, g.shape[0] + 1)), slice(a1, rng.randrange(a1, g.shape[1] + 1)))
            fast = g._parse(key)
            slow = g._parse((slice(key[0].start, key[0].stop, 1), slice(key[1].start, key[1].stop, 1)))  # general
            assert (fast[0], fast[1], list(fast[2])) == (slow[0], slow[1], list(slow[2]))
            assert fast[0] == [key[0].start, key[1].start] and fast[1] == [key[0].stop, key[1].stop]
