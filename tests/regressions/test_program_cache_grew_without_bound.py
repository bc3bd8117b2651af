"""The program cache never forgot a key before 512 of them, first in first out: a long run with
ever new keys (decode positions) kept every recording, and a hot key was dropped like a cold one.

Now it keeps the 256 most recently used keys (``set_program_cache_size`` changes the bound).
"""

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info, set_program_cache_size


pytestmark = pytest.mark.usefixtures("fresh_program_cache")


@pl.jit
def at_pos(x: pl.Tensor[[4, 16], pl.FP32], pos: pl.Scalar[pl.INT32], y: pl.Out[pl.Tensor[[4, 16], pl.FP32]]):
    for b in pl.spmd(1, name_hint="p"):
        y[0:4, 0:16] = x[0:4, 0:16] + pl.cast(pl.full([4, 16], pl.INT32, pos), pl.FP32)


def test_default_bound_is_256_keys():
    x = torch.randn(4, 16)
    for pos in range(300):
        y = torch.empty(4, 16)
        at_pos.run(x, pos, y)
        assert torch.equal(y, x + pos)
    assert cache_info()["entries"] == 256 and cache_info()["evicted"] == 44


def test_least_recently_used_key_goes_first():
    set_program_cache_size(3)
    x = torch.randn(4, 16)

    def call(pos):
        y = torch.empty(4, 16)
        prog = at_pos.run(x, pos, y)
        assert torch.equal(y, x + pos)
        return prog

    for _ in range(2):
        call(0)  # seen, then recorded
    for pos in (1, 2, 0, 3, 4):  # key 0 stays in use; 1 and 2 are the oldest when 3 and 4 come
        call(pos)
    assert cache_info()["entries"] == 3 and cache_info()["evicted"] == 2
    assert call(0).replayed  # a FIFO bound would have dropped key 0 first


def test_bad_bound_raises():
    with pytest.raises(ValueError, match="at least 1"):
        set_program_cache_size(0)
    with pytest.raises(TypeError, match="expected an int"):
        set_program_cache_size(2.5)
