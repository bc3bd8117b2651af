"""Exact-key recordings (the default program cache) guard only the elements of a ``tolist`` result
the program reads, noted by a list subclass's ``__getitem__``. ``pl.read_values`` handed that list
to the kernel, and ``heapq.heapify`` / ``heappop`` or an explicit ``list.__getitem__(lst, i)`` read
its elements from C with no method of the subclass called: a replay with other values there
(FP32 data: not in the key) gave the recording's result.

Now only the DSL's private element cache (``pl.read`` from a tile) is tracked element by element;
a list handed to other code is guarded whole, so such a call diverges and runs plain.
"""

import heapq

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info, set_program_cache

pytestmark = pytest.mark.usefixtures("fresh_program_cache")


@pl.jit
def smallest_by_heap(v: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        vals = pl.read_values(v, [0, 0], 8)
        heapq.heapify(vals)
        y[0:1, 0:16] = pl.full([1, 16], pl.FP32, heapq.heappop(vals))
    return y


@pl.jit
def by_list_getitem(v: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        vals = pl.read_values(v, [0, 0], 8)
        y[0:1, 0:16] = pl.full([1, 16], pl.FP32, list.__getitem__(vals, 3))
    return y


@pl.jit
def by_tile_reads(v: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        t = v[0:1, 0:8]
        a = pl.read(t, [0, 0])
        b = pl.read(t, [0, 1])  # from the second read on: the tile's private list
        y[0:1, 0:16] = pl.full([1, 16], pl.FP32, a + b)
    return y


def _call(kernel, vals):
    y = torch.zeros(1, 16)
    kernel.run(torch.tensor([vals], dtype=torch.float32), y)
    return y


A = [5.0, 4.0, 3.0, 2.0, 1.0, 6.0, 7.0, 8.0]
B = [5.0, 4.0, 3.0, 9.0, 0.5, 6.0, 7.0, 8.0]  # another minimum, another element 3; elements 0, 1 the same


@pytest.mark.parametrize("kernel, replays", [(smallest_by_heap, 0), (by_list_getitem, 0), (by_tile_reads, 1)])
def test_a_replay_sees_every_element_the_kernel_read(kernel, replays):
    set_program_cache(False)
    plain = [_call(kernel, x) for x in (A, A, B)]
    assert not torch.equal(plain[1], plain[2]) or kernel is by_tile_reads
    set_program_cache(True)
    got = [_call(kernel, x) for x in (A, A, B)]  # a first call, the recording, then B
    for p, g in zip(plain, got):
        assert torch.equal(p, g)
    info = cache_info()
    assert (info["recorded"], info["replayed"], info["diverged"]) == (1, replays, 1 - replays)
