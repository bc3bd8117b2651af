"""After a wrap the ring's head met its tail and the full ring looked empty:
the next allocation was placed on top of a live tensor."""

import pytest

from pto.errors import HeapExhaustedError
from pto.runtime.heap import RingHeap


def test_full_ring_after_wrap_is_full():
    h = RingHeap(1024)
    a = h.alloc(512, "a")
    h.alloc(512, "b")
    h.free(a)
    assert h.alloc(512, "c") == 0
    with pytest.raises(HeapExhaustedError):
        h.alloc(512, "d")
