"""The reference golden harness (pypto-lib ``golden``) served by pto, with its calling conventions.

Reference: pypto-lib `golden/` (behaviour of ``TensorSpec``, ``ScalarSpec``, ``run``,
``run_jit``, ``validate_golden`` and the comparators). Under ``pto pypto`` a script's
``from golden import ...`` gets this module. Differences from the reference, all reported
on stdout as ``[RUN] pto: ... ignored`` lines:

* there is no compiler: ``compile_cfg``, ``compile_only``, ``runtime_dir``, the platform and
  device id, the DFX flags (``enable_l2_swimlane`` / ``enable_chip_swimlane``, ...) and
  ``TensorSpec.resident`` are accepted and ignored; the kernel runs on the CPU in check mode;
* ``compile_only=True`` still runs the kernel (there is nothing else to check);
* the benchmark loop (``PYPTO_BENCH``) is not run.

What matches: specs in parameter order passed positionally; the golden computed first from
clones of the inputs (pure outputs start as zeros, scalars as Python values); only outputs are
validated (``is_output=True``, or, when a spec does not say, as the current reference harness
stamps it from the kernel signature: a ``pl.Out`` / ``pl.InOut`` parameter; a run with a golden
and no output fails, it compared nothing), each by its ``compare_fn`` entry called as
``cmp(actual, expected, actual_outputs=, expected_outputs=, inputs=, rtol=, atol=)`` or by
``torch.allclose``; ``save_data`` writes ``<work_dir>/data/{in,out}/<name>.pt`` and
``golden_data=<dir>`` replays that layout; kernel exceptions propagate.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from pto.errors import ConfigError
from pto.golden import compare as _cmp
from pto.golden.spec import ScalarSpec as _PtoScalarSpec
from pto.golden.spec import TensorSpec as _PtoTensorSpec

__all__ = ["TensorSpec", "ScalarSpec", "RunConfig", "run", "run_jit", "RunResult", "validate_golden",
           "ratio_allclose", "ratio_reldiff", "error_distribution", "topk_pair_compare", "bf16_allclose_or_ulp"]

_RUNTIME_KEYS = {"platform", "device_id", "enable_l2_swimlane", "enable_chip_swimlane", "enable_dump_args",
                 "enable_pmu", "enable_dep_gen", "enable_scope_stats", "log_level", "ring_task_window",
                 "ring_heap", "ring_dep_pool", "backend_type", "dump_passes", "save_kernels_dir",
                 "compile_profiling", "strategy", "distributed_config"}


def _log(msg: str) -> None:
    print(f"[RUN] {msg}", flush=True)


@dataclass
class TensorSpec(_PtoTensorSpec):
    """The reference ``TensorSpec(name, shape, dtype, init_value=None, is_output=False, resident=None)``.

    ``resident``: None/False (off), a worker id (int >= 0) or ``"stacked"``; validated like the
    reference and ignored on one CPU device. Initialisation as :class:`pto.golden.TensorSpec`.

    Raises:
        ValueError: ``resident`` True, a negative int or another type (as the reference).
    """

    resident: Any = None

    def __post_init__(self):
        super().__post_init__()
        r = self.resident
        if r is True:
            raise ValueError(f"TensorSpec {self.name!r}: resident=True is ambiguous; give a worker id or 'stacked'")
        if not (r is None or r is False or r == "stacked" or (isinstance(r, int) and not isinstance(r, bool) and r >= 0)):
            raise ValueError(f"TensorSpec {self.name!r}: resident must be None, False, a worker id >= 0 or "
                             f"'stacked', got {r!r}")

    @property
    def is_resident(self) -> bool:
        """True when ``resident`` is set (not None, not False)."""
        return self.resident is not None and self.resident is not False


@dataclass
class ScalarSpec(_PtoScalarSpec):
    """The reference ``ScalarSpec(name, dtype, value)``; ``value`` becomes a 0-dim tensor of ``dtype``.

    ``compile_runtime`` / ``benchmark_step`` (signature-mode compile and benchmark stepping in
    newer harness versions) are accepted and have no effect on the CPU.

    Raises:
        pto.BindError: a value that does not fit ``dtype`` (see :class:`pto.golden.ScalarSpec`).
    """

    compile_runtime: Any = None
    benchmark_step: Any = None

    @property
    def has_benchmark_step(self) -> bool:
        """True when ``benchmark_step`` is set."""
        return self.benchmark_step is not None


class RunConfig:
    """The older harness's ``RunConfig(**options)``: every option is accepted and reported ignored."""

    def __init__(self, **options):
        self.options = options

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


class RunResult:
    """The reference result: ``passed``, ``error``, ``execution_time`` (s), ``work_dir``, ``bench``;
    ``program`` is the last pto Program run (statistics, task graph)."""

    def __init__(self, passed: bool, error: str | None = None, execution_time: float | None = None,
                 work_dir: str | None = None, bench=None, program=None):
        self.passed = passed
        self.error = error
        self.execution_time = execution_time
        self.work_dir = work_dir
        self.bench = bench
        self.program = program

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        t = f" ({self.execution_time:.2f}s)" if self.execution_time is not None else ""
        return f"PASS{t}" if self.passed else f"FAIL: {self.error}{t}"

    __repr__ = __str__


# ---- comparators (reference calling convention) ----------------------------------------------

def _named(fn, label):
    fn.__name__ = fn.__qualname__ = label
    return fn


def ratio_allclose(atol: float | None = None, rtol: float | None = None, max_error_ratio: float = 0.005,
                   max_show: int = 10, valid_rows: int | None = None):
    """At most ``round(max_error_ratio * numel)`` elements outside ``atol + rtol * |e|`` (the run's
    tolerances when None); NaN/Inf in ``actual`` fail (pypto-lib `golden/`). ``valid_rows``
    (newer harness versions): compare only the first ``valid_rows`` rows of dim 0.

    Raises:
        ValueError: ``max_error_ratio`` outside [0, 1].
    """
    try:
        inner = _cmp.ratio_allclose(atol, rtol, max_error_ratio, max_show)
    except ConfigError as e:
        raise ValueError(str(e)) from None

    def cmp(actual, expected, rtol=1e-5, atol=1e-5, **_):
        if valid_rows is not None:
            actual, expected = actual[:valid_rows], expected[:valid_rows]
        return inner(actual, expected, rtol_run=rtol, atol_run=atol)
    label = inner.__name__ if valid_rows is None else inner.__name__[:-1] + f", valid_rows={valid_rows})"
    return _named(cmp, label)


def bf16_allclose_or_ulp(max_ulp: int = 1):
    """BF16 comparator: ``torch.isclose`` at the run's tolerances, or raw BF16 encodings at most
    ``max_ulp`` apart (finite values only).

    Raises:
        ValueError: a negative ``max_ulp``.
    """
    if max_ulp < 0:
        raise ValueError(f"bf16_allclose_or_ulp: max_ulp must be non-negative, got {max_ulp}")

    def cmp(actual, expected, rtol=1e-5, atol=1e-5, **_):
        if actual.dtype != torch.bfloat16 or expected.dtype != torch.bfloat16:
            return False, f"bf16_allclose_or_ulp needs BF16 tensors, got {actual.dtype} and {expected.dtype}"
        af, ef = actual.float(), expected.float()
        ulp = (actual.contiguous().view(torch.int16).int() - expected.contiguous().view(torch.int16).int()).abs()
        ok = torch.isclose(af, ef, rtol=rtol, atol=atol) | (torch.isfinite(af) & torch.isfinite(ef) & (ulp <= max_ulp))
        if bool(ok.all()):
            return True, ""
        bad = (~ok).reshape(-1).nonzero().reshape(-1)[:20].tolist()
        return False, (f"{int((~ok).sum())}/{ok.numel()} elements beyond {max_ulp} ULP: " +
                       ", ".join(f"[{i}] actual={float(af.reshape(-1)[i]):.6g} expected={float(ef.reshape(-1)[i]):.6g}"
                                 for i in bad))
    return _named(cmp, f"bf16_allclose_or_ulp(max_ulp={max_ulp})")


def ratio_reldiff(diff_thd: float = 0.01, pct_thd: float = 0.05, max_diff_hd: float = math.inf, max_show: int = 10):
    """The reference relative-difference rule (pypto-lib `golden/`); ignores the run tolerances.

    Raises:
        ValueError: a non-positive threshold or ``pct_thd`` outside [0, 1].
    """
    try:
        inner = _cmp.ratio_reldiff(diff_thd, pct_thd, max_diff_hd, max_show)
    except ConfigError as e:
        raise ValueError(str(e)) from None

    def cmp(actual, expected, **_):
        return inner(actual, expected)
    return _named(cmp, inner.__name__)


def error_distribution(diff_thds=(1e-3, 3e-3, 5e-3, 1e-2, 3e-2, 5e-2), quantiles=(0.5, 0.9, 0.99, 0.999, 0.9999, 1.0),
                       always_pass: bool = True):
    """A measuring comparator: prints rel-L2, cosine similarity, per-threshold bad fractions and
    quantiles of the relative and absolute error (pypto-lib `golden/`). Passes unless
    ``always_pass`` is False and ``actual`` has NaN/Inf."""
    def cmp(actual, expected, **_):
        a = actual.detach().to(torch.float64).reshape(-1)
        e = expected.detach().to(torch.float64).reshape(-1)
        bad = ~torch.isfinite(a)
        if bool(bad.any()):
            print(f"[RUN]     NaN={int(torch.isnan(a).sum())} Inf={int(torch.isinf(a).sum())}")
        fin = ~bad & torch.isfinite(e)
        a, e = a[fin], e[fin]
        d = (a - e).abs()
        rel_l2 = float(d.norm() / max(float(e.norm()), 1e-12)) if a.numel() else 0.0
        cos = float(torch.nn.functional.cosine_similarity(a, e, dim=0)) if a.numel() else 1.0
        print(f"[RUN]     rel-L2={rel_l2:.3e} cosine={cos:.6f} numel={a.numel()}")
        for thd in diff_thds:
            b = torch.clamp(torch.maximum(a.abs(), e.abs()), min=2.0 ** -14 / thd) + 1e-9
            rd = torch.where(d < thd, d, d / b)
            nb = int((rd > thd).sum())
            print(f"[RUN]     diff_thd={thd:g}: bad {nb}/{a.numel()} worst rdiff "
                  f"{float(rd.max()) if rd.numel() else 0.0:.3e}")
        if a.numel():
            rel = d / torch.clamp(torch.maximum(a.abs(), e.abs()), min=1e-6)
            srt_rel, srt_abs = torch.sort(rel).values, torch.sort(d).values
            for q in quantiles:
                i = min(a.numel() - 1, int(round(q * (a.numel() - 1))))
                print(f"[RUN]     q{q:g}: rel {float(srt_rel[i]):.3e} abs {float(srt_abs[i]):.3e}")
        ok = always_pass or not bool(bad.any())
        return ok, "" if ok else "NaN/Inf in actual"
    return _named(cmp, "error_distribution")


def topk_pair_compare(vals_name: str, *, dim: int = -1, descending: bool = True, max_show: int = 10):
    """Index-output comparator paired with value output ``vals_name``: a position whose index
    differs from the golden passes iff the actual values are monotone there (a tie the
    kernel broke differently; pypto-lib `golden/`). Newer harness versions instead pass
    when the paired values agree with the golden's once sorted (allclose at the run's
    tolerances); either rule passing passes."""
    def cmp(actual, expected, actual_outputs=None, **_):
        vals = (actual_outputs or {}).get(vals_name)
        if vals is None:
            return False, f"topk_pair_compare: value output {vals_name!r} missing from the actual outputs"
        if actual.shape != expected.shape or vals.shape != actual.shape:
            return False, (f"topk_pair_compare: shapes differ (actual {list(actual.shape)}, expected "
                           f"{list(expected.shape)}, {vals_name} {list(vals.shape)})")
        rank = actual.dim()
        if not -rank <= dim < rank:
            return False, f"topk_pair_compare: dim {dim} outside rank {rank}"
        a = actual.movedim(dim, -1).reshape(-1, actual.shape[dim])
        x = expected.movedim(dim, -1).reshape(-1, actual.shape[dim])
        v = vals.movedim(dim, -1).reshape(-1, actual.shape[dim]).to(torch.float64)
        k = a.shape[1]
        bad = []
        for r, c in (a != x).nonzero().tolist():
            ok = True
            if c > 0:
                ok &= bool(v[r, c - 1] >= v[r, c]) if descending else bool(v[r, c - 1] <= v[r, c])
            if c + 1 < k:
                ok &= bool(v[r, c] >= v[r, c + 1]) if descending else bool(v[r, c] <= v[r, c + 1])
            if not ok:
                bad.append((r, c))
        if not bad:
            return True, ""
        exp_vals = (_.get("expected_outputs") or {}).get(vals_name)
        if exp_vals is not None and exp_vals.shape == vals.shape:
            # the newer harness's rule: the paired value sets agree once sorted
            srt_a = torch.sort(vals.float(), dim=dim, descending=True).values
            srt_e = torch.sort(exp_vals.float(), dim=dim, descending=True).values
            if torch.allclose(srt_a, srt_e, rtol=_.get("rtol", 1e-5), atol=_.get("atol", 1e-5)):
                return True, ""
        shown = "; ".join(f"row {r} pos {c}: idx {int(a[r, c])} vs {int(x[r, c])} score {float(v[r, c]):.6g}"
                          for r, c in bad[:max_show])
        return False, f"{len(bad)} index positions differ where the values are not tied: {shown}"
    return _named(cmp, f"topk_pair_compare({vals_name!r})")


def validate_golden(outputs: dict, golden: dict, rtol: float = 1e-5, atol: float = 1e-5, compare_fn=None,
                    inputs=None) -> None:
    """Compare every output with its golden; print a PASS/FAIL line per output.

    Raises:
        AssertionError: naming every failing output, after all were checked.
    """
    compare_fn = compare_fn or {}
    failed, details = [], []
    for name, actual in outputs.items():
        actual = actual.cpu()
        expected = golden[name].cpu()
        cmp = compare_fn.get(name)
        if cmp is not None:
            label = getattr(cmp, "__name__", "compare_fn")
            if actual.shape != expected.shape:
                ok, detail = False, f"shape {list(actual.shape)} != golden {list(expected.shape)}"
            else:
                ok, detail = cmp(actual, expected, actual_outputs=outputs, expected_outputs=golden,
                                 inputs=inputs or {}, rtol=rtol, atol=atol)
        else:
            label = f"allclose(rtol={rtol}, atol={atol})"
            ok = actual.shape == expected.shape and torch.allclose(actual, expected, rtol=rtol, atol=atol)
            detail = ""
            if not ok:
                if actual.shape != expected.shape:
                    detail = f"shape {list(actual.shape)} != golden {list(expected.shape)}"
                else:
                    a = actual.to(torch.float64).reshape(-1)
                    e = expected.to(torch.float64).reshape(-1)
                    badm = ~((a - e).abs() <= atol + rtol * e.abs())
                    idx = badm.nonzero().reshape(-1)[:20].tolist()
                    detail = (f"Mismatched elements: {int(badm.sum())}/{a.numel()} (rtol={rtol}, atol={atol}); " +
                              ", ".join(f"[{i}] actual={float(a[i]):.6g}, expected={float(e[i]):.6g}" for i in idx))
        _log(f"  {name!r} {'PASS' if ok else 'FAIL'}  shape={tuple(actual.shape)} dtype={actual.dtype} ({label})")
        if not ok:
            failed.append(name)
            details.append(f"{name}: {detail}")
    if failed:
        raise AssertionError(f"Output(s) does not match golden: {failed}\n" + "\n".join(details))


# ---- run ----------------------------------------------------------------------------------------

def _ignored(compile_cfg, runtime_cfg, compile_only, runtime_dir, specs) -> int:
    """Report what pto accepts but ignores; returns the heap size to run with."""
    notes = []
    rc = dict(runtime_cfg or {})
    heap = rc.pop("ring_heap", None)
    for k in ("platform", "device_id"):
        if k in rc:
            notes.append(f"{k}={rc.pop(k)!r}")
    for k in sorted(rc):
        if k not in _RUNTIME_KEYS:
            notes.append(f"unknown runtime_cfg key {k}={rc[k]!r}")
        elif rc[k]:
            notes.append(f"{k}={rc[k]!r}")
    for k, v in (compile_cfg or {}).items():
        if v:
            notes.append(f"compile_cfg {k}={v!r}")
    if compile_only:
        notes.append("compile_only (the kernel runs anyway: there is no compile step)")
    if runtime_dir:
        notes.append(f"runtime_dir={runtime_dir!r}")
    res = [s.name for s in specs if getattr(s, "is_resident", False)]
    if res:
        notes.append(f"resident= on {res} (one device)")
    if os.environ.get("PYPTO_BENCH", "") not in ("", "0", "false", "False"):
        notes.append("PYPTO_BENCH (no benchmark loop on the CPU runtime)")
    if notes:
        _log("pto: ignored: " + "; ".join(notes))
    return int(heap) if isinstance(heap, int) and not isinstance(heap, bool) and heap >= 1024 else 1 << 30


def _load_dir(golden_data: str, specs):
    missing = []
    for s in specs:
        out_only = isinstance(s, _PtoTensorSpec) and s.is_output and s.init_value is None
        need = (["out"] if out_only else ["in", "out"] if getattr(s, "is_output", False) else ["in"])
        for sub in need:
            p = os.path.join(golden_data, sub, f"{s.name}.pt")
            if not os.path.isfile(p):
                missing.append(os.path.join(sub, f"{s.name}.pt"))
    return missing


def _parameter_annotations(fn) -> list:
    """The annotations of the kernel entry's parameters in order (a ``@pl.jit`` function, the
    entry of a ``@pl.program`` class, a ``@pl.jit.host`` function; None for an unannotated one);
    ``[]`` when it has no signature. Specs bind to parameters by position, as they are passed."""
    target = getattr(fn, "entry", fn)
    sig = getattr(target, "signature", None)
    if sig is None:
        return []
    signature, anns = sig()
    return [anns.get(name) for name in signature.parameters]


def _resolve_directions(fn, specs) -> list:
    """``specs`` with every ``TensorSpec`` whose ``is_output`` was not given resolved from the
    kernel's signature, as the current reference harness stamps a spec's direction from the
    compiled parameter (``pl.Out`` / ``pl.InOut`` / ``pl.PartialOut``: an output); without an
    annotation the older harness's default (not an output) holds. Spec ``i`` is parameter
    ``i`` (specs are passed positionally). An explicit ``is_output`` is kept. Returns a new
    list; the caller's specs are unchanged (a spec left None is not an output until the run
    shows it written: :func:`_written_inputs`)."""
    from dataclasses import replace

    from pto.language.typing import IN, TensorType
    anns = _parameter_annotations(fn)
    out = []
    for i, s in enumerate(specs):
        if isinstance(s, _PtoTensorSpec) and s.is_output is None:
            ann = anns[i] if i < len(anns) else None
            if isinstance(ann, TensorType) and ann.direction != IN:
                s = replace(s, is_output=True)
        out.append(s)
    return out


def _written_inputs(fn, prog, specs) -> set:
    """Names of the specs left without a direction whose parameter is declared In but the run
    wrote (pypto infers InOut, and pto follows with a warning): outputs too. Only when ``prog``
    is the run of ``fn``'s own entry (a host function's last chip program has other parameters)."""
    jf = getattr(prog, "jf", None)
    if jf is None or jf is not getattr(fn, "entry", fn):
        return set()
    written = {p.name for p, _caller, g in getattr(prog, "args", ()) if not g.buf.readonly and p.direction == "in"}
    names = list(jf.signature()[0].parameters)
    return {s.name for i, s in enumerate(specs) if isinstance(s, _PtoTensorSpec) and s.is_output is None
            and i < len(names) and names[i] in written}


def _run_kernel(fn, args, cfg):
    """Run ``fn`` (a @pl.jit function, a @pl.program class or a @pl.jit.host function) once."""
    run = getattr(fn, "run", None)
    if run is None:
        raise ConfigError(f"run_jit: {fn!r} is not a pto kernel (@pl.jit, @pl.program or @pl.jit.host)")
    return run(*args, config=cfg)


def run_jit(fn, specs, golden_fn=None, golden_data=None, compile_cfg=None, runtime_cfg=None, rtol: float = 1e-5,
            atol: float = 1e-5, compare_fn=None, compile_only: bool = False, runtime_dir=None,
            save_data: bool = False) -> RunResult:
    """The reference ``run_jit``: inputs, golden, one check-mode run on the CPU, validation.

    Args:
        fn: a ``@pl.jit`` function (also a ``@pl.program`` class or a ``@pl.jit.host`` function)
            whose parameters are ``specs`` in order (passed positionally).
        specs: TensorSpec / ScalarSpec in parameter order.
        golden_fn: ``golden_fn(values)`` fills the output entries of a dict of clones.
        golden_data: a ``data/`` directory saved by ``save_data`` to replay (inputs and goldens).
        compare_fn: {output name: comparator}; others use ``torch.allclose(rtol, atol)``.
        save_data: write ``<work_dir>/data/{in,out}/<name>.pt``.
        compile_cfg, runtime_cfg, compile_only, runtime_dir: accepted, reported, ignored
            (``runtime_cfg['ring_heap']`` sizes the ring heap).

    Returns:
        RunResult (``passed`` False with ``error`` on a mismatch or missing replay files).

    Raises:
        Whatever the kernel raises (pto errors name the construct and the line).
    """
    from pto.runtime import RunConfig

    t0 = time.perf_counter()
    if compile_only and runtime_dir:
        return RunResult(False, "runtime_dir is incompatible with compile_only")
    heap = _ignored(compile_cfg, runtime_cfg, compile_only, runtime_dir, specs)
    name = getattr(fn, "__name__", "kernel")
    work_dir = None
    if save_data:
        work_dir = os.path.join("build_output", f"{name}_{time.strftime('%Y%m%d_%H%M%S')}")
    specs = _resolve_directions(fn, specs)
    outputs = [s for s in specs if isinstance(s, _PtoTensorSpec) and s.is_output]
    golden: dict = {}
    if golden_data is not None:
        missing = _load_dir(golden_data, specs)
        if missing:
            return RunResult(False, f"golden_data is missing files: {missing}", time.perf_counter() - t0)
        _log(f"  cache hit: {os.path.join(golden_data, 'in')}")
        values = {}
        for s in specs:
            if isinstance(s, _PtoScalarSpec):
                v = torch.load(os.path.join(golden_data, "in", f"{s.name}.pt"), weights_only=True)
                if not isinstance(v, torch.Tensor) or v.dim() != 0 or v.dtype != s.dtype:
                    return RunResult(False, f"golden_data scalar {s.name!r} must be a 0-dim {s.dtype} tensor",
                                     time.perf_counter() - t0)
                values[s.name] = v.item()
            elif s.is_output and s.init_value is None:
                values[s.name] = torch.zeros(s.shape, dtype=s.dtype)
            else:
                values[s.name] = torch.load(os.path.join(golden_data, "in", f"{s.name}.pt"), weights_only=True)
        golden = {s.name: torch.load(os.path.join(golden_data, "out", f"{s.name}.pt"), weights_only=True)
                  for s in specs if isinstance(s, _PtoTensorSpec) and (s.is_output or (
                      s.is_output is None and os.path.isfile(os.path.join(golden_data, "out", f"{s.name}.pt"))))}
    else:
        values = {s.name: (s.to_python() if isinstance(s, _PtoScalarSpec) else s.create_tensor()) for s in specs}
        if work_dir is not None:
            d = os.path.join(work_dir, "data", "in")
            os.makedirs(d, exist_ok=True)
            for s in specs:
                if isinstance(s, _PtoScalarSpec):
                    torch.save(s.value.clone(), os.path.join(d, f"{s.name}.pt"))
                elif not (s.is_output and s.init_value is None):
                    torch.save(values[s.name].clone(), os.path.join(d, f"{s.name}.pt"))
        if golden_fn is not None:
            gvals = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
            for s in outputs:
                if s.init_value is None:
                    gvals[s.name] = torch.zeros(s.shape, dtype=s.dtype)
            _log("golden ...")
            golden_fn(gvals)
            # every tensor the golden filled: a spec without a direction whose In parameter the run
            # writes (pypto infers InOut) is compared too
            golden = {s.name: gvals[s.name] for s in specs if isinstance(s, _PtoTensorSpec)
                      and (s.is_output or s.is_output is None)}  # saved once the outputs are known
    cfg = RunConfig(heap_bytes=heap, check=True)
    args = [values[s.name] for s in specs]
    _log(f"runtime (pto CPU, check mode) {name} ...")
    prog = _run_kernel(fn, args, cfg)
    _log(f"runtime done ({time.perf_counter() - t0:.2f}s)")
    if golden_fn is None and golden_data is None:
        _log(f"PASS ({time.perf_counter() - t0:.2f}s, validation skipped: no golden_fn or golden_data)")
        return RunResult(True, None, time.perf_counter() - t0, work_dir, program=prog)
    written = _written_inputs(fn, prog, specs)
    outputs = [s for s in specs if isinstance(s, _PtoTensorSpec) and (s.is_output or s.name in written)]
    if not outputs:
        _log(f"FAIL ({time.perf_counter() - t0:.2f}s)")
        return RunResult(False, "nothing to validate: no spec is an output (no pl.Out / pl.InOut parameter, none "
                                "written by the kernel and no is_output=True)", time.perf_counter() - t0,
                         work_dir, program=prog)
    out_names = {s.name for s in outputs}
    if work_dir is not None and golden_data is None and golden:
        d = os.path.join(work_dir, "data", "out")
        os.makedirs(d, exist_ok=True)
        for k in out_names:
            torch.save(golden[k].clone(), os.path.join(d, f"{k}.pt"))
    missing = [s.name for s in outputs if s.name not in golden]
    if missing:  # a golden_data replay saved without them
        return RunResult(False, f"golden_data has no golden for output(s) {missing}", time.perf_counter() - t0,
                         work_dir, program=prog)
    inputs = {s.name: (s.value if isinstance(s, _PtoScalarSpec) else values[s.name])
              for s in specs if not (isinstance(s, _PtoTensorSpec) and s.name in out_names)}
    try:
        validate_golden({s.name: values[s.name] for s in outputs}, golden, rtol, atol, compare_fn, inputs)
    except AssertionError as e:
        _log(f"FAIL ({time.perf_counter() - t0:.2f}s)")
        return RunResult(False, str(e), time.perf_counter() - t0, work_dir, program=prog)
    _log(f"PASS ({time.perf_counter() - t0:.2f}s)")
    return RunResult(True, None, time.perf_counter() - t0, work_dir, program=prog)


def run(program=None, specs=None, golden_fn=None, golden_data=None, compile_cfg=None, runtime_cfg=None,
        rtol: float = 1e-5, atol: float = 1e-5, compare_fn=None, compile_only: bool = False, runtime_dir=None,
        save_data: bool = False, fn=None, config=None) -> RunResult:
    """The reference ``run`` for a ``@pl.program`` class (or, as other harness versions spell it,
    ``run(fn=kernel, specs, ..., config=dict(...) | RunConfig(...))``): the same as :func:`run_jit`;
    ``config`` options are reported and ignored like ``runtime_cfg``.

    Raises:
        pto.ConfigError: neither ``program`` nor ``fn``, or no ``specs``.
    """
    kernel = program if program is not None else fn
    if kernel is None or specs is None:
        raise ConfigError("golden.run: give the program (or fn=) and specs")
    if config is not None:
        extra = config.options if isinstance(config, RunConfig) else dict(config)
        runtime_cfg = {**extra, **(runtime_cfg or {})}
    return run_jit(kernel, specs, golden_fn, golden_data, compile_cfg, runtime_cfg, rtol, atol, compare_fn,
                   compile_only, runtime_dir, save_data)
