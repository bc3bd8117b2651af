"""The ``pto`` command line (README.md): ``pto demo|run|check|graph ...``.

Registry-driven: kernels are found by name in the :mod:`pto.golden` registry
(model kernels from ``pto.models.deepseek_v4``, examples from ``examples/``),
or by ``MODULE:FUNCTION`` for anything else. Kernel modules never parse
arguments; every option reaches them as ``build(preset, mode, **options)``.

Adding a subcommand is one decorated function::

    def _trace_args(p):                      # argparse.ArgumentParser of the subcommand
        add_target_args(p)
        p.add_argument("-o", "--output", default="trace.json")

    @command("trace", "export a Perfetto trace of a kernel run", _trace_args)
    def cmd_trace(args) -> int:              # returns the exit code
        target = resolve_target(args.target, args.preset, args.mode, parse_options(args.opt), args.dim)
        prog = target.run_program(check=False)
        ...

Exit codes: 0 success, 1 a kernel failed (mismatch or a check-mode error),
2 bad input (unknown kernel, preset or mode, malformed option); bad input is
reported as one ``error: ...`` line, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import gc
import copy
import importlib
import inspect
import math
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import pto
from pto.errors import BindError, CapacityError, CheckpointError, ConfigError, PtoError
from pto.golden import CaseRun, KernelCase, ScalarSpec, all_cases, get_case, load_examples, run_jit
from pto.golden.registry import import_file
from pto.language.graph_only import is_index_dtype
from pto.language.jit import JitFunction
from pto.language.typing import OUT, DynVar, ScalarType, TensorType
from pto.runtime import Program, RunConfig
from pto.runtime.program import freeze_imports

__all__ = ["main", "command", "COMMANDS", "Command", "Target", "resolve_target", "parse_options",
           "add_target_args", "console", "DEFAULT_PRESET"]

DEFAULT_PRESET = "flash"


# ---- subcommand registry --------------------------------------------------------

@dataclass
class Command:
    """One subcommand: ``handler(args) -> exit code``; ``configure(parser)`` adds its arguments."""

    name: str
    help: str
    handler: Callable
    configure: Callable | None = None


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Callable | None = None):  # noqa: A002 - argparse word
    """Decorator registering ``fn(args) -> int`` as subcommand ``name``."""
    def deco(fn):
        COMMANDS[name] = Command(name, help, fn, configure)
        return fn
    return deco


class _Console(Console):
    """rich's Console whose closed stdout (``pto sim ... | head -1``) raises BrokenPipeError for
    :func:`main` (exit 141) instead of rich's own ``SystemExit(1)``, the code of a failed kernel."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("stdout closed by its reader")


def console() -> Console:
    """A rich console; 120 columns for tables when stdout is not a terminal (CI
    logs); long message lines are never hard-wrapped (soft wrap); no ``:name:`` emoji codes (a
    path or a kernel's text such as ``ck:smile:x`` prints as it is)."""
    c = _Console(soft_wrap=True, emoji=False)
    return c if c.is_terminal else _Console(width=120, soft_wrap=True, emoji=False)


# ---- targets: registered kernels or MODULE:FUNCTION -----------------------------------

def parse_options(items, flag: str = "--opt") -> dict:
    """``["T=128", "seed_scopes=True", "name=x"]`` -> ``{"T": 128, "seed_scopes": True, "name": "x"}``.
    Values are Python literals; ``true/false/yes/no/on/off`` (any case) are booleans and
    ``inf``, ``-inf``, ``nan`` (any case; ``infinity`` too) are floats, as ``float()`` reads them.

    Raises:
        ConfigError: an item without ``=``, or a key given twice (``--opt T=4 --opt T=8``: which
            one was meant?).
    """
    out = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"option {item!r} is not KEY=VALUE")
        if key.strip() in out:
            raise ConfigError(f"{flag} {key.strip()} is given twice ({item!r} after {key.strip()}="
                              f"{out[key.strip()]!r})")
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            word = raw.strip().lower()
            if word in _BOOL_WORDS:
                out[key.strip()] = _BOOL_WORDS[word]
            elif word.lstrip("+-") in ("inf", "infinity", "nan"):
                out[key.strip()] = float(word)
            else:
                out[key.strip()] = raw
    return out


# spellings of booleans that ast.literal_eval does not read (a bare string would be truthy)
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def load_kernels() -> None:
    """Fill the kernel registry: the model kernels (``pto.models.deepseek_v4`` registers
    each on import) and the examples (:func:`pto.golden.load_examples`). The golden layer
    never imports the model layer; the CLI does it here."""
    importlib.import_module("pto.models.deepseek_v4")
    load_examples()
    freeze_imports()  # before any input exists, so that no input is frozen by the first program


def _pypto_hint(e: BaseException) -> str:
    """A hint for an import that failed on pypto's own modules: such a file is a pypto script,
    which runs under ``pto pypto``."""
    name = getattr(e, "name", None) or ""
    if isinstance(e, ImportError) and name.split(".")[0] in ("pypto", "golden"):
        return " (a pypto / pypto-lib file: run it with `pto pypto FILE.py`)"
    return ""


def _check_preset(preset: str) -> None:
    from pto.models.deepseek_v4.config import PRESETS
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}")


def _load_attr(spec: str):
    mod_part, _, attr = spec.rpartition(":")
    if not mod_part or not attr:
        raise ConfigError(f"{spec!r} is not MODULE:FUNCTION")
    if mod_part.endswith(".py") or "/" in mod_part:
        path = Path(mod_part)
        if not path.is_file():
            raise ConfigError(f"no such file {mod_part!r}")
        if path.suffix != ".py":  # importlib finds no loader for it
            raise ConfigError(f"{mod_part!r} is not a Python file: a kernel file's name ends in .py")
        folder = str(path.resolve().parent)  # its sibling modules import as when Python runs the file
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            module = import_file(path, f"pto_cli_target.{path.stem}")
        except PtoError:
            raise
        except Exception as e:  # noqa: BLE001 - user code
            raise ConfigError(f"cannot import {mod_part!r}: {type(e).__name__}: {e}{_pypto_hint(e)}") from None
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(mod_part)
        except ImportError as e:
            raise ConfigError(f"cannot import module {mod_part!r}: {e}{_pypto_hint(e)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {mod_part!r} has no attribute {attr!r}") from None


def _synth_args(jf: JitFunction, dims: dict, scalars: dict) -> list:
    """Seeded arguments built from ``jf``'s annotations (floats randn, ints in [0, 8), outputs zero)."""
    sig, anns = jf.signature()
    gen = torch.Generator().manual_seed(0)
    args = []
    for name, param in sig.parameters.items():
        ann = anns.get(name)
        if isinstance(ann, TensorType):
            if ann.dims is None or ann.dtype is None:
                raise ConfigError(f"kernel {jf.__name__}: parameter {name!r} is a bare pl.Tensor; "
                                "cannot build an argument for it")
            shape = []
            for d in ann.dims:
                if isinstance(d, DynVar):
                    if d.name not in dims:
                        raise ConfigError(f"kernel {jf.__name__}: parameter {name!r} has dynamic dim {d.name}; "
                                        f"pass --dim {d.name}=<extent>")
                    shape.append(dims[d.name])
                else:
                    shape.append(d)
            dt = ann.dtype.torch
            if ann.direction == OUT:
                t = torch.zeros(shape, dtype=dt)
            elif dt.is_floating_point:
                t = torch.randn(shape, generator=gen).to(dt)
            elif dt == torch.bool:
                t = torch.zeros(shape, dtype=dt)
            else:
                t = torch.randint(0, 8, shape, generator=gen).to(dt)
            args.append(t)
        elif isinstance(ann, ScalarType):
            if name not in scalars:
                raise ConfigError(f"kernel {jf.__name__}: scalar parameter {name!r}; pass --scalar {name}=<value>")
            try:  # the kernel's own check, before anything runs: a bad --scalar is bad input (exit 2)
                ScalarSpec(name, ann.dtype.torch, scalars[name])
            except BindError as e:
                raise ConfigError(f"--scalar {name}={scalars[name]!r}: {e}") from None
            args.append(scalars[name])
        elif param.default is param.empty:
            raise ConfigError(f"kernel {jf.__name__}: parameter {name!r} has no annotation and no default; "
                            "wrap the kernel in a function that returns a CaseRun")
    return args


@dataclass
class Target:
    """What a command runs: a registered case build or a bare jit function.

    Attributes:
        name: display name; mode: the mode (``""`` for bare functions).
        case_run: the CaseRun (golden available) or None.
        fn, args: the jit function and its arguments (bare functions).
        program: an already-run Program (a callable that returned one).
        note: said after the mode in the title (``"(demo preset)"``: a case run below the
            default preset because no ``--preset`` was given).
    """

    name: str
    mode: str = ""
    case_run: CaseRun | None = None
    fn: object = None
    args: list | None = None
    program: Program | None = None
    note: str = ""

    @property
    def title(self) -> str:
        """``"name mode note"`` for tables and PASS/FAIL lines (just ``name`` without a mode)."""
        return " ".join(p for p in (self.name, self.mode, self.note) if p)

    def run_program(self, check: bool = False, drop_init: tuple = (), execute: bool = True) -> Program:
        """Run once (no golden) and return the Program (``drop_init``, ``execute``: see RunConfig;
        ``execute=False`` is graph-only mode). A target that returned an already-run Program
        is that run, which cannot be run again in another mode.

        Raises:
            ConfigError: check mode, ``drop_init`` or graph-only mode asked of an already-run
                Program that did not run that way (it would be reported as checked, mutated or
                graph-only when it was not).
        """
        if self.program is not None:
            pc = self.program.config
            asked = [what for what, differs in (("check mode", check and not pc.check),
                                                 ("--drop-init", tuple(drop_init) != tuple(pc.drop_init)),
                                                 ("graph-only mode" if not execute else "a run that computes",
                                                  execute != pc.execute)) if differs]
            if asked:
                raise ConfigError(f"{self.name} returned a Program that was already run; {asked[0]} needs a kernel "
                                  f"it can run itself (a @pl.jit function, a KernelCase or a callable returning a "
                                  f"CaseRun)")
            return self.program
        cfg = RunConfig(check=check, keep_footprints=True, drop_init=tuple(drop_init), execute=execute)
        if self.case_run is not None:
            cr = self.case_run
            torch.manual_seed(0)
            vals = [s.to_python() if hasattr(s, "to_python") else
                    s.create_tensor() if execute or is_index_dtype(s.dtype) else
                    torch.empty(s.shape, dtype=s.dtype, device="meta") for s in cr.specs]
            return cr.fn.run(*vals, config=cfg)
        return self.fn.run(*self.args, config=cfg)


def resolve_target(spec: str, preset: str | None, mode: str | None, options: dict, dims=None,
                   scalars=None, shape_only: bool = False) -> Target:
    """Turn ``KERNEL`` or ``MODULE:FUNCTION`` into a :class:`Target`.

    ``MODULE`` is a dotted module name or a ``.py`` path; ``FUNCTION`` is a
    ``@pl.jit`` function (arguments built from its annotations, ``dims`` for
    dynamic dims and ``scalars`` for scalar parameters), a ``KernelCase``, or
    a zero-argument callable returning a ``CaseRun`` or a ``Program``.

    ``preset`` / ``mode`` None and empty ``options`` / ``dims`` / ``scalars`` mean "not
    given"; a kernel case takes preset (default :data:`DEFAULT_PRESET`), mode and options,
    a ``@pl.jit`` function takes dims and scalars, a zero-argument callable takes none.
    Anything given that the target would ignore is rejected. ``shape_only`` (graph-only runs):
    a kernel case is built under :class:`_ShapeOnlyFactories` (its float and INT8 inputs
    shape-only, so a FLASH-size case never holds its weights).

    Raises:
        ConfigError: unknown kernel, preset or mode; bad module or attribute;
            arguments that cannot be built from the annotations; an option the target
            would ignore (``--dim`` / ``--scalar`` on a kernel case, ``--preset`` /
            ``--mode`` / ``--opt`` on a ``@pl.jit`` function, any of them on a callable,
            a ``--dim`` the kernel does not have, a ``--scalar`` that is not a scalar
            parameter).
    """
    dims, scalars = dims or {}, scalars or {}
    if ":" not in spec:
        load_kernels()
        _reject_ignored(spec, "a registered kernel case", dim=dims, scalar=scalars)
        return _case_target(get_case(spec), preset, mode, options, shape_only)
    obj = _load_attr(spec)
    if isinstance(obj, KernelCase):
        _reject_ignored(spec, "a KernelCase", dim=dims, scalar=scalars)
        return _case_target(obj, preset, mode, options, shape_only)
    if isinstance(obj, JitFunction):
        _reject_ignored(spec, "a @pl.jit function", preset=preset, mode=mode, opt=options)
        _check_jit_names(obj, dims, scalars)
        if shape_only:  # graph-only: the float arguments shape-only, as a case's
            with _ShapeOnlyFactories():
                return Target(spec, fn=obj, args=_synth_args(obj, dims, scalars))
        return Target(spec, fn=obj, args=_synth_args(obj, dims, scalars))
    if callable(obj):
        _reject_ignored(spec, "a callable returning a CaseRun or Program", preset=preset, mode=mode, opt=options,
                        dim=dims, scalar=scalars)
        res = obj()
        if isinstance(res, CaseRun):
            return Target(spec, case_run=res)
        if isinstance(res, Program):
            return Target(spec, program=res)
        raise ConfigError(f"{spec} returned {type(res).__name__}; expected a CaseRun or a Program")
    raise ConfigError(f"{spec} is a {type(obj).__name__}, not a kernel")


def _reject_ignored(spec: str, what: str, **given) -> None:
    """ConfigError naming the first option in ``given`` that was given (not None, not empty):
    ``spec`` is ``what``, which does not take it."""
    for key, value in given.items():
        if value not in (None, {}, [], ()):
            shown = value if not isinstance(value, dict) else " ".join(f"{k}={v!r}" for k, v in value.items())
            raise ConfigError(f"--{key} {shown} does not apply to {spec} ({what}): it would be ignored")


def _check_jit_names(jf: JitFunction, dims: dict, scalars: dict) -> None:
    """ConfigError for a ``--dim`` that is none of ``jf``'s dynamic dims or a ``--scalar``
    that is not one of its ``pl.Scalar`` parameters (naming what it is instead)."""
    sig, anns = jf.signature()
    dyn = list(dict.fromkeys(d.name for a in anns.values() if isinstance(a, TensorType) and a.dims
                             for d in a.dims if isinstance(d, DynVar)))
    for name in dims:
        if name not in dyn:
            raise ConfigError(f"--dim {name}: kernel {jf.__name__} has no dynamic dim {name!r} "
                              f"(its dynamic dims: {', '.join(dyn) or 'none'})")
    scalar_params = [n for n in sig.parameters if isinstance(anns.get(n), ScalarType)]
    for name in scalars:
        if name not in scalar_params:
            kind = ("a tensor parameter" if isinstance(anns.get(name), TensorType) else
                    "not a pl.Scalar parameter" if name in sig.parameters else "not a parameter")
            raise ConfigError(f"--scalar {name}: {name!r} is {kind} of kernel {jf.__name__} "
                              f"(its scalar parameters: {', '.join(scalar_params) or 'none'})")


def _user_named(case: KernelCase, cr: CaseRun) -> CaseRun:
    """``cr`` with its entry named after the kernel case when the entry is a pypto-style test
    wrapper (``rms_norm_test`` for the ``rms_norm`` case), so that the program's name in error
    messages, traces and DOT output is the name the user typed; other entries (an example's
    own ``@pl.jit`` function) keep theirs. The wrapper itself is not changed (a renamed
    shallow copy: same body, annotations and cached signature)."""
    fn = cr.fn
    if not (isinstance(fn, JitFunction) and fn.__name__.endswith("_test") and fn.__name__ != case.name):
        return cr
    named = copy.copy(fn)
    named.__name__ = case.name
    named.__qualname__ = f"{fn.__qualname__.rpartition('.')[0]}.{case.name}".lstrip(".")
    return replace(cr, fn=named)


class _ShapeOnlyFactories(TorchFunctionMode):
    """While active, a torch factory call (``randn``, ``zeros``, ``empty``, ``randint``, ...,
    their ``*_like`` forms; not ``arange``, whose small tables builders mix with real ones) whose result would be a float, INT8 or UINT8 tensor returns a
    shape-only (``meta``) tensor instead (no storage, the generator not drawn from); integer
    (16 bits and more) and BOOL results are made for real, as graph-only mode reads those.
    An index computed by a sort of shape-only values (``argsort``, ``sort``, ``topk``) is real:
    the values taken as ties, each row's indices in input order rotated by the row's number
    (row ``i`` starts at index ``i``), so a seeded hash table's rows send token ``t`` to experts
    ``t, t + 1, .., t + K - 1`` (mod the expert count): tokens spread evenly over the experts, as
    graph-only mode's balanced-routing assumption spreads learned routes (docs/graph_only.md),
    not every token to experts ``0 .. K-1``. Used to build a kernel case's inputs for a
    graph-only run (``--graph-only``)."""

    _SORTS = {torch.argsort: 0, torch.Tensor.argsort: 0, torch.sort: 1, torch.Tensor.sort: 1,
              torch.topk: 2, torch.Tensor.topk: 2}

    _FACTORIES = frozenset((torch.randn, torch.rand, torch.randint, torch.empty, torch.zeros, torch.ones, torch.full,
                            torch.normal, torch.randn_like, torch.rand_like, torch.randint_like, torch.empty_like,
                            torch.zeros_like, torch.ones_like, torch.full_like))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FACTORIES and "out" not in kwargs:
            kw = {k: v for k, v in kwargs.items() if k not in ("generator", "device", "pin_memory")}
            try:
                m = func(*args, **kw, device="meta")
            except (TypeError, RuntimeError):
                m = None
            if m is not None and not is_index_dtype(m.dtype):
                return m
        kind = self._SORTS.get(func)
        if kind is not None and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            res = func(*args, **kwargs)  # shape-only values and indices of the right shapes
            dim = kwargs.get("dim", args[2 if kind == 2 else 1] if len(args) > (2 if kind == 2 else 1) else -1)
            ix = res if kind == 0 else res[1]
            d = dim % ix.dim()
            n = args[0].shape[d] if args[0].dim() else 1  # the sorted extent (a topk keeps k of n)
            lane = torch.arange(ix.shape[d]).view([-1 if i == d else 1 for i in range(ix.dim())])
            rows = torch.arange(ix.numel() // max(ix.shape[d], 1)).view(
                [1 if i == d else ix.shape[i] for i in range(ix.dim())]) if ix.dim() > 1 else 0
            ties = ((lane + rows) % max(n, 1)).expand(ix.shape).contiguous()
            return ties if kind == 0 else type(res)((res[0], ties))
        return func(*args, **kwargs)


def _build_case(case: KernelCase, preset: str, mode: str, options: dict, shape_only: bool) -> CaseRun:
    """``case.build(preset, mode, **options)``; with ``shape_only`` under
    :class:`_ShapeOnlyFactories` first, again for real if the builder cannot run on shape-only
    tensors (it used a value computed from one) or an index input came out shape-only (computed
    from float data, e.g. routes from scores: graph-only mode needs index inputs real)."""
    if shape_only:
        try:
            with _ShapeOnlyFactories():
                cr = case.build(preset, mode, **options)
            if not any(isinstance(getattr(s, "init_value", None), torch.Tensor) and s.init_value.is_meta
                       and is_index_dtype(s.dtype) for s in cr.specs):
                return cr
        except Exception:  # noqa: BLE001 - whatever failed on shape-only tensors, the real build raises its own
            pass
    return case.build(preset, mode, **options)


def _check_build_options(case: KernelCase, options: dict) -> None:
    """ConfigError naming the ``--opt`` keys that ``case.build`` has no parameter for (as the
    builders that take ``**options`` report theirs), instead of Python's "unexpected keyword
    argument" TypeError; a builder taking ``**options`` checks its own."""
    try:
        params = inspect.signature(case.build).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n, p in params.items() if n not in ("preset", "mode")
             and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(k for k in options if k not in names)
    if unknown:
        raise ConfigError(f"{case.name}: unknown options {unknown} (its options: {', '.join(names) or 'none'})")
    for k, v in options.items():
        default = params[k].default
        if default is None:  # ``T: int | None = None``: the annotation says the kind (None itself is the default)
            if v is None:
                continue
            default = _annotated_kind(params[k].annotation)
        _check_option_type(case.name, k, v, default)


def _annotated_kind(ann):
    """A sample value of the kind ``ann`` names when it is ``bool``, ``int`` or ``float``, alone or
    ``| None`` (an annotation object or, under ``from __future__ import annotations``, its
    string); None for anything else (no check)."""
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", None) if isinstance(ann, type) else str(ann)
    if not text:
        return None
    kinds = {part.strip() for part in text.replace("typing.Optional[", "").rstrip("]").split("|")} - {"None"}
    return {"bool": False, "int": 0, "float": 0.0}.get(kinds.pop()) if len(kinds) == 1 else None


def _check_option_type(kernel: str, key: str, value, default) -> None:
    """ConfigError when ``--opt key=value`` is not of the kind of the builder's default: a
    boolean option takes a boolean (a misspelt ``Flase`` stays a string, which is truthy), an
    integer option an integer (not ``True``), a float option a number."""
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "a boolean (True / False)"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        return
    if not ok:
        raise ConfigError(f"{kernel}: --opt {key} expects {want}, got {value!r}")


def _default_preset(case: KernelCase, shape_only: bool) -> str:
    """The preset a kernel case runs at when ``--preset`` is not given: :data:`DEFAULT_PRESET`,
    capped at the case's ``max_preset`` as ``pto demo`` caps it (the MoE kernels at ``flash``
    hold about 13 GB and take minutes), except in graph-only mode (shape-only weights)."""
    if shape_only or case.max_preset is None:
        return DEFAULT_PRESET
    from pto.models.deepseek_v4.config import capped_preset
    return capped_preset(DEFAULT_PRESET, case.max_preset)


def _case_target(case: KernelCase, preset: str | None, mode: str | None, options: dict,
                 shape_only: bool = False) -> Target:
    if preset is not None and not case.takes_preset:
        _check_preset(preset)  # an unknown preset is named as such first
        raise ConfigError(f"--preset {preset} does not apply to kernel {case.name!r}: its builder ignores the "
                          "preset (its sizes are build options: --opt)")
    default = _default_preset(case, shape_only)
    capped = preset is None and default != DEFAULT_PRESET
    preset = default if preset is None else preset  # an empty --preset is an unknown preset, not the default
    _check_preset(preset)
    mode = case.modes[0] if mode is None else mode
    if mode not in case.modes:
        raise ConfigError(f"kernel {case.name!r} has no mode {mode!r}; modes: {', '.join(case.modes)}")
    if "seed_scopes" in options:  # a builder taking **options checks no type of its own
        _check_option_type(case.name, "seed_scopes", options["seed_scopes"], False)
    if options.get("seed_scopes") and not case.seed_variant:
        raise ConfigError(f"kernel {case.name!r} has no seed variant (seed_scopes)")
    _check_build_options(case, options)
    try:
        cr = _user_named(case, _build_case(case, preset, mode, options, shape_only))
    except TypeError as e:
        raise ConfigError(f"kernel {case.name!r}: bad options {options}: {e}") from None
    except (ConfigError, CapacityError):
        raise
    except PtoError as e:  # the inputs the options ask for cannot be built (e.g. a T above a ring): bad input
        raise ConfigError(f"kernel {case.name!r}: options {options}: {type(e).__name__}: {e}") from None
    return Target(case.name, mode, case_run=cr, note=f"({preset} preset)" if capped else "")


def add_target_args(p: argparse.ArgumentParser, function_args: bool = True) -> None:
    """The target arguments shared by run/check/graph/trace/sim/diff; ``function_args`` False
    (diff, whose variants are build options of a kernel case) leaves out ``--dim`` and
    ``--scalar``, which only a ``MODULE:FUNCTION`` target takes."""
    p.add_argument("target", help="registered kernel name, or MODULE:FUNCTION (module name or .py path)")
    p.add_argument("--preset", default=None, help=f"model preset of a kernel case (default {DEFAULT_PRESET}, or the "
                                                  "case's largest demo preset: demo for the MoE kernels)")
    p.add_argument("--mode", default=None, help="kernel mode of a kernel case (default: its first mode)")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="extra build option of a kernel case, e.g. --opt T=64 --opt seed_scopes=True")
    if not function_args:
        return
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="extent of a pl.dynamic dim (MODULE:FUNCTION targets)")
    p.add_argument("--scalar", action="append", default=[], metavar="NAME=VALUE",
                   help="value of a pl.Scalar parameter (MODULE:FUNCTION targets)")


def _target_from_args(args) -> Target:
    dims = parse_options(args.dim, "--dim")
    for k, v in dims.items():
        if not isinstance(v, int) or v < 0:
            raise ConfigError(f"--dim {k}={v!r}: extent must be a non-negative int")
    return resolve_target(args.target, args.preset, args.mode, parse_options(args.opt), dims,
                          parse_options(args.scalar, "--scalar"), shape_only=getattr(args, "graph_only", False))


# ---- formatting ------------------------------------------------------------------------

def fmt_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``count(1, "edge")`` -> ``"1 edge"``, ``count(3, "edge")`` -> ``"3 edges"`` (``plural``
    when the plural is not ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def fmt_err(x: float | None) -> str:
    """A max-error figure for tables: 3 significant digits, ``0`` for exact, ``nan``/``inf`` spelled out."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.2e}"


def _stats_table(title: str, prog: Program) -> Table:
    s = prog.stats
    t = Table(title=title, title_justify="left", show_header=True)
    t.add_column("statistic")
    t.add_column("value", justify="right")
    rows = [("tasks", s.tasks), ("join nodes", s.dummies), ("blocks", s.blocks), ("edges", s.edges),
            ("tile ops", s.tile_ops), ("GM bytes moved", fmt_bytes(s.bytes)), ("flops", f"{s.flops:,}"),
            ("heap peak", fmt_bytes(s.heap_peak_bytes)),
            ("scratch tensors", f"{s.scratch_tensors} ({fmt_bytes(s.scratch_bytes)})"),
            ("wall", f"{s.wall_us / 1e3:.2f} ms")]
    if s.graph_only:
        rows.append(("graph-only assumptions", f"{s.assumed_reads} reads, {s.assumed_footprints} footprints, "
                                               f"{s.assumed_sorts} sorts (docs/graph_only.md)"))
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def add_graph_only_arg(p: argparse.ArgumentParser) -> None:
    """``--graph-only``: run in graph-only mode (``RunConfig(execute=False)``, docs/graph_only.md)."""
    p.add_argument("--graph-only", action="store_true",
                   help="graph-only mode: record tasks, edges, footprints and heap without computing float data "
                        "(RunConfig(execute=False); docs/graph_only.md)")
    for a in p._actions:  # the preset default is the uncapped one in graph-only mode
        if "--preset" in a.option_strings:
            a.help = a.help[:-1] + f"; {DEFAULT_PRESET} with --graph-only)"


def _graph_only_title(title: str, args) -> str:
    return f"{title} (graph-only)" if getattr(args, "graph_only", False) else title


def _mode_label(mode: str, preset: str, label: str) -> str:
    """``"decode T=8"`` from mode ``decode`` and a case label such as ``"flash decode T=8"``:
    the mode once, the preset (already in the table title) left out."""
    words = [w for w in (label or "").split() if w != preset]
    if mode not in words:
        words.insert(0, mode)
    return " ".join(words)


def _first_line(msg: str, limit: int = 160) -> str:
    line = str(msg).strip().splitlines()[0] if str(msg).strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


# ---- subcommands -------------------------------------------------------------------------

def _demo_args(p):
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset of the model kernels (default "
                                                            f"{DEFAULT_PRESET})")
    p.add_argument("--group", choices=("model", "example"), default=None, help="only this group")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only these kernels")
    p.add_argument("--check", action="store_true", help="also run the sanitizer and race checker")
    add_json_arg(p)


def _fmt_margin(m) -> str:
    """A margin for tables: two decimals, ``-`` when the compare function defines none; a
    nonzero margin below 0.005 in two significant digits (``8.1e-04``, not ``0.00``, which is
    an exact match), and one just past 1 as ``>1.00`` (a failing output, not ``1.00``)."""
    if m is None:
        return "-"
    if isinstance(m, float) and not math.isfinite(m):
        return str(m)
    s = f"{m:.2f}"
    if m and s in ("0.00", "-0.00"):
        return f"{m:.1e}"
    if m > 1 and s == "1.00":
        return ">1.00"
    return s


def _worst_output(outputs: list) -> dict | None:
    """The output with the largest margin (None when no output defines one)."""
    return max((o for o in outputs if o["margin"] is not None), key=lambda o: o["margin"], default=None)


def _demo_row(case, mode: str, preset: str, args) -> dict:
    """One kernel and mode through ``run_jit``: the row of the ``pto demo`` document
    (``kernel``, ``mode``, ``preset``, ``status`` PASS / FAIL / ERROR, ``error``, ``tasks``,
    ``edges``, ``heap_peak_bytes``, ``max_abs_error``, ``kernel_ms``, ``golden_ms``,
    ``outputs``: :func:`_outputs_doc`)."""
    row = {"kernel": case.name, "mode": mode, "preset": preset, "status": "ERROR", "error": None, "tasks": None,
           "edges": None, "heap_peak_bytes": None, "max_abs_error": None, "kernel_ms": None, "golden_ms": None,
           "outputs": []}
    try:
        cr = _user_named(case, case.build(preset, mode))
        row["mode"] = _mode_label(mode, preset, cr.label) + (f" ({preset} preset)" if preset != args.preset else "")
        res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=args.check)
    except Exception as e:  # noqa: BLE001 - one failing kernel must not hide the others
        row["error"] = f"{type(e).__name__}: {_first_line(e)}"
        return row
    s = res.stats
    row.update(status="PASS" if res.passed else "FAIL", error=None if res.passed else _first_line(res.error),
               tasks=s.tasks, edges=s.edges, heap_peak_bytes=s.heap_peak_bytes, max_abs_error=res.max_abs_error,
               kernel_ms=round(res.kernel_ms, 3), golden_ms=round(res.golden_ms, 3), outputs=_outputs_doc(res))
    return row


def _demo_graph_row(preset: str) -> dict:
    """The MoE block at ``preset`` in graph-only mode (:func:`graph_only.moe_graph`: the decode
    step's rows, a learned layer, its experts' weights shape-only), a ``pto demo`` row of status
    ``GRAPH``: tasks, edges, heap peak and the build ms, no golden (the row of the MoE kernels
    whose ``max_preset`` caps their golden-checked run below ``preset``)."""
    from pto.models.deepseek_v4.graph_only import moe_graph
    row = {"kernel": "moe", "mode": f"decode ({preset} preset, graph-only)", "preset": preset, "status": "ERROR",
           "error": None, "tasks": None, "edges": None, "heap_peak_bytes": None, "max_abs_error": None,
           "kernel_ms": None, "golden_ms": None, "outputs": []}
    t0 = time.perf_counter()
    try:
        g = moe_graph(preset)
    except Exception as e:  # noqa: BLE001 - as _demo_row: one failing row must not hide the others
        row["error"] = f"{type(e).__name__}: {_first_line(e)}"
        return row
    st = g.stats
    layer = g.stages[0].name.split()[0][1:]
    row.update(mode=f"decode T={g.tokens} layer={layer} (learned) ({preset} preset, graph-only)", status="GRAPH",
               tasks=st.tasks,
               edges=st.edges, heap_peak_bytes=st.heap_peak_bytes, kernel_ms=round(1e3 * (time.perf_counter() - t0), 3))
    return row


@command("demo", "run every registered kernel against its golden and print a table", _demo_args)
def cmd_demo(args) -> int:
    """Every registered case (model kernels at ``--preset`` in each mode, and the
    examples) through ``run_jit``, with a live progress display on stderr; a table with,
    per output, the error, its tolerance and the margin as its compare function defines it
    (:func:`pto.golden.compare.margin_of`), and the golden's time beside the kernel's;
    ``--json``: ``{"preset", "check", "rows": [_demo_row ...], "passed", "total", "wall_s"}``.
    Exit 1 when anything fails."""
    from rich import box
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pto.models.deepseek_v4.config import capped_preset
    _check_preset(args.preset)
    load_kernels()
    cases = all_cases(args.group)
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in cases})
        if unknown:
            other = sorted(set(unknown) & {c.name for c in all_cases()})
            where = f" (in another group than {args.group!r}: {other})" if other else ""
            raise ConfigError(f"unknown kernel(s) {unknown}{where}; known: {sorted(c.name for c in cases)}")
        cases = [c for c in cases if c.name in args.only]
    cases.sort(key=lambda c: (c.group != "model", c.name))
    rows = []
    t_start = time.perf_counter()
    err = Console(stderr=True)  # rich's terminal test (FORCE_COLOR counts as a terminal)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True,
                  disable=args.json or not err.is_terminal) as bar:  # a bar only on a terminal (no blank line in logs)
        job = bar.add_task("pto demo", total=sum(len(c.modes) for c in cases))
        for case in cases:
            for mode in case.modes:
                preset = capped_preset(args.preset, case.max_preset) if case.group == "model" else args.preset
                bar.update(job, description=f"{case.name} {mode} ({preset})")
                rows.append(_demo_row(case, mode, preset, args))
                gc.collect()  # a finished row is reference cycles (its Program) holding its inputs: 1 GiB FLASH tables
                bar.advance(job)
            if case.group == "model" and case.name == "moe" and preset != args.preset:
                rows.append(_demo_graph_row(args.preset))  # the capped MoE at full size, graph-only
    wall_s = time.perf_counter() - t_start
    n_pass = sum(r["status"] == "PASS" for r in rows)
    n_checked = sum(r["status"] != "GRAPH" for r in rows)  # graph-only rows have no golden
    if args.json:
        from pto.views import to_json
        print(to_json({"preset": args.preset, "check": args.check, "rows": rows, "passed": n_pass,
                       "total": n_checked, "wall_s": round(wall_s, 3)}))
        return 1 if n_pass < n_checked or not rows else 0
    con = console()
    table = Table(title=f"pto demo (model preset {args.preset}, golden validation"
                        f"{', check mode' if args.check else ''})",
                  caption="heap: heap peak; error, tol(erance), margin: the worst output (each output below) as its "
                          "compare function measures it, margin = error / tolerance (at most 1 passes); ms, golden: "
                          "CPU wall ms of the kernel and of its golden"
                          + ("; graph: a graph-only row (no golden; ms: its build)" if n_checked < len(rows) else ""),
                  caption_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    for col, just in (("kernel", "left"), ("mode / output", "left"), ("tasks", "right"), ("edges", "right"),
                      ("heap", "right"), ("error", "right"), ("tol.", "right"), ("margin", "right"),
                      ("pass", "center"), ("ms", "right"), ("golden", "right")):
        table.add_column(col, justify=just, no_wrap=col != "mode / output",
                         min_width=24 if col == "mode / output" else None)
    style = {"PASS": "[green]PASS[/green]", "FAIL": "[red]FAIL[/red]", "ERROR": "[red]ERROR[/red]"}
    for r in rows:
        if r["status"] == "ERROR":
            table.add_row(r["kernel"], r["mode"], *["-"] * 6, style["ERROR"], "-", "-")
            continue
        if r["status"] == "GRAPH":
            table.add_row(r["kernel"], r["mode"], str(r["tasks"]), str(r["edges"]), fmt_bytes(r["heap_peak_bytes"]),
                          "-", "-", "-", "graph", f"{r['kernel_ms']:.1f}", "-")
            continue
        w = _worst_output(r["outputs"]) or {"error": None, "tolerance": None, "margin": None}
        table.add_row(r["kernel"], r["mode"], str(r["tasks"]), str(r["edges"]), fmt_bytes(r["heap_peak_bytes"]),
                      fmt_err(w["error"]), fmt_err(w["tolerance"]), _fmt_margin(w["margin"]), style[r["status"]],
                      f"{r['kernel_ms']:.1f}", f"{r['golden_ms']:.1f}")
        if len(r["outputs"]) > 1:
            for o in r["outputs"]:
                table.add_row("", f" └ {o['name']}", "", "", "", fmt_err(o["error"]), fmt_err(o["tolerance"]),
                              _fmt_margin(o["margin"]), "ok" if o["passed"] else "[red]fail[/red]", "", "")
    con.print(table)
    con.print(f"{n_pass}/{n_checked} passed in {wall_s:.2f} s")
    for r in rows:
        if r["status"] not in ("PASS", "GRAPH"):
            detail = f"{r['kernel']} [{r['mode']}]: {r['error']}"
            con.print(f"[red]FAIL[/red] {escape(detail)}", highlight=False)
    return 1 if n_pass < n_checked or not rows else 0


def _run_args(p):
    add_target_args(p)
    add_json_arg(p)
    add_graph_only_arg(p)


@command("run", "run a kernel once without checks and print its statistics", _run_args)
def cmd_run(args) -> int:
    """``pto run KERNEL --preset P --mode M`` or ``pto run MODULE:FUNCTION``; ``--json``:
    ``{"kernel", "stats"}`` (:func:`pto.views.stats_doc`)."""
    from pto.views import stats_doc, to_json
    target = _target_from_args(args)
    prog = target.run_program(check=False, execute=not args.graph_only)
    title = _graph_only_title(target.title, args)
    if args.json:
        print(to_json({"kernel": target.title, "stats": stats_doc(prog.stats)}))
        return 0
    console().print(_stats_table(title, prog))
    return 0


def _check_args(p):
    add_target_args(p)
    add_json_arg(p)
    p.add_argument("--drop-init", action="append", default=[], metavar="ALLOCATION",
                   help="mutation test: ignore the init_value of this allocation (pto.runtime.drop_init_values); "
                        "'all': drop each init_value of the run in turn and print a table of what caught it")
    p.add_argument("--block-order", choices=("reverse", "shuffle"), default=None,
                   help="schedule sensitivity: run the blocks of every task (and unordered atomic adds) in this "
                        "order too and compare every output bit for bit with program order")
    p.add_argument("--block-order-seed", type=int, default=None, metavar="K",
                   help="seed of --block-order shuffle (default 0)")


@command("check", "run a kernel in check mode against its golden; print PASS or the error", _check_args)
def cmd_check(args) -> int:
    """Check mode (sanitizer + race checker) and the golden comparison;
    ``--drop-init NAME`` runs it with that allocation's init_value dropped
    (``RunConfig.drop_init``: a name that drops nothing is a ConfigError). ``--json``: one
    document (:func:`_check_doc`) instead of the PASS / FAIL line."""
    if args.block_order_seed is not None and args.block_order != "shuffle":
        raise ConfigError(f"--block-order-seed seeds the --block-order shuffle; it needs --block-order shuffle "
                          f"(got {'no --block-order' if args.block_order is None else '--block-order ' + args.block_order})")
    if len(set(args.drop_init)) < len(args.drop_init):
        twice = next(n for n in args.drop_init if args.drop_init.count(n) > 1)
        raise ConfigError(f"--drop-init {twice} is given twice")
    target = _target_from_args(args)
    if args.block_order is not None:
        if args.drop_init:
            raise ConfigError("--block-order compares schedules of the kernel as it is; it takes no --drop-init")
        return _block_order_check(target, args.block_order, args.block_order_seed or 0, args.json)
    if "all" in args.drop_init:
        return _drop_init_all(target, args.drop_init, args.json)
    drop = tuple(args.drop_init)
    title = target.title
    if args.drop_init:
        title += f" (init_value dropped: {', '.join(args.drop_init)})"
    con = console()

    def emit(doc: dict, line: str) -> int:
        if args.json:
            from pto.views import to_json
            print(to_json(doc))
        else:
            con.print(line, highlight=False, markup=False)
        return 0 if doc["passed"] else 1

    try:
        if target.case_run is not None:
            cr = target.case_run
            res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=True,
                          config=RunConfig(drop_init=drop))
            doc = _check_doc(title, res.program, res.passed, None if res.passed else res.error, res)
            if not res.passed:
                return emit(doc, f"FAIL {title}: {res.error}")
            s = res.stats
            return emit(doc, f"PASS {title}: max error {fmt_err(res.max_abs_error)}, {count(s.tasks, 'task')}, "
                             f"{count(s.edges, 'edge')}, heap peak {fmt_bytes(s.heap_peak_bytes)}, "
                             f"{res.kernel_ms:.1f} ms (check mode)")
        prog = target.run_program(check=True, drop_init=drop)
    except (ConfigError, CapacityError):  # bad input (a size above a capacity): exit 2, as in `pto run`
        raise
    except PtoError as e:
        return emit(_check_doc(title, None, False, f"{type(e).__name__}: {e}"), f"FAIL {title}: {type(e).__name__}: {e}")
    return emit(_check_doc(title, prog, True, None),
                f"PASS {title}: no undefined outputs, no races ({count(prog.stats.tasks, 'task')}; no golden)")


def _outputs_doc(res) -> list:
    """Per compared output of a RunResult: ``name``, ``passed``, ``compare`` (the compare
    function's label), ``max_abs_error``, ``metric`` / ``error`` / ``tolerance`` / ``margin``
    (the margin as the compare function defines it; None when it defines none)."""
    out = []
    for o in res.outputs.values():
        m = o.margin or {}
        out.append({"name": o.name, "passed": o.passed, "compare": o.label, "max_abs_error": o.stats.get("max_abs"),
                    "metric": m.get("metric"), "error": m.get("error"), "tolerance": m.get("tolerance"),
                    "margin": m.get("margin")})
    return out


def _check_doc(title: str, prog, passed: bool, error: str | None, res=None) -> dict:
    """The ``pto check --json`` document: ``kernel``, ``passed``, ``error`` (None on a pass),
    ``golden`` (compared against a golden), ``max_abs_error``, ``tasks`` / ``edges`` /
    ``heap_peak_bytes`` (None when the run stopped at an error), ``kernel_ms`` / ``golden_ms``
    and ``outputs`` (:func:`_outputs_doc`)."""
    s = prog.stats if prog is not None else None
    return {"kernel": title, "passed": passed, "error": error, "golden": res is not None and res.validated,
            "max_abs_error": res.max_abs_error if res is not None and res.outputs else None,
            "tasks": s.tasks if s else None, "edges": s.edges if s else None,
            "heap_peak_bytes": s.heap_peak_bytes if s else None,
            "kernel_ms": round(res.kernel_ms, 3) if res is not None else None,
            "golden_ms": round(res.golden_ms, 3) if res is not None else None,
            "outputs": _outputs_doc(res) if res is not None else []}


def _block_order_check(target: Target, order: str, seed: int, as_json: bool = False) -> int:
    """``pto check KERNEL --block-order reverse|shuffle``: program order and the other schedule
    on the same inputs, both in check mode; a table of every output (bit-identical or not,
    differing elements, max abs, max ulps, through which atomic-add tasks). Exit 1 on a
    check-mode error; a schedule-sensitive output is a finding, not a failure. ``as_json``:
    ``{"kernel", "passed", "error", "order", "seed", "stable", "reordered", "outputs": [{"name",
    "identical", "differing", "numel", "max_abs", "max_ulps", "through"}]}``."""
    from pto.golden.schedule import schedule_sensitivity
    if target.program is not None:
        raise ConfigError(f"{target.name} returned a Program that was already run; --block-order needs a kernel it "
                          f"can run again (a registry kernel, a KernelCase or a @pl.jit function)")
    if target.case_run is not None:
        cr = target.case_run
        fn = cr.fn
        torch.manual_seed(0)
        vals = [s.to_python() if hasattr(s, "to_python") else s.create_tensor() for s in cr.specs]
    else:
        fn, vals = target.fn, target.args
    con = console()
    what = f"{order}{f' (seed {seed})' if order == 'shuffle' else ''}"
    try:
        rep = schedule_sensitivity(fn, vals, order, seed, check=True)
    except PtoError as e:
        if as_json:
            return _print_json({"kernel": target.title, "passed": False, "error": f"{type(e).__name__}: {e}"}, 1)
        con.print(f"FAIL {target.title}: {type(e).__name__}: {e}", highlight=False, markup=False)
        return 1
    if as_json:
        return _print_json({"kernel": target.title, "passed": True, "error": None, "order": order, "seed": seed,
                            "stable": rep.stable, "reordered": list(rep.reordered),
                            "outputs": [{"name": o.name, "identical": o.identical, "differing": o.differing,
                                         "numel": o.numel, "max_abs": o.max_abs, "max_ulps": o.max_ulps,
                                         "through": list(o.through)} for o in rep.outputs]}, 0)
    table = Table(title=f"{target.title}: block order {what} vs program order, bit for bit (check mode)")
    for col, just in (("output", "left"), ("bit-identical", "center"), ("differing", "right"),
                      ("max abs", "right"), ("max ulps", "right"), ("through atomic task(s)", "left")):
        table.add_column(col, justify=just)
    for o in rep.outputs:
        table.add_row(escape(o.name), "[green]yes[/green]" if o.identical else "[yellow]no[/yellow]",
                      f"{o.differing}/{o.numel}", fmt_err(o.max_abs), str(o.max_ulps),
                      escape(", ".join(o.through) or "-"))
    con.print(table)
    if rep.stable:
        moved = f" although the atomic adds of {', '.join(rep.reordered)} ran in another order" if rep.reordered else ""
        con.print(f"bit-stable: every output is the same under block order {what}{moved}", highlight=False,
                  markup=False)
    else:
        bad = [o.name for o in rep.outputs if not o.identical]
        con.print(f"schedule-sensitive: {', '.join(bad)} depend(s) on the order of the atomic adds of "
                  f"{', '.join(rep.reordered) or 'no task (check the block bodies for order dependence)'}",
                  highlight=False, markup=False)
    return 0


def _print_json(doc: dict, code: int) -> int:
    """Print ``doc`` as one JSON document (:func:`pto.views.to_json`) and return ``code``."""
    from pto.views import to_json
    print(to_json(doc))
    return code


def _drop_init_all(target: Target, names: list, as_json: bool = False) -> int:
    """``pto check KERNEL --drop-init all``: a passing check-mode run, then one run per
    allocation with an init_value, with it dropped; a table of what caught each (exit 1 when
    the baseline run fails). ``as_json``: ``{"kernel", "passed" (the baseline run), "error",
    "golden", "allocations": [{"name", "count", "site", "init_value", "caught", "by", "detail"}],
    "caught", "total"}``."""
    from pto.golden.mutation import drop_init_sweep
    from pto.runtime.sanitizer import short_site
    if names != ["all"]:
        raise ConfigError(f"--drop-init all drops every init_value in turn; it takes no other names (got {names})")
    if target.program is not None:
        raise ConfigError(f"{target.name} returned a Program that was already run; --drop-init all needs a kernel "
                          f"it can run again (a registry kernel, a KernelCase or a @pl.jit function)")
    cr = target.case_run
    if cr is not None:
        def run(cfg):
            return run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=True,
                           config=cfg)
    else:
        def run(cfg):
            return target.fn.run(*[a.clone() for a in target.args], config=cfg)
    con = console()
    title = target.title
    try:
        base = run(RunConfig(check=True))
    except PtoError as e:
        if as_json:
            return _print_json({"kernel": title, "passed": False, "error": f"{type(e).__name__}: {e}"}, 1)
        con.print(f"FAIL {title}: {type(e).__name__}: {e}", highlight=False, markup=False)
        return 1
    if not isinstance(base, Program):
        if not base.passed:
            if as_json:
                return _print_json({"kernel": title, "passed": False, "error": base.error}, 1)
            con.print(f"FAIL {title}: {base.error}", highlight=False, markup=False)
            return 1
        base = base.program
    rows = drop_init_sweep(run, base)
    if as_json:
        return _print_json({"kernel": title, "passed": True, "error": None, "golden": cr is not None,
                            "allocations": [{"name": r.name, "count": r.count, "site": short_site(r.site),
                                             "init_value": r.init_value, "caught": r.caught, "by": r.by,
                                             "detail": r.detail} for r in rows],
                            "caught": sum(r.caught for r in rows), "total": len(rows)}, 0)
    table = Table(title=f"{title}: each init_value dropped in turn (check mode{', golden' if cr else ''})")
    for col in ("allocation", "site", "init", "caught", "by"):
        table.add_column(col, no_wrap=True)
    prefix = f"kernel {base.name}: "
    for r in rows:
        table.add_row(escape(r.name if r.count == 1 else f"{r.name} (x{r.count})"), escape(short_site(r.site)),
                      escape(repr(r.init_value)),
                      "[green]yes[/green]" if r.caught else "[yellow]no[/yellow]", r.by or "-")
    con.print(table)
    for r in rows:
        if r.caught:
            detail = r.detail[len(prefix):] if r.detail.startswith(prefix) else r.detail
            con.print(f"  {r.name}: {detail}", highlight=False, markup=False)
    n_caught = sum(r.caught for r in rows)
    con.print(f"{n_caught} of {len(rows)} init_value(s) load-bearing (dropping them is caught); "
              f"{len(rows) - n_caught} not caught", highlight=False, markup=False)
    return 0


def add_json_arg(p: argparse.ArgumentParser) -> None:
    """``--json``: print one JSON document on stdout instead of the table (keys in docs/cli.md)."""
    p.add_argument("--json", action="store_true",
                   help="print one JSON document with the same figures instead of the table (keys: docs/cli.md)")


def _graph_args(p):
    add_target_args(p)
    p.add_argument("--footprints", action="store_true", help="list each task's coalesced footprints")
    p.add_argument("--buffer", default=None, metavar="NAME",
                   help="only footprints on this buffer, and the tasks that have some (implies --footprints)")
    p.add_argument("--task", default=None, metavar="NAME",
                   help="only the tasks with this name_hint (or id) (implies --footprints)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--dot", action="store_true", help="print the graph in Graphviz DOT (pipe into dot -Tsvg)")
    out.add_argument("--json", action="store_true",
                     help="print one JSON document with the same figures instead of the table (keys: docs/cli.md)")
    add_graph_only_arg(p)
    next(a for a in p._actions if a.dest == "target").nargs = "?"  # not with --model
    p.add_argument("--model", default=None, metavar="PRESET",
                   help="instead of a kernel: the whole DeepSeek-V4 step of this preset (flash, tiny, ...) in "
                        "graph-only mode, per-stage tasks, edges and heap (docs/graph_only.md)")
    p.add_argument("--stage", choices=("decode", "prefill", "moe"), default=None,
                   help="with --model: one decode step of the deployment's batch (default), a prefill chunk, or "
                        "one MoE block of the decode step's rows")
    p.add_argument("--tokens", type=int, default=None,
                   help="with --model --stage prefill: chunk tokens (default 128); --stage moe: rows (default the "
                        "decode step's)")
    p.add_argument("--context", type=int, default=None,
                   help="with --model: tokens each request held before the step (decode default "
                        "min(4096, max_context / 2), prefill 0)")
    p.add_argument("--layers", action="store_true", help="with --model: one row per layer stage, not per stage kind")
    p.add_argument("--ep", type=int, default=1, metavar="N",
                   help="with --model --stage decode: one rank's step at expert parallelism N (every rank its own "
                        "batch; ranks as threads)")
    p.add_argument("--rank", type=int, default=0, metavar="R", help="with --model --ep N: the rank shown (default 0)")


def _model_graph(args) -> int:
    """``pto graph --model PRESET [--stage decode|prefill] [--tokens N] [--context N] [--layers]
    [--json]`` (:mod:`pto.models.deepseek_v4.graph_only`): the step's task graph without computing
    float data; per stage kind (or per layer stage) tasks, edges, edges per task, blocks, heap
    peak, the total beside the reference device graph."""
    from pto.models.deepseek_v4.graph_only import REFERENCE_DECODE_TASKS, decode_step_graph, moe_graph, prefill_graph
    from pto.views import stats_doc, to_json
    if args.target or args.footprints or args.buffer or args.task or args.dot or args.preset or args.mode:
        raise ConfigError("pto graph --model builds the whole model step: it takes no kernel, --preset, --mode, "
                          "--footprints, --buffer, --task or --dot")
    _check_preset(args.model)
    args.stage = args.stage or "decode"
    if (args.ep != 1 or args.rank) and args.stage != "decode":
        raise ConfigError(f"pto graph --model --ep / --rank: only with --stage decode (not {args.stage})")
    if args.tokens is not None and args.stage == "decode":
        raise ConfigError("pto graph --model --tokens: only with --stage prefill or moe (a decode step's tokens are "
                          "the deployment's batch x seq): it would be ignored")
    if args.context is not None and args.stage == "moe":
        raise ConfigError("pto graph --model --context: not with --stage moe (one MoE block reads no cache): "
                          "it would be ignored")
    for opt, v, lo in (("--tokens", args.tokens, 1), ("--context", args.context, 0), ("--ep", args.ep, 1)):
        if v is not None and v < lo:
            raise ConfigError(f"pto graph --model {opt} must be an integer >= {lo}, got {v}")
    if not 0 <= args.rank < args.ep:
        raise ConfigError(f"pto graph --model --rank must be a rank of --ep {args.ep} (0 .. {args.ep - 1}), "
                          f"got {args.rank}")
    if args.stage == "decode":
        g = decode_step_graph(args.model, ep=args.ep, rank=args.rank, context=args.context)
    elif args.stage == "moe":
        g = moe_graph(args.model, tokens=args.tokens)
    else:
        g = prefill_graph(args.model, tokens=128 if args.tokens is None else args.tokens, context=args.context or 0)
    stages = g.stages if args.layers else g.by_kind()
    if args.json:
        doc = {"model": args.model, "stage": args.stage, "tokens": g.tokens, "requests": g.requests,
               "context": g.context, **({"ep": g.ep, "rank": g.rank} if g.ep > 1 else {}),
               "build_s": round(g.wall_s, 3), "stats": stats_doc(g.stats),
               "stages": [{"name": s.name, "count": s.kernels.get("layers", 1), "tasks": s.tasks, "edges": s.edges,
                           "edges_per_task": round(s.edges_per_task, 3), "blocks": s.blocks,
                           "heap_peak_bytes": s.heap_peak_bytes} for s in stages]}
        if args.stage == "decode" and g.cfg.name == "flash":
            doc["reference_tasks"] = REFERENCE_DECODE_TASKS
        print(to_json(doc))
        return 0
    lines = g.summary()
    if args.layers:
        t = Table(title=lines[0], title_justify="left")
        for col in ("stage", "tasks", "edges", "edges/task", "blocks", "heap peak"):
            t.add_column(col, justify="left" if col == "stage" else "right")
        for s in stages:
            t.add_row(escape(s.name), str(s.tasks), str(s.edges), f"{s.edges_per_task:.2f}", str(s.blocks),
                      fmt_bytes(s.heap_peak_bytes))
        console().print(t)
        lines = lines[next(i for i, ln in enumerate(lines) if ln.startswith("total")):]
    for line in lines:
        console().print(line, highlight=False, markup=False)
    return 0


@command("graph", "run a kernel and print its tasks and edges", _graph_args)
def cmd_graph(args) -> int:
    """The recorded task graph as a table (id, name, kind, blocks, core type, predecessors
    with the kinds of their edges, site; ``--footprints`` / ``--buffer`` / ``--task``: the
    footprints), as ``--json`` (:func:`pto.views.graph_doc`) or as ``--dot``
    (:func:`pto.views.graph_dot`)."""
    from pto.views import graph_doc, graph_dot, to_json
    if args.model:
        return _model_graph(args)
    if not args.target:
        raise ConfigError("pto graph: name a kernel (or MODULE:FUNCTION), or --model PRESET for the whole model step")
    for opt, given in (("--stage", args.stage is not None), ("--tokens", args.tokens is not None),
                       ("--context", args.context is not None), ("--layers", args.layers), ("--ep", args.ep != 1),
                       ("--rank", args.rank != 0)):
        if given:
            raise ConfigError(f"pto graph {opt}: only with --model PRESET (the whole model step): it would be "
                              f"ignored for a kernel")
    target = _target_from_args(args)
    prog = target.run_program(check=False, execute=not args.graph_only)
    title = _graph_only_title(target.title, args)
    if args.dot:
        if args.footprints or args.buffer or args.task:
            raise ConfigError("--dot draws the whole graph; --footprints, --buffer and --task apply to the table "
                              "and --json")
        sys.stdout.write(graph_dot(prog, title))
        return 0
    doc = graph_doc(prog, title, args.footprints, args.buffer, args.task)
    if args.json:
        print(to_json(doc))
        return 0
    kinds = {(e["from"], e["to"]): e["kinds"] for e in doc["edge_list"]}
    names = {t.id: t.name for t in prog.graph}
    table = Table(title=f"task graph of {title}: {count(doc['tasks'], 'task')}, "
                        f"{count(doc['join_nodes'], 'join node')}, {count(doc['edges'], 'edge')}")
    cols = ["id", "task", "kind", "blocks", "core", "waits for", "site"] + (["footprints"] if "footprints" in
                                                                        (doc["nodes"] or [{}])[0] else [])
    for col in cols:
        table.add_column(col, justify="right" if col in ("id", "blocks") else "left")
    for n in doc["nodes"]:
        preds = ", ".join(f"#{p} {names[p]} ({','.join(kinds[(p, n['id'])])})" for p in n["preds"]) or "-"
        row = [str(n["id"]), escape(n["name"]), n["kind"], str(n["blocks"]), n["core"], escape(preds), escape(n["site"])]
        if "footprints" in n:
            row.append(escape("\n".join(f"{f['kind']} {f['buffer']}[{f['rows'][0]}:{f['rows'][1]}, "
                                 f"{f['cols'][0]}:{f['cols'][1]}]" for f in n["footprints"]) or "-"))
        table.add_row(*row)
    console().print(table)
    return 0


def _trace_args(p):
    add_target_args(p)
    p.add_argument("--out", required=True, metavar="FILE", help="trace JSON to write (open in ui.perfetto.dev)")
    p.add_argument("--simulate", default=None, metavar="MACHINE",
                   help="trace a simulated schedule on MACHINE (a2a3 or a5) instead of the CPU run")


@command("trace", "export a Chrome/Perfetto trace of a kernel's CPU run or simulated schedule", _trace_args)
def cmd_trace(args) -> int:
    """``pto trace KERNEL --out FILE [--simulate a2a3]``: one track of CPU task
    wall times, or one track per simulated core."""
    from pto.runtime.simulate import get_machine, simulate
    from pto.runtime.trace import cpu_trace, sim_trace, write_trace
    machine = get_machine(args.simulate) if args.simulate is not None else None
    if not args.out:
        raise ConfigError("--out: an empty path")
    out = Path(args.out).resolve()  # a symbolic link: the file it names
    # before the run, which may take minutes: an existing file (or device) must be writable, a new
    # one needs a writable directory
    why = ("Is a directory" if out.is_dir() else
           ("Permission denied" if not os.access(out, os.W_OK) else None) if out.exists() else
           "No such directory" if not out.parent.is_dir() else
           "Permission denied" if not os.access(out.parent, os.W_OK) else None)
    if why:
        raise ConfigError(f"cannot write {args.out!r}: {why}")
    target = _target_from_args(args)
    prog = target.run_program(check=False)
    if machine is None:
        tr, what = cpu_trace(prog), "CPU run"
    else:
        sim = simulate(prog, machine)
        tr, what = sim_trace(sim, prog), f"simulated {machine.name}, makespan {sim.makespan_us:.2f} us"
    try:
        write_trace(tr, args.out)
    except OSError as e:
        raise ConfigError(f"cannot write {args.out!r}: {e.strerror}") from None
    n = sum(1 for e in tr["traceEvents"] if e["ph"] == "X")
    arrows = sum(1 for e in tr["traceEvents"] if e["ph"] == "s")
    console().print(f"wrote {args.out}: {count(n, 'span')}, {count(arrows, 'dependency arrow')} ({what})",
                    highlight=False, markup=False)
    return 0


def _sim_args(p):
    add_target_args(p)
    p.add_argument("--machine", default="a2a3", help="machine model: a2a3 (default) or a5")
    p.add_argument("--tasks", action="store_true",
                   help="also a per-task table: ready, start, end, slack, core type, on the critical path")
    add_json_arg(p)
    add_graph_only_arg(p)


@command("sim", "schedule a kernel's task graph on a simulated accelerator", _sim_args)
def cmd_sim(args) -> int:
    """``pto sim KERNEL [--machine a2a3|a5] [--tasks] [--json]``: AICPU orchestration, scheduler and
    effective windows, makespan, critical path, utilisation (:func:`pto.views.sim_doc`); ``--tasks``:
    per task ready, start, end, slack, core type and whether it is on the critical path
    (:func:`pto.views.sim_task_rows`), and the critical path as ids and names."""
    from pto.runtime.simulate import get_machine, simulate
    from pto.views import sim_doc, sim_task_rows, to_json
    machine = get_machine(args.machine)
    target = _target_from_args(args)
    prog = target.run_program(check=False, execute=not args.graph_only)
    sim = simulate(prog, machine)
    title = _graph_only_title(target.title, args)
    doc = sim_doc(sim, title)
    if args.tasks:
        doc["task_table"] = sim_task_rows(sim, prog)
    if args.json:
        print(to_json(doc))
        return 0
    table = Table(title=f"{title} on {machine.name}", title_justify="left",
                  caption=f"{machine.n_aic} AIC + {machine.n_aiv} AIV, estimates", caption_justify="left")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    rows = [("tasks", sim.tasks), ("join nodes", sim.dummies), ("edges", sim.edges), ("blocks", sim.blocks),
            ("init fills", f"{sim.fills} ({fmt_bytes(sim.fill_bytes)}, {sim.fill_us:.2f} us)"),
            *_sim_rows(sim)]
    for k, v in rows:
        table.add_row(k, str(v))
    con = console()
    con.print(table)
    if args.tasks:
        tt = Table(title=f"tasks of {title} on {machine.name} (us)", title_justify="left",
                   caption="slack: how much later the task could end without delaying this schedule's end (0: it "
                           "binds the end); * on the critical path (unlimited cores, idle scheduler)",
                   caption_justify="left")
        for col in ("id", "task", "core", "ready", "start", "end", "slack", "critical"):
            tt.add_column(col, justify="left" if col in ("task", "core") else "right")
        for r in doc["task_table"]:
            tt.add_row(str(r["id"]), escape(r["name"]), r["core"], f"{r['ready_us']:.2f}", f"{r['start_us']:.2f}",
                       f"{r['end_us']:.2f}", f"{r['slack_us']:.2f}", "*" if r["critical"] else "")
        con.print(tt)
        names = {t.id: t.name for t in prog.graph}
        con.print("critical path (ids): " + _path_text([f"#{i} {names[i]}" for i in sim.critical_path_ids]),
                  highlight=False, markup=False)
    con.print("critical path: " + _path_text(sim.critical_path), highlight=False, markup=False)
    return 0


def _path_text(steps, keep: int = 10) -> str:
    """A critical path as ``a -> b -> ...``; past ``2 * keep + 4`` steps its first and last ``keep``
    around ``... (N more steps) ...`` (the whole path is in ``--json``)."""
    steps = list(steps)
    if len(steps) > 2 * keep + 4:
        steps = steps[:keep] + [f"... ({len(steps) - 2 * keep} more steps) ..."] + steps[-keep:]
    return " -> ".join(steps)


def _sim_rows(sim) -> list:
    """(label, value) rows of the simulated AICPU windows, makespan, critical path and utilisation."""
    return [("orchestration window", f"{sim.orch_us:.2f} us"), ("scheduler window", f"{sim.sched_us:.2f} us"),
            ("effective (union)", f"{sim.effective_us:.2f} us"), ("makespan (cores)", f"{sim.makespan_us:.2f} us"),
            ("critical path", f"{count(sim.critical_path_tasks, 'task')}, {sim.critical_path_us:.2f} us"),
            ("AIC utilisation", f"{sim.utilisation['aic']:.1%}"), ("AIV utilisation", f"{sim.utilisation['aiv']:.1%}")]


def _diff_doc(title: str, label: list, progs: list, sims: list, machine) -> dict:
    """The ``pto diff --json`` document: ``kernel``, ``machine``, ``variants`` (the two labels),
    ``figures`` ({name: [base, other]}: tasks, edges, blocks, heap_peak_bytes, scratch_bytes,
    fills, fill_us, orch_us, sched_us, effective_us, makespan_us, critical_path_us),
    ``outputs`` ({name: bit-identical}), ``critical_path`` (names, per variant) and
    ``fill_vs_seed`` (per ``init_value`` allocation of one variant against the seed task of the
    other: buffer, bytes, fill_us, fill_cost_us, seed_task, seed_block_us, seed_cost_us,
    cheaper)."""
    from pto.runtime.simulate import fill_vs_seed
    st = [p.stats for p in progs]
    figures = {"tasks": [s.tasks for s in st], "edges": [s.edges for s in st], "blocks": [s.blocks for s in sims],
               "heap_peak_bytes": [s.heap_peak_bytes for s in st], "scratch_bytes": [s.scratch_bytes for s in st]}
    for key in ("fills", "fill_us", "orch_us", "sched_us", "effective_us", "makespan_us", "critical_path_us"):
        figures[key] = [getattr(s, key) for s in sims]
    outs = [_outputs(p) for p in progs]
    same = {n: outs[0].get(n) is not None and outs[1].get(n) is not None and _bit_identical(outs[0][n], outs[1][n])
            for n in dict.fromkeys([*outs[0], *outs[1]])}
    init_i = 0 if sims[0].fills > sims[1].fills else 1 if sims[1].fills > sims[0].fills else None
    rows = fill_vs_seed(progs[1 - init_i], progs[init_i], machine) if init_i is not None else []
    return {"kernel": title, "machine": machine.name, "variants": label, "figures": figures, "outputs": same,
            "critical_path": [list(s.critical_path) for s in sims],
            "fill_vs_seed": [{"buffer": r.buffer, "bytes": r.nbytes, "fill_us": r.fill_us,
                              "fill_cost_us": r.fill_cost_us, "seed_task": r.seed_task,
                              "seed_block_us": r.seed_block_us, "seed_cost_us": r.seed_cost_us,
                              "cheaper": r.cheaper} for r in rows]}


def _diff_args(p):
    add_target_args(p, function_args=False)
    p.add_argument("--base-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="build option of the base variant (default: none); --opt gives the other variant")
    p.add_argument("--machine", default="a2a3", help="machine model for the simulated times: a2a3 (default) or a5")
    add_json_arg(p)


def _outputs(prog: Program) -> dict:
    """{name: caller tensor} of the Out/InOut arguments of a finished run."""
    from pto.language.typing import INOUT
    return {p.name: caller for p, caller, g in prog.args if g.buf.direction in (OUT, INOUT)}


def _bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@command("diff", "two variants of a kernel side by side: graph, heap, simulated times, outputs", _diff_args)
def cmd_diff(args) -> int:
    """``pto diff KERNEL --opt seed_scopes=True``: the base build (``--base-opt``, default none)
    against the build with ``--opt``: tasks, edges, heap peak, simulated AICPU windows and
    critical path, whether every output is bit-identical; for each ``init_value`` allocation of
    one variant, its fill cost against the seed task of the other (:func:`fill_vs_seed`)."""
    from pto.runtime.simulate import fill_vs_seed, get_machine, simulate
    machine = get_machine(args.machine)
    base_opts, opts = parse_options(args.base_opt, "--base-opt"), parse_options(args.opt)
    if base_opts == opts:
        raise ConfigError(f"pto diff: both variants have the options {opts or '{}'}; give the other variant --opt")
    targets = [resolve_target(args.target, args.preset, args.mode, o) for o in (base_opts, opts)]
    progs = [t.run_program(check=False) for t in targets]
    sims = [simulate(p, machine) for p in progs]
    label = [", ".join(f"{k}={v}" for k, v in o.items()) or "base" for o in (base_opts, opts)]
    if args.json:
        return _print_json(_diff_doc(targets[0].title, label, progs, sims, machine), 0)
    table = Table(title=f"{targets[0].title}: {label[0]} vs {label[1]} (simulated {machine.name})",
                  title_justify="left", caption="simulated times are estimates; see docs/performance.md",
                  caption_justify="left")
    for h, j in (("", "left"), (label[0], "right"), (label[1], "right"), ("difference", "right")):
        table.add_column(h or "statistic", justify=j)

    def us(x: float) -> str:
        return f"{x:.2f} us"

    def count(x: int) -> str:
        return str(x)

    def row(name, a, b, fmt):
        sign = "+" if b >= a else "-"
        table.add_row(name, fmt(a), fmt(b), sign + fmt(abs(b - a)))

    st = [p.stats for p in progs]
    for name, src, attr, fmt in (
            ("tasks", st, "tasks", count), ("edges", st, "edges", count), ("blocks", sims, "blocks", count),
            ("heap peak", st, "heap_peak_bytes", fmt_bytes), ("scratch", st, "scratch_bytes", fmt_bytes),
            ("init fills", sims, "fills", count), ("AICPU fill time", sims, "fill_us", us),
            ("orchestration window", sims, "orch_us", us), ("scheduler window", sims, "sched_us", us),
            ("effective (union)", sims, "effective_us", us), ("makespan (cores)", sims, "makespan_us", us),
            ("critical path", sims, "critical_path_us", us)):
        row(name, getattr(src[0], attr), getattr(src[1], attr), fmt)
    outs = [_outputs(p) for p in progs]
    for name in dict.fromkeys([*outs[0], *outs[1]]):
        a, b = outs[0].get(name), outs[1].get(name)
        same = a is not None and b is not None and _bit_identical(a, b)
        table.add_row(escape(f"output {name}"), "", "", "bit-identical" if same else "DIFFERS")
    con = console()
    con.print(table)
    for lab, sim in zip(label, sims):
        con.print(f"critical path ({lab}): " + _path_text(sim.critical_path), highlight=False, markup=False)
    init_i = 0 if sims[0].fills > sims[1].fills else 1 if sims[1].fills > sims[0].fills else None
    if init_i is not None:
        rows = fill_vs_seed(progs[1 - init_i], progs[init_i], machine)
        ft = Table(title=f"init_value fill ({label[init_i]}) vs seed task ({label[1 - init_i]}): cost = effective "
                         f"time it adds (counterfactual runs)", title_justify="left")
        for h in ("allocation", "bytes", "AICPU fill", "fill cost", "seed task", "seed block", "seed cost",
                  "cheaper"):
            ft.add_column(h, justify="left" if h in ("allocation", "seed task", "cheaper") else "right")
        for r in rows:
            ft.add_row(escape(r.buffer), fmt_bytes(r.nbytes), us(r.fill_us), us(r.fill_cost_us),
                       escape(r.seed_task or "-"),
                       us(r.seed_block_us), us(r.seed_cost_us), r.cheaper)
        con.print(ft)
    return 0


# ---- the model: checkpoint writer and generation -------------------------------------------

def _checkpoint_args(p):
    p.add_argument("kind", choices=("tiny",), help="checkpoint to write (tiny: the tiny preset)")
    p.add_argument("dir", help="output directory (must not hold a config.json yet)")
    p.add_argument("--seed", type=int, default=0, help="weight generator seed (default 0)")
    p.add_argument("--layout", choices=("hf", "fp8"), default="hf",
                   help="hf: transformers' saved names, FP32 (default); fp8: the published "
                        "DeepSeek-V4-Flash FP8/FP4 layout")
    p.add_argument("--shards", type=int, default=1, help="number of safetensors files (default 1)")
    p.add_argument("--mtp", action="store_true",
                   help="also write the multi-token-prediction layer (mtp.0.*, the published names)")


@command("checkpoint", "write a seeded tiny DeepSeek-V4 checkpoint (Hugging Face or published FP8/FP4 layout)",
         _checkpoint_args)
def cmd_checkpoint(args) -> int:
    """``pto checkpoint tiny DIR``: :func:`write_tiny_checkpoint`; exit 2 on bad input."""
    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint

    if not args.dir:
        raise ConfigError("pto checkpoint: an empty directory name")
    try:
        root = write_tiny_checkpoint(args.dir, args.seed, layout=args.layout, shards=args.shards, mtp=args.mtp)
    except PtoError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"cannot write a checkpoint to {args.dir!r}: {e.strerror or e}") from None
    console().print(f"wrote tiny checkpoint (seed {args.seed}, layout {args.layout}"
                    f"{', with the MTP layer' if args.mtp else ''}) to {root}",
                    highlight=False, markup=False)
    return 0


def _generate_args(p):
    p.add_argument("checkpoint", help="checkpoint directory (config.json + safetensors)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input-ids", metavar='"5 17 300"', help="prompt token ids, space separated")
    src.add_argument("--input-ids-file", metavar="F",
                     help="file with one prompt per line (token ids, space separated); one request each")
    src.add_argument("--prompt", metavar="TEXT", help="prompt text, encoded with the checkpoint's tokenizer.json")
    p.add_argument("--max-new-tokens", type=int, default=8, help="new tokens per request (default 8)")
    p.add_argument("--weights", choices=("bf16", "int8"), default="bf16",
                   help="bf16: unquantised (default; BF16 kernels); int8: W8A8 quantised at load")
    p.add_argument("--chunk", type=int, default=128, help="prefill chunk in tokens (default 128)")
    p.add_argument("--backend", choices=("auto", "golden", "kernels"), default="auto",
                   help="golden: the FP32 golden forward; kernels: the DSL kernels in the --weights format; "
                        "auto (default): kernels")
    p.add_argument("--max-context", type=int, default=None,
                   help="deployment context in tokens (default: the model's, at most 16384)")
    p.add_argument("--json", action="store_true", help="print one JSON object (tokens, timings)")
    p.add_argument("--stats", action="store_true",
                   help="kernel path: per program kind the runs, tasks, edges, edges per task, heap peak, wall")
    p.add_argument("--check", action="store_true",
                   help="kernel path: run every step program in check mode (definedness sanitizer, race checker)")
    p.add_argument("--ep", type=int, default=None, metavar="N",
                   help="expert parallelism: start N ranks (torch.distributed, gloo) on this machine; under "
                        "torchrun the world size (docs/distributed.md)")
    p.add_argument("--mtp", action="store_true",
                   help="self-speculative decoding with the checkpoint's MTP layer (same tokens, fewer decode steps)")


_ID_RE = re.compile(r"[+-]?[0-9]+")  # a token id as _parse_ids takes it


def _parse_ids(text: str, where: str) -> list[int]:
    """``"5 17 300"`` (spaces or commas) -> ``[5, 17, 300]``; ConfigError naming ``where``."""
    items = text.replace(",", " ").split()
    for t in items:  # ASCII decimal digits with an optional sign: not int()'s '1_000' or other scripts' digits
        if not _ID_RE.fullmatch(t):
            raise ConfigError(f"{where}: {t!r} is not an integer token id")
    return [int(t) for t in items]


@command("generate", "greedy generation with a DeepSeek-V4 checkpoint (chunked prefill, batched decode)",
         _generate_args)
def cmd_generate(args) -> int:
    """``pto generate CHECKPOINT``: load, check the prompts, generate with a progress bar,
    print the tokens and timings. Any bad input (unreadable prompt, ids outside the
    vocabulary, empty or too long prompt, malformed checkpoint) exits 2 before any work."""
    import json

    from pto.models.deepseek_v4.ep_model import ep_launch

    ep_launch(args)  # --ep N: the option checks; the ranks start once the inputs are checked (ep_start)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pto.models.deepseek_v4.config import DeploymentConfig
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.model import GoldenModel
    from pto.models.deepseek_v4.weights import open_checkpoint

    text = None
    try:
        ckpt = open_checkpoint(args.checkpoint, args.weights)
        if args.input_ids is not None:
            prompts = [_parse_ids(args.input_ids, "--input-ids")]
        elif args.input_ids_file is not None:
            try:
                lines = Path(args.input_ids_file).read_text(encoding="utf-8-sig").splitlines()
            except OSError as e:
                raise ConfigError(f"--input-ids-file: cannot read {args.input_ids_file}: {e.strerror}") from None
            except UnicodeDecodeError as e:
                raise ConfigError(f"--input-ids-file: {args.input_ids_file} is not a text file (byte {e.start}: "
                                  f"{e.reason})") from None
            numbered = [(k + 1, _parse_ids(ln, f"{args.input_ids_file} line {k + 1}"))
                        for k, ln in enumerate(lines) if ln.strip()]
            V = ckpt.config.vocab_size
            for line, ids in numbered:  # name the line, as the parse errors do (not the request index)
                bad = next((t for t in ids if not 0 <= t < V), None)
                if bad is not None:
                    raise ConfigError(f"{args.input_ids_file} line {line}: token id {bad} is outside the "
                                      f"vocabulary [0, {V})")
            prompts = [ids for _, ids in numbered]
            if not prompts:
                raise ConfigError(f"--input-ids-file: {args.input_ids_file} holds no prompt (no line with a token id; "
                                  "one prompt per line)")
        else:
            tok_file = Path(args.checkpoint) / "tokenizer.json"
            if not tok_file.is_file():
                raise ConfigError(f"--prompt needs a tokenizer: no tokenizer.json in {args.checkpoint}")
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ConfigError("--prompt needs the 'tokenizers' package, pto's 'text' extra: "
                                  "pip install -e '.[text]' in the pto source tree "
                                  "(or pip install tokenizers)") from None
            try:
                text = Tokenizer.from_file(str(tok_file))
            except Exception as e:  # noqa: BLE001 - the tokenizers package raises a bare Exception
                raise ConfigError(f"--prompt: cannot read {tok_file}: {_first_line(e)}") from None
            prompts = [text.encode(args.prompt).ids]
        from pto.models.deepseek_v4.ep_model import generate_backend
        backend = generate_backend(args)
        if args.stats and backend != "kernels":  # the golden forward runs no programs: nothing to report
            raise ConfigError("--stats reports the kernel programs: it needs the kernel path (not --backend golden)")
        if args.chunk < 1:
            raise ConfigError(f"--chunk must be a positive integer, got {args.chunk}")
        if args.max_context is not None and args.max_context < 1:
            raise ConfigError(f"--max-context must be a positive integer, got {args.max_context}")
        if args.chunk > 128 and backend == "kernels":
            raise ConfigError(f"--chunk {args.chunk}: the kernels take at most 128 tokens per prefill chunk")
        n = args.max_context if args.max_context is not None else min(ckpt.config.max_position_embeddings, 16384)
        # pools for every prompt (at least 4 requests) of n tokens; small models get 16-row pages
        dep = DeploymentConfig.sized(ckpt.config, max(4, len(prompts)), n,
                                     block_size=16 if ckpt.config.hidden_size <= 1024 else 128)
        if backend != "kernels" and args.check:
            raise ConfigError("--check runs the kernels in check mode: it needs the kernel path (not --backend golden)")
        from pto.models.deepseek_v4.generate import check_prompts
        check_prompts(prompts, ckpt.config, dep, args.max_new_tokens)
        from pto.models.deepseek_v4.ep_model import ep_start
        code = ep_start(args, ckpt.config, dep)  # --ep N: start N ranks now (exit code); in a rank: join the world
        if code is not None:
            return code
        if backend == "kernels":
            from pto.models.deepseek_v4.layer import KernelModel
            import pto.language.distributed as pld
            from pto.models.deepseek_v4.ep_model import ep_rank_model
            if pld.world_size() > 1:  # check mode includes the cross-rank race check
                model = ep_rank_model(ckpt, dep, check=args.check)
            else:
                model = KernelModel(ckpt, dep, check=args.check)
        else:
            model = GoldenModel(ckpt, dep)
    except ConfigError:
        raise
    except PtoError as e:  # bad input: exit 2, one line
        raise ConfigError(f"{type(e).__name__}: {e}") from None

    con = console()
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                  disable=args.json or not sys.stderr.isatty()) as bar:  # a bar only on a terminal (no blank line in logs)
        task = bar.add_task("generate", total=1)

        def progress(done, total, phase):
            bar.update(task, completed=done, total=total, description=phase)

        try:
            res = generate(model, prompts, max_new_tokens=args.max_new_tokens, chunk=args.chunk,
                           progress=progress, mtp=args.mtp)
        except CheckpointError as e:  # a tensor checked when first loaded (lazily): still bad input, exit 2
            raise ConfigError(f"CheckpointError: {e}") from None
    wall = time.perf_counter() - t0
    out = {"tokens": res.tokens, "stop_reasons": res.stop_reasons,
           "prompt_tokens": [len(p) for p in prompts], "weights": args.weights,
           "backend": backend, "prefill_s": round(res.prefill_s, 6),
           "decode_ms_per_token": round(res.decode_ms_per_token, 3),
           "tokens_per_s": round(res.tokens_per_s, 3), "wall_s": round(wall, 6),
           "decode_steps": res.decode_steps}
    if args.mtp:
        out.update(mtp_drafts=res.mtp_drafts, mtp_accepted=res.mtp_accepted,
                   acceptance_rate=round(res.acceptance_rate, 4), decode_steps_saved=res.decode_steps_saved)
    if text is not None:
        out["text"] = [text.decode(t) for t in res.tokens]
    if backend == "kernels":
        out["programs"] = [{"program": k, "runs": n, "tasks": t, "edges": e, "edges_per_task": round(ept, 3),
                            "heap_peak_bytes": h, "wall_ms": round(w, 3)} for k, n, t, e, ept, h, w in model.stats.rows()]
    if args.json:
        print(json.dumps(out))
        return 0
    if args.stats and backend == "kernels":
        table = Table(title="kernel programs (per run)")
        for col in ("program", "runs", "tasks", "edges", "edges/task", "heap peak", "wall ms"):
            table.add_column(col, justify="left" if col == "program" else "right")
        for k, n, t, e, ept, h, w in model.stats.rows():
            table.add_row(k, str(n), f"{t:.0f}", f"{e:.0f}", f"{ept:.2f}", fmt_bytes(h), f"{w:.1f}")
        con.print(table)
    for r, toks in enumerate(res.tokens):
        label = f"request {r}" if len(prompts) > 1 else "tokens"
        con.print(f"{label}: {' '.join(map(str, toks))}  ({res.stop_reasons[r]})", highlight=False)
        if text is not None:  # the decoded text as it is (no rich markup in it)
            con.print(f"text: {out['text'][r]}", highlight=False, markup=False)
    # no decode step ran (every request stopped at its first token): no per-token decode rate
    decode = (f"decode {res.decode_ms_per_token:.2f} ms/token" if res.decode_steps else "no decode step")
    con.print(f"prefill {1e3 * res.prefill_s:.1f} ms ({sum(out['prompt_tokens'])} tokens), {decode}, "
              f"{res.tokens_per_s:.1f} tokens/s "
              f"({f'weights {args.weights}, DSL kernels' if backend == 'kernels' else 'golden FP32 forward'})",
              highlight=False)
    if args.mtp:
        con.print(f"MTP: {res.mtp_accepted}/{res.mtp_drafts} drafts accepted (acceptance rate "
                  f"{100 * res.acceptance_rate:.1f} %), {res.decode_steps} decode steps, "
                  f"{res.decode_steps_saved} saved", highlight=False)
    return 0


# ---- entry point -------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with one subparser per registered command."""
    parser = argparse.ArgumentParser(prog="pto", description="pto: tile DSL, CPU task-graph runtime and "
                                                             "DeepSeek-V4-Flash kernels")
    parser.add_argument("--version", action="version", version=f"pto {pto.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser._pto_sub = {}  # command name -> its parser (main reports unknown arguments with its usage)
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.configure is not None:
            cmd.configure(p)
        p.set_defaults(_handler=cmd.handler)
        parser._pto_sub[cmd.name] = p
    return parser


def _pypto_args(p):
    # FILE is optional for argparse so that a bare `pto pypto` gets our usage line (argparse
    # would say "required: file, script_args", naming the REMAINDER list as if it were needed)
    p.add_argument("file", nargs="?", metavar="FILE", help="a pypto script (e.g. a pypto-lib kernel file)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to the script")


@command("pypto", "run a pypto script as it is (pypto.language and golden served by pto, check mode)", _pypto_args)
def cmd_pypto(args) -> int:
    """``pto pypto FILE.py [ARGS...]``: see pto.compat; the exit code is the script's.

    Raises:
        ConfigError: no FILE given (exit 2 with the usage).
    """
    if args.file is None:
        raise ConfigError("pto pypto needs a pypto script to run: pto pypto FILE.py [ARGS ...] "
                          "(pypto.language served by pto, check mode; docs/porting.md)")
    from pto.compat import run_file
    return run_file(args.file, args.script_args)


def _set_threads() -> None:
    """torch intra-op threads for CLI runs: ``PTO_THREADS`` (default 1).

    Kernels are many small and mid-size tile ops; on a small shared machine
    (2 cores here) OpenMP threads spinning against other processes made runs
    10x slower and erratic, so one thread is the stable default.

    Raises:
        ConfigError: a ``PTO_THREADS`` that is not an integer from 1 to 4 x cores.
    """
    raw = os.environ.get("PTO_THREADS", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    limit = 4 * (os.cpu_count() or 1)
    if not 1 <= n <= limit:
        raise ConfigError(f"PTO_THREADS must be an integer from 1 to {limit} (4 x cores), got {raw!r}")
    torch.set_num_threads(n)


def main(argv=None) -> int:
    """Console-script entry: parse and dispatch.

    Exit codes: 0 success; 1 the kernel failed (a golden mismatch, or any
    error raised while it ran, printed as one ``error:`` line; ``PTO_DEBUG=1``
    shows the traceback); 2 bad command-line input (unknown kernel, preset,
    mode or option: a ConfigError; a size above a capacity: a CapacityError; sizes
    that exhaust the machine's memory); 130 interrupted; 141 stdout closed by its reader
    (a pipe into ``head``), nothing more printed.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # an unknown option of a command: its own usage line, not the top-level one (exit 2)
        parser._pto_sub.get(getattr(args, "command", None), parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `pto generate --ep N` gives its ranks
    if getattr(args, "_handler", None) is None:
        parser.print_help()
        return 2
    try:
        _set_threads()
        return int(args._handler(args) or 0)
    except ConfigError as e:  # the whole first line: it may list what is known (every kernel name)
        print(f"error: {_first_line(e, 4000)}", file=sys.stderr)
        return 2
    except CapacityError as e:  # a size the options ask for (--opt T=..., --dim) above a capacity: bad input
        print(f"error: CapacityError: {_first_line(e, 400)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`pto sim ... | head -1`): stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped
    except Exception as e:  # noqa: BLE001 - kernel code: one line, not a traceback
        if os.environ.get("PTO_DEBUG"):
            raise
        if _out_of_memory(e):  # the sizes asked for (--opt T=..., --dim) exhaust the machine: bad input
            print(f"error: out of memory: {_first_line(e, 400)}; ask for smaller sizes", file=sys.stderr)
            return 2
        where = "" if isinstance(e, PtoError) else " (raised by the kernel or its inputs; PTO_DEBUG=1 for the traceback)"
        notes = "; ".join(getattr(e, "__notes__", None) or ())  # e.g. the kernel, task and block it came from
        print(f"error: {type(e).__name__}: {_first_line(e, 400)}{f' ({notes})' if notes else ''}{where}",
              file=sys.stderr)
        return 1


def _out_of_memory(e: BaseException) -> bool:
    """True for a failed host allocation: ``MemoryError``, ``torch.OutOfMemoryError`` or
    torch's CPU allocator ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory")."""
    return (isinstance(e, (MemoryError, torch.OutOfMemoryError))
            or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e)))


if __name__ == "__main__":
    sys.exit(main())
