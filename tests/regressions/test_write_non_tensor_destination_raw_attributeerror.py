"""pl.write into something that is neither a GM tensor nor a tile (a number, a torch tensor, a
list) raised a raw AttributeError ("'int' object has no attribute 'data'") whenever the value was
a float: the fractional-value check read ``dst.data`` before the destination was checked. It is a
DslError naming pl.write and what it got, inside a task and in orchestration, for every value."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def _kernel(dst, value, inside: bool):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT8], y: pl.Out[pl.Tensor[[2, 4], pl.INT8]]):
        if inside:
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
                pl.write(dst, [0, 0], value)
        else:
            pl.write(dst, [0, 0], value)
        return y
    return k


@pytest.mark.parametrize("inside", [True, False])
@pytest.mark.parametrize("value", [1, 1.0, 1.5])
@pytest.mark.parametrize("dst,got", [(5, "int 5"), (2.5, "float 2.5"), (torch.zeros(2, 4), "Tensor"),
                                     ([[0, 0]], "list")])
def test_non_tensor_destination_is_a_dsl_error(dst, got, value, inside):
    k = _kernel(dst, value, inside)
    with pytest.raises(DslError, match=rf"pl\.write: expected a GM tensor or a tile to write into, got {got}\b"):
        k.run(torch.zeros(2, 4, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8))


def test_tile_and_tensor_destinations_still_written():
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.FP32], y: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = x[0:2, 0:4]
            pl.write(t, [1, 2], 1.5)
            y[0:2, 0:4] = t
            pl.write(y, [0, 3], -2.0)
        return y
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    y = torch.zeros(2, 4)
    k.run(x, y)
    want = x.clone()
    want[1, 2] = 1.5
    want[0, 3] = -2.0
    assert torch.equal(y, want)
