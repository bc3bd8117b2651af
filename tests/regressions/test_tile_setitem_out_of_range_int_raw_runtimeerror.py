"""``t[i, j] = 300`` on an INT8 tile (any number outside an integer tile's range, an integral float
or a defined scalar from pl.read included, at an element or over a slice) raised torch's raw
RuntimeError ("value cannot be converted to type int8_t without overflow"). It is a DslError naming
the tile subscript assign, the value and the dtype's range, as pl.write says it; values in range
are stored as before, and an undefined scalar (check mode) stays undefined without an error."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError


def _kernel(dtype, value, key, from_read=False, undefined=False):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT64], y: pl.Out[pl.Tensor[[2, 4], dtype]]):
        # a scratch never written is poisoned in check mode: its elements are undefined
        src = pl.create_tensor([2, 4], pl.INT64, name="sc") if undefined else x
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = pl.full([2, 4], dtype, 0)
            t[key] = pl.read(src, [0, 0]) if from_read else value
            y[0:2, 0:4] = t
        return y
    return k


KEYS = [(0, 1), (slice(0, 2), slice(1, 2))]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("from_read", [False, True])
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 300), (pl.INT8, -129), (pl.INT32, 1 << 31), (pl.INT8, 1000.0),
                                         (pl.UINT8, -1)])
def test_out_of_range_value_is_a_dsl_error(dtype, value, from_read, key):
    k = _kernel(dtype, value, key, from_read)
    x = torch.full((2, 4), int(value), dtype=torch.int64)
    with pytest.raises(DslError, match=r"task 'w' .*tile subscript assign: value -?\d+(\.0)? out of range of "
                                       r"pl\.U?INT(8|32) \[-?\d+, \d+\]"):
        k.run(x, torch.zeros(2, 4, dtype=dtype.torch))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("from_read", [False, True])
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 127), (pl.INT8, -128), (pl.INT32, (1 << 31) - 1), (pl.INT8, -5.0),
                                         (pl.UINT8, 255)])
def test_values_in_range_are_stored(dtype, value, from_read, key):
    k = _kernel(dtype, value, key, from_read)
    y = torch.zeros(2, 4, dtype=dtype.torch)
    k.run(torch.full((2, 4), int(value), dtype=torch.int64), y)
    want = torch.zeros(2, 4, dtype=dtype.torch)
    want[key] = int(value)
    assert torch.equal(y, want)


def test_undefined_value_stays_undefined():
    k = _kernel(pl.INT8, None, (0, 1), from_read=True, undefined=True)
    with pytest.raises(pto.errors.UndefinedOutputError, match="y"):  # reported as undefined, not as a range error
        k.run(torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int8), config=pto.RunConfig(check=True))
