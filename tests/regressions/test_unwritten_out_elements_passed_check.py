"""Regression: elements of a ``pl.Out`` the kernel never wrote passed check mode.

A kernel that stored rows 0..32 of a 40-row ``pl.Out`` passed check mode, and
``run_jit`` passed it when the golden expected zeros there (outputs start at zero).
Now every unwritten element of a ``pl.Out`` is an UndefinedOutputError naming the
output and the box; a kernel that leaves part of an output alone on purpose
declares it ``pl.PartialOut[...]`` (not poisoned, unwritten elements keep the
caller's values).
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import UndefinedOutputError
from pto.golden import TensorSpec, run_jit

CHECK = pto.RunConfig(check=True)


@pl.jit
def copy_32_rows(x: pl.Tensor[[40, 16], pl.FP32], y: pl.Out[pl.Tensor[[40, 16], pl.FP32]]):
    for b in pl.spmd(2, name_hint="copy"):
        y[b * 16:(b + 1) * 16, :] = x[b * 16:(b + 1) * 16, :]


@pl.jit
def copy_32_rows_partial(x: pl.Tensor[[40, 16], pl.FP32], y: pl.PartialOut[pl.Tensor[[40, 16], pl.FP32]]):
    for b in pl.spmd(2, name_hint="copy"):
        y[b * 16:(b + 1) * 16, :] = x[b * 16:(b + 1) * 16, :]


def _golden_zero_tail(v):
    v["y"][:32] = v["x"][:32]  # rows 32..40 stay the zeros the output starts with


def test_unwritten_rows_of_out_are_an_error_naming_output_and_box():
    y = torch.full((40, 16), 7.0)
    with pytest.raises(UndefinedOutputError, match=r"output 'y' \[40, 16\] has 128 element\(s\) the program never "
                                                   r"wrote, in box \[32:40, 0:16\]"):
        copy_32_rows.run(torch.randn(40, 16), y, config=CHECK)
    assert bool((y == 7.0).all())  # nothing written back on failure
    specs = [TensorSpec("x", [40, 16], torch.float32), TensorSpec("y", [40, 16], torch.float32, is_output=True)]
    with pytest.raises(UndefinedOutputError, match="never wrote"):
        run_jit(copy_32_rows, specs, _golden_zero_tail)


def test_partial_out_keeps_caller_values_and_passes():
    x = torch.randn(40, 16)
    for cfg in (CHECK, pto.RunConfig()):
        y = torch.full((40, 16), 7.0)
        copy_32_rows_partial.run(x, y, config=cfg)
        assert torch.equal(y[:32], x[:32]) and bool((y[32:] == 7.0).all())
    specs = [TensorSpec("x", [40, 16], torch.float32), TensorSpec("y", [40, 16], torch.float32, is_output=True)]
    assert run_jit(copy_32_rows_partial, specs, _golden_zero_tail).passed
    assert repr(copy_32_rows_partial.signature()[1]["y"]) == "pl.PartialOut[pl.Tensor[[40, 16], pl.FP32]]"


def test_partial_out_still_reports_undefined_written_elements():
    @pl.jit
    def k(y: pl.PartialOut[pl.Tensor[[8, 16], pl.FP32]]):
        junk = pl.create_tensor([8, 16], pl.FP32)
        with pl.at(name_hint="w"):
            y[0:2, :] = junk[0:2, :]

    with pytest.raises(UndefinedOutputError, match=r"output 'y' \[8, 16\] has 32 undefined written element\(s\) "
                                                   r"in box \[0:2, 0:16\](.|\n)*allocation 'junk'"):
        k.run(torch.zeros(8, 16), config=CHECK)
