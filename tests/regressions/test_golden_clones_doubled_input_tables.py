"""Regression: ``run_jit`` gave the golden a clone of every input, so a table the kernel only
reads was held twice while the golden ran (``pto demo`` at FLASH: the 1 GiB BF16 vocab tables of
``lookup_embedding`` and ``lm_head``), and each finished row's Program, a reference cycle
holding its inputs, lived on until a full collection: 7.25 GB peak RSS in all. Inputs of
``pl.Tensor`` (In) parameters are now the kernel's own tensors (outputs are still cloned) and
``pto demo`` collects after each row: 2.72 GB, the same 51 rows, figures and errors. A golden
that writes such an input in place (which would change what the kernel reads) is a GoldenError
naming it, before the kernel runs; results are the same as with clones.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import GoldenError
from pto.golden import TensorSpec, run_jit


@pl.jit
def scale_acc(x: pl.Tensor[[16, 32], pl.FP32], acc: pl.InOut[pl.Tensor[[16, 32], pl.FP32]],
              y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    for b in pl.spmd(2, name_hint="scale_acc"):
        rows = slice(8 * b, 8 * b + 8)
        y[rows, :] = x[rows, :] * 2.0
        acc[rows, :] = acc[rows, :] + x[rows, :]


def _specs():
    return [TensorSpec("x", [16, 32], torch.float32, init_value=torch.randn),
            TensorSpec("acc", [16, 32], torch.float32, init_value=torch.randn),
            TensorSpec("y", [16, 32], torch.float32, is_output=True)]


def test_read_only_inputs_are_shared_and_outputs_cloned():
    seen = {}

    def golden(v):
        seen.update(v)
        v["y"] = v["x"] * 2.0
        v["acc"].add_(v["x"])  # an InOut: the golden's own clone, written in place

    res = run_jit(scale_acc, _specs(), golden)
    assert res.passed, res.error
    # the golden's acc is a clone: its in-place add did not reach the kernel's acc, which the
    # kernel's own add brought to the same values
    assert seen["acc"] is not res.actual["acc"]
    assert torch.equal(res.expected["acc"], res.actual["acc"])
    assert torch.equal(res.actual["y"], res.expected["y"])


def test_shared_input_is_the_kernels_tensor():
    ptrs = {}

    def golden(v):
        ptrs["x"], ptrs["acc"] = v["x"].data_ptr(), v["acc"].data_ptr()
        v["y"] = v["x"] * 2.0
        v["acc"] = v["acc"] + v["x"]

    calls = []
    real_run = scale_acc.run

    def spy(*args, **kw):
        calls.append([a.data_ptr() for a in args])
        return real_run(*args, **kw)

    scale_acc.run = spy
    try:
        assert run_jit(scale_acc, _specs(), golden).passed
    finally:
        del scale_acc.run
    assert calls[0][0] == ptrs["x"] and calls[0][1] != ptrs["acc"]


@pytest.mark.parametrize("write", [
    lambda x: x.mul_(2.0),           # in place
    lambda x: x[3].zero_(),          # through a view
    lambda x: x.copy_(x + 1.0),      # copy_
    lambda x: x.__setitem__((slice(0, 4), 0), 0.0),
])
def test_a_golden_writing_a_read_only_input_is_caught(write):
    def golden(v):
        write(v["x"])
        v["y"] = v["x"] * 2.0
        v["acc"] = v["acc"] + v["x"]

    with pytest.raises(GoldenError, match=r"wrote its read-only input\(s\) \['x'\] in place"):
        run_jit(scale_acc, _specs(), golden)


def test_results_equal_the_cloned_run():
    def golden(v):
        v["y"] = v["x"] * 2.0
        v["acc"] = v["acc"] + v["x"]

    a = run_jit(scale_acc, _specs(), golden, seed=3)
    torch.manual_seed(3)
    x, acc = torch.randn(16, 32), torch.randn(16, 32)
    assert torch.equal(a.expected["y"], x * 2.0) and torch.equal(a.expected["acc"], acc + x)
    assert torch.equal(a.actual["y"], x * 2.0) and torch.equal(a.actual["acc"], acc + x)
