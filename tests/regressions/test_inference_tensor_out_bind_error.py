"""Regression: an inference tensor (made under ``torch.inference_mode()``) passed as an Out
argument by a call outside inference mode failed with torch's bare RuntimeError ("Inplace update
to inference tensor outside InferenceMode") from the first store; it is now a BindError naming
the parameter, raised before anything runs. Under inference mode the same call works."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError
from pto.runtime import set_program_cache


@pl.jit
def add_one(x: pl.Tensor[[4, 16], pl.FP32], y: pl.Out[pl.Tensor[[4, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        y[0:4, 0:16] = x[0:4, 0:16] + 1.0
    return y


@pytest.mark.parametrize("cache", [False, True])
def test_inference_out_outside_inference_mode_is_a_bind_error(cache):
    set_program_cache(cache)
    try:
        x = torch.randn(4, 16)
        add_one(x, torch.zeros(4, 16))  # a first good call (the fast binding remembers its shapes)
        with torch.inference_mode():
            y = torch.zeros(4, 16)
        with pytest.raises(BindError, match=r"parameter 'y' .*inference tensor"):
            add_one(x, y)
        assert torch.equal(y, torch.zeros(4, 16))
        with torch.inference_mode():
            add_one(x, y)
        assert torch.equal(y, x + 1.0)
    finally:
        set_program_cache(True)
