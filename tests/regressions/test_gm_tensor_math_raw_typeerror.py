"""Regression: tile math on a GM tensor, the most likely beginner mistake (``y[0:16, :] =
x[0:16, :] * 2.0`` without a task scope, or ``x * 2.0`` on a whole parameter inside one), raised
a raw ``TypeError: unsupported operand type(s) for *: 'GMTensor' and 'float'``; a GM tensor given
to a tile op or stored as a value said "expected a tile, got GMTensor" without mentioning the task
scope (breaker findings M8, L5). Each is now a DslError saying that tile math needs a tile loaded
inside a task (pl.at / pl.spmd).
"""

import operator

import pytest
import torch

import pto.language as pl
from pto.errors import DslError

HINT = r"tile math needs tiles: inside a task \(pl.at / pl.spmd\), load one with a window such as x\[a:b, c:d\]"


def _kernel(body, in_task: bool):
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
        if in_task:
            with pl.at(name_hint="t"):
                body(x, y)
        else:
            body(x, y)
    return k


@pytest.mark.parametrize("op,sym", [(operator.mul, r"'\*'"), (operator.add, "'[+]'"), (operator.sub, "'-'"),
                                    (operator.truediv, "'/'"), (operator.lt, "'<'"), (operator.ge, "'>='"),
                                    (operator.pow, r"'\*\*'"), (operator.matmul, "'@'")])
def test_operators_on_a_gm_tensor_in_orchestration(op, sym):
    def body(x, y):
        y[0:16, :] = op(x[0:16, :], 2.0)

    with pytest.raises(DslError, match=rf"^kernel k: x: {sym} on a GM tensor \[16, 128\]; {HINT}.* at .*test_gm_tensor_math"):
        _kernel(body, False)(torch.randn(64, 128), torch.zeros(64, 128))


def test_reflected_and_unary_operators_on_a_gm_tensor():
    for body in (lambda x, y: 2.0 * x, lambda x, y: 1.0 - x, lambda x, y: -x, lambda x, y: abs(x)):
        with pytest.raises(DslError, match=HINT):
            _kernel(body, False)(torch.randn(64, 128), torch.zeros(64, 128))


def test_operator_on_a_whole_parameter_inside_a_task_names_the_task():
    def body(x, y):
        y[:, :] = x * 2.0

    with pytest.raises(DslError, match=rf"x: '\*' on a GM tensor \[64, 128\]; {HINT}.*\(task 't' block 0 at "):
        _kernel(body, True)(torch.randn(64, 128), torch.zeros(64, 128))


def test_tile_op_or_store_of_a_gm_tensor_mentions_the_task_scope():
    with pytest.raises(DslError, match=r"pl.exp: expected a tile, got GM tensor 'x' \[16, 128\]; tile math runs "
                                       r"inside a task \(pl.at / pl.spmd\) on tiles loaded there"):
        _kernel(lambda x, y: pl.exp(x[0:16, :]), False)(torch.randn(64, 128), torch.zeros(64, 128))
    with pytest.raises(DslError, match=r"y: subscript assign of GM tensor 'x': GM-to-GM copies go through a tile "
                                       r"inside a task \(pl.at / pl.spmd\)"):
        _kernel(lambda x, y: y.__setitem__((slice(0, 16), slice(None)), x[0:16, :]), False)(
            torch.randn(64, 128), torch.zeros(64, 128))


def test_gm_tensors_keep_identity_equality_and_length():
    seen = {}

    def body(x, y):
        seen["eq"] = (x == x, x == y, x in [y, x], len(x))

    _kernel(body, False)(torch.randn(64, 128), torch.zeros(64, 128))
    assert seen["eq"] == (True, False, True, 64)
