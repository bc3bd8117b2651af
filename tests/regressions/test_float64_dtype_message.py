"""Binding a float64 tensor to an FP32 parameter said "dtype pl.FP32 does not
match annotation pl.FP32" (float64 was then mapped to FP32; it now has no pto dtype at all,
see test_float64_silently_treated_as_fp32.py)."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError


def test_float64_is_named_as_such():
    @pl.jit
    def k(x: pl.Tensor[[2], pl.FP32]):
        pass

    with pytest.raises(BindError, match="dtype torch.float64 does not match annotation pl.FP32"):
        k.run(torch.zeros(2, dtype=torch.float64))
