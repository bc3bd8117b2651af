"""Margins of the compare functions (compare.margin_of): error / tolerance as each compare
function defines it, on hand-computed cases, and the margin the harness reports per output."""

import math

import pytest
import torch

from pto.golden import TensorSpec, run_jit
from pto.golden.compare import allclose, exact, margin_of, ratio_allclose, ratio_reldiff, valid_ratio_reldiff


def test_allclose_margin_is_the_worst_error_over_its_tolerance():
    e = torch.tensor([1.0, 10.0, 0.0], dtype=torch.float64)
    a = torch.tensor([1.001, 10.0, 0.0005], dtype=torch.float64)
    m = margin_of(allclose(atol=1e-3, rtol=1e-3), a, e)
    # element 0: 0.001 / (1e-3 + 1e-3) = 0.5; element 2: 0.0005 / 1e-3 = 0.5; element 1: 0
    assert m["margin"] == pytest.approx(0.5, rel=1e-5)
    assert m["error"] / m["tolerance"] == pytest.approx(m["margin"])
    assert margin_of(allclose(atol=1e-3, rtol=0.0), torch.tensor([0.003]), torch.tensor([0.0]))["margin"] == \
        pytest.approx(3.0)


def test_ratio_allclose_margin_is_the_fraction_outside_over_the_allowed_fraction():
    e = torch.zeros(1000)
    a = e.clone()
    a[:3] = 1.0  # 3 of 1000 outside atol=0.1
    m = margin_of(ratio_allclose(atol=0.1, rtol=0.0, max_error_ratio=0.005), a, e)
    assert (m["error"], m["tolerance"]) == (0.003, 0.005)
    assert m["margin"] == pytest.approx(0.6)
    # the run's tolerances fill in atol / rtol None
    m = margin_of(ratio_allclose(max_error_ratio=0.01), a, e, atol_run=2.0, rtol_run=0.0)
    assert m["margin"] == 0.0
    m = margin_of(ratio_allclose(atol=0.5, rtol=0.0, max_error_ratio=0.0), a, e)  # no element may be outside
    assert (m["metric"], m["error"], m["tolerance"], m["margin"]) == ("max |a-e| / (atol + rtol*|e|)", 1.0, 0.5, 2.0)
    a[0] = math.nan
    assert margin_of(ratio_allclose(atol=0.1, rtol=0.0), a, e)["margin"] == math.inf


def test_ratio_reldiff_exact_and_valid_rows():
    e = torch.ones(100)
    a = e.clone()
    a[:2] = 2.0  # rdiff 0.5 > 0.01 on 2 elements
    assert margin_of(ratio_reldiff(0.01, 0.05), a, e)["margin"] == pytest.approx(0.02 / 0.05)
    assert margin_of(exact(), torch.tensor([1, 2]), torch.tensor([1, 2]))["margin"] == 0.0
    assert margin_of(exact(), torch.tensor([1, 3]), torch.tensor([1, 2]))["margin"] == math.inf
    v = valid_ratio_reldiff(2, 0.01, 0.5)
    x = torch.tensor([[1.0], [2.0], [0.0]])
    assert margin_of(v, x, x)["margin"] == 0.0
    assert margin_of(v, torch.tensor([[1.0], [2.0], [1.0]]), x)["margin"] == math.inf
    assert margin_of(lambda a, e, **_: (True, ""), x, x) is None  # a compare function without a margin


def test_run_jit_reports_the_margin_per_output():
    import pto.language as pl

    @pl.jit
    def add1(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(name_hint="add1"):
            y[:, :] = x[:, :] + 1.0
        return y

    def golden(v):
        v["y"] = v["x"] + 1.0

    res = run_jit(add1, [TensorSpec("x", [4, 8], torch.float32), TensorSpec("y", [4, 8], torch.float32,
                                                                            is_output=True)],
                  golden, compare_fn={"y": ratio_allclose(atol=1e-5, rtol=1e-5)})
    assert res.passed
    assert res.outputs["y"].margin == {"metric": "fraction outside atol + rtol*|e| / max_error_ratio",
                                       "error": 0.0, "tolerance": 0.005, "margin": 0.0}
