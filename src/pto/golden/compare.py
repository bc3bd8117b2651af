"""Compare functions of the golden harness (pypto-lib `golden/`).

Each compare function is called as ``cmp(actual, expected, **context)`` and
returns ``(ok, detail)``; its ``__name__`` is a descriptive label. Arithmetic
is in FP32 (FP64 for the statistics) on the CPU.
"""

from __future__ import annotations

import math

import torch

from pto.errors import ConfigError

__all__ = ["allclose", "ratio_allclose", "ratio_reldiff", "exact", "valid_ratio_reldiff", "error_stats",
           "default_compare", "margin_of"]


def _named(fn, label, margin=None):
    fn.__name__ = label
    fn.__qualname__ = label
    if margin is not None:
        fn.margin = margin
    return fn


def _margin(metric: str, error: float, tolerance: float) -> dict:
    """``{"metric", "error", "tolerance", "margin"}``: margin = error / tolerance (<= 1 passes;
    0 / 0 is 0, anything else over 0 is inf)."""
    m = error / tolerance if tolerance > 0 else (0.0 if error == 0 else math.inf)
    return {"metric": metric, "error": error, "tolerance": tolerance, "margin": m}


def margin_of(cmp, actual: torch.Tensor, expected: torch.Tensor, **context) -> dict | None:
    """How close an output is to failing, as its compare function defines it: a dict with
    ``metric`` (what error and tolerance measure), ``error``, ``tolerance`` and ``margin``
    (error / tolerance: at most 1 passes; for the ratio compares the count limit is rounded,
    so a margin a little above 1 can still pass), or None for a compare function without a
    ``margin`` attribute (a user's own). ``context`` as for the compare call
    (``rtol_run``, ``atol_run``)."""
    fn = getattr(cmp, "margin", None)
    if fn is None or actual.shape != expected.shape:
        return None
    return fn(actual, expected, **context)


def _elementwise_margin(actual, expected, atol: float, rtol: float) -> dict:
    """The element with the largest ``|a-e| / (atol + rtol*|e|)``: its error, its tolerance
    and their ratio (inf for NaN/Inf in ``actual``)."""
    metric = "max |a-e| / (atol + rtol*|e|)"
    a = actual.to(torch.float64).reshape(-1)
    e = expected.to(torch.float64).reshape(-1)
    if a.numel() == 0:
        return _margin(metric, 0.0, float(atol))
    if not bool(torch.isfinite(a).all()):
        return _margin(metric, math.inf, float(atol))
    d, tol = (a - e).abs(), atol + rtol * e.abs()
    i = int(torch.argmax(d / tol.clamp_min(1e-300)))
    return _margin(metric, float(d[i]), float(tol[i]))


def _outside_fraction(actual, expected, at, rt) -> float:
    a, e, illegal = _flat_fp32(actual, expected)
    if illegal:
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float(((a - e).abs() > at + rt * e.abs()).sum()) / a.numel()


def error_stats(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    """max/mean absolute error, max relative error (|a-e| / max(|e|, 1e-6)) and
    NaN/Inf counts of ``actual``, as Python floats/ints. Errors are over the
    elements whose difference is finite; a NaN/Inf where a finite value was
    expected makes max/mean absolute error infinite."""
    a = actual.detach().to(torch.float64).reshape(-1)
    e = expected.detach().to(torch.float64).reshape(-1)
    if a.numel() == 0:
        return {"max_abs": 0.0, "mean_abs": 0.0, "max_rel": 0.0, "nan": 0, "inf": 0, "numel": 0}
    d = (a - e).abs()
    finite = torch.isfinite(d)
    dd = d[finite]
    rel = dd / e[finite].abs().clamp_min(1e-6)
    # NaN/Inf produced where a finite value was expected is an infinite error;
    # a non-finite expected element (with any actual) is left out
    produced_bad = bool(((~finite) & torch.isfinite(e)).any())
    return {
        "max_abs": math.inf if produced_bad else (float(dd.max()) if dd.numel() else 0.0),
        "mean_abs": math.inf if produced_bad else (float(dd.mean()) if dd.numel() else 0.0),
        "max_rel": float(rel.max()) if rel.numel() else math.inf,
        "nan": int(torch.isnan(a).sum()),
        "inf": int(torch.isinf(a).sum()),
        "numel": a.numel(),
    }


def _first_bad(bad: torch.Tensor, a, e, shape, max_show: int) -> str:
    idx = bad.nonzero().reshape(-1)[:max_show].tolist()
    parts = []
    for i in idx:
        coord = list(torch.unravel_index(torch.tensor(i), shape)) if len(shape) else []
        parts.append(f"{[int(c) for c in coord]} actual={float(a[i]):.6g} expected={float(e[i]):.6g}")
    return "; ".join(parts)


def _flat_fp32(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``actual`` and ``expected`` flattened to FP32, and the failure detail for NaN/Inf in
    ``actual`` (``""`` when it has none)."""
    a = actual.to(torch.float32).reshape(-1)
    e = expected.to(torch.float32).reshape(-1)
    n_nan, n_inf = int(torch.isnan(a).sum()), int(torch.isinf(a).sum())
    return a, e, (f"illegal values in actual: NaN={n_nan} Inf={n_inf}" if n_nan or n_inf else "")


def allclose(atol: float = 1e-5, rtol: float = 1e-5):
    """``|a - e| <= atol + rtol * |e|`` everywhere (dtype-native, NaN never equal)."""
    def cmp(actual, expected, **_):
        if actual.dtype != expected.dtype:  # a golden that rebinds its output in another dtype
            actual, expected = actual.to(torch.float64), expected.to(torch.float64)
        ok = torch.allclose(actual, expected, rtol=rtol, atol=atol)
        if ok:
            return True, ""
        a = actual.to(torch.float64).reshape(-1)
        e = expected.to(torch.float64).reshape(-1)
        bad = ~((a - e).abs() <= atol + rtol * e.abs())
        both = int((torch.isnan(a) & torch.isnan(e)).sum())
        note = (f" ({both} of them NaN in the golden too: NaN never matches, so the inputs may be outside the "
                "op's domain)" if both else "")
        return False, (f"Mismatched elements: {int(bad.sum())}/{a.numel()} (atol={atol}, rtol={rtol}){note}; first: "
                       f"{_first_bad(bad, a, e, tuple(actual.shape), 20)}")
    def margin(actual, expected, **_):
        return _elementwise_margin(actual, expected, atol, rtol)
    return _named(cmp, f"allclose(atol={atol}, rtol={rtol})", margin)


def ratio_allclose(atol: float | None = None, rtol: float | None = None, max_error_ratio: float = 0.005,
                   max_show: int = 10):
    """Pass when at most ``round(max_error_ratio * numel)`` elements have
    ``|a - e| > atol + rtol * |e|``; fails at once on NaN/Inf in ``actual``.
    ``atol``/``rtol`` None fall back to the run's tolerances.

    Raises:
        ConfigError: ``max_error_ratio`` outside [0, 1].
    """
    if not 0.0 <= max_error_ratio <= 1.0:
        raise ConfigError(f"ratio_allclose: max_error_ratio must be in [0, 1], got {max_error_ratio}")

    def cmp(actual, expected, rtol_run=1e-5, atol_run=1e-5, **_):
        at = atol if atol is not None else atol_run
        rt = rtol if rtol is not None else rtol_run
        a, e, illegal = _flat_fp32(actual, expected)
        if illegal:
            return False, illegal
        diff = (a - e).abs()
        bad = diff > at + rt * e.abs()
        nbad = int(bad.sum())
        limit = round(max_error_ratio * a.numel())
        if nbad <= limit:
            return True, ""
        i = int(torch.argmax(torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)))
        return False, (f"{nbad}/{a.numel()} elements outside tolerance (ratio {nbad / a.numel():.4g} > "
                       f"{max_error_ratio}, threshold {limit}); atol={at} rtol={rt}; max abs diff "
                       f"{float(diff[i]):.6g} at flat {i}; first: {_first_bad(bad, a, e, tuple(actual.shape), max_show)}")
    def margin(actual, expected, rtol_run=1e-5, atol_run=1e-5, **_):
        at = atol if atol is not None else atol_run
        rt = rtol if rtol is not None else rtol_run
        if max_error_ratio == 0:  # no element may be outside: the allclose margin says how close one is
            return _elementwise_margin(actual, expected, at, rt)
        return _margin("fraction outside atol + rtol*|e| / max_error_ratio",
                       _outside_fraction(actual, expected, at, rt), max_error_ratio)
    return _named(cmp, f"ratio_allclose(atol={atol}, rtol={rtol}, max_error_ratio={max_error_ratio})", margin)


def ratio_reldiff(diff_thd: float = 0.01, pct_thd: float = 0.05, max_diff_hd: float = math.inf, max_show: int = 10):
    """Relative-difference check: ``rdiff = |a-e|`` where below ``diff_thd``,
    else ``|a-e| / (max(|a|, |e|, 2^-14/diff_thd) + 1e-9)``; pass when at most
    ``round(pct_thd * numel)`` elements exceed ``diff_thd`` and the worst of
    them is below ``max_diff_hd``. NaN/Inf in ``actual`` fail.

    Raises:
        ConfigError: a non-positive threshold or ``pct_thd`` outside [0, 1].
    """
    if diff_thd <= 0 or not 0 <= pct_thd <= 1 or max_diff_hd <= 0:
        raise ConfigError(f"ratio_reldiff: bad thresholds diff_thd={diff_thd} pct_thd={pct_thd} "
                          f"max_diff_hd={max_diff_hd}")

    def cmp(actual, expected, **_):
        a, e, illegal = _flat_fp32(actual, expected)
        if illegal:
            return False, illegal
        ad = (a - e).abs()
        b = torch.maximum(torch.maximum(a.abs(), e.abs()), torch.tensor(2.0 ** -14 / diff_thd)) + 1e-9
        rd = torch.where(ad < diff_thd, ad, ad / b)
        bad = rd > diff_thd
        nbad = int(bad.sum())
        worst = float(rd[bad].max()) if nbad else 0.0
        limit = round(pct_thd * a.numel())
        if nbad <= limit and worst < max_diff_hd:
            return True, ""
        why = []
        if nbad > limit:
            why.append(f"{nbad}/{a.numel()} elements with rdiff > {diff_thd} (limit {limit})")
        if worst >= max_diff_hd:
            why.append(f"worst rdiff {worst:.6g} >= {max_diff_hd}")
        return False, "; ".join(why) + f"; first: {_first_bad(bad, a, e, tuple(actual.shape), max_show)}"
    def margin(actual, expected, **_):
        a, e, illegal = _flat_fp32(actual, expected)
        if illegal or a.numel() == 0:
            return _margin(f"fraction with rdiff > {diff_thd} / pct_thd", math.inf if illegal else 0.0, pct_thd)
        ad = (a - e).abs()
        b = torch.maximum(torch.maximum(a.abs(), e.abs()), torch.tensor(2.0 ** -14 / diff_thd)) + 1e-9
        rd = torch.where(ad < diff_thd, ad, ad / b)
        return _margin(f"fraction with rdiff > {diff_thd} / pct_thd", float((rd > diff_thd).sum()) / a.numel(),
                       pct_thd)
    return _named(cmp, f"ratio_reldiff(diff_thd={diff_thd}, pct_thd={pct_thd}, max_diff_hd={max_diff_hd})", margin)


def exact():
    """Bit-exact equality (integer outputs, INT8 codes, index lists)."""
    def cmp(actual, expected, **_):
        if actual.shape != expected.shape:
            return False, f"shape {list(actual.shape)} != {list(expected.shape)}"
        if torch.equal(actual, expected):
            return True, ""
        bad = (actual != expected).reshape(-1)  # values compared across dtypes (torch promotion)
        if actual.dtype != expected.dtype and not bool(bad.any()):
            return True, ""
        return False, (f"{int(bad.sum())}/{bad.numel()} elements differ; first: "
                       f"{_first_bad(bad, actual.reshape(-1), expected.reshape(-1), tuple(actual.shape), 10)}")
    def margin(actual, expected, **_):
        bad = int((actual != expected).sum()) if actual.numel() else 0
        return _margin("fraction of differing elements / 0", bad / max(actual.numel(), 1), 0.0)
    return _named(cmp, "exact", margin)


def valid_ratio_reldiff(num_tokens: int, diff_thd: float, pct_thd: float, max_diff_hd: float = math.inf):
    """Rows ``>= num_tokens`` (dim 0) must be exactly zero; the first
    ``num_tokens`` rows then pass :func:`ratio_reldiff`."""
    inner = ratio_reldiff(diff_thd, pct_thd, max_diff_hd)

    def cmp(actual, expected, **kw):
        tail = actual[num_tokens:]
        nz = int((tail != 0).sum())
        if nz:
            return False, f"{nz} non-zero elements in rows >= num_tokens={num_tokens}"
        return inner(actual[:num_tokens], expected[:num_tokens], **kw)
    def margin(actual, expected, **kw):
        if int((actual[num_tokens:] != 0).sum()):
            return _margin(f"fraction with rdiff > {diff_thd} / pct_thd (rows < num_tokens)", math.inf, pct_thd)
        return inner.margin(actual[:num_tokens], expected[:num_tokens], **kw)
    return _named(cmp, f"valid_ratio_reldiff(num_tokens={num_tokens}, diff_thd={diff_thd}, pct_thd={pct_thd}, "
                       f"max_diff_hd={max_diff_hd})", margin)


def default_compare(dtype: torch.dtype, rtol: float, atol: float):
    """Exact compare for integer and bool outputs, allclose otherwise."""
    if not dtype.is_floating_point:
        return exact()
    return allclose(atol=atol, rtol=rtol)
