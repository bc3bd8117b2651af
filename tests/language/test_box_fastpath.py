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


def test_box_fast_path_matches_general_path():
    rng = random.Random(3)
    checked = 0
    for g in _views(rng):
        ref = GMTensor(g.data, g.buf, "x")
        ref._rows = None  # force the general loop
        for _ in range(20):
            starts = [rng.randrange(n + 1) for n in g.shape]
            stops = [rng.randrange(a, n + 1) for a, n in zip(starts, g.shape)]
            assert g.box(starts, stops) == ref.box(starts, stops)
            checked += g._rows is not None
    assert checked > 1000


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
