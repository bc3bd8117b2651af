"""Program: one call of a ``@pl.jit`` function (docs/dsl.md).

The program binds the arguments, runs the orchestration as plain Python with
tasks executing eagerly in program order, records the task graph and the
statistics. A plain run writes Out/InOut arguments in place, into the caller's
tensors, and every store into one first saves the window it overwrites (an undo
log, ``Program.undo``); a program that fails (bad input, capacity, heap, an error
in kernel code) puts the saved windows back, newest first, so the caller's tensors
are exactly as before the call: nothing is lost or half-written. Check mode,
graph-only mode, ``block_order`` runs, pypto compatibility, ``pld`` windows and an
Out/InOut tensor sharing memory with another argument work on private copies,
copied back at the end (``_writes_in_place``). At its end a program's buffers stop
pointing back to it (a sentinel), so the Program is freed by refcount, and so is its task
graph: it holds no reference cycle (a block holds its task weakly, the pending derivation
holds footprints, not tasks, and a task scope keeps its site string, not the kernel's frame),
so it is freed when its last holder drops it, without a collection.
"""

from __future__ import annotations

import gc
import linecache
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field

import torch

from pto.errors import BindError, CapacityError, ConfigError, DslError, PtoError
from pto.language import _ctx
from pto.language import compat_ops as _compat
from pto.language.distributed import WindowType
from pto.language.jit import bind_arguments
from pto.language.tensor_ops import GMTensor
from pto.language.typing import IN, INOUT, OUT, DynVar, TensorType
from pto.runtime import sanitizer as _sanitizer
from pto.runtime.deps import DepTracker, LazyDerivation, derive_task, group_footprints
from pto.runtime.graph import KIND_NAMES, Block, Footprint, Task, TaskGraph
from pto.runtime.graph_only import GraphOnlyState
from pto.runtime.heap import POISON_BYTE, Buffer, RingHeap, contiguous_strides, validate_init_value

__all__ = ["RunConfig", "Program", "ProgramStats", "gc_paused"]


@dataclass
class RunConfig:
    """How a program runs.

    Attributes:
        heap_bytes: ring-heap capacity in bytes (>= 1024; default 1 GiB).
        check: check mode: definedness sanitizer and race checker (docs/dsl.md).
            On by default in ``pto.golden.run_jit`` and ``pto check``, off in
            ``pto run`` and benchmarks.
        keep_footprints: keep per-block footprints after the run (trace
            export); check mode keeps them anyway.
        drop_init: testing tool, off by default (empty): names of
            allocations whose ``init_value`` is ignored (left undefined), so a
            mutation test can show that check mode catches the missing
            initialisation without editing kernel source. Same effect as the
            ``pto.runtime.drop_init_values(...)`` context manager, except that a
            name here that drops nothing in the run (no allocation of that name
            with an ``init_value``) is a ConfigError at program end.
        block_order: schedule-sensitivity testing, ``"program"`` by default (blocks in
            index order, atomic adds applied as they are issued). ``"reverse"`` or
            ``"shuffle"`` runs the blocks of every SPMD task (and of every syncall phase)
            in reverse or a seeded random order, and holds back atomic-add contributions
            until the next plain access of their buffer, then applies them task by task in
            another order that the task graph allows (reverse or seeded random
            topological order of the contributing tasks; blocks of one task in the order
            they ran). Any valid schedule of a correct program gives the same result up to
            the rounding of its atomic adds; ``pto check --block-order`` compares.
        block_order_seed: seed of ``"shuffle"`` (an int; same seed, same orders).
        execute: ``False`` is graph-only mode (docs/graph_only.md): the orchestration runs and
            the task graph, footprints, edges and heap plan are recorded as in a real run, but
            float (and INT8) data is shape-only (torch ``meta``) and tile math on it is skipped;
            integer index data (block tables, positions, ids) is computed for real. Out / InOut
            arguments are not written. Not combinable with ``check`` or a ``block_order``.
    """

    heap_bytes: int = 1 << 30
    check: bool = False
    keep_footprints: bool = False
    drop_init: tuple = ()
    block_order: str = "program"
    block_order_seed: int = 0
    execute: bool = True

    def validate(self) -> "RunConfig":
        """Raises ConfigError on a heap smaller than 1024 bytes, a ``check`` or
        ``keep_footprints`` that is not a bool, or a ``drop_init`` that is not a tuple of names."""
        if isinstance(self.heap_bytes, bool) or not isinstance(self.heap_bytes, int) or self.heap_bytes < 1024:
            raise ConfigError(f"RunConfig.heap_bytes must be an int >= 1024, got {self.heap_bytes!r}")
        for f in ("check", "keep_footprints", "execute"):
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise ConfigError(f"RunConfig.{f} must be True or False, got {type(v).__name__} {v!r}")
        if isinstance(self.drop_init, str) or not all(isinstance(n, str) for n in self.drop_init):
            raise ConfigError(f"RunConfig.drop_init must be a tuple of allocation names, got {self.drop_init!r}")
        if self.block_order not in BLOCK_ORDERS:
            raise ConfigError(f"RunConfig.block_order must be one of {', '.join(BLOCK_ORDERS)}, got "
                              f"{self.block_order!r}")
        if isinstance(self.block_order_seed, bool) or not isinstance(self.block_order_seed, int):
            raise ConfigError(f"RunConfig.block_order_seed must be an int, got {self.block_order_seed!r}")
        if not self.execute and (self.check or self.block_order != "program"):
            raise ConfigError("RunConfig(execute=False) (graph-only mode) computes no float data: it cannot be "
                              "combined with check=True or a block_order other than 'program'")
        return self


BLOCK_ORDERS = ("program", "reverse", "shuffle")


@dataclass
class ProgramStats:
    """Statistics of one program run (bytes in bytes, wall time in µs). The graph figures
    (tasks, dummies, blocks, tile_ops, bytes, flops, task_wall_us; ``edges``, a property) are
    counted from the graph on first read (a plain run derives its edges then)."""

    tasks: int = 0
    dummies: int = 0
    blocks: int = 0
    tile_ops: int = 0
    bytes: int = 0
    flops: int = 0
    heap_peak_bytes: int = 0
    scratch_bytes: int = 0
    scratch_tensors: int = 0
    init_bytes: int = 0
    # graph-only mode (RunConfig(execute=False), pto.runtime.graph_only): reads of assumed values,
    # footprint boxes that may follow from them, sorts of unknown values under the ties assumption
    graph_only: bool = False
    assumed_reads: int = 0
    assumed_footprints: int = 0
    assumed_sorts: int = 0
    wall_us: float = 0.0
    task_wall_us: float = 0.0

    _edges: int = field(default=0, repr=False, compare=False)
    _edges_graph: object = field(default=None, repr=False, compare=False)
    _counts_graph: object = field(default=None, repr=False, compare=False)

    def __getattribute__(self, name):
        if name in _COUNTED:
            g = object.__getattribute__(self, "_counts_graph")
            if g is not None:
                object.__getattribute__(self, "_count")(g)
        return object.__getattribute__(self, name)

    def _count(self, graph) -> None:
        """Count the graph figures of ``graph`` (a TaskGraph) into the fields."""
        self._counts_graph = None
        tasks = dummies = blocks = ops = flops = nbytes = wall_ns = 0
        for t in graph.tasks:
            if t.kind == "dummy":
                dummies += 1
                continue
            tasks += 1
            blocks += len(t.blocks)
            wall_ns += t.wall_ns
            for b in t.blocks:
                ops += b.ops
                flops += b.flops
                nbytes += b.bytes
        self.tasks, self.dummies, self.blocks = tasks, dummies, blocks
        self.tile_ops, self.flops, self.bytes = ops, flops, nbytes
        self.task_wall_us = wall_ns / 1e3

    @property
    def edges(self) -> int:
        """Edges of the task graph (derived + explicit + join), counted on first read."""
        g = self._edges_graph
        if g is not None:
            self._edges = sum(len(t.preds) for t in g.tasks)
            self._edges_graph = None
        return self._edges

    @edges.setter
    def edges(self, value: int) -> None:
        """Edges of the task graph (set by a caller that counts them itself)."""
        self._edges, self._edges_graph = value, None

    def edges_of(self, graph) -> None:
        """Count ``edges`` and the other graph figures from ``graph`` (a TaskGraph) when first read."""
        self._edges_graph = self._counts_graph = graph

    def as_row(self) -> dict:
        """The headline figures as a flat dict."""
        return {k: getattr(self, k) for k in ("tasks", "edges", "blocks", "tile_ops", "bytes", "flops",
                                              "heap_peak_bytes", "scratch_bytes", "wall_us")}


# runtime/blocks.py installs its execute wrapper here (the rerun of a program whose block template
# recording could not go on); None: no wrapper
_block_execute = None

_COUNTED = frozenset(("tasks", "dummies", "blocks", "tile_ops", "bytes", "flops", "task_wall_us"))
_now_ns = time.perf_counter_ns

_LHS = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*(?::[^=]*)?=(?!=)")


def _lhs_name(frame) -> str | None:
    if frame is None:
        return None
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    hit = _LHS_NAMES.get(key)
    if hit is None or hit[0] is not code:  # once per call site (as _site): the line is read and matched
        if len(_LHS_NAMES) > 100_000:
            _LHS_NAMES.clear()
        m = _LHS.match(linecache.getline(code.co_filename, frame.f_lineno))
        hit = _LHS_NAMES[key] = (code, m.group(1) if m else None)
    return hit[1]


_LHS_NAMES: dict = {}  # (id(code), bytecode offset) -> (code, assignment target or None)
_ARG_SITES: dict = {}  # (kernel name, parameter name) -> the site text of its argument buffers


# (id(code), bytecode offset) -> (code, "file:line"): frame.f_lineno decodes the line table, and
# hashing a code object hashes its contents; holding the code keeps its id from being reused
_SITES: dict = {}


def _site(frame) -> str:
    if frame is None:
        return "<unknown>"
    if type(frame) is str:
        return frame
    code = frame.f_code
    hit = _SITES.get((id(code), frame.f_lasti))
    if hit is None:
        if len(_SITES) > 100_000:
            _SITES.clear()
        hit = _SITES[(id(code), frame.f_lasti)] = (code, _ctx.frame_site(frame))
    return hit[1]


class Program:
    """One execution of a jit function; see the module docstring.

    Attributes:
        graph: the TaskGraph; stats: ProgramStats (after the run);
        result: the function's return value mapped to torch tensors;
        buffers: every root Buffer (arguments and allocations);
        replayed: False (True on a replay of the program cache, runtime/replay.py).
    """

    replayed = False

    def __init__(self, jf, config: RunConfig | None = None, params=None):
        """Set up a run of ``jf`` under ``config``; ``params``: the arguments of the coming
        :meth:`execute` already bound by ``bind_arguments(jf, args, kwargs, gm=False)`` (the
        program cache binds them for its key), None to bind them there.

        Raises:
            ConfigError: ``config`` is not a RunConfig, fails its validation, or asks for a
                heap larger than the host can reserve.
        """
        self.jf = jf
        self.name = jf.__name__
        self._bound = params
        if config is not None and not isinstance(config, RunConfig):
            raise ConfigError(f"kernel {self.name}: config= must be a pto.RunConfig, got {type(config).__name__} "
                              f"{config!r}; write config=pto.RunConfig(...)")
        self.config = config.validate() if config is not None else RunConfig()  # the defaults are valid
        self.check = self.config.check
        # graph-only mode (RunConfig(execute=False)): pto.runtime.graph_only.GraphOnlyState
        self.go = None if self.config.execute else GraphOnlyState(self)
        try:
            self.heap = RingHeap(self.config.heap_bytes, backing=self.go is None)
        except (RuntimeError, MemoryError) as e:
            raise ConfigError(f"RunConfig.heap_bytes={self.config.heap_bytes}: cannot reserve that many bytes of "
                              f"host memory for the ring heap ({type(e).__name__}); lower heap_bytes "
                              f"(default {RunConfig.heap_bytes})") from None
        self.graph = TaskGraph()
        self.deps = DepTracker()
        self.lazy = LazyDerivation(self.deps)  # edges of a plain run are derived on first read
        self.buffers: list[Buffer] = []
        self._no_copy_data: list = []  # the tensors of the no-copy (Buffer.no_copy) arguments
        self._no_copy_storages = None  # their storages (no_copy_storages), on first use
        # Out/InOut arguments written in place (see _writes_in_place): (view, its values before the
        # store that overwrote it), appended by Buffer.save_view before each such store; restored
        # newest first if the program raises
        self.undo: list = []
        self._in_place = False
        self.args: list = []  # (Param, caller tensor, GMTensor)
        self.manual = False
        self.scopes: list[list[Buffer]] = [[]]
        self.cur_task: Task | None = None
        # the running block (the same as this thread's pl state.block while the program runs; read
        # by the GM access fast paths, which reach the program through the buffer)
        self.cur_block: Block | None = None
        self.result = None
        self.stats = ProgramStats()
        self.races = None
        self.sanitizer = None
        self.dropped_init: list[str] = []  # allocations whose init_value the mutation hook dropped
        dropped = _sanitizer.active_drop_init()
        self._drop_init = frozenset(self.config.drop_init) | dropped if self.config.drop_init else dropped
        self.orch_reads = 0
        self._t0 = 0
        # schedule sensitivity (RunConfig.block_order): the block order of each task (None:
        # index order), whether atomic adds are held back, the buffers holding some, and per
        # atomic-add task the buffers on which its contributions were applied out of program
        # order against overlapping ones
        self.reorder = None if self.config.block_order == "program" else self._block_sequence
        self.defer_atomics = self.reorder is not None
        self._pending: list[Buffer] = []
        self._flushes = 0
        self.atomic_reordered: dict[int, set] = {}
        # a task scope left early (break/return/exception): the DslError message, raised at the
        # next runtime interaction or at program end (see end_task); its cause (a race found in
        # the blocks that ran), if any
        self.left_early: str | None = None
        self._left_early_cause: BaseException | None = None
        # PtoErrors created inside a running block, (block, error); non-empty at the normal end of
        # a task means kernel code caught one: the task fails with it (see end_task)
        self.block_errors: list = []

    def __repr__(self) -> str:
        s = self.stats
        state = ("not run" if not self._t0 else
                 f"{s.tasks} tasks, {s.blocks} blocks, {s.edges} edges, heap peak {s.heap_peak_bytes} B, "
                 f"{s.wall_us / 1e3:.1f} ms")
        return f"<pto Program {self.name}{' (check mode)' if self.check else ''}: {state}>"

    @property
    def no_copy_storages(self) -> set:
        """The storages (``untyped_storage().data_ptr()``) of the no-copy (``Buffer.no_copy``) In
        arguments: a tile viewing one is copied before a tile write (tensor_ops.aliases_readonly).
        Built on first use (the arguments are all bound before the kernel body runs)."""
        s = self._no_copy_storages
        if s is None:
            s = self._no_copy_storages = {d.untyped_storage().data_ptr() for d in self._no_copy_data}
        return s

    @property
    def dyn_dims(self) -> dict:
        """The runtime extents of this call's ``pl.dynamic`` dims by name (``{"T": 129}``), for
        capacity errors on the sizes derived from them; ``{}`` before the arguments are bound."""
        d = self.__dict__.get("_dyn_dims")
        if d is None:
            params = self.__dict__.get("_params") or ()
            d = {dv.name: p.value.shape[i] for p in params if isinstance(p.ann, TensorType) and p.ann.dims
                 for i, dv in enumerate(p.ann.dims) if isinstance(dv, DynVar)}
            if params:
                self._dyn_dims = d
        return d

    @dyn_dims.setter
    def dyn_dims(self, value: dict) -> None:
        """Set the dynamic dims (a replay takes its recording's)."""
        self._dyn_dims = value

    # ---- run -----------------------------------------------------------------
    def execute(self, args, kwargs) -> "Program":
        """Bind, run and finish; returns self. Raises the program's errors."""
        if _block_execute is not None:  # block templates (runtime/blocks.py): may rerun the program plainly
            return _block_execute(self, self._execute, args, kwargs)
        return self._execute(args, kwargs)

    def _execute(self, args, kwargs) -> "Program":
        """:meth:`execute`, once."""
        params = self._bound
        if params is None:
            params = bind_arguments(self.jf, args, kwargs, gm=False)
        else:
            self._bound = None
        self._params = params  # dyn_dims is built from them when first read
        check_written_aliasing(self.name, params, self.check)
        self._in_place = self._writes_in_place(params)
        values = []
        for p in params:
            if isinstance(p.ann, TensorType):
                values.append(self._bind_tensor(p))
            else:
                values.append(p.value)
        if self.check:
            from pto.runtime.races import RaceChecker
            self.races = RaceChecker(self)
            self.sanitizer = _sanitizer.Sanitizer(self)
        st = _ctx.state
        if st.program is not None:
            raise DslError(f"program {self.name} started while another program is running")
        st.program, st.block, st.check = self, None, self.check
        # The cyclic GC would rescan the growing task graph over and over (about 9 us per task on
        # 10k-task programs); pause it for the run, cyclic garbage made meanwhile is collected after.
        _gc_pause()
        self._t0 = time.perf_counter_ns()
        ok = False
        try:
            ret = self.jf.fn(*values)
            if self.cur_task is not None:
                if self.left_early is not None:
                    self.raise_left_early()
                raise DslError(f"program {self.name} ended inside task {self.cur_task.name!r}")
            while self._pending:
                self.flush_atomics(self._pending[-1])
            if self.config.drop_init:
                self._check_drop_init()
            if self.check:
                _sanitizer.check_outputs(self)
            self.result = self._map_back(ret)
            self._copy_back()
            ok = True
        except BaseException as e:
            if self.undo:
                self._undo_stores()
            if isinstance(e, Exception):
                unsupported = _unsupported_dtype_error(e)
                if unsupported is not None:  # torch has no kernel for a tile op's dtype: bad input
                    _name_context(self, unsupported)
                    raise unsupported from None
                _name_context(self, e)
            raise
        finally:
            self.undo = []
            st.program, st.block, st.check = None, None, False
            try:
                while len(self.scopes) > 1:
                    self.pop_scope()
                self.pop_scope()
                self._finish_stats()
                if self.go is not None:
                    self.go.finish(self.stats)
                self.heap.release()
                if self.sanitizer is not None:
                    self.sanitizer.release()  # the shadows go back to the pool of the next check-mode run
                if not ok:
                    self.result = None
                for buf in self.buffers:  # no Program <-> Buffer cycle: the Program is freed by refcount
                    buf.program = _ENDED
            finally:
                # last, with nothing allocated after it: the young collection that the run's
                # allocations have made due runs at the caller's next allocation, after a caller
                # that only wanted the result has dropped the Program, so it frees the task graph
                # in one pass; run here, it moved the live graph to an older generation, to be
                # scanned again when it dies (see _gc_resume)
                _gc_resume()
        return self

    def allocations(self) -> list[Buffer]:
        """The scratch allocations of the run (``pl.create_tensor``), in allocation order.

        Each is a Buffer record: ``name`` (``name=`` or the assignment target; the name
        ``RunConfig(drop_init=...)`` takes), ``site`` (``file:line``), ``shape``, ``dtype``
        (torch), ``nbytes``, ``init_value`` (None without one, and for one dropped by the
        mutation hook, which sets ``init_dropped``), ``scope`` (heap scope depth) and
        ``freed``. An allocation inside a loop appears once per iteration.
        """
        return [b for b in self.buffers if b.kind == "scratch"]

    def _check_drop_init(self) -> None:
        """ConfigError if a ``RunConfig.drop_init`` name dropped nothing in this run (no allocation
        of that name with an ``init_value``): a typo would make the mutation test pass vacuously.
        Names given through ``drop_init_values`` are not checked here: that block may span
        several programs, each with its own allocations."""
        missing = [n for n in dict.fromkeys(self.config.drop_init) if n not in self.dropped_init]
        if not missing:
            return
        with_init = list(dict.fromkeys(b.name for b in self.buffers if b.kind == "scratch"
                                       and (b.init_value is not None or b.init_dropped)))
        without = list(dict.fromkeys(b.name for b in self.buffers if b.kind == "scratch"
                                     and b.init_value is None and not b.init_dropped and b.name not in with_init))
        raise ConfigError(f"kernel {self.name}: RunConfig.drop_init names {missing} matched no allocation with an "
                          f"init_value in this run, so nothing was dropped for them (allocations with an "
                          f"init_value: {', '.join(with_init) or 'none'}; without: {', '.join(without) or 'none'})")

    def _bind_tensor(self, p) -> GMTensor:
        t = p.value
        if t.is_meta and self.go is None:
            raise BindError(f"kernel {self.name}: parameter {p.name!r} is a shape-only (meta) tensor; only graph-only "
                            f"mode (RunConfig(execute=False)) runs on those, a real run needs CPU tensors")
        if not t.is_contiguous():
            raise BindError(f"kernel {self.name}: parameter {p.name!r} must be contiguous (call .contiguous())")
        ann = p.ann
        direction = ann.direction
        written = direction != IN  # Out or InOut
        partial = ann.partial
        if self.go is not None:  # graph-only: shape-only floats, the caller's index tensors (never written)
            data = self.go.bind(t)
            if data is t and written:
                data = t.clone()
        elif not written:
            data = t
        elif direction == OUT and self.check and not partial:
            data = torch.empty_like(t)  # undefined until written: poisoned where loaded (lazy_poison below)
        elif not self._in_place:
            data = t.clone()
        else:
            data = t
        site = _ARG_SITES.get((self.name, p.name))
        if site is None:
            if len(_ARG_SITES) > 100_000:
                _ARG_SITES.clear()
            site = _ARG_SITES[(self.name, p.name)] = f"parameter {p.name!r} of {self.name}"
        buf = Buffer(len(self.buffers) + 1, p.name, site, "arg", data, self, direction=direction)
        if written:
            if data is t and self.go is None:
                buf.undo = 0  # written in place: its stores save what they overwrite (Buffer.save_view)
        else:
            buf.readonly = True
            if not isinstance(ann, WindowType) and not _compat.mode.pypto and not data.is_meta:
                buf.no_copy = True
                self._no_copy_data.append(data)
        buf.partial = partial
        if self.go is not None:
            self.go.attach(buf)
        self.buffers.append(buf)
        if self.check and direction in (OUT, INOUT):
            # Out (and PartialOut) elements are undefined until written; a PartialOut keeps the
            # caller's values in its storage for the elements the program leaves alone
            buf.shadow = _sanitizer.new_shadow(buf.shape, None if direction == OUT else 0)  # Out: Sanitizer.defer
            if direction == OUT and not partial:
                # not filled with the poison pattern (a pass over the whole output, and the copy
                # back another): every read of an undefined element goes through its shadow, so
                # a tile load gets the pattern there (poisoned()), a scalar read an undefined value,
                # and the output check keeps an unwritten element from reaching the caller
                buf.lazy_poison = True
        g = GMTensor(data, buf, p.name)
        self.args.append((p, t, g))
        return g

    def _map_back(self, ret):
        if isinstance(ret, GMTensor):
            for p, caller, g in self.args:
                if g.buf is ret.buf and ret.data.data_ptr() == g.data.data_ptr() and ret.shape == g.shape:
                    return caller
            return ret.data.clone()
        if isinstance(ret, tuple):
            return tuple(self._map_back(r) for r in ret)
        if isinstance(ret, list):
            return [self._map_back(r) for r in ret]
        return ret

    def _copy_back(self) -> None:
        # in check mode the output check passed: every element of an Out was written, and the
        # unwritten elements of a PartialOut still hold the caller's values in the private copy
        if self.go is not None:
            return  # graph-only mode writes no output
        for p, caller, g in self.args:
            if g.buf.direction in (OUT, INOUT) and g.data is not caller:  # a private copy
                caller.copy_(g.data)

    def _writes_in_place(self, params) -> bool:
        """Whether the Out/InOut arguments of this run are written in place, into the caller's
        tensors, with an undo log (``self.undo``) instead of private copies: a plain run (not check
        mode, graph-only mode or a ``block_order`` run; not under pypto compatibility) with no
        ``pld`` window among them, where no Out/InOut tensor shares bytes with another tensor
        argument (an aliased one is seen through its other parameter as before the run only with
        private copies). Either way a program that raises leaves the caller's tensors as they were."""
        if self.check or self.go is not None or self.reorder is not None or _compat.mode.pypto:
            return False
        spans = []  # (first byte, bytes, written) of every tensor argument
        any_written = False
        for p in params:
            ann = p.ann
            if isinstance(ann, TensorType):
                t = p.value
                if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
                    return False  # a BindError is raised when it is bound (a sparse tensor has no data_ptr)
                written = ann.direction != IN
                if written:
                    if isinstance(ann, WindowType):
                        return False
                    any_written = True
                spans.append((t.data_ptr(), t.nbytes, written))
        return any_written and not written_overlap(spans)

    def _undo_stores(self) -> None:
        """Give the arguments written in place back their values from before the run: the saved
        windows of the undo log, newest first (a window saved twice ends with its first values)."""
        log, self.undo = self.undo, []
        for view, saved in reversed(log):
            view.copy_(saved)

    def _finish_stats(self) -> None:
        s = self.stats
        s.wall_us = (time.perf_counter_ns() - self._t0) / 1e3
        s.edges_of(self.graph)  # the graph figures are counted on first read
        s.heap_peak_bytes = self.heap.peak

    # ---- allocation ------------------------------------------------------------
    def new_tensor(self, shape, dtype, init_value, capacity, manual_dep, name, frame) -> GMTensor:
        """Allocate a scratch tensor (see ``pl.create_tensor``)."""
        if self.left_early is not None:
            self.raise_left_early()
        site = _site(frame)
        name = name or _lhs_name(frame) or f"tensor@{site.rsplit(':', 1)[-1]}"
        for d, s in enumerate(shape):
            if s < 0:
                raise DslError(f"create_tensor {name!r} at {site}: negative dim {d} = {s}")
        if capacity is not None:
            caps = [capacity] if isinstance(capacity, int) else list(capacity)
            if len(caps) > len(shape):
                raise DslError(f"create_tensor {name!r} at {site}: capacity {capacity} has more dims than shape")
            for d, c in enumerate(caps):
                if c is not None and shape[d] > c:
                    dyn = ", ".join(f"{k}={v}" for k, v in getattr(self, "dyn_dims", {}).items())
                    raise CapacityError(f"create_tensor {name!r} at {site}: dim {d} = {shape[d]} exceeds its "
                                        f"declared capacity {c} (shape {shape}"
                                        + (f"; runtime dims of this call: {dyn}" if dyn else "") + ")")
        if init_value is not None:
            validate_init_value(name, dtype, init_value)
        dropped = init_value is not None and name in self._drop_init
        if dropped:
            init_value = None
            self.dropped_init.append(name)
        n = 1
        for s in shape:
            n *= s
        nbytes = n * dtype.itemsize
        off = self.heap.alloc(nbytes, lambda: f"{name!r} {list(shape)} {dtype} at {site}")
        stats = self.stats
        assumption = facts = None
        if self.go is not None:  # graph-only: planned in the heap, stored elsewhere (or shape-only)
            data, assumption = self.go.allocate(name, site, shape, dtype, init_value)
            if init_value is not None:
                stats.init_bytes += nbytes
        else:
            tdt = dtype.torch
            shape_t = tuple(shape)
            strides = contiguous_strides(shape_t)
            elem_off = off // tdt.itemsize
            data = self.heap.view_at(shape_t, strides, elem_off, tdt)
            facts = (elem_off, strides, shape_t, tdt.itemsize)  # what GMTensor would read from data
            if init_value is not None:
                data.fill_(init_value)
                stats.init_bytes += nbytes
            elif self.check:
                _poison(data)
        buf = Buffer(len(self.buffers) + 1, name, site, "scratch", data, self, offset=off,
                     init_value=init_value, untracked=manual_dep,
                     facts=None if facts is None else (shape_t, tdt, n * tdt.itemsize, elem_off))
        buf.init_dropped = dropped
        buf.tasks_before = len(self.graph.tasks)
        if self.go is not None:
            self.go.attach(buf, assumption)
        if self.check:  # all defined (clean: loads and stores skip the shadow) or undefined (deferred)
            self.sanitizer.track(buf, init_value is not None)
        buf.scope = len(self.scopes) - 1
        self.scopes[-1].append(buf)
        self.buffers.append(buf)
        stats.scratch_bytes += nbytes
        stats.scratch_tensors += 1
        return GMTensor(data, buf, name, facts)

    def push_scope(self) -> None:
        """Open a heap scope."""
        self.scopes.append([])

    def pop_scope(self) -> None:
        """Close the innermost heap scope, freeing its tensors."""
        for buf in self.scopes.pop():
            if buf.pending:
                self.flush_atomics(buf)
            buf.freed = buf.slow = True
            self.heap.free(buf.offset)

    # ---- tasks -----------------------------------------------------------------
    def begin_task(self, name: str, n_blocks: int, deps, frame, first_block: bool = False) -> Task:
        """Open a task (called by pl.spmd / pl.at); ``first_block``: also begin block 0."""
        if self.cur_task is not None or self.cur_block is not None:
            if self.left_early is not None:
                self.raise_left_early()
            raise DslError(f"task {name!r} at {_site(frame)} opened inside task "
                           f"{self.cur_task.name if self.cur_task else '?'!r}; task scopes cannot nest")
        tid = len(self.graph.tasks)
        if deps:
            for d in deps:
                if not (0 <= d < tid) and d != -1:
                    raise DslError(f"task {name!r} at {_site(frame)}: deps names unknown task id {d}")
            deps = [d for d in deps if d >= 0]
        task = Task(tid, name, "spmd" if n_blocks != 1 else "at", _site(frame), n_blocks, deps, self.manual)
        self.graph.tasks.append(task)
        self.cur_task = task
        if first_block:
            blk = Block(task, 0, 0)
            task.blocks.append(blk)
            _ctx.state.block = self.cur_block = blk
        task.t0 = _now_ns()
        return task

    def begin_block(self, task: Task, idx: int, phase: int = 0) -> None:
        """Open block ``idx`` (barrier phase ``phase``) of ``task``; it becomes the current block."""
        blk = Block(task, idx, phase)
        task.blocks.append(blk)
        _ctx.state.block = self.cur_block = blk

    def end_block(self) -> None:
        """Close the current block."""
        if self.go is not None and self.cur_block is not None:
            self.go.end_block(self.cur_block)
        _ctx.state.block = self.cur_block = None

    def end_task(self, task: Task, ok: bool) -> None:
        """Close a task: derive its edges, run the race checker in check mode.

        ``ok`` False: the task scope was left early (break, return or an exception inside it);
        see :meth:`_end_task_early`. Never raises in that case.
        """
        task.wall_ns = _now_ns() - task.t0
        self.cur_task = None
        _ctx.state.block = self.cur_block = None
        if self.block_errors:
            caught, self.block_errors = self.block_errors, []
            if ok:  # the blocks ran to their end although a PtoError was raised in one of them
                raise _caught_error(self.name, task, caught)
        if not ok:
            self._end_task_early(task)
            return
        blocks = task.blocks
        if len(blocks) == 1:
            fp = blocks[0].fp
            n = len(fp)
            distinct = True  # at most one box per (buffer, kind): nothing to group or coalesce
            if n == 3:  # the common load, load, store task
                (b0, _, k0), (b1, _, k1), (b2, _, k2) = fp
                distinct = not ((b0 is b1 and k0 == k1) or (b0 is b2 and k0 == k2) or (b1 is b2 and k1 == k2))
            elif n == 2:
                distinct = fp[0][0] is not fp[1][0] or fp[0][2] != fp[1][2]
            elif 1 < n <= 4:
                for i in range(1, n):
                    b, _, k = fp[i]
                    for j in range(i):
                        e = fp[j]
                        if e[0] is b and e[2] == k:
                            distinct = False
                            break
                    if not distinct:
                        break
            elif n > 4:
                distinct = len({(id(b), k) for b, _, k in fp}) == n
            if distinct:
                task.grouped = fp  # the raw records; footprints and buffer ids are built on first access
                if self.races is None:  # _close_task of a plain run, inline
                    lazy = self.lazy
                    task._preds, task._lazy = None, lazy
                    lazy.pending.append((task.id, fp, task.manual, task.explicit))
                    if not self.config.keep_footprints:
                        blocks[0].fp = None
                    return
                self._close_task(task)
                return
        # footprints and buffer ids are built from it on first access
        task.grouped = group_footprints([blk.fp for blk in task.blocks])
        self._close_task(task)

    def _end_task_early(self, task: Task) -> None:
        """Close a task whose scope was left early, on this abnormal path only (the normal path
        pays nothing for it): its edges are derived from the footprints of the blocks that did
        run and, in check mode, they are race-checked, so the graph never silently lacks them.
        The program cannot go on with a partly run task: a DslError naming the task, where it
        was left and how many blocks had started is kept in ``left_early`` and raised at the next
        task, allocation, join node or orchestration read, or at program end. ``cur_task`` stays
        set, so ``begin_task`` finds it on its existing nesting check. Nothing is raised here: an
        exception already leaving the task scope (and maybe the program) stays the one the
        caller sees; a race found in the recorded blocks becomes part of the message."""
        started = len({b.idx for b in task.blocks})
        where = f" in block {task.blocks[-1].idx}" if task.blocks else ""
        msg = (f"left task {task.name!r} (opened at {task.site}) early at {_exit_site()}{where}, after "
               f"{started} of {task.n_blocks} blocks had started (break, return or an exception inside the "
               f"task scope); a task scope must run all its blocks to the end: keep break and return out of it "
               f"and handle exceptions inside the block body")
        cause = None
        n_groups = len(self.races.groups) if self.races is not None else 0
        try:
            self.end_task(task, True)  # derive edges, race-check the footprints that were recorded
            if self.races is not None:
                cause = self.races.report(n_groups)  # the races of this task's blocks
        except PtoError as e:
            cause = e
        if cause is not None:
            msg += f"; the blocks that ran also fail the check: {cause}"
        self.cur_task = task
        if self.left_early is None:
            self.left_early, self._left_early_cause = msg, cause

    def raise_left_early(self) -> None:
        """Raise the DslError of a task scope left early (see :meth:`_end_task_early`)."""
        err = DslError(self.left_early)
        if self._left_early_cause is not None:
            raise err from self._left_early_cause
        raise err

    def _close_task(self, task: Task) -> None:
        """Derive ``task.preds`` from ``task.grouped`` (plus its explicit deps) and run the race
        checker (check mode), or queue the derivation until someone reads a task's preds (a
        plain run: ``self.lazy``) and drop the blocks' raw footprints (unless ``keep_footprints``)."""
        if self.races is not None:
            task.preds = derive_task(self.deps, task)
            self.races.check_task(task)
            return
        self.lazy.add(task)
        if not self.config.keep_footprints:
            for blk in task.blocks:
                blk.fp = None

    def add_dummy(self, deps, frame) -> int:
        """A join node (``pl.system.task_dummy``); returns its id."""
        if self.left_early is not None:
            self.raise_left_early()
        tid = len(self.graph.tasks)
        for d in deps:
            if not 0 <= d < tid:
                raise DslError(f"task_dummy at {_site(frame)}: deps names unknown task id {d}")
        task = Task(tid, "task_dummy", "dummy", _site(frame), 0, deps, self.manual)
        task.preds = set(deps)
        self.graph.tasks.append(task)
        if self.races is not None:
            self.races.add_node(task)
        return tid

    # ---- schedule sensitivity (RunConfig.block_order) ------------------------------
    def _block_sequence(self, task: Task, blocks=None, phase: int = 0) -> list:
        """The order in which the blocks of ``task`` (``blocks``: those of syncall phase
        ``phase``; default all) run under ``RunConfig.block_order``."""
        seq = list(range(task.n_blocks)) if blocks is None else list(blocks)
        if self.config.block_order == "reverse":
            seq.reverse()
        else:
            random.Random(f"{self.config.block_order_seed}:{task.id}:{phase}").shuffle(seq)
        return seq

    def defer_atomic(self, buf: Buffer, blk: Block, dst: torch.Tensor, src: torch.Tensor, box) -> None:
        """Hold back one atomic-add contribution ``dst += src`` of ``blk`` onto ``buf``
        (``box``: its root 2-D footprint, a box or a list of boxes) until the next plain
        access of ``buf`` (see :meth:`flush_atomics`). The fast GM access paths skip a
        buffer that holds some (``buf.slow``)."""
        if buf.pending is None:
            buf.pending = []
            self._pending.append(buf)
        buf.pending.append((blk.task.id, blk.idx, dst, src.clone(), box))
        buf.slow = True

    def flush_atomics(self, buf: Buffer) -> None:
        """Apply the held-back atomic adds onto ``buf``: task by task in a reverse or seeded
        random order that the task graph allows (a task waits for every contributing task it
        has a path from; the running task, whose edges are not derived yet, goes last), each
        task's contributions in the order its blocks ran. Inversions against program order
        between overlapping contributions are recorded in ``atomic_reordered``."""
        contribs, buf.pending = buf.pending, None
        buf.slow = buf.freed
        self._pending.remove(buf)
        by_task: dict = {}
        for c in contribs:
            by_task.setdefault(c[0], []).append(c)
        order = self._atomic_task_order(list(by_task), buf) if len(by_task) > 1 else list(by_task)
        seq = [c for tid in order for c in by_task[tid]]
        for _tid, _idx, dst, src, _box in seq:
            dst.add_(src)
        self._record_inversions(buf, seq)

    def _atomic_task_order(self, tids: list, buf: Buffer) -> list:
        """A topological order of the tasks ``tids`` (in program order) under the graph's
        paths: reverse (the latest ready task first) or seeded random."""
        cur = self.cur_task.id if self.cur_task is not None else None
        closed = [t for t in tids if t != cur]
        preds = {t: {u for u in closed if u < t and self.graph.reachable(u, t)} for t in closed}
        self._flushes += 1
        rng = random.Random(f"{self.config.block_order_seed}:flush:{buf.id}:{self._flushes}")
        out: list = []
        ready = [t for t in closed if not preds[t]]
        while ready:
            t = max(ready) if self.config.block_order == "reverse" else rng.choice(ready)
            ready.remove(t)
            out.append(t)
            for u in closed:
                if t in preds[u]:
                    preds[u].discard(t)
                    if not preds[u]:
                        ready.append(u)
        return out + ([cur] if cur in tids else [])

    def _record_inversions(self, buf: Buffer, seq: list) -> None:
        """Mark the tasks of two overlapping contributions applied against program order."""
        items = []
        for pos, (tid, idx, _d, _s, box) in enumerate(seq):
            for b in (box if type(box) is list else [box] if box is not None else []):
                items.append((b, (tid, idx), pos))
        items.sort(key=lambda it: it[0][0])
        for i, (bi, ki, pi) in enumerate(items):
            for bj, kj, pj in items[i + 1:]:
                if bj[0] >= bi[1]:
                    break
                if ki != kj and (ki < kj) != (pi < pj) and bi[2] < bj[3] and bj[2] < bi[3]:
                    for tid in (ki[0], kj[0]):
                        self.atomic_reordered.setdefault(tid, set()).add(buf.name)

    # ---- check mode hooks ------------------------------------------------------
    def orchestration_read(self, buf: Buffer, box) -> None:
        """An orchestration-level ``pl.read`` (blocks until the producer is done)."""
        if self.left_early is not None:
            self.raise_left_early()
        self.orch_reads += 1

    def consume_undefined(self, mask: torch.Tensor, blk: Block | None, how: str = "load") -> torch.Tensor:
        """Check mode: tag the raw undefined elements of ``mask`` with ``blk``
        as their first consumer (in place; see runtime/sanitizer.py)."""
        return self.sanitizer.consume(mask, blk, how)

    @staticmethod
    def poisoned(data: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Check mode: a tile's ``data`` loaded from an Out argument (``Buffer.lazy_poison``)
        with the poison pattern where its definedness ``mask`` is nonzero (:func:`poisoned`)."""
        return poisoned(data, mask)

    def consume_scalar(self, tag: int, blk: Block | None, site: str | None = None) -> int:
        """Check mode: the tag of an undefined scalar read by ``blk`` (None:
        an orchestration read at ``site``)."""
        return self.sanitizer.consume_scalar(tag, blk, "scalar read", site)

    def describe_undefined(self, tag: int) -> str:
        """Check mode: origin allocation and first consumer of a tag, one line."""
        return self.sanitizer.describe(tag)

    def footprints(self, task: Task) -> list[Footprint]:
        """The coalesced footprints of ``task`` as Footprint records."""
        return [Footprint(buf.name, buf.id, KIND_NAMES[k], box) for buf, k, box in task.footprints]


class _EndedProgram:
    """The ``program`` of a Buffer whose program has ended (``Program.execute`` sets it, so that
    a Program and its buffers form no reference cycle and the Program is freed by refcount). The
    GM access fast paths read ``cur_block`` (None: no block of it runs) and take the general path;
    anything else a GM tensor of an ended program is asked for is a DslError."""

    cur_block = None
    defer_atomics = False
    sanitizer = None
    name = "<ended program>"

    def __getattr__(self, name):
        raise DslError(f"a GM tensor of a program that has ended was used (it needed the program's {name!r}); "
                       f"GM tensors live only while their @pl.jit program runs: pass torch tensors to the next "
                       f"program instead")


_ENDED = _EndedProgram()


# programs running in any thread, and whether the cyclic GC was on before the first of them started
_GC_STATE = [0, False]
_GC_LOCK = threading.Lock()


# ``import pto`` moves the objects that exist then (the imported modules: torch's alone are about
# 200k) to the collector's permanent generation (gc.freeze), so that no later collection rescans
# them: the first full collection after the imports took about 9 µs per task of a 10k-task first
# call. Freezing at the first program instead would freeze that program's arguments too (an
# argument in a reference cycle would never be collected). PTO_GC_FREEZE=0 turns it off.
FREEZE_IMPORTS = os.environ.get("PTO_GC_FREEZE", "1").strip() != "0"


# glibc's malloc gives freed memory at the top of its heap back to the OS as soon as more than
# M_TRIM_THRESHOLD bytes are free there, and serves requests above M_MMAP_THRESHOLD with a fresh
# mmap; both are page faults again on the next touch. Once a program's memory goes back promptly
# (no private Out/InOut copies kept alive by its reference cycles until a collection, the Program
# freed by refcount) every call paid them again: rms_norm at flash decode 56 faults per call
# (0.08 ms of system time), prefill 870 (1.5 ms).
# pto keeps up to 128 MiB of such memory mapped and serves requests up to 32 MiB from the heap
# (glibc's own dynamic threshold goes up to 32 MiB too). Not done when the environment sets a
# malloc tunable itself (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, GLIBC_TUNABLES), off with
# PTO_MALLOC_TUNING=0, and a no-op where the C library has no mallopt (not glibc).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MALLOC_TRIM_BYTES = 128 << 20
MALLOC_MMAP_BYTES = 32 << 20


def check_written_aliasing(program: str, params, check: bool = False) -> None:
    """Raise when two Out/InOut tensor arguments of one call share bytes (``k(buf, buf)``, or
    ``buf[0:16]`` and ``buf[8:24]``): each is written through its own parameter, so the bytes both
    write would end as whichever is copied back last, a lost update no check can see. In check
    mode (``check``) an In argument that shares bytes with an Out/InOut one is refused too: on the
    device the kernel reads what its own stores wrote (one GM buffer, in place, with no task edge
    or race check between the two parameters), while pto reads the In argument's values from
    before the run, so neither the results nor the race checker would be the device's. Under
    pypto compatibility (where pypto-lib code may pass one tensor twice) they are left alone.

    Raises:
        BindError: naming the program and both parameters.
    """
    if _compat.mode.pypto:
        return
    spans = []
    for p in params:
        ann = p.ann
        if isinstance(ann, TensorType) and (check or ann.direction != IN):
            t = p.value
            if (isinstance(t, torch.Tensor) and t.layout is torch.strided and t.nbytes and not t.is_meta
                    and t.is_contiguous()):  # a shape-only (meta) tensor has no bytes of its own
                spans.append((t.data_ptr(), t.data_ptr() + t.nbytes, p.name, ann.direction != IN))
    if len(spans) < 2:
        return
    spans.sort()
    end = w_end = -1  # furthest end of any earlier span, of any earlier written span
    name = w_name = None
    for s0, e, n, written in spans:
        if s0 < w_end or (written and s0 < end):
            if s0 < w_end and written:
                raise BindError(f"{program}: written arguments {w_name!r} and {n!r} share memory; each Out/InOut "
                                "argument needs bytes of its own (pass separate tensors, or one InOut)")
            read, wrote = (name, n) if written else (n, w_name)
            raise BindError(f"{program}: In argument {read!r} shares memory with the written argument {wrote!r}; "
                            "in check mode each needs bytes of its own (on the device the In parameter would "
                            "read the kernel's own stores, pto reads its values from before the run): pass a "
                            "copy, or make it one InOut parameter")
        if e > end:
            end, name = e, n
        if written and e > w_end:
            w_end, w_name = e, n


def written_overlap(spans) -> bool:
    """True when a written span shares bytes with another span. ``spans``: ``(first byte
    (data_ptr), bytes (nbytes), written)`` of every tensor argument of a call; tensor arguments
    are contiguous, so ``nbytes`` is a tensor's extent. Two tensors over the same memory through
    different storages (``torch.from_numpy`` of overlapping numpy views) overlap here too."""
    # one sweep in order of first byte (a decode step binds ~300 arguments, ~40 of them written:
    # the pairwise test was 12k comparisons per call): a span overlaps an earlier one iff it starts
    # before the furthest end seen so far; it matters when either of the two is written
    end = w_end = -1
    for s0, e, written in sorted((s0, s0 + sn, written) for s0, sn, written in spans if sn):
        if s0 < w_end or (written and s0 < end):
            return True
        if e > end:
            end = e
        if written and e > w_end:
            w_end = e
    return False


def tune_malloc() -> bool:
    """Set glibc's trim and mmap thresholds for pto's allocation pattern (see the comment above
    this function); ``import pto`` calls it once. Returns whether they were set."""
    if os.environ.get("PTO_MALLOC_TUNING", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    if any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")):
        return False
    try:
        import ctypes
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_BYTES))


tune_malloc()


def freeze_imports() -> None:
    """Freeze the objects that exist now (``gc.freeze``): call it after importing what a run
    needs and before building its inputs (the CLI does, after loading the kernel modules),
    so that later collections do not rescan the imported modules. ``import pto`` does it
    once. Objects frozen are never collected if they die in a reference cycle: never call it
    while large inputs are alive. No effect with ``PTO_GC_FREEZE=0``."""
    if FREEZE_IMPORTS:
        with _GC_LOCK:
            gc.freeze()


def _gc_pause() -> None:
    """Pause the cyclic GC while at least one program runs (in any thread)."""
    with _GC_LOCK:
        if _GC_STATE[0] == 0:
            _GC_STATE[1] = gc.isenabled()
            gc.disable()
        _GC_STATE[0] += 1


def _gc_resume() -> None:
    """End of a program: turn the GC back on when the last running program ends (if it was on).

    The objects the run allocated (its task graph: about 11 per single-block task) are all in the
    youngest generation then, and its count is far past the threshold: the next allocation of a
    tracked object runs a collection. ``Program.execute`` calls this last, so that the
    collection comes after the caller has taken the result: a caller that dropped the Program
    freed its graph by refcount (it holds no cycle), so that pass finds next to nothing; one that
    keeps the Program while it allocates (reading its statistics) has the pass move the live
    graph to an older generation, about 1.5 us per task, up to three times as much when the
    object allocator's pools are fragmented. :func:`gc_paused` around the call and the reads
    avoids it."""
    with _GC_LOCK:
        _GC_STATE[0] -= 1
        if _GC_STATE[0] == 0 and _GC_STATE[1]:
            gc.enable()


class gc_paused:
    """``with gc_paused(): prog = kernel.run(...); read prog.stats; del prog``: the cyclic GC
    stays paused (as inside a program) until the block ends, so a caller that reads a program's
    statistics and then drops it never has a collection scan the live task graph; the graph is
    freed by refcount when dropped. Nests with running programs and other such blocks, in any
    thread."""

    __slots__ = ()

    def __enter__(self) -> "gc_paused":
        _gc_pause()
        return self

    def __exit__(self, et, ev, tb) -> bool:
        _gc_resume()
        return False


def _record_block_error(err: PtoError) -> None:
    """``pto.errors`` hook: remember a PtoError created while a task block runs (and, on the
    error, that block, for :func:`_name_context`)."""
    st = _ctx.state
    blk = st.block
    if blk is not None and st.program is not None:
        st.program.block_errors.append((blk, err))
        err._pto_block = blk


# torch's refusals of an operation for a dtype ("add_stub" not implemented for 'UInt32'; BOOL - and negation)
_UNSUPPORTED = re.compile(r'"\w+" not implemented for \'\w+\'|'
                          r'the `-` operator, (with|on) (a|two) bool tensors? is not supported')


def _unsupported_dtype_error(err: Exception):
    """A DslError for ``err`` when it is torch refusing an operation for a dtype (an arithmetic
    op on a UINT32 or BOOL tile: ``"add_stub" not implemented for 'UInt32'``), else None."""
    if not isinstance(err, (NotImplementedError, RuntimeError)) or isinstance(err, PtoError):
        return None
    msg = str(err)
    if not _UNSUPPORTED.search(msg):
        return None
    e = DslError(f"a tile operation on a dtype the CPU runtime cannot compute it for (torch: {msg.splitlines()[0]}); "
                 "cast the tile to a dtype it supports first (pl.cast)")
    e._pto_block = getattr(err, "_pto_block", None)
    e._pto_site = _raise_site(err)  # the kernel line (this error has no traceback of its own yet)
    return e


def _name_context(prog: "Program", err: Exception) -> None:
    """Make ``err``, leaving program ``prog``, name the kernel, the task and block it was raised
    in (if any) and the kernel-source ``file:line``.

    A PtoError gets the pieces its message lacks as a prefix (messages built by the runtime
    that already name kernel, task and block are left alone); any other exception (raised by
    kernel code, or by torch under it) keeps its type and message and gets the context as a
    note (``add_note``; the CLI prints it). Done once per exception.
    """
    if getattr(err, "_pto_named", False):
        return
    err._pto_named = True
    blk = getattr(err, "_pto_block", None)
    if blk is not None and not (blk.task.id < len(prog.graph.tasks) and prog.graph.tasks[blk.task.id] is blk.task):
        blk = None  # a block of another program
    if blk is None and prog.cur_task is not None and prog.cur_task.blocks:
        blk = prog.cur_task.blocks[-1]  # the task scope the exception left (see _end_task_early)
    site = getattr(err, "_pto_site", None) or _raise_site(err)
    if isinstance(err, PtoError):
        msg = str(err)
        if f"kernel {prog.name}" in msg and "task " in msg and " block" in msg:
            return
        pieces = [] if f"kernel {prog.name}" in msg else [f"kernel {prog.name}"]
        if blk is not None and not (f"task {blk.task.name!r}" in msg and f"block {blk.idx}" in msg):
            pieces.append(f"task {blk.task.name!r} (#{blk.task.id}) block {blk.idx}")
        if site is not None and site not in msg:
            pieces.append(f"at {site}")
        if pieces:
            err.args = (f"{', '.join(pieces)}: {msg}",) + tuple(err.args[1:])
        return
    where = f"kernel {prog.name}"
    if blk is not None:
        where += f", task {blk.task.name!r} (#{blk.task.id}) block {blk.idx}"
    if site is not None:
        where += f", at {site}"
    err.add_note(f"raised in {where}")


def _caught_error(kernel: str, task: Task, caught: list) -> PtoError:
    """The error that fails ``task`` because kernel code caught the PtoErrors in ``caught``
    (``[(block, error), ...]``): the class of the first one, naming the task, the block and
    the kernel-source line that raised it; the original is its ``__cause__``."""
    blk, err = caught[0]
    site = _raise_site(err)
    more = f" ({len(caught) - 1} more in this task)" if len(caught) > 1 else ""
    msg = (f"kernel {kernel}: task {task.name!r} (#{task.id}, {task.site}) block {blk.idx}: "
           f"{type(err).__name__} raised{f' at {site}' if site else ''} inside the block and caught by kernel "
           f"code{more}; a PtoError inside a block fails the program (the device has no exceptions: test the "
           f"condition instead of catching the error): {err}")
    try:
        new = type(err)(msg)
    except Exception:  # noqa: BLE001 - a subclass with another constructor
        new = DslError(msg)
    new.__cause__ = err
    return new


def _raise_site(exc) -> str | None:
    """``file:line`` (relative to the current directory) of the innermost kernel-source frame
    in the traceback of ``exc`` (None without one)."""
    site = None
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        if not _in_pto(tb.tb_frame):
            site = f"{_ctx.rel_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _exit_site() -> str:
    """``file:line`` where a task scope is being left early: the innermost kernel-source frame
    of the exception leaving it (also when it closes the scope's generator), else the
    kernel-source line running now (a ``break`` or ``return``)."""
    exc = sys.exc_info()[1]
    if isinstance(exc, GeneratorExit):
        exc = exc.__context__
    site = _raise_site(exc)
    if site is None:
        f = sys._getframe(1)
        while f is not None and _in_pto(f):
            f = f.f_back
        site = _ctx.frame_site(f) if f is not None else "<unknown>"
    return site


_PTO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../pto/
_MODELS_DIR = _PTO_DIR + "models" + os.sep
_IN_PTO: dict = {}  # source file name -> pto's own code


def _in_pto(frame) -> bool:
    """The frame runs pto's own code (language, runtime, golden, compat, cli), not kernel source
    (the kernels in pto/models count as kernel source)."""
    fname = frame.f_code.co_filename
    inside = _IN_PTO.get(fname)
    if inside is None:
        inside = _IN_PTO[fname] = fname.startswith(_PTO_DIR) and not fname.startswith(_MODELS_DIR)
    return inside


_POISON_VALUE: dict = {}  # torch dtype -> its one-element poison tensor (the pattern _poison fills)


def poisoned(data: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``data`` (a tile's values loaded from a check-mode Out argument, ``Buffer.lazy_poison``)
    with the poison pattern where ``mask`` (its definedness mask, same shape) is nonzero: NaN
    for floats, True for BOOL, bytes 0xAB for integers, as :func:`_poison` fills storage. A new
    tensor; ``data`` is not written."""
    v = _POISON_VALUE.get(data.dtype)
    if v is None:
        v = torch.empty(1, dtype=data.dtype)
        _poison(v)
        _POISON_VALUE[data.dtype] = v
    return torch.where(mask != 0, v, data)


def _poison(data: torch.Tensor) -> None:
    if data.dtype.is_floating_point:
        data.fill_(float("nan"))
    elif data.dtype == torch.bool:
        data.fill_(True)
    else:
        data.view(torch.uint8).fill_(POISON_BYTE) if data.is_contiguous() else data.fill_(-85)
