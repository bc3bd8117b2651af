"""``pl.cmp(int8_tile, 300, "lt")`` and ``pl.cmp(int32_tile, 0.5, "ge")`` compared against a number
the tile's dtype cannot hold (torch compares exactly, so ``int8 < 300`` was all True and ``>= 0.5``
was ``> 0``), although every other scalar form takes the number in the tile's dtype and rejects
it (``int8_tile + 300``, ``pl.select``). Now the scalar of ``pl.cmp`` (and of the comparison
operators, which are ``pl.cmp``) follows the same rule: a fractional number or one outside an
integer tile's range is a DslError naming pl.cmp, the value and the range; numbers in range
(an integral float included) compare as before; float tiles take any number; an undefined
scalar (check mode) is not range-checked but makes the result undefined."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, UndefinedOutputError

X = [[-128, -1, 0, 1], [2, 7, 100, 127]]


def _kernel(dtype, body, from_read=False):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], dtype], s: pl.Tensor[[1, 1], pl.INT64], y: pl.Out[pl.Tensor[[2, 4], pl.BOOL]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="c"):
            y[0:2, 0:4] = body(x[0:2, 0:4], pl.read(s, [0, 0]) if from_read else None)
        return y
    return k


def _run(dtype, body, value=0, from_read=False):
    y = torch.zeros(2, 4, dtype=torch.bool)
    _kernel(dtype, body, from_read).run(torch.tensor(X, dtype=dtype.torch), torch.tensor([[value]]), y)
    return y.tolist()


@pytest.mark.parametrize("body,match", [
    (lambda t, _: pl.cmp(t, 300, "lt"), r"pl\.cmp: value 300 out of range of pl\.INT8 \[-128, 127\] \(no implicit"),
    (lambda t, _: t < 300, r"pl\.cmp: value 300 out of range of pl\.INT8"),
    (lambda t, _: -129 < t, r"pl\.cmp: value -129 out of range of pl\.INT8"),
    (lambda t, _: t == 128.0, r"pl\.cmp: value 128(\.0)? out of range of pl\.INT8"),
    (lambda t, _: pl.cmp(t, 0.5, "ge"), r"pl\.cmp: fractional scalar 0\.5 with a pl\.INT8 tile \(no implicit"),
    (lambda t, s: pl.cmp(t, s, "gt"), r"pl\.cmp: value 1000 out of range of pl\.INT8"),
])
def test_number_the_dtype_cannot_hold_is_a_dsl_error(body, match):
    with pytest.raises(DslError, match=rf"task 'c' .*{match}"):
        _run(pl.INT8, body, value=1000, from_read=True)


T, F = True, False


def test_numbers_in_range_compare_as_before():
    assert _run(pl.INT8, lambda t, _: pl.cmp(t, 127, "lt")) == [[T, T, T, T], [T, T, T, F]]
    assert _run(pl.INT8, lambda t, _: pl.cmp(t, -128, "eq")) == [[T, F, F, F], [F, F, F, F]]
    assert _run(pl.INT8, lambda t, _: t >= 7.0) == [[F, F, F, F], [F, T, T, T]]  # an integral float
    assert _run(pl.INT8, lambda t, s: pl.cmp(t, s, "le"), value=1, from_read=True) == [[T, T, T, T], [F, F, F, F]]
    assert _run(pl.INT32, lambda t, _: t < 300) == [[T] * 4, [T] * 4]  # 300 fits INT32
    assert _run(pl.FP32, lambda t, _: t > 0.5) == [[F, F, F, T], [T, T, T, T]]  # float tiles take any number
    assert _run(pl.FP32, lambda t, _: t < 1e30) == [[T] * 4, [T] * 4]


def test_bool_tiles_compare_with_bools():
    m = pl.Tile(torch.tensor([[True, False]]))
    assert pl.cmp(m, False, "eq").data.tolist() == [[False, True]]
    assert (m != True).data.tolist() == [[False, True]]  # noqa: E712 - the elementwise operator


def test_undefined_scalar_not_range_checked():
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT8], y: pl.Out[pl.Tensor[[2, 4], pl.BOOL]]):
        sc = pl.create_tensor([1, 1], pl.INT32, name="sc")  # never written: poisoned in check mode
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="c"):
            y[0:2, 0:4] = pl.cmp(x[0:2, 0:4], pl.read(sc, [0, 0]), "lt")
        return y
    with pytest.raises(UndefinedOutputError, match="y"):  # reported as undefined, not as a range error
        k.run(torch.tensor(X, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.bool), config=pto.RunConfig(check=True))
