"""Regression: two ``pl.dynamic("N")`` annotations (two objects of one name) did not tie, so a
call binding them to different extents (x [6, 8], y [4, 8]) bound silently and
``Program.dyn_dims`` reported ``{"N": 4}``; ``pto run --dim N=..`` and ``dyn_dims`` already name
the dims. Binding now ties them by name: a BindError naming both parameters, entry calls (both
binding paths: first call and a call after a cached one) and inline calls inside a program."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError


@pl.jit
def scale(x: pl.Tensor[[pl.dynamic("N"), 8], pl.FP32], y: pl.Out[pl.Tensor[[pl.dynamic("N"), 8], pl.FP32]]):
    for _ in pl.spmd(1, name_hint="scale"):
        y[0:4, 0:8] = x[0:4, 0:8] * 2.0


@pl.jit.inline
def inner(x: pl.Tensor[[pl.dynamic("N"), 8], pl.FP32], y: pl.Out[pl.Tensor[[pl.dynamic("N"), 8], pl.FP32]]):
    for _ in pl.spmd(1, name_hint="inner"):
        y[0:4, 0:8] = x[0:4, 0:8] * 2.0


@pl.jit
def outer(x: pl.Tensor[[6, 8], pl.FP32], x4: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    inner(x4, y)  # binds (the fast path remembers these shapes)
    inner(x, y)


def test_entry_call_ties_same_named_dynamic_dims():
    y = torch.zeros(4, 8)
    with pytest.raises(BindError, match=r"parameter 'y': dynamic dim N \(dim 0\) is 4, but parameter 'x' bound it to 6"):
        scale(torch.ones(6, 8), y)
    assert torch.equal(y, torch.zeros(4, 8))
    prog = scale.run(torch.ones(4, 8), y)  # agreeing extents bind, then a cached-shape call still checks
    assert prog.dyn_dims == {"N": 4} and torch.equal(y, torch.full((4, 8), 2.0))
    with pytest.raises(BindError, match=r"dynamic dim N"):
        scale(torch.ones(6, 8), torch.zeros(4, 8))


def test_inline_call_ties_same_named_dynamic_dims():
    with pytest.raises(BindError, match=r"kernel inner: parameter 'y': dynamic dim N \(dim 0\) is 4, but parameter 'x' bound it to 6"):
        outer(torch.ones(6, 8), torch.ones(4, 8), torch.zeros(4, 8))
