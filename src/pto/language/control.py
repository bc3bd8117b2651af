"""Task-creating scopes and loops (hw-native-sys/pypto `docs/en/user/`).

* ``for b in pl.spmd(n, name_hint=...)``: one task of ``n`` blocks; each
  iteration is one block. The object is also the task handle:
  ``s = pl.spmd(n); for b in s: ...; s.tid``. As a decorator,
  ``@pl.spmd(n, ...)`` on ``def body(b): ...`` runs the task and binds the
  name to its task id. A generator body (``yield pl.system.syncall()``) is
  the form that supports the all-block barrier.
* ``with pl.at(level=pl.Level.CORE_GROUP, name_hint=...) as tid``: one task of
  one block.
* ``pl.manual_scope()``: dependency derivation off inside (explicit ``deps=``
  only); ``pl.scope()``: a heap scope whose tensors are freed at exit.
* ``pl.range`` / ``pl.pipeline`` / ``pl.unroll`` / ``pl.parallel``: loops.
  Inside a task they are on-core loops; in orchestration every iteration is an
  AUTO scope (tensors created in it are freed at the end of the iteration).
"""

from __future__ import annotations

import inspect

from pto.errors import DslError
from pto.language import _ctx
from pto.language.typing import as_int, concrete

__all__ = ["Level", "spmd", "at", "manual_scope", "scope", "range", "pipeline", "unroll", "parallel"]

_builtin_range = range


class Level:
    """Hierarchy levels for ``pl.at``."""

    CORE_GROUP = "core_group"
    CHIP = "chip"
    HOST = "host"


def _deps_list(deps):
    """Task ids of a ``deps=`` argument: a task id, a ``pl.spmd`` / ``pl.at`` object that has run,
    or a list or tuple of them (nested lists flattened, ``None`` skipped; ``-1`` stays, the caller
    ignores it as the invalid id). A bare id is one dependency, ``deps=0`` included.

    Raises:
        DslError: an entry that is no task id, or a task scope that has not run yet (its id is not
            known: the dependency would be dropped).
    """
    if deps is None:
        return []
    if not isinstance(deps, (list, tuple)):
        deps = [deps]
    out = []
    for d in deps:
        if d is None:
            continue
        if isinstance(d, (list, tuple)):
            out.extend(_deps_list(d))
        elif isinstance(d, (spmd, at)):
            if d.tid < 0:
                raise DslError(f"deps=: task {d.name!r} (pl.{type(d).__name__}) has not run yet, so it has no "
                               f"task id to depend on; run it first or pass the id it returns{_ctx.user_site()}")
            out.append(d.tid)
        elif hasattr(d, "tid"):
            out.append(d.tid)
        else:
            v = concrete(d, "a task id")
            if isinstance(v, bool) or not isinstance(v, int):
                raise DslError(f"deps=: expected task ids (ints returned by pl.at / pl.spmd / task_dummy) or "
                               f"pl.spmd objects, got {d!r}{_ctx.user_site()}")
            out.append(v)
    return out


class spmd:
    """One SPMD task of ``n`` blocks (see the module docstring for the forms).

    Args:
        n: block count (a runtime value is fine; 0 blocks is an empty task).
        name_hint: task name (swimlane row, messages).
        deps: explicit extra predecessors (task ids; ``-1`` = invalid, ignored).
        allow_early_resolve, sync_start: scheduling hints, numerically inert.

    Raises:
        DslError: nested task scopes, or ``with pl.spmd(n)`` with ``n != 1``.
    """

    def __init__(self, n, name_hint: str = "", deps=None, allow_early_resolve: bool = False,
                 sync_start: bool = False, predicate=None, optimizations=None):
        self.n = as_int(n, "an spmd block count")
        if self.n < 0:
            raise DslError(f"pl.spmd: negative block count {self.n}")
        self.name = name_hint or "spmd"
        self.deps = deps
        self.tid = -1
        self._site = _ctx.user_frame()

    def __iter__(self):
        return self._blocks(None)

    def __call__(self, body):
        """Decorator form: run ``body(b)`` for every block; returns the task id."""
        phased = inspect.isgeneratorfunction(body)
        blocks = self._blocks(body if phased else None)
        try:
            for b in blocks:  # a phased body runs inside _blocks, which then yields nothing
                body(b)
        finally:
            blocks.close()  # a body error ends the block and the task now, not at garbage collection
        return self.tid

    def _blocks(self, phased_body):
        """Open the task, yield every block index between begin_block and end_block (or run
        the generator ``phased_body`` in phases, yielding nothing), then close the task."""
        prog = _ctx.program("pl.spmd")
        task = prog.begin_task(self.name, self.n, _deps_list(self.deps), self._site)
        # keep the site, not the frame: a kernel holding the spmd object in a local (``g = pl.spmd(n)``)
        # would otherwise form a frame <-> spmd cycle, keeping every caller frame's locals alive until a collection
        self._site = task.site
        self.tid = task.id
        ok = False
        try:
            if phased_body is not None:
                _run_phased(prog, task, phased_body, self.n)
            else:
                order = prog.reorder  # None: index order (RunConfig.block_order)
                runner = _ctx.block_runner  # block templates (runtime/blocks.py), None when off
                tpl = runner(prog, task, self.n) if runner is not None and order is None else None
                if tpl is not None:
                    yield from tpl
                else:
                    for b in (_builtin_range(self.n) if order is None else order(task)):
                        prog.begin_block(task, b)
                        yield b
                        prog.end_block()
            ok = True
        finally:
            if not ok:
                prog.end_block()
            prog.end_task(task, ok)

    def __enter__(self):
        if self.n != 1:
            raise DslError(f"`with pl.spmd({self.n})` would run its body once; use `for b in pl.spmd(n)` "
                           "or the decorator form for more than one block")
        prog = _ctx.program("pl.spmd")
        self._task = prog.begin_task(self.name, 1, _deps_list(self.deps), self._site)
        self._site = self._task.site  # the site, not the frame (see _blocks)
        self.tid = self._task.id
        prog.begin_block(self._task, 0)
        return self.tid

    def __exit__(self, et, ev, tb):
        prog = _ctx.state.program
        prog.end_block()
        prog.end_task(self._task, et is None)
        return False


def _run_phased(prog, task, body, n):
    """Run a generator body whose ``yield pl.system.syncall()`` statements split
    it into phases: phase k of every block runs before phase k+1 of any block
    (the CPU emulation of a hard barrier, hw-native-sys/pypto `docs/en/user/`)."""
    gens = [None] * n
    live = list(_builtin_range(n))
    phase = 0
    order = prog.reorder  # None: index order (RunConfig.block_order)
    for b in (live if order is None else order(task, live, phase)):
        prog.begin_block(task, b, phase)
        gens[b] = body(b)
        prog.end_block()
    st = _ctx.state
    while live:
        nxt = []
        for b in (live if order is None else order(task, live, phase)):
            prog.begin_block(task, b, phase)
            st.syncalls = 0
            try:
                marker = next(gens[b])
            except StopIteration:
                marker = None
            finally:
                calls, st.syncalls = st.syncalls, None
                prog.end_block()
            if marker is not None and marker is not _SYNCALL:
                raise DslError(f"spmd body of {task.name!r} yielded {marker!r}; only "
                               "`yield pl.system.syncall()` is allowed")
            if calls != (marker is not None):
                raise DslError(f"task {task.name!r} block {b}: pl.system.syncall() was called without `yield` "
                               f"in phase {phase}, so it would not be a barrier; write "
                               "`yield pl.system.syncall()`")
            if marker is not None:
                nxt.append(b)
        if nxt and len(nxt) != len(live):
            raise DslError(f"task {task.name!r}: blocks reached a different number of syncall barriers")
        live = sorted(nxt)
        phase += 1


_SYNCALL = object()


class at:
    """One task of one block on a core group: ``with pl.at(...) as tid``.

    Raises:
        DslError: nested inside another task.
    """

    __slots__ = ("name", "deps", "tid", "_site", "_task", "_prog")

    def __init__(self, level=Level.CORE_GROUP, name_hint: str = "", deps=None, no_dep_args=None,
                 allow_early_resolve: bool = False, optimizations=None, dumps=None):
        self.name = name_hint or "at"
        self.deps = deps
        self.tid = -1
        self._site = _ctx.user_frame(2)  # start at our caller

    def __enter__(self):
        prog = _ctx.state.program
        if prog is None:
            _ctx.program("pl.at")  # raises: outside a program
        self._task = prog.begin_task(self.name, 1, _deps_list(self.deps), self._site, True)
        self._site = self._task.site  # the site, not the frame: no frame <-> task-scope reference cycle
        self._prog = prog
        self.tid = self._task.id
        return self.tid

    def __exit__(self, et, ev, tb):
        self._prog.end_task(self._task, et is None)  # also ends the block
        return False


class manual_scope:
    """Dependency derivation off for every task inside (explicit ``deps=`` only;
    creator retention stays). Cannot nest.

    Raises:
        DslError: nested manual scopes or use inside a task.
    """

    def __enter__(self):
        prog = _ctx.program("pl.manual_scope")
        if _ctx.state.block is not None:
            raise DslError("pl.manual_scope is orchestration-only")
        if prog.manual:
            raise DslError("pl.manual_scope cannot nest inside another manual scope")
        prog.manual = True
        return self

    def __exit__(self, et, ev, tb):
        _ctx.state.program.manual = False
        return False


class scope:
    """A heap scope: tensors created inside are freed (FIFO) at exit."""

    def __init__(self, mode=None):
        self.mode = mode

    def __enter__(self):
        prog = _ctx.program("pl.scope")
        if self.mode is not None and str(self.mode).lower().endswith("manual"):
            self._manual = manual_scope().__enter__()
        else:
            self._manual = None
        prog.push_scope()
        return self

    def __exit__(self, et, ev, tb):
        prog = _ctx.state.program
        prog.pop_scope()
        if self._manual is not None:
            self._manual.__exit__(et, ev, tb)
        return False


def _bounds(args, what):
    """The int bounds of a loop: ``(stop)``, ``(start, stop)`` or ``(start, stop, step)``.

    Raises:
        DslError: another number of bounds, a bound that is no integer, or a step of 0.
    """
    if not 1 <= len(args) <= 3:
        raise DslError(f"{what}: takes 1 to 3 bounds (stop | start, stop[, step]), got {len(args)}"
                       f"{_ctx.user_site()}")
    bounds = [as_int(a, f"a {what} bound") for a in args]
    if len(bounds) == 3 and bounds[2] == 0:
        raise DslError(f"{what}: step must not be zero{_ctx.user_site()}")
    return bounds


def _loop(args, what):
    bounds = _bounds(args, what)
    prog = _ctx.state.program
    if prog is None or _ctx.state.block is not None:
        return _builtin_range(*bounds)
    return _scoped_iter(prog, _builtin_range(*bounds))


def _scoped_iter(prog, it):
    for i in it:
        prog.push_scope()
        try:
            yield i
        finally:
            prog.pop_scope()


def _no_carry(what: str, init_values) -> None:
    """pypto's loop-carried form ``for i, (acc,) in pl.range(n, init_values=(acc0,))`` with
    ``pl.yield_``: not supported (a DslError naming the loop's line)."""
    if init_values is not None:
        raise DslError(f"{what}(init_values=...): loop-carried values (pl.yield_) are not supported by pto"
                       f"{_ctx.user_site()}; "
                       f"carry the value in a plain variable (acc = pl.add(acc, ...) inside the loop)")


def range(*args, init_values=None):  # noqa: A001 - DSL name
    """Sequential loop ``range(stop)`` / ``(start, stop[, step])``; bounds may be scalars.

    Raises:
        DslError: ``init_values`` given (pypto's loop-carried values are not supported).
    """
    _no_carry("pl.range", init_values)
    return _loop(args, "pl.range")


def pipeline(*args, stage: int = 2, init_values=None):
    """Software-pipelined loop; numerically identical to :func:`range` (same errors)."""
    _no_carry("pl.pipeline", init_values)
    return _loop(args, "pl.pipeline")


def unroll(*args, init_values=None):
    """Fully unrolled loop; literal bounds; numerically identical to :func:`range` (same errors)."""
    _no_carry("pl.unroll", init_values)
    return _loop(args, "pl.unroll")


def parallel(*args, init_values=None):
    """Loop whose iterations are asserted independent; numerically :func:`range` (same errors)."""
    _no_carry("pl.parallel", init_values)
    return _loop(args, "pl.parallel")
