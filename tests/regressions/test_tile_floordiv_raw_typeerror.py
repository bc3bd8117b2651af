"""``tile // 3`` (and ``3 // tile``, ``tile // tile``) raised Python's raw TypeError
"unsupported operand type(s) for //". The DSL has no flooring division: ``pl.div`` (the ``/``
operator) truncates integer quotients toward zero, so ``//`` cannot map to it without giving
another quotient for negative operands. It is a DslError naming '//', the operands and the ops to
use; the recipe it names (``pl.cast(a / b, dtype, mode='floor')``) gives Python's floored quotient."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def _kernel(dtype, body):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], dtype], y: pl.Out[pl.Tensor[[2, 4], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="fd"):
            y[0:2, 0:4] = body(x[0:2, 0:4])
        return y
    return k


@pytest.mark.parametrize("dtype", [pl.INT8, pl.INT32, pl.FP32])
@pytest.mark.parametrize("body,shown", [(lambda t: t // 3, r"Tile\(\[2, 4\], pl\.\w+\) // 3"),
                                        (lambda t: 3 // t, r"3 // Tile\(\[2, 4\], pl\.\w+\)"),
                                        (lambda t: t // t, r"Tile\(\[2, 4\], pl\.\w+\) // Tile")])
def test_floordiv_is_a_dsl_error(dtype, body, shown):
    k = _kernel(dtype, body)
    x = torch.full((2, 4), 7, dtype=dtype.torch)
    with pytest.raises(DslError, match=rf"task 'fd' .*'//' on a tile \({shown}.*\): no DSL op floors a quotient; "
                                       r"use pl\.div \(the '/' operator"):
        k.run(x, torch.zeros(2, 4, dtype=torch.int32))


def test_named_recipe_floors():
    k = _kernel(pl.FP32, lambda t: pl.cast(t / 3.0, pl.INT32, mode="floor"))
    x = torch.tensor([[-7, -6, -5, -1], [0, 1, 5, 7]], dtype=torch.float32)
    y = torch.zeros(2, 4, dtype=torch.int32)
    k.run(x, y)
    assert y.tolist() == [[-3, -2, -2, -1], [0, 0, 1, 2]]  # Python's -7 // 3 == -3, 5 // 3 == 1


def test_true_division_unchanged():
    k = _kernel(pl.INT32, lambda t: t / 3)  # integer division truncates toward zero
    x = torch.tensor([[-7, -6, -5, -1], [0, 1, 5, 7]], dtype=torch.int32)
    y = torch.zeros(2, 4, dtype=torch.int32)
    k.run(x, y)
    assert y.tolist() == [[-2, -2, -1, 0], [0, 0, 1, 2]]
