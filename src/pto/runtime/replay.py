"""The program cache: a repeated plain call of a kernel replays the torch work of a recorded run.

A decode loop calls the same kernels with the same shapes every step; every call used to run
the whole orchestration again (the DSL's Python, footprints, the task graph) for the same
torch operations. With the cache on (the default), calls of one kernel are keyed by

* the kernel, every tensor argument's shape, dtype, storage offset and which arguments share
  storage, the values of small index tensors (INT16/INT32/INT64/BOOL, at most 4096 elements:
  positions, block tables, lengths, which steer control flow and footprints), every scalar
  argument's value (a float by its bit pattern: ``-0.0`` is not ``0.0``, a NaN is its own
  NaN), every pass-through (unannotated) argument's value when it is immutable (None, bool,
  int, float, complex, str, bytes, tuples, named tuples and frozensets of such values, frozen
  dataclasses whose fields are such values, enums, DSL and torch dtypes, and functions,
  modules and classes by identity), ``RunConfig.heap_bytes`` and whether the pypto
  compatibility mode is on. A call with any other pass-through value (a list, a dict, a
  mutable object, a tensor not bound as ``pl.Tensor``) could change between calls without
  changing the key: it always runs plain (``cache_info()["unkeyable"]``). The cache keeps the
  ``set_program_cache_size()`` most recently used keys (256 by default) and forgets the least
  recently used one beyond that (``cache_info()["evicted"]``);

and go through three stages per key:

1. first call: a plain run (``Program.execute``);
2. second call: a plain run recorded by a ``torch.overrides.TorchFunctionMode``: every torch
   operation the program runs (tile loads and stores, tile math, heap views, init fills), with
   the argument tensors, the heap's backing buffer and each operation's results as numbered
   values. Metadata queries (shape, dtype, strides, ...) are left out: they are fixed by the key.
   Every Python value an operation hands back to the program (``item``, ``bool``, ``tolist``:
   ``pl.read`` and data-dependent control flow) becomes a guard, and so does the result shape of
   an operation whose shape depends on data (``nonzero``, boolean-mask indexing, ...). The
   recording is turned into straight-line Python (one call per operation, results in registers
   reused after their last use);
3. later calls: the arguments are bound and checked as for a plain run, Out/InOut arguments get
   private copies, the straight-line code runs, outputs are copied back. A guard that sees
   another value (another control path or another data-dependent footprint) stops the replay
   (only private copies and heap scratch were written) and the call runs as a plain run; a key
   whose replays diverge three times in a row goes back to plain runs for good.

Results are bit-identical to a plain run: the same torch operations run on the same values in
the same order. The replayed program's ``graph``, ``buffers`` and ``stats`` are the recorded
run's (the graph is rebuilt on first access with this call's buffers; ``wall_us`` is this
call's, ``task_wall_us`` and ``Task.wall_ns`` are the recording's). Not cached, always a plain
run: check mode, any RunConfig field other than ``heap_bytes`` off its default,
``pto.runtime.drop_init_values`` active, a distributed world of more than one rank, a program
that raised, and a recording that saw something replay cannot reproduce (an operation with a
``generator=``, an in-place write into a tensor the program did not create or receive, a
non-plain Python result, an operation that raised). The orchestration must be a function of
the key and of the values it reads from tensors (what a kernel is anyway); a kernel whose
Python reads other mutable state (a global flag, the clock) must run with the cache off:
``pto.runtime.set_program_cache(False)`` or ``PTO_PROGRAM_CACHE=0`` in the environment.
``pto.runtime.clear_program_cache()`` forgets every recording.

Parametric recordings (opt-in: ``with parametric_replay():``, :func:`set_parametric_replay` or
``PTO_PARAMETRIC_REPLAY=1``; runtime/symbolic.py) serve calls whose index data differ:

* the key leaves out the values of small index tensors (an entry under such a key is
  *parametric*); the recording returns every ``int`` / ``float`` a program reads from a tensor
  (``item``, ``tolist``; not BOOL data) as a :class:`~pto.runtime.symbolic.Sym` holding the value
  and an expression over the recording's reads. Arithmetic stays symbolic (integer sums of reads
  simplify: ``(p + 4) - p`` is the int 4); a torch call handed a symbol (directly, in a list, a
  tuple or a slice) records the expression, which the replay evaluates from its own reads;
* guards, checked in program order by the replay: a comparison and ``bool`` by the outcome,
  ``__index__`` (list indexing, ``range``), ``int``, ``float``, ``hash``, ``str`` and a
  ScalarValue's ``value`` (the DSL's scalar tile operands, ``pl.full``) by the exact value and
  type (a float with its sign); the shape and strides of a torch result made with symbolic
  arguments; where a view at a symbolic offset starts, when the program asks
  (``storage_offset``, ``data_ptr``). A long expression (a running sum) is computed into a
  register of its own;
* footprints, block counters, buffer offsets and statistics computed from reads stay symbolic
  in the recorded template: a replay's ``graph`` evaluates them with its reads, groups and
  coalesces each task's boxes as ``Program.end_task`` does and derives its edges afresh, so it
  equals a plain run's graph; the recorded program itself gets plain numbers;
* the runtime's own task bookkeeping (grouping, coalescing, derivation) runs without guards: a
  replay redoes it from its footprints;
* a symbol answers ``isinstance`` as its number (its ``__class__`` is ``int`` / ``float``); kernel
  Python that could still tell it apart (``type(v)``, ``id(v)``, ``v is w``: code outside pto's DSL
  and runtime, torch and the standard library, examined at its first call by the recording's
  ``sys.settrace`` hook; symbolic.observes_identity) stops the recording before it runs: the
  call runs plain and the key goes back to exact keys; so does a recording started while a
  trace function (a debugger, coverage) is on;
* a recording that raises (a DSL path that does not take a symbol) is dropped and the call runs
  plain (the caller's tensors are untouched until a run succeeds); a recording that takes more
  than ``_GUARD_BUDGET`` guards or ``_EXACT_BUDGET`` exact ones stops there and the call runs
  plain (going on under the recorder would cost more than a plain run); in both cases
  and at the first divergence of a recording that never replayed the key goes back to exact
  keys (the non-parametric behaviour above); three divergences in a row, too.

``PTO_REPLAY_DEBUG=1`` keeps where each guard was taken; the latest divergences, recordings that
gave up (and why) and each recording's most frequent guard sites are in ``_DIVERGED_AT`` (kernel,
text), every guard of a kernel's latest recording counted by kind and site in ``_GUARD_SITES``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import os
import struct
import sys
import threading
import time
import types
import weakref
from collections import OrderedDict

import torch
from torch.overrides import TorchFunctionMode

from pto.errors import DslError
from pto.language import _ctx
from pto.language import compat_ops as _compat
from pto.language import distributed as _pld
from pto.language.dtypes import DType
from pto.language.jit import bind_arguments
from pto.language.tensor_ops import GMTensor
from pto.language.typing import IN, INOUT, OUT, ScalarType, TensorType
from pto.runtime.deps import LazyDerivation, group_footprints
from pto.runtime.graph import Block, Task, TaskGraph
from pto.runtime.heap import RingHeap
from pto.runtime.program import (_COUNTED, Program, ProgramStats, RunConfig, _gc_pause, _gc_resume,
                                  check_written_aliasing, written_overlap)
from pto.runtime.sanitizer import active_drop_init as _active_drop_init
from pto.runtime.symbolic import NAMESPACE as _SYM_NS
from pto.runtime.symbolic import Sym, concrete_of, evaluate, has_sym, observes_identity, source

__all__ = ["run", "set_program_cache", "set_program_cache_size", "program_cache_enabled", "clear_program_cache",
           "cache_info", "set_parametric_replay", "parametric_replay", "parametric_replay_enabled",
           "program_cache_bypass"]

_ENABLED = [os.environ.get("PTO_PROGRAM_CACHE", "1") not in ("0", "false", "off", "no")]
_PARAMETRIC = [os.environ.get("PTO_PARAMETRIC_REPLAY", "0") not in ("0", "false", "off", "no", "")]
_BYPASS = [False]  # program_cache_bypass: calls run plainly, the cache kept as it is
_MAX_ENTRIES = [256]  # keys kept, least recently used forgotten first (set_program_cache_size)
_MAX_DIVERGED = 3
_GUARD_BUDGET = 8_000  # guards on values read from data a parametric recording may take (else it gives up)
_EXACT_BUDGET = 512  # of those, guards on an exact value
_CACHE: OrderedDict = OrderedDict()
_OBSERVES: dict = {}  # code object -> why it could tell a Sym from its number (None: it cannot)
_LOCK = threading.Lock()
_INFO = {"plain": 0, "recorded": 0, "replayed": 0, "diverged": 0, "uncacheable": 0, "errors": 0, "unkeyable": 0,
         "evicted": 0}


def set_program_cache(enabled: bool) -> None:
    """Turn the program cache on or off for every later call (on by default; off also when the
    environment has ``PTO_PROGRAM_CACHE=0``). Turning it off forgets every recording.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_program_cache(enabled): expected True or False, got {enabled!r}")
    _ENABLED[0] = enabled
    if not enabled:
        clear_program_cache()


def set_parametric_replay(enabled: bool) -> None:
    """Turn parametric recordings on or off (off by default; on from the start with
    ``PTO_PARAMETRIC_REPLAY=1`` in the environment). On, the values of small index tensors leave
    the key and the numbers a program reads from data are symbols with guards (module
    docstring); off, they are part of the key and every read is guarded by its exact value.
    Recordings of either kind are kept (their keys differ).

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_parametric_replay(enabled): expected True or False, got {enabled!r}")
    _PARAMETRIC[0] = enabled


def parametric_replay_enabled() -> bool:
    """True when new calls are keyed and recorded parametrically (see :func:`set_parametric_replay`)."""
    return _PARAMETRIC[0]


class _Switch:
    """Base of the runtime's ``with`` switches (:class:`parametric_replay`, and
    ``blocks.block_templates``): a subclass names its one-element flag list ``_flag`` and its
    name ``_what`` (for the error). ``enabled`` holds inside the block; the previous setting
    comes back after it.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """

    _flag: list
    _what: str

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"{self._what}(enabled): expected True or False, got {enabled!r}")
        self.enabled = enabled
        self.saved = None

    def __enter__(self):
        self.saved = self._flag[0]
        self._flag[0] = self.enabled
        return self

    def __exit__(self, *exc):
        self._flag[0] = self.saved
        return False


class parametric_replay(_Switch):  # noqa: N801 - used like a function: ``with parametric_replay():``
    """``with pto.runtime.parametric_replay():`` turns parametric recordings on (``enabled=False``:
    off) for the calls inside the block and restores the previous setting after it.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """

    _flag, _what = _PARAMETRIC, "parametric_replay"


class program_cache_bypass(_Switch):  # noqa: N801 - used like a function: ``with program_cache_bypass():``
    """``with pto.runtime.replay.program_cache_bypass():`` runs the calls inside the block as plain
    runs without the program cache's key and lookup (``enabled=False``: through the cache as
    usual), keeping every recording (``set_program_cache(False)`` forgets them) and counting
    nothing in :func:`cache_info`. For calls whose exact key cannot hit (a decode step's positions
    and tables change every step): the key's hashing is all they would get from the cache.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """

    _flag, _what = _BYPASS, "program_cache_bypass"


def set_program_cache_size(max_entries: int) -> None:
    """Keep at most ``max_entries`` keys (256 by default): a new key beyond that forgets the least
    recently used one and its recording, so a long run with ever new keys (decode positions)
    keeps a bounded cache. Lowering the bound forgets the oldest keys at once.

    Raises:
        TypeError: ``max_entries`` is not an int.
        ValueError: ``max_entries`` is smaller than 1.
    """
    if type(max_entries) is not int:
        raise TypeError(f"set_program_cache_size(max_entries): expected an int, got {max_entries!r}")
    if max_entries < 1:
        raise ValueError(f"set_program_cache_size(max_entries): expected at least 1, got {max_entries}")
    with _LOCK:
        _MAX_ENTRIES[0] = max_entries
        _evict()


def _evict() -> None:
    """Forget the least recently used keys beyond the bound (the caller holds _LOCK)."""
    while len(_CACHE) > _MAX_ENTRIES[0]:
        _CACHE.popitem(last=False)
        _INFO["evicted"] += 1


def program_cache_enabled() -> bool:
    """True when repeated plain calls are recorded and replayed (see the module docstring)."""
    return _ENABLED[0]


def clear_program_cache() -> None:
    """Forget every recorded program: the next call of each kernel is a first call again."""
    with _LOCK:
        _CACHE.clear()
        for k in _INFO:
            _INFO[k] = 0


def cache_info() -> dict:
    """Counters since the last clear: ``plain`` (calls run as plain programs, recordings not
    counted), ``recorded``, ``replayed``, ``diverged`` (replays stopped by a guard or an error,
    then run plain), ``errors`` (of those, replays stopped by an exception), ``uncacheable``
    (recordings that could not be replayed), ``unkeyable`` (calls run plain because a pass-through
    argument is not an immutable value), ``evicted`` (keys forgotten by the size bound) and
    ``entries`` (keys held now)."""
    with _LOCK:
        return dict(_INFO, entries=len(_CACHE))


_DEBUG = os.environ.get("PTO_REPLAY_DEBUG", "0") not in ("0", "")
_DIVERGED_AT: list = []  # (kernel, guard site) of the latest divergences (PTO_REPLAY_DEBUG=1)


_GUARD_SITES: dict = {}  # kernel -> Counter {(guard kind, site): count} of its latest recording (PTO_REPLAY_DEBUG=1)
_GUARD_KIND = {6: "outcome", 7: "exact", 8: "shape", 2: "data shape"}


def _note_guards(kernel: str, rec) -> None:
    """Keep the guards recorder ``rec`` took, counted by kind and site, in ``_GUARD_SITES[kernel]``
    and the most frequent ones in ``_DIVERGED_AT`` (PTO_REPLAY_DEBUG=1: a site is the innermost
    and outermost of the four frames ``_stack`` keeps; a torch call's site starts with its name)."""
    import collections
    c: collections.Counter = collections.Counter()
    for i, op in enumerate(rec.ops):
        kind = _GUARD_KIND.get(op[4])
        if kind is not None:
            site = rec.sites.get(i, "?").split(" < ")
            c[(kind, site[0] if len(site) == 1 else f"{site[0]} < {site[-1]}")] += 1
    _GUARD_SITES[kernel] = c
    _DIVERGED_AT.append((kernel, f"guards by site: {c.most_common(12)}"))


def _stack() -> str:
    import traceback
    fr = [f for f in traceback.extract_stack()[:-3] if "/pto/runtime/" not in f.filename]
    return " < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in fr[-4:][::-1])


class _GiveUp(BaseException):
    """A parametric recording past its guard budget stops the run (internal; a BaseException so
    that a kernel's ``except Exception`` does not swallow it)."""


class _Diverged(Exception):
    """A replay guard saw another value than the recording (internal)."""


# ---- the key ------------------------------------------------------------------------------------
_PLAIN = (int, float, str, bool, type(None))


def _plain_value(v) -> bool:
    t = type(v)
    if t in _PLAIN:
        return True
    return t is tuple and all(_plain_value(x) for x in v)


_INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.bool)
_INDEX_NUMEL = 4096
_ATOMS = (int, str, bool, bytes, type(None))
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, enum.Enum, DType, torch.dtype)


class _Unkeyable(Exception):
    """A pass-through argument that may change without changing its key (internal)."""


def _value_key(v, keep: list, depth: int = 0):
    """The key part of an immutable value (see the module docstring): floats by their bits, tuples,
    frozensets and frozen dataclasses by their items, functions, modules, classes, enums and dtypes
    by identity (kept alive in ``keep``). Raises _Unkeyable for anything else."""
    t = type(v)
    if t is float:
        return (float, struct.pack("<d", v))
    if t in _ATOMS:
        return (t, v)
    if t is complex:
        return (complex, struct.pack("<dd", v.real, v.imag))
    if depth > 32:
        raise _Unkeyable("nested too deep")
    if t is tuple:
        return (tuple, tuple(_value_key(x, keep, depth + 1) for x in v))
    if t is frozenset:
        return (frozenset, frozenset(_value_key(x, keep, depth + 1) for x in v))
    if isinstance(v, _BY_IDENTITY):
        keep.append(v)
        return ("id", id(v))
    if isinstance(v, tuple) and hasattr(t, "_fields") and not hasattr(v, "__dict__"):  # a named tuple
        keep.append(t)
        return (("id", id(t)), tuple(_value_key(x, keep, depth + 1) for x in v))
    params = getattr(t, "__dataclass_params__", None)
    if params is not None and params.frozen:
        keep.append(t)
        return (("id", id(t)), tuple(_value_key(getattr(v, f.name), keep, depth + 1) for f in dataclasses.fields(v)))
    raise _Unkeyable(t.__name__)


def _key(jf, params, cfg, exact: bool = True):
    """The cache key of a call, with the objects kept alive so that their ids stay theirs;
    (None, None) when the call cannot be keyed (a non-contiguous tensor: the plain run reports
    it) and ``(None, "unkeyable")`` when a pass-through argument is not an immutable value."""
    parts = []
    keep = [jf]
    storages: dict = {}
    for p in params:
        v = p.value
        if isinstance(p.ann, TensorType):
            if not v.is_contiguous():
                return None, None
            sp = v.untyped_storage().data_ptr()
            part = (tuple(v.shape), v.dtype, v.storage_offset(), v.requires_grad, storages.setdefault(sp, len(storages)))
            if exact and v.dtype in _INDEX_DTYPES and v.numel() <= _INDEX_NUMEL:
                # small index data (positions, block tables, lengths) steers control and footprints:
                # its values are part of the key, so a call with other positions is not even tried
                part += (tuple(v.reshape(-1).tolist()),)
            parts.append(part)
        else:
            try:
                parts.append(_value_key(v, keep))
            except _Unkeyable:
                return None, "unkeyable"
    return (id(jf), tuple(parts), cfg.heap_bytes, _compat.mode.pypto, exact), keep


def _cacheable_config(config):
    """The validated RunConfig of a call when the cache may serve it, else None."""
    if config is None:
        return _DEFAULT_CONFIG
    if type(config) is not RunConfig:
        return None
    try:
        config.validate()
    except Exception:  # noqa: BLE001 - the plain run reports it
        return None
    if config != RunConfig(heap_bytes=config.heap_bytes):
        return None
    return config


_DEFAULT_CONFIG = RunConfig()


def _world_size() -> int:
    try:
        return _pld.world_size()
    except Exception:  # noqa: BLE001 - no distributed runtime
        return 1


# ---- the cache entry ----------------------------------------------------------------------------
class _Entry:
    __slots__ = ("state", "trace", "keep", "diverged", "param", "replays")

    def __init__(self, keep, param: bool):
        # seen once -> "trace" (replayable) or "off" (plain runs only); a parametric key whose
        # recording failed or whose replays diverge goes "exact": its calls use the exact keys
        self.state = "seen"
        self.trace = None
        self.keep = keep
        self.diverged = 0
        self.replays = 0
        self.param = param


def _lookup(key, keep, param: bool):
    """The entry of ``key`` (None when it was not there: it is made now)."""
    with _LOCK:
        ent = _CACHE.get(key)
        if ent is None:
            _CACHE[key] = _Entry(keep, param)
            _evict()
        else:
            _CACHE.move_to_end(key)
    return ent


def run(jf, args, kwargs, config) -> Program:
    """Run ``@pl.jit`` function ``jf`` (the runtime's program factory): a plain run, a recorded
    run or a replay (see the module docstring). Raises what a plain run raises."""
    cfg = _cacheable_config(config) if _ENABLED[0] and not _BYPASS[0] else None
    if cfg is None or _ctx.state.program is not None:
        return Program(jf, config).execute(args, kwargs)
    if _active_drop_init() or _world_size() > 1:
        return Program(jf, config).execute(args, kwargs)
    try:
        params = bind_arguments(jf, args, kwargs, gm=False)
    except Exception:  # noqa: BLE001 - the plain run raises it with its context
        return Program(jf, config).execute(args, kwargs)
    param = _PARAMETRIC[0]
    key, keep = _key(jf, params, cfg, exact=not param)
    if key is None:
        if keep == "unkeyable":
            _count("unkeyable")
        return Program(jf, config, params).execute(args, kwargs)
    ent = _lookup(key, keep, param)
    if ent is not None and ent.state == "exact":  # parametric replay failed for this key: keyed by values
        key, keep = _key(jf, params, cfg, exact=True)
        ent = _lookup(key, keep, False)
    if ent is None or ent.state == "off":
        _count("plain")
        return Program(jf, config, params).execute(args, kwargs)
    if ent.state == "seen":
        return _record(ent, jf, args, kwargs, config, params)
    prog = _replay(ent.trace, jf, params, cfg)
    if prog is not None:
        ent.diverged = 0
        ent.replays += 1
        _count("replayed")
        return prog
    ent.diverged += 1
    if ent.diverged >= _MAX_DIVERGED or ent.param and ent.replays == 0:
        # a parametric recording that never replayed goes to the exact keys at its first divergence
        ent.state, ent.trace = ("exact" if ent.param else "off"), None
    _count("diverged")
    return Program(jf, config, params).execute(args, kwargs)


def _count(what: str) -> None:
    with _LOCK:
        _INFO[what] += 1


def _record(ent: _Entry, jf, args, kwargs, config, params) -> Program:
    """The second call of a key: a plain run under the recorder; keeps the trace if it can be replayed.
    ``params``: the call's bound arguments (``bind_arguments``)."""
    rec = _Recorder(ent.param)
    proxy = copy.copy(jf)
    proxy.fn = rec.wrap(jf.fn)
    if not ent.param:
        prog = Program(proxy, config, params)
        try:
            prog.execute(args, kwargs)
        finally:
            prog.jf = jf
    else:
        # the blocks keep their raw footprints (a replay groups its own evaluated boxes from them);
        # the runtime's task bookkeeping decides on the recording's numbers without guards
        prog = Program(proxy, dataclasses.replace(config or _DEFAULT_CONFIG, keep_footprints=True))
        end_task = prog.end_task

        def quiet_end_task(task, ok):
            rec.quiet += 1
            try:
                end_task(task, ok)
            finally:
                rec.quiet -= 1
        prog.end_task = quiet_end_task
        try:
            prog.execute(args, kwargs)
        except _GiveUp:  # past the guard budget: a plain run (the caller's tensors are untouched)
            if _DEBUG:
                _DIVERGED_AT.append((jf.__name__, f"gave up: {rec.bad}"))
                _note_guards(jf.__name__, rec)
            ent.state = "exact"
            _count("uncacheable")
            return Program(jf, config).execute(args, kwargs)
        except Exception as e:  # noqa: BLE001 - a plain run (the caller's tensors are untouched) raises it
            if _DEBUG:
                import traceback
                _DIVERGED_AT.append((jf.__name__, "recording raised: " + "".join(
                    traceback.format_exception(type(e), e, e.__traceback__)[-6:])))
            ent.state = "exact"
            _count("uncacheable")
            return Program(jf, config).execute(args, kwargs)
        finally:
            prog.jf = jf
            del prog.end_task
            prog.config = config or _DEFAULT_CONFIG
    _gc_pause()  # building the trace makes many small objects next to a large graph: no collections meanwhile
    try:
        trace = rec.finish(prog)
    except _Unreplayable as e:
        trace, rec.bad = None, str(e)
    finally:
        _gc_resume()
    if ent.param and (trace is None or not trace.template.symbolic):
        _concretize_program(prog)
    if trace is None:
        if _DEBUG:
            _DIVERGED_AT.append((jf.__name__, f"unreplayable: {rec.bad}"))
        ent.state = "exact" if ent.param else "off"
        _count("uncacheable")
    else:
        ent.trace, ent.state = trace, "trace"
        _count("recorded")
    return prog


# ---- recording ----------------------------------------------------------------------------------
class _V:
    """A recorded tensor value (its number) inside an argument template."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _Seq:
    """A list or tuple argument holding recorded tensors."""

    __slots__ = ("kind", "items")

    def __init__(self, kind, items):
        self.kind = kind
        self.items = items


class _X:
    """An argument computed from scalar reads: its expression (runtime/symbolic.py)."""

    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n


class _Sl:
    """A slice argument whose bounds are templates."""

    __slots__ = ("start", "stop", "step")

    def __init__(self, start, stop, step):
        self.start, self.stop, self.step = start, stop, step


class _Unreplayable(Exception):
    """The recorded run did something a replay cannot reproduce (internal)."""


_META = frozenset((
    "shape", "dtype", "device", "size", "stride", "dim", "ndim", "numel", "nelement", "element_size",
    "storage_offset", "is_contiguous", "is_floating_point", "is_complex", "is_signed", "data_ptr", "requires_grad",
    "layout", "itemsize", "nbytes", "names", "is_sparse", "is_quantized", "is_meta", "is_cuda", "is_cpu", "__len__",
    "untyped_storage", "_version", "_is_view", "is_leaf", "grad_fn", "is_inference", "get_device", "is_nested", "is_mkldnn"))
_INPLACE_DUNDER = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                             "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"))
_DATA_SHAPE = frozenset(("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "repeat_interleave",
                         "nonzero_static", "bincount"))
_KIND: dict = {}  # func -> (name, kind): 0 metadata, 1 operation, 2 in-place operation, 3 data-dependent shape


def _func_kind(func):
    k = _KIND.get(func)
    if k is None:
        name = getattr(func, "__name__", "")
        if name == "__get__":
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if name in _META:
            kind = 0
        elif name in _INPLACE_DUNDER or (name.endswith("_") and not name.endswith("__")):
            kind = 2
        elif name in _DATA_SHAPE:
            kind = 3
        else:
            kind = 1
        k = _KIND[func] = (name, kind)
    return k


def _plain_result(v) -> bool:
    t = type(v)
    if t in _PLAIN or t is torch.Size or t is torch.dtype:
        return True
    if t is tuple or t is list:
        return all(_plain_result(x) for x in v)
    return False


class _Recorder(TorchFunctionMode):
    """Records the torch operations of one program run (see the module docstring)."""

    def __init__(self, param: bool = False):
        super().__init__()
        self.ids: dict = {}  # id(tensor) -> (weakref, value number)
        self.nvals = 0
        self.inputs: list = []  # value numbers of the GM argument data, then the heap storage
        self.consts: dict = {}  # value number -> tensor made before the run (kept by reference)
        self.protected: set = set()  # storage pointers the program must not write (In arguments, constants)
        self.ops: list = []  # (func, args template, kwargs template, outputs, guard kind, guard value, big outputs)
        self.bad = None
        self.ret = None
        self.param = param  # scalar reads come back as Sym (a parametric recording)
        self.active = False  # guards are recorded only while the kernel body runs
        self.quiet = 0  # > 0: inside the runtime's task bookkeeping (its decisions are redone at replay)
        self.saw = False  # the current operation's arguments hold a Sym
        self.reads: list = []  # value numbers of the scalar reads (item / tolist results)
        self.sites: dict = {}  # op index -> where the program took that guard (PTO_REPLAY_DEBUG=1)
        self.pending = None  # an __index__ guard waiting for the next event (pending_index)
        self.otaint: set = set()  # value numbers of views whose storage offset may follow from reads
        self.nguards = self.nexact = 0

    def pending_index(self, node, v, frame, lasti) -> None:
        """``__index__`` of a symbol called from bytecode ``lasti`` of ``frame``: an exact guard,
        unless the next event is a torch call made by that same instruction (torch's argument
        parser; the call records the expression instead)."""
        self.flush()
        self.pending = (node, v, frame, lasti)

    def flush(self) -> None:
        """Turn a pending ``__index__`` into its exact guard."""
        p = self.pending
        if p is not None:
            self.pending = None
            self.guard_exact(p[0], p[1])

    def materialize(self, node):
        """A register computing expression ``node`` at replay; returns its leaf."""
        self.flush()
        v = self.nvals
        self.nvals += 1
        self.reads.append(v)
        self.ops.append((None, (), {}, v, 9, node, ()))
        return ("R", v)

    def _budget(self, exact: bool) -> None:
        """Count a guard; past a budget the recording gives up (raises _GiveUp: the call then runs
        plain) and the key goes back to exact keys. Many guards replay slowly; many exact
        ones (a program steering by the values it reads: routing, per-value Python lists) mean
        the next call's reads most likely take another path."""
        self.nguards += 1
        if exact:
            self.nexact += 1
        if self.nguards > _GUARD_BUDGET or self.nexact > _EXACT_BUDGET:
            self.bad = (f"more than {_GUARD_BUDGET} guards" if self.nguards > _GUARD_BUDGET else
                        f"more than {_EXACT_BUDGET} exact guards") + " on values read from data"
            self.active = False
            raise _GiveUp(self.bad)  # the run stops here; the call runs plain (cheaper than going on recorded)

    def guard_outcome(self, node, out: bool) -> None:
        """A guard: expression ``node`` (a comparison) had the outcome ``out``."""
        self.flush()
        self._budget(False)
        if _DEBUG:
            self.sites[len(self.ops)] = _stack()
        self.ops.append((None, (), {}, None, 6, (node, out), ()))

    def guard_exact(self, node, v) -> None:
        """A guard: expression ``node`` had the value ``v`` (the program used it as a Python number)."""
        if self.pending is not None:
            self.flush()
        self._budget(True)
        if _DEBUG:
            self.sites[len(self.ops)] = _stack()
        self.ops.append((None, (), {}, None, 7, (node, v), ()))

    def _symbolic(self, res, v: int, path: tuple):
        """The read result ``res`` (a number or nested lists of numbers) as Syms of read ``v``."""
        t = type(res)
        if t is list:
            return [self._symbolic(x, v, path + (k,)) for k, x in enumerate(res)]
        if t is int or t is float:
            return Sym(res, ("L", v, path) if path else ("R", v), self)
        return res

    def wrap(self, fn):
        """``fn`` (the kernel body) run under this recorder, its GM arguments and the heap as inputs."""
        rec = self

        def recorded(*values):
            prog = _ctx.state.program
            for v in values:
                if isinstance(v, GMTensor):
                    rec.inputs.append(rec._new(v.data))
                    if v.buf.readonly:
                        rec.protected.add(v.data.untyped_storage().data_ptr())
            rec.inputs.append(rec._new(prog.heap.storage))
            watch = rec.param  # a parametric recording hands Syms to the kernel's Python: watch what it runs
            if watch:
                if sys.gettrace() is not None:  # a debugger or coverage is on: the watch cannot run, no symbols
                    rec.bad = "a trace function was on (sys.settrace): parametric recordings need that hook"
                    raise _GiveUp(rec.bad)
                sys.settrace(rec.watch)
            rec.active = True
            try:
                with rec:
                    ret = fn(*values)
                rec.flush()
            finally:
                rec.active = False
                if watch:
                    sys.settrace(None)
            rec.ret = ret
            return ret
        return recorded

    def watch(self, frame, event, arg):
        """The trace hook of a parametric recording (``sys.settrace``, calls only): the first call of
        every code object is examined (:func:`~pto.runtime.symbolic.observes_identity`); code that
        could tell a symbol from its number by ``type``, ``id`` or ``is`` stops the recording
        (raises _GiveUp before that code runs: the call runs plain, the key goes back to exact keys)."""
        code = frame.f_code
        why = _OBSERVES.get(code, 0)
        if why == 0:
            why = _OBSERVES[code] = observes_identity(frame)
        if why is not None:
            self.bad = f"the kernel's Python could tell a value read from data by its type or identity: {why}"
            self.active = False
            sys.settrace(None)
            raise _GiveUp(self.bad)
        # no local trace function: only calls are seen

    def _new(self, t) -> int:
        i = self.nvals
        self.nvals += 1
        self.ids[id(t)] = (weakref.ref(t), i)
        return i

    def _val(self, t) -> _V:
        e = self.ids.get(id(t))
        if e is not None and e[0]() is t:
            return _V(e[1])
        i = self._new(t)  # made before the run (a module constant, a config's tensor): by reference
        self.consts[i] = t
        self.protected.add(t.untyped_storage().data_ptr())
        return _V(i)

    def _enc(self, x):
        if isinstance(x, torch.Tensor):
            return self._val(x)
        t = type(x)
        if t is Sym:
            self.saw = True
            return _X(x.n) if x.rec is self else x.v  # another recording's symbol is a constant here
        if t is tuple or t is list:
            items = [self._enc(y) for y in x]
            if any(a is not b for a, b in zip(items, x)):
                return _Seq(t, items)
            return x
        if t is slice and (type(x.start) is Sym or type(x.stop) is Sym or type(x.step) is Sym):
            return _Sl(self._enc(x.start), self._enc(x.stop), self._enc(x.step))
        if t is dict and has_sym(x):
            self.bad = "a dict argument holding a value read from data"
        if t is dict or (t is slice and any(isinstance(y, torch.Tensor) for y in (x.start, x.stop, x.step))):
            self.bad = f"a {t.__name__} argument holding tensors"
        return x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        p = self.pending
        if p is not None:
            self.pending = None
            f = sys._getframe(1)
            if not (f is p[2] and f.f_lasti == p[3]):  # not the parser of this very call
                self.guard_exact(p[0], p[1])
                p = None
        name, kind = _func_kind(func)
        if kind == 0 or self.bad is not None:
            if p is not None:
                self.guard_exact(p[0], p[1])
            res = func(*args, **kwargs)
            if self.otaint and (name == "storage_offset" or name == "data_ptr") and args and self.bad is None:
                t = args[0]
                e = self.ids.get(id(t))
                if e is not None and e[0]() is t and e[1] in self.otaint:
                    # where a view at an offset computed from reads starts: a guard on it
                    if name == "data_ptr":
                        self.ops.append((_rel_ptr, [_V(e[1])], {}, None, 1, _rel_ptr(t), ()))
                    else:
                        self.ops.append((func, [_V(e[1])], {}, None, 1, res, ()))
            return res
        if "generator" in kwargs:
            self.bad = f"{name} with a generator= (its state is not replayed)"
            return func(*args, **kwargs)
        if kind == 2 or "out" in kwargs:
            dst = kwargs.get("out", args[0] if args else None)
            if isinstance(dst, torch.Tensor) and dst.untyped_storage().data_ptr() in self.protected:
                self.bad = f"{name} writes into a tensor the program did not create"
        self.saw = False
        a = [self._enc(x) for x in args]
        kw = {k: self._enc(v) for k, v in kwargs.items()}
        if self.saw:  # the call itself takes the numbers the symbols stand for
            args, kwargs = concrete_of(args), concrete_of(kwargs)
        elif p is not None:  # the parser's __index__ was not about this call's symbols
            self.guard_exact(p[0], p[1])
        if kind == 1 and name == "__getitem__" and len(args) > 1:
            idx = args[1] if type(args[1]) is tuple else (args[1],)
            if any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in idx):
                kind = 3
        try:
            res = func(*args, **kwargs)
        except BaseException:
            self.bad = f"{name} raised"
            raise
        if _DEBUG:
            self.sites[len(self.ops)] = f"{name}: " + _stack()
        if self.param and (name == "item" or name == "tolist") and (type(res) in (int, float, list)):
            src = args[0] if args else None
            if isinstance(src, torch.Tensor) and src.dtype is not torch.bool:
                # a scalar read: its value is a register of the replay, the program gets symbols
                v = self.nvals
                self.nvals += 1
                self.reads.append(v)
                self.ops.append((func, a, kw, v, 5, None, ()))
                return self._symbolic(res, v, ())
        if isinstance(res, torch.Tensor):
            e = self.ids.get(id(res))
            if e is not None and e[0]() is res:
                outs = e[1]  # an in-place operation returning its input, or a view cached by torch
                fresh = None
            else:
                outs = self._new(res)
                fresh = outs
            guard = tuple(res.shape) if kind == 3 else None
            big = (fresh,) if fresh is not None and res.numel() * res.element_size() > 65536 else ()
            gk = 2 if kind == 3 else 0
            if fresh is not None and self.param:
                if self.saw and kind != 3:
                    # a result whose shape or strides may follow from values read from data: the
                    # key no longer fixes them, so a guard does (metadata queries stay unrecorded)
                    gk, guard = 8, (tuple(res.shape), res.stride())
                if (self.saw or self.otaint and _any_use(a, kw, self.otaint)) and res._is_view():
                    self.otaint.add(fresh)  # a view whose storage offset may follow from reads
            self.ops.append((func, a, kw, outs, gk, guard, big))
        elif type(res) in (tuple, list) or isinstance(res, tuple) and all(isinstance(y, torch.Tensor) for y in res):
            if all(isinstance(y, torch.Tensor) for y in res):
                outs = []
                for y in res:
                    e = self.ids.get(id(y))
                    outs.append(e[1] if e is not None and e[0]() is y else self._new(y))
                guard = tuple(tuple(y.shape) for y in res) if kind == 3 or self.saw else None
                if self.param and (self.saw or self.otaint and _any_use(a, kw, self.otaint)):
                    self.otaint.update(v for v, y in zip(outs, res) if y._is_view())
                self.ops.append((func, a, kw, tuple(outs), 2 if guard is not None else 0, guard, ()))
            elif name == "tolist" and type(res) is list and sys._getframe(1).f_code is _tile_value_code():
                # pl.read keeps a tile's values as a list of its own (never handed out, read by int
                # subscripts only): guard only the elements the program reads. A list that reaches
                # other code (pl.read_values, a kernel's own tolist) can be read where no method of
                # a list subclass runs (heapq, list.__getitem__(lst, i), C code): guarded whole
                acc = _Access()
                res = _tracked(res, acc, ())
                self.ops.append((func, a, kw, None, 4, acc, ()))
            elif _plain_result(res):
                self.ops.append((func, a, kw, None, 1, res, ()))
            else:
                self.bad = f"{name} returned {type(res).__name__} mixing tensors and other values"
        elif _plain_result(res):
            self.ops.append((func, a, kw, None, 1 if res is not None else 0, res, ()))
        else:
            self.bad = f"{name} returned a {type(res).__name__}"
        return res

    # ---- the trace --------------------------------------------------------------------------
    def _ret_spec(self, prog, ret):
        if isinstance(ret, GMTensor):
            for k, (p, caller, g) in enumerate(prog.args):
                if g.buf is ret.buf and ret.data.data_ptr() == g.data.data_ptr() and ret.shape == g.shape:
                    return ("arg", k)
            e = self.ids.get(id(ret.data))
            if e is None or e[0]() is not ret.data:
                raise _Unreplayable("the returned tensor was not recorded")
            return ("clone", e[1])
        if type(ret) in (tuple, list):
            return (type(ret), [self._ret_spec(prog, r) for r in ret])
        if type(ret) is Sym:
            return ("expr", ret.n) if ret.rec is self else ("value", ret.v)
        if _plain_value(ret):
            return ("value", ret)
        raise _Unreplayable(f"the kernel returned a {type(ret).__name__}")

    def finish(self, prog) -> "_Trace | None":
        """The replayable trace of the finished program ``prog``, or None."""
        if _DEBUG:
            kinds: dict = {}
            for op in self.ops:
                kinds[op[4]] = kinds.get(op[4], 0) + 1
            _DIVERGED_AT.append((prog.name, f"recorded: {len(self.ops)} ops, reads {len(self.reads)}, by kind {kinds}"))
            _note_guards(prog.name, self)
        if self.bad is not None:
            return None
        ret = self._ret_spec(prog, self.ret)
        return _Trace(self, prog, ret)


def _tile_value_code():
    """The code of ``tensor_ops._tile_value``: the one caller whose ``tolist`` result stays private."""
    from pto.language.tensor_ops import _tile_value
    return _tile_value.__code__


class _Access:
    """The elements of a recorded ``tolist`` result the program looked at: ``{index path: value}``,
    or ``whole`` when it used the list another way than by int subscripts."""

    __slots__ = ("seen", "whole", "value")

    def __init__(self):
        self.seen: dict = {}
        self.whole = False
        self.value = None


def _whole(method):
    def f(self, *a, **k):
        self._acc.whole = True
        return getattr(list, method)(self, *a, **k)
    f.__name__ = method
    return f


class _TList(list):
    """A ``tolist`` result that notes which elements the program reads (see :class:`_Access`)."""

    __slots__ = ("_acc", "_path")

    def __getitem__(self, i):
        if type(i) is not int:
            self._acc.whole = True
            return list.__getitem__(self, i)
        v = list.__getitem__(self, i)
        if type(v) is not _TList:
            self._acc.seen[self._path + (i % len(self),)] = v
        return v

    for _m in ("__iter__", "__reversed__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
               "__ge__", "__add__", "__mul__", "__rmul__", "__repr__", "__str__", "index", "count", "copy",
               "__setitem__", "__delitem__", "append", "extend", "insert", "pop", "remove", "sort", "reverse",
               "__iadd__", "__imul__", "clear", "__reduce_ex__"):
        locals()[_m] = _whole(_m)
    del _m


def _tracked(lst: list, acc: _Access, path: tuple) -> _TList:
    acc.value = lst if not path else acc.value
    out = _TList(_tracked(x, acc, path + (k,)) if type(x) is list else x for k, x in enumerate(lst))
    out._acc, out._path = acc, path
    return out


def _same(a, b) -> bool:
    """``a == b`` with NaN equal to NaN (guard values: what the program saw)."""
    if a == b:
        return True
    ta = type(a)
    if ta is float and type(b) is float:
        return a != a and b != b
    if ta in (list, tuple, _TList) and type(b) in (list, tuple, _TList) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b))
    return False


def _same_signed(a, b) -> bool:
    """:func:`_same` that also tells ``-0.0`` from ``0.0`` (a zero read from data may feed a division)."""
    ta, tb = type(a), type(b)
    if ta is float and tb is float:
        if a != a or b != b:
            return a != a and b != b
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if ta in (list, tuple, _TList) and tb in (list, tuple, _TList):
        return len(a) == len(b) and all(_same_signed(x, y) for x, y in zip(a, b))
    return a == b


def _rel_ptr(t: torch.Tensor) -> int:
    """Where ``t`` starts in its storage, in bytes (what its ``data_ptr`` says beyond the storage)."""
    return t.data_ptr() - t.untyped_storage().data_ptr()


def _any_use(a, kw, vals: set) -> bool:
    """True when the argument templates ``a`` / ``kw`` use a value of ``vals``."""
    used: list = []
    for x in a:
        _uses(x, used)
    for x in kw.values():
        _uses(x, used)
    return any(v in vals for v in used)


def _uses(x, out):
    t = type(x)
    if t is _V:
        out.append(x.i)
    elif t is _Seq:
        for y in x.items:
            _uses(y, out)
    elif t is _Sl:
        for y in (x.start, x.stop, x.step):
            _uses(y, out)


def _ret_uses(spec, out):
    if spec[0] == "clone":
        out.append(spec[1])
    elif spec[0] in (tuple, list):
        for s in spec[1]:
            _ret_uses(s, out)


_WINDOW = 12  # lines per replay window
_TEMPLATES: dict = {}  # window body -> compiled template ``t(r, p)``


class _Trace:
    """Straight-line replay code of one recording, the recorded graph and statistics."""

    def __init__(self, rec: _Recorder, prog: Program, ret_spec):
        ops = rec.ops
        inputs = rec.inputs
        n_ops = len(ops)
        end = n_ops + 1
        last: dict = {}
        for i, (_f, a, kw, outs, _gk, _g, _b) in enumerate(ops):
            used: list = []
            for x in a:
                _uses(x, used)
            for x in kw.values():
                _uses(x, used)
            if type(outs) is int:
                used.append(outs)
            for v in used:
                last[v] = i
        keep: list = []
        _ret_uses(ret_spec, keep)
        for v in keep:
            last[v] = end
        for v in inputs:
            last[v] = end
        for v in rec.reads:  # scalar reads: expressions and the graph of the replay use them to the end
            last[v] = end
        # registers: the inputs first, then every value in a free register from its definition to its last use
        reg = {v: k for k, v in enumerate(inputs)}
        free: list = []
        nregs = len(inputs)
        P: list = []  # the parameters of the operations of the current window

        def par(obj) -> str:
            P.append(obj)
            return f"p[{len(P) - 1}]"

        const = par

        def leaf(node) -> str:
            out = f"r[{par(reg[node[1]])}]"
            if node[0] == "L":
                out += "".join(f"[{par(k)}]" for k in node[2])
            return out

        def sym(node) -> str:
            return source(node, leaf, par)

        def expr(x) -> str:
            t = type(x)
            if t is _V:
                c = rec.consts.get(x.i)
                return par(c) if c is not None else f"r[{par(reg[x.i])}]"
            if t is _Seq:
                inner = ", ".join(expr(y) for y in x.items)
                return f"({inner},)" if x.kind is tuple else f"[{inner}]"
            if t is _X:
                return sym(x.n)
            if t is _Sl:
                return f"slice({expr(x.start)}, {expr(x.stop)}, {expr(x.step)})"
            if t is bool or x is None:
                return repr(x)
            return par(x)

        state = {"nregs": nregs}

        def emit(lines):
            """The window's (template, parameters): templates are shared by every window of the same
            shape (the operations' structure without registers, constants and numbers)."""
            body = "\n    ".join(lines or ["pass"])
            fn = _TEMPLATES.get(body)
            if fn is None:
                if len(_TEMPLATES) > 50_000:
                    _TEMPLATES.clear()
                ns = {"D": _Diverged, "S": _same, "Z": _same_signed, **_SYM_NS}
                exec(compile(f"def t(r, p):\n    {body}\n", "<pto replay>", "exec"), ns)  # noqa: S102 - generated
                fn = _TEMPLATES[body] = ns["t"]
            out = (fn, tuple(P))
            P.clear()
            return out

        def chunks():
            nregs = state["nregs"]
            lines: list = []
            bigvals = {v for op in ops for v in op[6]}
            for i, (f, a, kw, outs, gk, g, big) in enumerate(ops):
                if len(lines) >= _WINDOW:  # a window ends between the lines of two operations
                    yield emit(lines)
                    lines = []
                if gk == 9:  # a long expression of reads computed into a register of its own
                    reg[outs] = free.pop() if free else nregs
                    nregs += reg[outs] == nregs
                    lines.append(f"r[{par(reg[outs])}] = {sym(g)}")
                    continue
                if gk == 6:  # a comparison of values read from data: its outcome
                    node, out = g
                    lines.append(f"if {'not ' if out else ''}{sym(node)}: raise D({par(i)})")
                    continue
                if gk == 7:  # a value read from data used as a Python number: its exact value and type
                    node, v = g
                    lines.append(f"_ = {sym(node)}")
                    if type(v) is float:
                        lines.append(f"if type(_) is not float or not Z(_, {par(v)}): raise D({par(i)})")
                    else:
                        lines.append(f"if _ != {par(v)} or type(_) is not {par(type(v))}: raise D({par(i)})")
                    continue
                call = const(f) + "(" + ", ".join([expr(x) for x in a] + [f"{k}={expr(v)}" for k, v in kw.items()]) + ")"
                used: list = []
                for x in a:
                    _uses(x, used)
                for x in kw.values():
                    _uses(x, used)
                # registers of values used for the last time here: freed after this operation's results
                # have theirs (so a kill below never hits a result)
                dying = [v for v in dict.fromkeys(used) if last.get(v) == i and v in reg and v not in rec.consts]
                kills = [reg[v] for v in dying if v in bigvals]
                if gk in (1, 4):
                    for v in dying:
                        free.append(reg.pop(v))
                if gk == 1:
                    if type(g) is float and g != g:
                        lines.append(f"_ = {call}")
                        lines.append(f"if _ == _: raise D({par(i)})")
                    elif _literal(g):
                        lines.append(f"if {call} != {expr(g)}: raise D({par(i)})")
                    else:
                        lines.append(f"if not {_cmp(g)}({call}, {const(g)}): raise D({par(i)})")
                    continue
                if gk == 4:  # a tolist whose read elements are guarded
                    lines.append(f"_ = {call}")
                    if g.whole:
                        lines.append(f"if not {_cmp(g.value)}(_, {const(g.value)}): raise D({par(i)})")
                    else:
                        conds = []
                        for path, v in g.seen.items():
                            el = "_" + "".join(f"[{k}]" for k in path)
                            if type(v) is float and v != v:
                                conds.append(f"{el} == {el}")
                            elif _literal(v):
                                conds.append(f"{el} != {expr(v)}")
                            else:
                                conds.append(f"not {_cmp(v)}({el}, {const(v)})")
                        if conds:
                            lines.append(f"if {' or '.join(conds)}: raise D({par(i)})")
                    continue
                targets = []
                for v in ((outs,) if type(outs) is int else outs or ()):
                    if v in reg or last.get(v, -1) <= i:
                        targets.append("_")
                        continue
                    if free:
                        reg[v] = free.pop()
                    else:
                        reg[v] = nregs
                        nregs += 1
                    targets.append(f"r[{par(reg[v])}]")
                if type(outs) is int:
                    if gk == 2 or gk == 8:
                        lines.append(f"_ = {call}")
                        if gk == 2:
                            lines.append(f"if tuple(_.shape) != {const(g)}: raise D({par(i)})")
                        else:
                            lines.append(f"if tuple(_.shape) != {const(g[0])} or _.stride() != {const(g[1])}: "
                                         f"raise D({par(i)})")
                        if targets[0] != "_":
                            lines.append(f"{targets[0]} = _")
                    elif targets[0] == "_":
                        lines.append(call)
                    else:
                        lines.append(f"{targets[0]} = {call}")
                elif outs is None:
                    lines.append(call)
                else:
                    lines.append(f"_ = {call}")
                    if gk == 2:
                        lines.append(f"if tuple(tuple(y.shape) for y in _) != {const(g)}: raise D({par(i)})")
                    for k, tg in enumerate(targets):
                        if tg != "_":
                            lines.append(f"{tg} = _[{k}]")
                for v in dying:
                    free.append(reg.pop(v))
                for k in kills:  # large values used for the last time: let them go now
                    lines.append(f"r[{par(k)}] = None")
            state["nregs"] = nregs
            self.out_regs = {v: reg[v] for v in keep}
            self.read_regs = {v: reg[v] for v in rec.reads}
            yield emit(lines)

        # the replay: windows of a few operations, each a shared template and its parameters
        self.out_regs = self.read_regs = None
        self.windows = list(chunks())
        self.nregs = state["nregs"]
        self.ret_spec = ret_spec
        self.n_ops = n_ops
        self.sites = rec.sites
        self.template = _Template(prog, rec)

    def run(self, regs) -> None:
        """Run the replay code on the registers ``regs`` (inputs set); raises _Diverged."""
        for fn, p in self.windows:
            fn(regs, p)


def _literal(v) -> bool:
    t = type(v)
    if t is int or t is bool or v is None or t is str:
        return True
    return t is float and math.isfinite(v) and v != 0.0  # a zero's guard must see its sign: not ``==``


def _has_zero(v) -> bool:
    """True when the guard value ``v`` holds a float zero (its sign needs :func:`_same_signed`)."""
    t = type(v)
    if t is float:
        return v == 0.0
    if t in (list, tuple, _TList):
        return any(_has_zero(x) for x in v)
    return False


def _cmp(v) -> str:
    """The comparison a guard on the recorded value ``v`` uses: ``Z`` when the sign of a zero counts."""
    return "Z" if _has_zero(v) else "S"


# ---- the recorded graph -------------------------------------------------------------------------
class _Template:
    """The recorded run's graph, buffers and statistics, without its tensors. A parametric
    recording's figures may be Syms (footprint boxes, byte counts, heap offsets computed from
    values read from data): ``symbolic`` is then True and a replay evaluates them with its reads
    (:meth:`ReplayedProgram._materialize`); the recorded program itself gets the plain numbers."""

    def __init__(self, prog: Program, rec=None):
        s = prog.stats
        self.buffers = []
        for b in prog.buffers:
            nb = copy.copy(b)
            nb.data = nb.shadow = nb.program = None
            nb.pending = None
            self.buffers.append(nb)
        bmap = {id(b): nb for b, nb in zip(prog.buffers, self.buffers)}
        self.symbolic = self.count_graph = False
        self.raw = {}  # task index -> its blocks' raw footprints (a task whose grouped boxes hold Syms)
        parametric = rec is not None and bool(rec.reads)
        if parametric:
            # the figures as the recording computed them (Syms where they follow from reads), taken
            # before the recorded program gets plain numbers and its edges are derived
            self.stats = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if not f.name.startswith("_")}
            snap = []
            for k, t in enumerate(prog.graph.tasks):
                g = t.grouped
                counters = [{a: getattr(blk, a) for a in _BLOCK_COUNTERS if has_sym(getattr(blk, a))}
                            for blk in t.blocks]
                if type(g) is dict and any(has_sym(x) for kinds in g.values() for x in kinds if x):
                    self.raw[k] = [[(bmap[id(buf)], box, kind) for buf, box, kind in blk.fp or ()] for blk in t.blocks]
                snap.append((g if has_sym(g) else None, counters))
            orch = prog.orch_reads
            self.symbolic = bool(self.raw or has_sym(orch) or any(has_sym(v) for v in self.stats.values()) or any(
                has_sym(getattr(b, a, None)) for b in self.buffers for a in _BUFFER_FIELDS) or any(
                g is not None or any(c) for g, c in snap))
            # the graph figures (sums over blocks) are counted from each replay's own graph when they
            # hold symbols (a sum over many blocks is a deep expression)
            self.count_graph = any(has_sym(self.stats.get(k)) for k in _COUNTED)
            if self.count_graph:
                self.stats.update({k: 0 for k in _COUNTED if k in self.stats})
            _concretize_program(prog)
        else:
            self.stats = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if not f.name.startswith("_")}
        self.edges = s.edges
        self.tasks = [_copy_task(t, bmap, None) for t in prog.graph.tasks]
        self.orch_reads = prog.orch_reads
        self.dyn_dims = getattr(prog, "dyn_dims", {})
        if self.symbolic:
            self.edges = None  # counted from each replay's graph
            self.orch_reads = orch
            for t, (g, counters) in zip(self.tasks, snap):
                if g is not None:
                    if type(g) is list:
                        t.grouped = [(bmap[id(buf)], box, kind) for buf, box, kind in g]
                    else:
                        t.grouped = {bmap[id(buf)]: [None if x is None else list(x) for x in kinds]
                                     for buf, kinds in g.items()}
                for blk, c in zip(t.blocks, counters):
                    for a, v in c.items():
                        setattr(blk, a, v)
        elif parametric:
            self.stats = {k: concrete_of(v) for k, v in self.stats.items()}


_BUFFER_FIELDS = ("shape", "nbytes", "offset", "base_off", "init_value")


def _concretize_program(prog: Program) -> None:
    """Replace the Syms of a finished recording's graph, buffers and statistics by their values."""
    for t in prog.graph.tasks:
        t.grouped = concrete_of(t.grouped)
        for blk in t.blocks:
            for a in _BLOCK_COUNTERS:
                v = getattr(blk, a)
                if has_sym(v):
                    setattr(blk, a, concrete_of(v))
            blk.fp = None
        t._fps = None
    for b in prog.buffers:
        for a in _BUFFER_FIELDS:
            v = getattr(b, a, None)
            if has_sym(v):
                setattr(b, a, concrete_of(v))
    s = prog.stats
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if has_sym(v):
            setattr(s, f.name, concrete_of(v))
    prog.orch_reads = concrete_of(prog.orch_reads)
    prog.heap.peak = concrete_of(prog.heap.peak)
    prog.result = concrete_of(prog.result)


def _evaluated(x, reads: dict):
    """``x`` (a value, tuple, list or dict) with every Sym evaluated for the reads ``reads``."""
    t = type(x)
    if t is Sym:
        return evaluate(x.n, reads)
    if t is tuple or t is list:
        out = [_evaluated(y, reads) for y in x]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: _evaluated(v, reads) for k, v in x.items()}
    return x


_BLOCK_COUNTERS = tuple(a for a in Block.__slots__ if a not in ("task", "idx", "phase", "fp"))


def _copy_task(t: Task, bmap: dict, prog) -> Task:
    nt = Task(t.id, t.name, t.kind, t.site, t.n_blocks, list(t.explicit), t.manual)
    nt.preds = set(t.preds)
    nt.wall_ns = t.wall_ns
    for blk in t.blocks:
        nb = Block(nt, blk.idx, blk.phase)
        for a in _BLOCK_COUNTERS:  # every counter (ops, flops, bytes, the simulator's ld/st/mm/vk, ...)
            v = getattr(blk, a)
            setattr(nb, a, dict(v) if type(v) is dict else v)
        nb.fp = None
        nt.blocks.append(nb)
    g = t.grouped
    if type(g) is list:
        nt.grouped = [(bmap[id(buf)], box, kind) for buf, box, kind in g]
    elif g:
        nt.grouped = {bmap[id(buf)]: [None if x is None else list(x) for x in kinds] for buf, kinds in g.items()}
    return nt


class ReplayedProgram(Program):
    """A :class:`Program` whose torch work was replayed from a recording (see the module
    docstring). ``replayed`` is True; ``graph``, ``buffers`` and ``args`` are built on first access."""

    replayed = True

    def __getattr__(self, name):
        if name in ("graph", "buffers", "args"):
            self._materialize()
            return object.__getattribute__(self, name)
        raise AttributeError(name)

    def _materialize(self) -> None:
        tpl = self._template
        reads = self._reads
        bufs = []
        arg_data = iter(self._gm)
        for b in tpl.buffers:
            nb = copy.copy(b)
            nb.program = self
            if reads is not None:
                for a in _BUFFER_FIELDS:
                    v = getattr(nb, a, None)
                    if has_sym(v):
                        setattr(nb, a, _evaluated(v, reads))
            if b.kind == "arg":
                nb.data = next(arg_data)
            else:
                nb.data = self.heap.storage[b.offset:b.offset + b.nbytes].view(b.dtype).view(list(b.shape))
            bufs.append(nb)
        bmap = {id(b): nb for b, nb in zip(tpl.buffers, bufs)}
        graph = TaskGraph()
        graph.tasks = [_copy_task(t, bmap, self) for t in tpl.tasks]
        if reads is not None:
            # this call's footprints and counters, and its edges derived from them afresh (as a plain run)
            from pto.runtime.deps import DepTracker
            lazy = LazyDerivation(DepTracker())
            for k, (t, nt) in enumerate(zip(tpl.tasks, graph.tasks)):
                raw = tpl.raw.get(k)
                if raw is not None:
                    nt.grouped = group_footprints([[(bmap[id(buf)], _evaluated(box, reads), kind)
                                                    for buf, box, kind in fp] for fp in raw])
                else:
                    nt.grouped = _evaluated(nt.grouped, reads)
                for blk in nt.blocks:
                    for a in _BLOCK_COUNTERS:
                        v = getattr(blk, a)
                        if has_sym(v):
                            setattr(blk, a, _evaluated(v, reads))
                if t.kind != "dummy":
                    lazy.add(nt)
        self.graph = graph
        self.buffers = bufs
        self.args = [(p, caller, GMTensor(d, nb, p.name)) for (p, caller), d, nb
                     in zip(self._params, self._gm, [b for b in bufs if b.kind == "arg"])]


def _replay(trace: _Trace, jf, params, cfg) -> Program | None:
    """Replay ``trace`` for the bound ``params``; None when a guard diverged (nothing the caller
    sees was written)."""
    st = _ctx.state
    if st.program is not None:
        raise DslError(f"program {jf.__name__} started while another program is running")
    check_written_aliasing(jf.__name__, params)  # as a plain run does, before anything is written
    t0 = time.perf_counter_ns()
    regs = [None] * trace.nregs
    gm = []
    tparams = []
    # Out/InOut arguments are written in place, as by a plain run, when none shares bytes with
    # another tensor argument (storages or not: two from_numpy views of one array are two
    # storages) and pypto compatibility is off: the replay writes the caller's tensor and keeps a
    # copy of its values to put back if it stops; otherwise every one gets a private copy
    in_place = not _compat.mode.pypto and not written_overlap(
        [(p.value.data_ptr(), p.value.nbytes, p.ann.direction != IN) for p in params if isinstance(p.ann, TensorType)])
    saved = []  # (caller tensor written in place, its values before the replay)
    k = 0
    for p in params:
        if isinstance(p.ann, TensorType):
            t = p.value
            if p.ann.direction in (OUT, INOUT):
                if in_place:
                    d = t
                    saved.append((t, t.clone()))
                else:
                    d = t.clone()
            else:
                d = t
            regs[k] = d
            gm.append(d)
            tparams.append((p, t))
            k += 1
    heap = RingHeap(cfg.heap_bytes)
    regs[k] = heap.storage
    _gc_pause()  # as a plain run: no collection rescans the caller's objects meanwhile
    try:
        trace.run(regs)
    except BaseException as e:
        for t, v in saved:  # the caller's tensors written in place get their values back first
            t.copy_(v)
        if isinstance(e, _Diverged):
            if _DEBUG:
                _DIVERGED_AT.append((jf.__name__, trace.sites.get(e.args[0], f"op {e.args[0]}")))
                del _DIVERGED_AT[:-200]
            return None
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: on up
            raise
        # whatever failed, the plain run reproduces it with its context
        if _DEBUG:
            import traceback
            _DIVERGED_AT.append((jf.__name__, "replay raised: " + "".join(
                traceback.format_exception(type(e), e, e.__traceback__)[-4:])))
        _count("errors")
        return None
    finally:
        _gc_resume()
        heap.release()
    if not in_place:
        for (p, caller), d in zip(tparams, gm):
            if p.ann.direction in (OUT, INOUT):
                caller.copy_(d)
    prog = ReplayedProgram.__new__(ReplayedProgram)
    prog.jf, prog.name, prog.config, prog.check = jf, jf.__name__, cfg, False
    prog.heap = heap
    tpl = trace.template
    prog._template, prog._gm, prog._params = tpl, gm, tparams
    prog._reads = None
    prog.result = _ret_value(trace, trace.ret_spec, regs, tparams)
    if tpl.symbolic:  # figures computed from values read from data: this call's
        reads = prog._reads = {v: regs[k] for v, k in trace.read_regs.items()}
        s = ProgramStats(**_evaluated(tpl.stats, reads))
        if tpl.count_graph:
            s.edges_of(_LazyGraph(prog))  # edges and graph figures of this call's graph, on first read
        else:
            s._edges_graph = _LazyGraph(prog)  # the edges of this call's graph, counted on first read
        prog.orch_reads = _evaluated(tpl.orch_reads, reads)
    else:
        s = ProgramStats(**tpl.stats)
        s.edges = tpl.edges
        prog.orch_reads = tpl.orch_reads
    heap.peak = s.heap_peak_bytes
    prog.stats = s
    prog.dyn_dims = tpl.dyn_dims
    prog.dropped_init, prog.atomic_reordered = [], {}
    prog.races = prog.sanitizer = prog.cur_task = prog.cur_block = prog.left_early = None
    prog.manual = False
    prog._t0 = t0
    s.wall_us = (time.perf_counter_ns() - t0) / 1e3
    return prog


class _LazyGraph:
    """The graph of a replayed program, built when its ``tasks`` are first read."""

    __slots__ = ("prog",)

    def __init__(self, prog):
        self.prog = prog

    @property
    def tasks(self):
        """The replayed program's tasks (the graph is built now)."""
        return self.prog.graph.tasks


def _ret_value(trace, spec, regs, tparams):
    kind = spec[0]
    if kind == "arg":
        return tparams[spec[1]][1]
    if kind == "clone":
        return regs[trace.out_regs[spec[1]]].clone()
    if kind == "value":
        return spec[1]
    if kind == "expr":
        return evaluate(spec[1], {v: regs[k] for v, k in trace.read_regs.items()})
    return kind(_ret_value(trace, s, regs, tparams) for s in spec[1])
