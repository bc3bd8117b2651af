"""Calls of a ``@pl.jit.inline`` kernel inside a program bind by a fast path (jit._bind_gm_fast)
when every argument is positional: the same values as the general binding, and the shapes of the
latest call that bound there skip the dims check; anything off (another shape, dtype, a
pl.dynamic disagreement, a bad scalar, a keyword, a default) goes through the general path and
raises its BindError."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError
import importlib

_jit = importlib.import_module("pto.language.jit")

N = pl.dynamic("N")


@pl.jit.inline
def _row_add(a: pl.Tensor[[N, 16], pl.FP32], b: pl.Tensor[[N, 16], pl.FP32], c: pl.Out[pl.Tensor[[N, 16], pl.FP32]],
             k: pl.Scalar[pl.FP32], scale: pl.Scalar[pl.FP32] = 1.0):
    for i in pl.spmd(pl.tensor.dim(a, 0), name_hint="row"):
        c[i:i + 1, 0:16] = (a[i:i + 1, 0:16] + b[i:i + 1, 0:16]) * (k * scale)
    return c


@pl.jit
def _twice(a: pl.Tensor[[8, 16], pl.FP32], b: pl.Tensor[[8, 16], pl.FP32], c: pl.Out[pl.Tensor[[8, 16], pl.FP32]],
           mode: pl.Scalar[pl.INT32]):
    _row_add(a, b, c, 2)  # an int for an FP32 scalar: bound as 2.0
    _row_add(a[0:4, 0:16], b[0:4, 0:16], c[4:8, 0:16], 3.0)  # another shape: checked in full
    if mode == 1:
        _row_add(a, b[0:4, 0:16], c, 1.0)  # N disagrees
    elif mode == 2:
        _row_add(a, b, c, "x")  # a bad scalar
    elif mode == 3:
        _row_add(a, b, c, 1.0, scale=2.0)  # a keyword: the general path
    elif mode == 4:
        _row_add(a, b, c, 1.0, 0.5)  # every argument positional
    elif mode == 5:
        _row_add(a, b, torch.zeros(8, 16), 1.0)  # not a GM tensor
    return c


def _ref(a, b, mode):
    c = (a + b) * 2.0
    c[4:8] = (a[0:4] + b[0:4]) * 3.0
    if mode == 3:
        c = (a + b) * 2.0
    if mode == 4:
        c = (a + b) * 0.5
    return c


@pytest.mark.parametrize("mode", [0, 3, 4, 0])
def test_nested_calls_bind_as_the_general_path(mode):
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    c = torch.zeros(8, 16)
    _twice(a, b, c, mode)
    assert torch.equal(c, _ref(a, b, mode))
    assert _row_add._gseen[0] is not None


@pytest.mark.parametrize("mode, match", [(1, "dynamic dim N"), (2, "expects a number"), (5, "expects a GM tensor")])
def test_nested_binding_errors_are_those_of_the_general_path(mode, match):
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    _twice(a, b, torch.zeros(8, 16), 0)  # the fast path has seen these shapes
    with pytest.raises(BindError, match=match):
        _twice(a, b, torch.zeros(8, 16), mode)


def test_fast_values_equal_the_general_binding():
    got = []

    @pl.jit
    def probe(a: pl.Tensor[[8, 16], pl.FP32], b: pl.Tensor[[8, 16], pl.FP32], c: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
        for args in [(a, b, c, 2), (a, b, c, 2), (a[0:4, 0:16], b[0:4, 0:16], c[0:4, 0:16], 1.5, 3)]:
            got.append((_jit._bind_gm_fast(_row_add, args),
                        [p.value for p in _jit.bind_arguments(_row_add, args, {}, gm=True)]))
        return c

    probe(torch.randn(8, 16), torch.randn(8, 16), torch.zeros(8, 16))
    assert len(got) == 3
    for fast, general in got:
        assert len(fast) == len(general) == 5
        assert all(f is g if hasattr(g, "buf") else (f == g and type(f) is type(g)) for f, g in zip(fast, general))
    assert got[0][0][3:] == [2.0, 1.0] and got[2][0][3:] == [1.5, 3.0]
