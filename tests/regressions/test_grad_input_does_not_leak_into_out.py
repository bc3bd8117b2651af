"""Regression: an In tensor with ``requires_grad=True`` pulled the Out tensor the program wrote
into autograd (afterwards ``y.requires_grad`` was True, ``grad_fn`` CopyBackwards), so a second
call with that ``y`` failed binding ("requires grad"). Entry programs now run with autograd off:
``y`` stays a plain tensor, with the same values, plain run or replay."""

import pytest
import torch

import pto.language as pl
from pto.runtime import clear_program_cache, set_program_cache


@pl.jit
def add_one(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        y[0:8, 0:16] = x[0:8, 0:16] + 1.0
    return y


@pytest.mark.parametrize("cache", [False, True])
def test_out_written_from_a_grad_input_stays_out_of_autograd(cache):
    set_program_cache(cache)
    clear_program_cache()
    try:
        x = torch.randn(8, 16, requires_grad=True)
        y = torch.zeros(8, 16)
        for _ in range(4):  # plain, recorded, replayed: the same y each time
            add_one(x, y)
            assert not y.requires_grad and y.grad_fn is None
            assert torch.equal(y, x.detach() + 1.0)
        assert torch.is_grad_enabled()  # the caller's autograd mode is back
    finally:
        set_program_cache(True)
        clear_program_cache()
