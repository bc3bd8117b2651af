"""The fast entry binding remembers the tensor shapes of the latest call it bound (jit._bind_fast):
a call with the same shapes skips the dims check, and anything else is still checked: another
shape, dtype, device or a pl.dynamic disagreement raises the same BindError as before."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError

N = pl.dynamic("N")


@pl.jit
def _add(a: pl.Tensor[[N, 16], pl.FP32], b: pl.Tensor[[N, 16], pl.FP32], c: pl.Out[pl.Tensor[[N, 16], pl.FP32]],
         k: pl.Scalar[pl.INT32]):
    for i in pl.spmd(a.shape[0], name_hint="row"):
        c[i:i + 1, 0:16] = a[i:i + 1, 0:16] + b[i:i + 1, 0:16]
    return c


def test_same_shapes_bind_and_run_again():
    for rows in (4, 4, 6, 6, 4):
        a, b = torch.randn(rows, 16), torch.randn(rows, 16)
        c = torch.zeros(rows, 16)
        _add(a, b, c, 3)
        assert torch.equal(c, a + b)


def test_what_is_not_the_shape_is_still_checked():
    a, b, c = torch.randn(4, 16), torch.randn(4, 16), torch.zeros(4, 16)
    _add(a, b, c, 1)
    with pytest.raises(BindError, match="dynamic dim N"):
        _add(a, torch.randn(5, 16), torch.zeros(4, 16), 1)  # a new shape: checked in full
    _add(a, b, c, 1)
    with pytest.raises(BindError, match="dtype"):
        _add(a, b.double(), c, 1)  # same shapes, another dtype
    with pytest.raises(BindError, match="dim 1"):
        _add(a, b, torch.zeros(4, 8), 1)
    with pytest.raises(BindError, match="out of range|expects an int"):
        _add(a, b, c, 1 << 40)  # same shapes, a bad scalar
    c.requires_grad_(True)
    with pytest.raises(BindError, match="requires grad"):
        _add(a, b, c, 1)
