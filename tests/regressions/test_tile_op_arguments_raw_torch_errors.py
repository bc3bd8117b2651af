"""Regression: bad arguments of pl.full / pl.arange gave raw torch or Python errors, and a
``pl.dynamic`` dim given to pl.create_tensor did not say what to use instead.

``pl.full([-1, 4], ...)`` raised torch's RuntimeError, ``pl.full(..., "x")`` torch's
TypeError, ``pl.arange(0, [], ...)`` an IndexError and ``pl.arange(0, [1, -3], ...)`` a
RuntimeError; ``pl.create_tensor([T, 4], ...)`` with ``T = pl.dynamic("T")`` said only
that a dim must be an int. Now each is a DslError naming the op and the bad argument,
and the dynamic dim points to ``pl.tensor.dim``.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError

T = pl.dynamic("T")

BAD = [
    ("full_negative_dim", lambda x: pl.full([-1, 4], pl.FP32, 0.0), r"pl.full: negative dim in shape \[-1, 4\]"),
    ("full_string_value", lambda x: pl.full([2, 4], pl.FP32, "x"), r"pl.full: value must be a number, got str 'x'"),
    ("full_tile_value", lambda x: pl.full([2, 4], pl.FP32, x), r"pl.full: value must be a number, got a tile"),
    ("full_int_shape", lambda x: pl.full(4, pl.FP32, 1.0), r"pl.full: shape must be a list of dims, got int 4"),
    ("arange_no_dims", lambda x: pl.arange(0, [], pl.INT32), r"pl.arange: shape must have at least one dim"),
    ("arange_negative", lambda x: pl.arange(0, [1, -3], pl.INT32), r"pl.arange: negative dim in shape \[1, -3\]"),
    ("arange_int_shape", lambda x: pl.arange(0, 8, pl.INT32), r"pl.arange: shape must be a list of dims, got int 8"),
]


@pytest.mark.parametrize("name,op,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_tile_op_arguments_are_dsl_errors(name, op, msg):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.FP32]):
        with pl.at(name_hint="t"):
            op(x[0:2, :])

    with pytest.raises(DslError, match=r"^kernel k, task 't' \(#0\) block 0, at .*: " + msg):
        k(torch.zeros(2, 4))


def test_good_arguments_still_work():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 8], pl.INT32]], z: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        with pl.at(name_hint="t"):
            y[0:1, :] = pl.arange(3, [1, 8], pl.INT32)
            z[0:2, :] = pl.full((2, 4), pl.FP32, True)

    y, z = torch.zeros(1, 8, dtype=torch.int32), torch.zeros(2, 4)
    k(y, z)
    assert y.tolist() == [list(range(3, 11))] and bool((z == 1.0).all())


def test_dynamic_dim_in_create_tensor_points_to_tensor_dim():
    @pl.jit
    def k(x: pl.Tensor[[T, 4], pl.FP32]):
        pl.create_tensor([T, 4], pl.FP32)

    with pytest.raises(DslError, match=r"a tensor dim is the symbolic dim pl.dynamic\('T'\) at .*; use its runtime "
                                       r"extent: pl.tensor.dim\(x, axis\)"):
        k(torch.zeros(3, 4))
