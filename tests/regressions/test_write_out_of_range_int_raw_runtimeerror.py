"""pl.write of an integer (or an integral float) outside an integer dtype's range raised torch's
raw RuntimeError ("value cannot be converted to type int8_t without overflow"), on the tile fast
path, the general tile path and into a GM tensor. It is a DslError naming pl.write, the value,
the dtype's range and the place, as pl.full says it; values in range are stored as before, and
an undefined value (check mode) stays undefined without an error."""

import numpy
import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError


def _kernel(target: str, dtype, value, idx=(0, 1)):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT32], y: pl.Out[pl.Tensor[[2, 4], dtype]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            if target == "gm":
                y[0:2, 0:4] = pl.full([2, 4], dtype, 0)
                pl.write(y, list(idx), value)
            else:
                t = pl.full([2, 4], dtype, 0)
                if target == "tile_general":  # numpy indices: the general tile path
                    pl.write(t, [numpy.int64(i) for i in idx], value)
                else:
                    pl.write(t, list(idx), value)
                y[0:2, 0:4] = t
        return y
    return k


@pytest.mark.parametrize("target", ["tile", "tile_general", "gm"])
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 300), (pl.INT8, -129), (pl.INT32, 1 << 31), (pl.INT8, 1000.0)])
def test_out_of_range_value_is_a_dsl_error(target, dtype, value):
    k = _kernel(target, dtype, value)
    y = torch.zeros(2, 4, dtype=dtype.torch)
    with pytest.raises(DslError, match=r"pl\.write: value .* out of range of pl\.INT(8|32) \[.*task 'w' block 0"):
        k.run(torch.zeros(2, 4, dtype=torch.int32), y)


@pytest.mark.parametrize("target", ["tile", "tile_general", "gm"])
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 127), (pl.INT8, -128), (pl.INT32, (1 << 31) - 1), (pl.INT8, -5.0)])
def test_values_in_range_are_stored(target, dtype, value):
    k = _kernel(target, dtype, value)
    y = torch.zeros(2, 4, dtype=dtype.torch)
    k.run(torch.zeros(2, 4, dtype=torch.int32), y)
    want = torch.zeros(2, 4, dtype=dtype.torch)
    want[0, 1] = int(value)
    assert torch.equal(y, want)


def test_undefined_value_stays_undefined():
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT32], y: pl.Out[pl.Tensor[[2, 4], pl.INT8]]):
        sc = pl.create_tensor([2, 4], pl.INT32, name="sc")  # never written: poisoned in check mode
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = pl.full([2, 4], pl.INT8, 0)
            pl.write(t, [0, 1], pl.read(sc, [0, 0]))
            y[0:2, 0:4] = t
        return y
    with pytest.raises(pto.errors.UndefinedOutputError, match="y"):  # reported as undefined, not as a range error
        k.run(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int8), config=pto.RunConfig(check=True))
