"""Compare functions: exact formulas and thresholds (pypto-lib `golden/`; golden/compare.py)."""

import math

import pytest
import torch

from pto.errors import ConfigError
from pto.golden import allclose, default_compare, error_stats, exact, ratio_allclose, ratio_reldiff
from pto.golden import valid_ratio_reldiff


def with_bad(n_bad: int, numel: int = 10, delta: float = 1.0):
    e = torch.zeros(numel)
    a = e.clone()
    a[:n_bad] = delta
    return a, e


# ---- ratio_allclose ------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio, n_bad, ok", [
    (0.25, 2, True), (0.25, 3, False),   # round(2.5) == 2 (half to even)
    (0.35, 4, True), (0.35, 5, False),   # round(3.5) == 4
    (0.0, 0, True), (0.0, 1, False), (1.0, 10, True),
])
def test_ratio_allclose_threshold_is_round_half_even(ratio, n_bad, ok):
    a, e = with_bad(n_bad)
    got, detail = ratio_allclose(atol=0.5, rtol=0.0, max_error_ratio=ratio)(a, e)
    assert got is ok
    if not ok:
        assert f"{n_bad}/10 elements outside tolerance" in detail and f"threshold {round(ratio * 10)}" in detail


def test_ratio_allclose_boundary_is_inclusive():
    e = torch.tensor([2.0, -4.0])
    a = e + torch.tensor([0.5 + 0.25 * 2.0, -(0.5 + 0.25 * 4.0)])  # exactly atol + rtol * |e|
    assert ratio_allclose(atol=0.5, rtol=0.25, max_error_ratio=0.0)(a, e)[0]
    a2 = a + torch.tensor([1e-5, 0.0])
    assert not ratio_allclose(atol=0.5, rtol=0.25, max_error_ratio=0.0)(a2, e)[0]


def test_ratio_allclose_nan_or_inf_in_actual_fails_even_when_the_ratio_allows():
    a, e = with_bad(0)
    a[3] = float("nan")
    ok, detail = ratio_allclose(atol=1, rtol=0, max_error_ratio=1.0)(a, e)
    assert not ok and "NaN=1 Inf=0" in detail
    a[3] = float("inf")
    ok, detail = ratio_allclose(atol=1, rtol=0, max_error_ratio=1.0)(a, e)
    assert not ok and "NaN=0 Inf=1" in detail


def test_ratio_allclose_nan_in_expected_never_counts_as_bad():
    a, e = with_bad(0)
    e[0] = float("nan")
    assert ratio_allclose(atol=1e-3, rtol=0, max_error_ratio=0.0)(a, e)[0]


def test_ratio_allclose_falls_back_to_the_run_tolerances():
    a, e = with_bad(1, delta=0.1)
    cmp = ratio_allclose(max_error_ratio=0.0)
    assert cmp(a, e, rtol_run=0.0, atol_run=0.2)[0]
    assert not cmp(a, e, rtol_run=0.0, atol_run=0.05)[0]
    assert cmp.__name__ == "ratio_allclose(atol=None, rtol=None, max_error_ratio=0.0)"


def test_ratio_allclose_computes_in_fp32_and_accepts_bf16():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    a = torch.tensor([1.0078125, 2.0], dtype=torch.bfloat16)  # one BF16 ulp at 1.0
    assert ratio_allclose(atol=0, rtol=1 / 128, max_error_ratio=0)(a, e)[0]
    assert not ratio_allclose(atol=0, rtol=1 / 256, max_error_ratio=0)(a, e)[0]


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_allclose_rejects_bad_ratios(ratio):
    with pytest.raises(ConfigError, match="max_error_ratio"):
        ratio_allclose(max_error_ratio=ratio)


# ---- ratio_reldiff ----------------------------------------------------------------------------------

def test_ratio_reldiff_formula():
    diff_thd = 0.01
    floor = 2.0 ** -14 / diff_thd  # 0.0061...
    e = torch.tensor([1.0, 1.0, 0.0, 100.0, 0.001])
    a = torch.tensor([1.005,     # |d| = 0.005 < diff_thd: rdiff = |d|, fine
                      1.02,      # rdiff = 0.02 / 1.02 = 0.0196 > 0.01: bad
                      0.02,      # rdiff = 0.02 / max(0.02, 0, floor) = 1.0: bad
                      100.5,     # rdiff = 0.5 / 100.5 = 0.005: fine
                      0.0105])   # |d| = 0.0095 < diff_thd: fine
    ok, detail = ratio_reldiff(diff_thd=diff_thd, pct_thd=0.2)(a, e)  # limit round(1.0) = 1
    assert not ok and "2/5 elements with rdiff > 0.01 (limit 1)" in detail
    assert ratio_reldiff(diff_thd=diff_thd, pct_thd=0.4)(a, e)[0]       # limit 2
    # the worst bad rdiff is 0.02 / (0.02 + 1e-9) ~ 1.0: max_diff_hd must be strictly above it
    ok, detail = ratio_reldiff(diff_thd=diff_thd, pct_thd=0.4, max_diff_hd=0.99)(a, e)
    assert not ok and "worst rdiff 1 >= 0.99" in detail
    assert ratio_reldiff(diff_thd=diff_thd, pct_thd=0.4, max_diff_hd=1.01)(a, e)[0]
    assert floor < 0.0062


def test_ratio_reldiff_floor_protects_tiny_values():
    # |d| = 0.012 with both values tiny: divided by the floor 2^-14 / 0.01 = 0.0061, rdiff ~ 1.97
    a, e = torch.tensor([0.012]), torch.tensor([0.0])
    assert not ratio_reldiff(diff_thd=0.01, pct_thd=0.0)(a, e)[0]
    a, e = torch.tensor([0.0]), torch.tensor([0.0])
    assert ratio_reldiff(diff_thd=0.01, pct_thd=0.0)(a, e)[0]


def test_ratio_reldiff_threshold_half_even_and_nan():
    e = torch.zeros(10)
    a = e.clone()
    a[:2] = 1.0
    assert ratio_reldiff(diff_thd=0.01, pct_thd=0.25)(a, e)[0]          # round(2.5) = 2
    a[2] = 1.0
    assert not ratio_reldiff(diff_thd=0.01, pct_thd=0.25)(a, e)[0]
    a[:] = 0
    a[0] = float("nan")
    ok, detail = ratio_reldiff(diff_thd=0.01, pct_thd=1.0)(a, e)
    assert not ok and "NaN=1" in detail


@pytest.mark.parametrize("kw", [dict(diff_thd=0), dict(pct_thd=1.5), dict(max_diff_hd=0)])
def test_ratio_reldiff_rejects_bad_thresholds(kw):
    with pytest.raises(ConfigError):
        ratio_reldiff(**kw)


def test_valid_ratio_reldiff_requires_zero_tail_rows():
    e = torch.ones(4, 3)
    a = e.clone()
    a[2:] = 0
    assert valid_ratio_reldiff(2, 0.01, 0.0)(a, e)[0]
    a[3, 1] = 1e-3
    ok, detail = valid_ratio_reldiff(2, 0.01, 0.0)(a, e)
    assert not ok and "1 non-zero elements in rows >= num_tokens=2" in detail


# ---- exact / allclose / defaults ---------------------------------------------------------------------------

def test_exact():
    a = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    assert exact()(a, a.clone()) == (True, "")
    b = a.clone()
    b[1, 0] = 9
    ok, detail = exact()(b, a)
    assert not ok and "1/4 elements differ" in detail and "[1, 0] actual=9 expected=3" in detail
    ok, detail = exact()(a, a.reshape(4))
    assert not ok and "shape" in detail


def test_allclose_nan_is_never_equal_and_lists_mismatches():
    a = torch.tensor([1.0, float("nan"), 3.0])
    ok, detail = allclose(atol=1e-5, rtol=1e-5)(a, a.clone())
    assert not ok and "Mismatched elements: 1/3" in detail
    assert allclose(atol=0.1, rtol=0)(torch.tensor([1.05]), torch.tensor([1.0]))[0]


def test_default_compare_is_exact_for_integers():
    assert default_compare(torch.int8, 1e-3, 1e-3).__name__ == "exact"
    assert default_compare(torch.bool, 1e-3, 1e-3).__name__ == "exact"
    assert default_compare(torch.float32, 1e-3, 2e-3).__name__ == "allclose(atol=0.002, rtol=0.001)"


def test_error_stats():
    s = error_stats(torch.tensor([1.0, 2.5, 3.0]), torch.tensor([1.0, 2.0, 4.0]))
    assert s["max_abs"] == 1.0 and s["mean_abs"] == 0.5 and s["max_rel"] == 0.25 and s["numel"] == 3
    s = error_stats(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))
    assert s["nan"] == 1 and math.isinf(s["max_abs"])  # a NaN where a number was expected is an infinite error
    s = error_stats(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert s["max_abs"] == 0.0  # NaN expected and NaN produced: no error to report
