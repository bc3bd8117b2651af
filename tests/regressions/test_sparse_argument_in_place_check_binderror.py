"""A sparse tensor passed for a tensor parameter of a plain run is a BindError (it must be a
contiguous strided tensor), as before Out/InOut arguments were written in place: the in-place
check (Program._writes_in_place) read ``data_ptr()`` of every tensor argument first, which a
sparse tensor does not have, so the call raised a bare RuntimeError instead."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError


@pl.jit
def _add_one(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    for i in pl.spmd(4, name_hint="cp"):
        y[i:i + 1, 0:8] = x[i:i + 1, 0:8] + 1.0


def test_sparse_out_argument_is_a_binderror():
    x = torch.randn(4, 8)
    with pytest.raises(BindError, match="'y'"):
        _add_one(x, torch.zeros(4, 8).to_sparse())


def test_sparse_in_argument_is_a_binderror_and_the_out_is_untouched():
    y = torch.full((4, 8), 3.0)
    with pytest.raises(BindError, match="'x'"):
        _add_one(torch.randn(4, 8).to_sparse(), y)
    assert torch.equal(y, torch.full((4, 8), 3.0))
