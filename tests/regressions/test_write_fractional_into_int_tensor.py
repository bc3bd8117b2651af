"""``pl.write(int_tensor, idx, 2.7)`` stored 2 without a word."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def test_fractional_write_into_integer_tensor_is_rejected():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[2], pl.INT32]]):
        with pl.at(name_hint="w"):
            pl.write(y, [0], 2.7)

    y = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(DslError, match="fractional value 2.7"):
        k.run(y)
    assert (y == 0).all()
