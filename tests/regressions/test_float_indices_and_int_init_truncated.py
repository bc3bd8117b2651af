"""Regression: float values were silently truncated where an int is meant (``x[0.5:16.7, :]``
acted as ``x[0:16, :]``, ``pl.create_tensor([2.5, 128])`` gave 2 rows, ``pl.spmd(2.7)`` ran 2
blocks), and ``create_tensor(..., pl.INT32, init_value=2.0)`` was accepted although integer dtypes
take int init values (breaker finding M9). Each is now an error: DslError for a float index, dim,
bound or block count (also an integral float: pto never truncates), BindError for a float
init_value on an integer dtype.
"""

import numpy as np
import pytest
import torch

import pto.language as pl
from pto.errors import BindError, DslError
from pto.golden import TensorSpec
from pto.runtime import RunConfig


def _kernel(how: str):
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
        if how == "create_dim":
            pl.create_tensor([2.5, 128], pl.FP32)
        elif how == "spmd":
            for b in pl.spmd(2.7):
                pass
        elif how == "range":
            for i in pl.range(2.0):
                pass
        elif how == "orch_view":
            x[0:2.0, :]
        with pl.at(name_hint="t"):
            if how == "slice":
                y[0:16, :] = x[0.5:16.7, :]
            elif how == "index":
                y[0, :] = x[1.0, :]
            elif how == "pl_slice":
                y[0:16, :] = pl.slice(x, [16, 128], [0.0, 0])
            elif how == "full_dim":
                pl.full([4.0, 4], pl.FP32, 0.0)
            elif how == "tile_slice":
                pl.slice(x[0:16, :], [8.0, 128], [0, 0])
            elif how == "read":
                pl.read(x, [0, 1.5])
            elif how == "inner_range":
                for i in pl.range(1.5):
                    pass
            elif how == "ok":
                n = np.int64(16)
                y[0:n, :] = x[torch.tensor(0):n, :]
        return y
    return k


@pytest.mark.parametrize("how,what,value", [
    ("create_dim", "a tensor dim", "float 2.5"), ("spmd", "an spmd block count", "float 2.7"),
    ("range", "a pl.range bound", "float 2.0"), ("orch_view", "a slice stop", "float 2.0"),
    ("slice", "a slice start", "float 0.5"), ("index", "an index", "float 1.0"),
    ("pl_slice", "a slice offset", "float 0.0"), ("full_dim", "a tile dim", "float 4.0"),
    ("tile_slice", "a slice dim", "float 8.0"), ("read", "an index", "float 1.5"),
    ("inner_range", "a pl.range bound", "float 1.5"),
])
def test_float_where_an_int_is_meant_is_a_dsl_error(how, what, value):
    with pytest.raises(DslError, match=rf"{what} must be an int, got {value} at .*test_float_indices.*never truncates"):
        _kernel(how)(torch.randn(64, 128), torch.zeros(64, 128))


def test_integer_like_values_still_work():
    x = torch.randn(64, 128)
    y = torch.zeros(64, 128)
    _kernel("ok")(x, y)
    assert torch.equal(y[0:16], x[0:16]) and not y[16:].any()


@pytest.mark.parametrize("value", [2.0, 1.5, 0.0])
def test_float_init_value_on_an_integer_dtype_is_a_bind_error(value):
    @pl.jit
    def k(x: pl.Tensor[[4], pl.FP32]):
        t = pl.create_tensor([4, 4], pl.INT32, init_value=value)

    with pytest.raises(BindError, match=rf"create_tensor 't': float init_value {value} on integer dtype pl.INT32"):
        k.run(torch.zeros(4), config=RunConfig(check=True))


def test_int_init_value_and_float_init_on_float_dtype_still_work():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[4, 4], pl.INT32]], z: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        t = pl.create_tensor([4, 4], pl.INT32, init_value=2)
        u = pl.create_tensor([4, 4], pl.FP32, init_value=2)
        with pl.at(name_hint="copy"):
            y[:, :] = t[:, :]
            z[:, :] = u[:, :]

    y, z = torch.zeros(4, 4, dtype=torch.int32), torch.zeros(4, 4)
    k(y, z)
    assert (y == 2).all() and (z == 2.0).all()


def test_tensor_spec_float_dim_is_a_bind_error():
    with pytest.raises(BindError, match=r"TensorSpec 'a': dim 0 of shape \[2.7\] must be a non-negative int"):
        TensorSpec("a", [2.7], pl.FP32)
