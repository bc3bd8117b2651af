"""``run_jit``: build inputs, run the golden, run the kernel, compare
(pypto-lib `golden/`; docs/dsl.md)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from pto.errors import BindError, ConfigError, GoldenDataError, GoldenError, PtoError
from pto.golden.compare import default_compare, error_stats, margin_of
from pto.golden.spec import ScalarSpec, TensorSpec
from pto.runtime import Program, RunConfig

__all__ = ["run_jit", "RunResult", "OutputReport", "save_golden_data", "load_golden_data", "resolve_outputs"]


@dataclass
class OutputReport:
    """Comparison of one output: pass flag, compare label, failure detail,
    error statistics (max_abs, mean_abs, max_rel, nan, inf, numel) and the margin
    as the compare function defines it (:func:`pto.golden.compare.margin_of`: metric,
    error, tolerance, margin = error / tolerance; None for a compare function that
    defines none)."""

    name: str
    passed: bool
    label: str
    detail: str
    stats: dict
    margin: dict | None = None


@dataclass
class RunResult:
    """Outcome of :func:`run_jit`.

    Attributes:
        passed: every output was compared against the golden and passed (False when
            no output was compared: no output spec, or no golden);
        validated: the outputs were compared against a golden (``golden_fn`` or
            ``golden_data``); error: the combined failure message.
        outputs: per-output reports; program: the kernel's Program (stats,
            graph); kernel_ms / golden_ms: CPU wall times.
        actual / expected: output tensors by name.
    """

    passed: bool
    error: str | None = None
    validated: bool = False
    outputs: dict = field(default_factory=dict)
    program: Program | None = None
    kernel_ms: float = 0.0
    golden_ms: float = 0.0
    actual: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)

    @property
    def stats(self):
        """The kernel's ProgramStats (None when it did not run)."""
        return self.program.stats if self.program is not None else None

    @property
    def max_abs_error(self) -> float:
        """Largest max-abs error over the compared outputs (0.0 when none)."""
        return max((o.stats.get("max_abs", math.inf) for o in self.outputs.values()), default=0.0)

    def __str__(self) -> str:
        if self.passed:
            return f"PASS ({self.kernel_ms:.1f} ms)"
        if not self.validated:
            return f"NOT VALIDATED: {self.error} ({self.kernel_ms:.1f} ms)"
        return f"FAIL: {self.error} ({self.kernel_ms:.1f} ms)"


def _file_names(directory: str):
    return os.path.join(directory, "in.safetensors"), os.path.join(directory, "out.safetensors")


def save_golden_data(directory: str, inputs: dict, golden: dict) -> None:
    """Write inputs (tensors and 0-dim scalars) and golden outputs as safetensors, atomically:
    both files go to a temporary directory next to ``directory``, which is then renamed onto it
    (an existing golden-data directory is replaced whole). On any failure nothing is left
    behind: no half-written directory, the previous one (if any) unchanged.

    Raises:
        GoldenDataError: ``directory`` cannot be created or written (e.g. it is a file), or a
            value cannot be saved (not a tensor, or one safetensors refuses).
    """
    import shutil
    import tempfile
    from safetensors.torch import save_file
    target = os.path.abspath(directory)
    parent = os.path.dirname(target)
    tmp = None

    def fail(what: str, e: BaseException):
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise GoldenDataError(f"save_data {directory!r}: {what} ({type(e).__name__}: {e})") from None

    try:
        if os.path.exists(target) and not os.path.isdir(target):
            raise NotADirectoryError(f"{target!r} exists and is not a directory")
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the renamed directory gets the usual mode
    except OSError as e:
        fail("cannot write the golden data there", e)
    fin, fout = _file_names(tmp)
    try:
        for path, table in ((fin, inputs), (fout, golden)):
            bad = [k for k, v in table.items() if not isinstance(v, torch.Tensor)]
            if bad:
                raise TypeError(f"{bad} are not tensors")
            save_file({k: v.contiguous() for k, v in table.items()}, path)
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
        fail("cannot save the golden data", e)
    old = None
    try:
        if os.path.isdir(target):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
            os.rename(target, os.path.join(old, "data"))
        os.rename(tmp, target)
    except OSError as e:
        if old is not None and not os.path.exists(target) and os.path.isdir(os.path.join(old, "data")):
            os.rename(os.path.join(old, "data"), target)  # put the previous golden data back
        fail("cannot move the golden data into place", e)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def load_golden_data(directory: str, specs) -> tuple[dict, dict]:
    """Load saved inputs and golden outputs, checked against ``specs``.

    Raises:
        GoldenDataError: missing files or tensors, or a name, shape or dtype
            that does not match the specs.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    fin, fout = _file_names(directory)
    missing = [f for f in (fin, fout) if not os.path.exists(f)]
    if missing:
        raise GoldenDataError(f"golden_data {directory!r} is missing files: {missing}")
    try:
        ins, outs = load_file(fin), load_file(fout)
    except (SafetensorError, OSError, ValueError) as e:
        raise GoldenDataError(f"golden_data {directory!r}: unreadable safetensors file ({e})") from None
    for s in specs:
        pure = isinstance(s, TensorSpec) and (s.is_pure_output or (s.is_output is None and s.init_value is None
                                                                   and s.name in outs and s.name not in ins))
        table = outs if pure else ins
        if s.name not in table:
            raise GoldenDataError(f"golden_data {directory!r}: tensor {s.name!r} missing")
        t = table[s.name]
        want_shape = list(s.shape) if isinstance(s, TensorSpec) else []
        if list(t.shape) != want_shape or t.dtype != s.dtype:
            raise GoldenDataError(f"golden_data {directory!r}: {s.name!r} is {list(t.shape)} {t.dtype}, "
                                  f"spec says {want_shape} {s.dtype}")
        if isinstance(s, TensorSpec) and s.is_output and s.name not in outs:
            raise GoldenDataError(f"golden_data {directory!r}: golden output {s.name!r} missing")
    return ins, outs


def _check_spec_names(fn, specs) -> None:
    """BindError unless spec ``i`` is named like the kernel's parameter ``i`` (run_jit passes
    the specs' values positionally, so a swapped pair would silently bind to the wrong parameter)."""
    sig = getattr(fn, "signature", None)
    if sig is None:
        return
    params = list(sig()[0].parameters)
    for i, s in enumerate(specs):
        if i >= len(params):
            raise BindError(f"run_jit {fn.__name__}: {len(specs)} specs for {len(params)} parameters {params}; "
                            f"spec {s.name!r} (position {i}) has no parameter")
        if s.name != params[i]:
            raise BindError(f"run_jit {fn.__name__}: spec {i} is named {s.name!r} but parameter {i} is "
                            f"{params[i]!r}; specs must follow the parameters in order {params}")


def resolve_outputs(fn, specs) -> list:
    """``specs`` with every ``TensorSpec(is_output=None)`` resolved from ``fn``'s annotation:
    a ``pl.Out`` / ``pl.InOut`` / ``pl.PartialOut`` parameter is an output, anything else is
    not; explicit True / False are kept (a False output stays unvalidated). Returns a new
    list (the caller's specs are not changed).

    Raises:
        BindError: an ``is_output=None`` spec whose parameter has no ``pl.Tensor`` annotation
            (or a kernel without a signature): set ``is_output`` explicitly.
    """
    from dataclasses import replace

    from pto.language.typing import IN, TensorType
    sig = getattr(fn, "signature", None)
    anns = sig()[1] if sig is not None else {}
    out = []
    for s in specs:
        if isinstance(s, TensorSpec) and s.is_output is None:
            ann = anns.get(s.name)
            if not isinstance(ann, TensorType):
                raise BindError(f"run_jit {getattr(fn, '__name__', fn)}: spec {s.name!r} has is_output=None but "
                                f"its parameter has no pl.Tensor annotation to take it from; set is_output")
            s = replace(s, is_output=ann.direction != IN)
        out.append(s)
    return out


def _shared_inputs(fn, specs, values: dict) -> dict:
    """``{name: version}`` of the tensors the golden can read in place instead of a clone: every
    tensor of a parameter annotated ``pl.Tensor`` (direction In, so the kernel cannot write
    it), with its torch version counter (bumped by every in-place write, also through a view)
    so that a golden writing one is caught. A table the kernel only reads (a FLASH vocab table
    is 1 GiB in BF16) is then held once, not twice. Outputs, scalars, parameters of a kernel
    without a signature and tensors without a version counter (inference-mode) are cloned."""
    from pto.language.typing import IN, TensorType
    sig = getattr(fn, "signature", None)
    if sig is None:
        return {}
    anns = sig()[1]
    shared = {}
    for s in specs:
        ann = anns.get(s.name)
        v = values.get(s.name)
        if isinstance(s, TensorSpec) and not s.is_output and isinstance(ann, TensorType) and ann.direction == IN \
                and isinstance(v, torch.Tensor):
            try:
                shared[s.name] = v._version
            except RuntimeError:  # an inference tensor has no version counter: clone it
                continue
    return shared


def run_jit(fn, specs, golden_fn=None, compare_fn=None, rtol: float = 1e-5, atol: float = 1e-5,
            check: bool = True, golden_data: str | None = None, save_data: str | None = None,
            seed: int | None = 0, config: RunConfig | None = None) -> RunResult:
    """Run kernel ``fn`` against ``golden_fn`` and compare every output.

    Args:
        fn: a ``@pl.jit`` function whose parameters are ``specs`` in order.
        specs: TensorSpec / ScalarSpec list in parameter order.
        golden_fn: ``golden_fn(values)`` fills the output entries of a dict of the
            inputs (pure outputs start as zeros, scalars are Python values): clones of the
            outputs, and the kernel's own tensors of the read-only (``pl.Tensor``, direction
            In) inputs, which the golden must not write (a GoldenError says which it wrote).
        compare_fn: {output name: compare function}; others use exact compare
            (integer outputs) or ``allclose(atol, rtol)``.
        check: run the kernel in check mode (sanitizer + race checker).
        golden_data / save_data: directory to replay from / save to (safetensors).
        seed: ``torch.manual_seed`` before building inputs (None: leave the RNG).
        config: RunConfig for the kernel (``check`` overrides its field).

    Returns:
        RunResult. Kernel errors (PtoError) propagate; mismatches do not raise. A run in
        which no output was compared -- no output spec at all (``is_output`` None is taken
        from the kernel's annotation, ``False`` is never validated), or outputs but neither
        ``golden_fn`` nor ``golden_data`` -- is not passed (``validated`` False, ``error``
        says so).

    Raises:
        BindError: a spec name that is not the kernel's parameter name at its position, or
            an ``is_output=None`` spec without a tensor annotation (:func:`resolve_outputs`).
        ConfigError: a ``compare_fn`` key that is not an output spec name.
        GoldenError: ``golden_fn`` raised an exception that is not a PtoError (a PtoError
            it raises propagates as is), or wrote a read-only input in place.
        GoldenDataError: bad golden data.
    """
    _check_spec_names(fn, specs)
    specs = resolve_outputs(fn, specs)
    compare_fn = compare_fn or {}
    outputs = [s.name for s in specs if isinstance(s, TensorSpec) and s.is_output]
    unknown = [k for k in compare_fn if k not in outputs]
    if unknown:
        raise ConfigError(f"run_jit {getattr(fn, '__name__', fn)}: compare_fn keys {unknown} are not output specs "
                          f"(outputs: {', '.join(outputs) or 'none'})")
    expected: dict = {}
    validated = golden_data is not None or golden_fn is not None
    if golden_data is not None:
        ins, outs = load_golden_data(golden_data, specs)
        values = {}
        for s in specs:
            if isinstance(s, ScalarSpec):
                values[s.name] = ins[s.name].item()
            elif s.is_pure_output:
                values[s.name] = torch.zeros(s.shape, dtype=s.dtype)
            else:
                values[s.name] = ins[s.name].clone()
        expected = {s.name: outs[s.name] for s in specs if isinstance(s, TensorSpec) and s.is_output}
        golden_ms = 0.0
    else:
        if seed is not None:
            torch.manual_seed(seed)
        values = {}
        for s in specs:
            values[s.name] = s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor()
        golden_ms = 0.0
        if golden_fn is not None:
            shared = _shared_inputs(fn, specs, values)
            gvals = {k: (v.clone() if isinstance(v, torch.Tensor) and k not in shared else v)
                     for k, v in values.items()}
            name = getattr(golden_fn, "__qualname__", None) or getattr(golden_fn, "__name__", None) or repr(golden_fn)
            t0 = time.perf_counter()
            try:
                golden_fn(gvals)
            except PtoError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of user golden code
                raise GoldenError(f"run_jit {getattr(fn, '__name__', fn)}: the golden {name} raised "
                                  f"{type(e).__name__}: {e}") from e
            golden_ms = (time.perf_counter() - t0) * 1e3
            written = [k for k, ver in shared.items() if values[k]._version != ver]
            if written:  # the kernel would run on the golden's writes: stop before it does
                raise GoldenError(f"run_jit {getattr(fn, '__name__', fn)}: the golden {name} wrote its read-only "
                                  f"input(s) {written} in place (inputs of pl.Tensor parameters are shared with "
                                  f"the kernel, not cloned); compute into new tensors or clone them first")
            expected = {s.name: gvals[s.name] for s in specs if isinstance(s, TensorSpec) and s.is_output}
        if save_data is not None:
            ins = {s.name: (torch.tensor(values[s.name], dtype=s.dtype) if isinstance(s, ScalarSpec)
                            else values[s.name].clone())
                   for s in specs if not (isinstance(s, TensorSpec) and s.is_pure_output)}
            save_golden_data(save_data, ins, expected)
    cfg = RunConfig(**{**(config.__dict__ if config else {}), "check": check})
    args = [values[s.name] for s in specs]
    t0 = time.perf_counter()
    prog = fn.run(*args, config=cfg)
    kernel_ms = (time.perf_counter() - t0) * 1e3
    res = RunResult(passed=True, validated=validated and bool(outputs), program=prog, kernel_ms=kernel_ms,
                    golden_ms=golden_ms)
    if not outputs:
        res.passed = False
        skipped = [s.name for s in specs if isinstance(s, TensorSpec) and s.is_output is False]
        res.error = ("no output was compared: no spec is an output (no pl.Out / pl.InOut parameter"
                     + (f"; is_output=False on {skipped}" if skipped else "") + "); the kernel ran without error")
        return res
    if not validated:
        res.passed = False
        res.error = (f"no golden: outputs {outputs} were not validated (pass golden_fn or golden_data); "
                     f"the kernel ran without error")
        return res
    failures = []
    for s in specs:
        if not (isinstance(s, TensorSpec) and s.is_output):
            continue
        actual, exp = values[s.name], expected[s.name]
        res.actual[s.name], res.expected[s.name] = actual, exp
        cmp = compare_fn.get(s.name) or default_compare(s.dtype, rtol, atol)
        if actual.shape != exp.shape:
            ok, detail = False, f"shape {list(actual.shape)} != golden {list(exp.shape)}"
        else:
            ok, detail = cmp(actual, exp, rtol_run=rtol, atol_run=atol, inputs=values)
        res.outputs[s.name] = OutputReport(s.name, ok, getattr(cmp, "__name__", "compare"), detail,
                                           error_stats(actual, exp) if actual.shape == exp.shape else {},
                                           margin_of(cmp, actual, exp, rtol_run=rtol, atol_run=atol))
        if not ok:
            failures.append(f"{s.name}: {detail}")
    if failures:
        res.passed = False
        res.error = "Output(s) do not match golden: " + " | ".join(failures)
    return res
