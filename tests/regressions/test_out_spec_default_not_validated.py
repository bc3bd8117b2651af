"""``TensorSpec`` defaulted to ``is_output=False``: a ``pl.Out`` parameter whose spec did not
say ``is_output=True`` was never compared, and a run that compared nothing at all came back
``passed=True``. Now ``is_output=None`` (the default) takes the direction from the kernel's
annotation, an explicit ``False`` stays unvalidated, and a run in which no output was
compared is ``passed=False, validated=False`` with an error saying so."""

import torch

import pto.language as pl
from pto.golden import TensorSpec, run_jit


@pl.jit
def scale2(x: pl.Tensor[[4, 8], pl.FP32], acc: pl.InOut[pl.Tensor[[4, 8], pl.FP32]],
           z: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale2"):
        z[:, :] = x[:, :] * 2.0
        acc[:, :] = acc[:, :] + x[:, :]
    return z


def specs(**flags):
    return [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
            TensorSpec("acc", [4, 8], torch.float32, init_value=1.0, is_output=flags.get("acc")),
            TensorSpec("z", [4, 8], torch.float32, is_output=flags.get("z"))]


def right(v):
    v["z"][:] = v["x"] * 2
    v["acc"][:] = v["acc"] + v["x"]


def wrong(v):
    v["z"][:] = v["x"] * 3  # the kernel computes 2x
    v["acc"][:] = v["acc"] + v["x"]


def test_out_and_inout_validated_by_default():
    res = run_jit(scale2, specs(), wrong)
    assert not res.passed and res.validated
    assert set(res.outputs) == {"acc", "z"}
    assert not res.outputs["z"].passed and res.outputs["acc"].passed
    ok = run_jit(scale2, specs(), right)
    assert ok.passed and ok.validated and set(ok.outputs) == {"acc", "z"}


def test_explicit_false_stays_unvalidated():
    res = run_jit(scale2, specs(z=False), wrong)
    assert res.passed and set(res.outputs) == {"acc"}


def test_nothing_compared_is_not_a_pass():
    res = run_jit(scale2, specs(z=False, acc=False), wrong)
    assert not res.passed and not res.validated
    assert res.error.startswith("no output was compared") and "'acc', 'z'" in res.error
    assert str(res).startswith("NOT VALIDATED")


@pl.jit
def reads_only(x: pl.Tensor[[4, 8], pl.FP32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="peek"):
        pl.read(x, [0, 0])


def test_kernel_without_outputs_is_not_a_pass():
    res = run_jit(reads_only, [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn)], lambda v: None)
    assert not res.passed and not res.validated and "no output was compared" in res.error
