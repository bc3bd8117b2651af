"""Definedness sanitizer: origins, first consumers, the end-of-program check
and the ``init_value`` mutation hook (docs/dsl.md).

Shadow masks live on every root buffer that can hold undefined data
(``Buffer.shadow``: scratch allocations and Out/InOut arguments; In arguments
are defined and carry none) and on every tile (``Tile.mask``; None = all
defined). Loads, stores and tile ops propagate them (tensor_ops.py,
tile_ops.py). A mask element is an INT32 *undefinedness tag*:

* ``0``: defined;
* ``1 <= v < TAINT_BASE``: undefined, straight from allocation ``v`` (the
  buffer id), not yet touched by any task;
* ``TILE_BASE <= v < TAINT_BASE``: undefined, straight from on-chip buffer
  ``v - TILE_BASE`` of the program's tile origins (an uninitialised
  ``pl.create_tile``: :meth:`Sanitizer.tile_origin`);
* ``v >= TAINT_BASE``: undefined, entry ``v - TAINT_BASE`` of the program's
  taint table: (origin allocation, the task/block that first consumed it).

A task *consumes* undefined data when it loads it into a tile, reads it as a
scalar, or atomically adds onto it; at that moment raw tags become taint
tags naming that task and block, and the tag then travels with the data
through tiles and GM. Combining masks keeps the larger tag (AND of
definedness), so every undefined element that reaches an output still names
one allocation it came from and the task that first pulled it in along that
path. Reading an undefined padding row whose results are later discarded is
legal and reports nothing: the check is on what reaches an output
(:func:`check_outputs`), not at the read.

Cheap paths (each the same outcome as the shadow work it skips; tests compare them with it
switched off): ``Sanitizer.clean`` holds the buffers whose shadow is known all defined (their
loads, scalar reads, defined stores and output check skip it); a buffer born all undefined
(an Out argument, scratch without ``init_value``) has its shadow *deferred*
(``Sanitizer.pending``, :data:`DEFER`): storage allocated but not filled, its stores of
defined tiles only recorded (as exact root 2-D boxes), until an access needs the shadow: a
read whose footprint lies inside the recorded boxes needs none; once the boxes cover the whole
buffer it joins ``clean`` with its shadow never filled (``Sanitizer.stale``); any other read,
a store of an undefined tile or an atomic add fills the shadow as those stores would have left
it. Poison (NaN / garbage in check mode) is still written at allocation.

Mutation testing: :func:`drop_init_values` (or ``RunConfig(drop_init=...)``)
makes ``pl.create_tensor`` of the named allocations ignore their
``init_value``, so a test can prove that check mode catches the missing
initialisation without editing kernel source. Off by default; a testing tool.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import sys
import threading

import torch

from pto.errors import UndefinedOutputError
from pto.language._ctx import frame_site
from pto.language.typing import INOUT, OUT
from pto.runtime.deps import coalesce

__all__ = ["TAINT_BASE", "TILE_BASE", "TileOrigin", "Sanitizer", "Consumer", "check_outputs", "output_problems",
           "undefined_box", "drop_init_values", "active_drop_init", "new_shadow"]

TAINT_BASE = 1 << 24  # tags below are raw allocation ids; at or above, taint-table entries
TILE_BASE = 1 << 23  # raw tags from TILE_BASE up to TAINT_BASE name on-chip buffers (TileOrigin)


class TileOrigin:
    """An uninitialised on-chip buffer (``pl.create_tile``, or ``pl.create_tensor`` inside a task
    under pypto compatibility) as the origin of undefined elements: ``id`` (its raw tag), the
    ``name`` given or ``None``, ``shape`` (list of ints), ``dtype`` (torch), ``site``
    (``file:line``). It quacks like a Buffer for the messages (``kind == "tile"``)."""

    kind = "tile"

    def __init__(self, oid: int, name, shape, dtype, site: str):
        self.id, self.name, self.shape, self.dtype, self.site = oid, name, list(shape), dtype, site

class _DropStack(threading.local):
    """The names of the open ``drop_init_values`` blocks of this thread (a list of frozensets)."""

    def __init__(self):
        self.stack: list[frozenset] = []


_DROP = _DropStack()


@contextlib.contextmanager
def drop_init_values(*names: str):
    """Testing tool: inside the ``with`` block, every ``pl.create_tensor`` whose
    allocation name is in ``names`` ignores its ``init_value`` (the tensor is
    left undefined: stale heap bytes, poisoned in check mode).

    The allocation name is the ``name=`` argument of ``create_tensor`` or else
    the assignment target on its source line (``mixes_raw = pl.create_tensor(...)``
    is ``"mixes_raw"``). Nests; names add up. Equivalent to
    ``RunConfig(drop_init=names)`` for every program started inside, in this
    thread (programs in other threads are not affected). The
    names that matched are in ``Program.dropped_init`` after the run.

    Example::

        with pto.runtime.drop_init_values("mixes_raw"):
            run_jit(...)   # raises UndefinedOutputError naming mixes_raw
    """
    stack = _DROP.stack
    stack.append(frozenset(names))
    try:
        yield
    finally:
        stack.pop()


def active_drop_init() -> frozenset:
    """Allocation names whose ``init_value`` is currently dropped by
    :func:`drop_init_values` blocks (empty outside them)."""
    out: frozenset = frozenset()
    for s in _DROP.stack:
        out |= s
    return out


class _ShadowPool(threading.local):
    """INT32 shadow tensors of finished check-mode programs of this thread, by element
    count, for the next programs to refill (:func:`new_shadow`): a fresh tensor costs a
    page fault per 4 KiB, about ten times a refill of one already mapped."""

    LIMIT = 256 << 20  # bytes kept at most

    def __init__(self):
        self.free: dict[int, list] = {}
        self.nbytes = 0


_POOL = _ShadowPool()


def new_shadow(shape, tag: int | None) -> torch.Tensor:
    """A new INT32 shadow mask of ``shape`` (a list of ints) with every element ``tag``
    (0 = defined; see the module docstring), reusing a released one when it can. ``tag``
    None: left unfilled (a deferred shadow, :meth:`Sanitizer.defer`)."""
    n = 1
    for d in shape:
        n *= d
    free = _POOL.free.get(n)
    if free:
        t = free.pop()
        _POOL.nbytes -= 4 * n
        return (t if tag is None else t.fill_(tag)).view(shape)
    if tag is None:
        return torch.empty(shape, dtype=torch.int32)
    return torch.full(shape, tag, dtype=torch.int32)


DEFER = True  # deferred shadows on (Sanitizer.defer); tests switch it off to compare


def _injective(shape, strides) -> bool:
    """Whether a strided view of ``shape`` / ``strides`` maps distinct indices to distinct
    storage elements (sufficient test: sorted by stride, each stride passes the span of the
    smaller ones)."""
    span = 0
    for st, n in sorted((st, n) for n, st in zip(shape, strides) if n > 1):
        if st <= span:
            return False
        span += st * (n - 1)
    return True


def _segments(t, starts, stops):
    """The root 2-D boxes of exactly the elements of the window ``[starts, stops)`` of view
    ``t`` (unit last stride): one one-row box per run along the last dim; None (unknown) for
    another last stride, a run that crosses a root row, or more than 4096 runs."""
    st = t._strides
    if st[-1] != 1:
        return None
    C = t.buf.C
    lead = [(a, b, s) for a, b, s in zip(starts[:-1], stops[:-1], st[:-1])]
    count = 1
    for a, b, _s in lead:
        count *= b - a
    if count > 4096:
        return None
    w = stops[-1] - starts[-1]
    first = t._off + starts[-1]
    out = []
    if len(lead) == 1:  # a 2-D view (rows narrower than a root row): one run per row
        a, b, s = lead[0]
        for f in range(first + a * s, first + b * s, s) if s > 0 else [first + a * s] * (b - a):
            r, c = divmod(f, C)
            if c + w > C:
                return None
            out.append((r, r + 1, c, c + w))
        return out
    for ix in itertools.product(*(range(a, b) for a, b, _s in lead)):
        f = first
        for i, (_a, _b, s) in zip(ix, lead):
            f += i * s
        r, c = divmod(f, C)
        if c + w > C:
            return None
        out.append((r, r + 1, c, c + w))
    return out


def _boxes_inside(box, idx) -> bool:
    """Whether the box (or every box of the list) ``box`` lies inside the union of the boxes
    indexed by ``idx`` (``(n, boxes sorted by r0, their r0s, the largest height, ...)``)."""
    bs, r0s, maxh = idx[1], idx[2], idx[3]
    for r0, r1, c0, c1 in (box if type(box) is list else (box,)):
        clip = []
        for k in range(bisect.bisect_left(r0s, r0 - maxh + 1), bisect.bisect_left(r0s, r1)):
            a0, a1, b0, b1 = bs[k]
            if a1 > r0 and b0 < c1 and c0 < b1:
                if a0 <= r0 and r1 <= a1 and b0 <= c0 and c1 <= b1:  # one box holds it
                    clip = None
                    break
                clip.append((max(a0, r0) - r0, min(a1, r1) - r0, max(b0, c0) - c0, min(b1, c1) - c0))
        if clip is not None and (not clip or not _union_covers(clip, r1 - r0, c1 - c0)):
            return False
    return True


def _union_covers(boxes: list, rows: int, cols: int) -> bool:
    """Whether the union of the 2-D boxes ``(r0, r1, c0, c1)`` (half-open) is all of
    ``[0, rows) x [0, cols)``; False (not decided: the caller falls back) past 4096 boxes."""
    bs = coalesce(boxes)
    if len(bs) == 1:
        return bs[0] == (0, rows, 0, cols)
    if len(bs) > 4096:
        return False
    bs.sort()
    cuts = sorted({b[0] for b in bs} | {b[1] for b in bs})
    if cuts[0] > 0 or cuts[-1] < rows:
        return False
    active: list = []
    j, n = 0, len(bs)
    for lo in cuts[:-1]:  # each row band [lo, next cut) must have its columns covered
        while j < n and bs[j][0] <= lo:
            active.append(bs[j])
            j += 1
        active = [b for b in active if b[1] > lo]
        reach = 0
        for c0, c1 in sorted((b[2], b[3]) for b in active):
            if c0 > reach:
                return False
            if c1 > reach:
                reach = c1
        if reach < cols:
            return False
    return True


def _operation_site() -> str | None:
    """``file:line`` of the kernel source line running now (the innermost frame outside pto's own
    code, as ``program._in_pto`` tells it: the load, read or atomic add that consumes), or None."""
    from pto.runtime.program import _in_pto  # program imports this module
    f = sys._getframe(1)
    while f is not None and _in_pto(f):
        f = f.f_back
    return frame_site(f) if f is not None else None


class Consumer:
    """The first task (and block) that consumed undefined data of an origin.

    Attributes:
        task_id: task id (None for an orchestration-level ``pl.read``).
        task: task name; block: block index (None in orchestration);
        site: ``file:line`` of the kernel line that consumed (the load, scalar read or atomic
            add; the task's line when none is found), or of the orchestration read;
        how: ``"load"``, ``"scalar read"`` or ``"atomic add onto undefined"``.
    """

    __slots__ = ("task_id", "task", "block", "site", "how")

    def __init__(self, task_id, task, block, site, how):
        self.task_id, self.task, self.block, self.site, self.how = task_id, task, block, site, how

    def key(self) -> tuple:
        """Identity of this consumer (task id, block, how) for de-duplication."""
        return (self.task_id if self.task_id is not None else -1, self.block or 0)

    def __str__(self) -> str:
        if self.task_id is None:
            return f"the orchestration ({self.how} at {self.site})"
        return f"task {self.task!r} (#{self.task_id}) block {self.block} at {self.site} ({self.how})"


class Sanitizer:
    """Definedness bookkeeping of one program in check mode: the taint table
    that maps undefinedness tags to (origin allocation, first consumer)."""

    def __init__(self, program):
        self.program = program
        self.taints: list[tuple[int, Consumer]] = []
        self._index: dict[tuple, int] = {}
        self.tiles: list[TileOrigin] = []  # on-chip origins, tag TILE_BASE + index
        self._tile_index: dict[tuple, int] = {}
        # Ids of the buffers whose shadow is known all zero (every element defined): loads,
        # stores of defined tiles and the output check skip their shadow. A store of a tile
        # with a mask drops the id (tensor_ops._store); a buffer that is not in the set gets
        # its whole shadow re-checked once its window checks since the last re-check have
        # covered as many elements as the shadow holds (window_undefined), so a scratch
        # tensor written in full becomes clean at most doubling the checks it costs today.
        self.clean: set[int] = {g.buf.id for _p, _c, g in program.args
                                if g.buf.shadow is not None and g.buf.direction == INOUT}
        self._spent: dict[int, int] = {}
        # Deferred shadows (:meth:`defer`): buffer id -> [stored windows, root boxes, exact, area]
        # for the buffers born all undefined (Out arguments, scratch without init_value) whose
        # shadow storage is not filled yet. Their stores of defined tiles only record the window;
        # the first access that needs the shadow (:meth:`settled`, :meth:`materialize`) finds
        # the buffer written in full (it becomes clean) or fills the shadow as it would be now.
        self.pending: dict[int, list] = {}
        # clean buffers whose shadow storage was never filled (zeroed if they ever leave clean)
        self.stale: set[int] = set()
        for _p, _c, g in program.args:
            if g.buf.shadow is not None and g.buf.direction == OUT:
                self.defer(g.buf)

    # ---- deferred shadows -------------------------------------------------------------
    def track(self, buf, defined: bool) -> None:
        """Give a new scratch allocation ``buf`` its shadow: all defined (``init_value``: the
        buffer is clean) or all undefined with its own raw tag (deferred, :meth:`defer`)."""
        if defined:
            buf.shadow = new_shadow(buf.shape, 0)
            self.clean.add(buf.id)
        else:
            buf.shadow = new_shadow(buf.shape, None)
            self.defer(buf)

    def defer(self, buf) -> None:
        """``buf`` (shadow storage allocated, contents not filled) is all undefined, tagged
        with its own id: with :data:`DEFER` on, filling is put off until an access needs the
        shadow; off, it is filled now."""
        if DEFER:
            self.pending[buf.id] = [[], [], True, 0, None]  # windows, boxes, exact, area, index
        else:
            buf.shadow.fill_(buf.id)

    def defer_rows(self, t, starts, stops, box) -> None:
        """:meth:`defer_store` of a window whose root box ``box`` (one tuple) is known to be
        exactly its elements (the GM fast paths of a view with root rows)."""
        ent = self.pending[t.buf.id]
        ent[0].append((t, starts, stops))
        ent[1].append(box)
        ent[3] += (box[1] - box[0]) * (box[3] - box[2])

    def defer_store(self, t, starts, stops, box) -> None:
        """Record a store of a defined tile into the window ``[starts, stops)`` of view ``t``
        (root footprint ``box``: a box, a list of boxes, or None when empty) of a buffer in
        :attr:`pending`, instead of zeroing its shadow window. A footprint wider than the
        window's elements (a strided view) is replaced by the window's exact row segments."""
        ent = self.pending[t.buf.id]
        ent[0].append((t, starts, stops))
        if box is None or not ent[2]:
            return
        n = 1
        for a, b in zip(starts, stops):
            n *= b - a
        boxes = box if type(box) is list else (box,)
        area = 0
        for r0, r1, c0, c1 in boxes:
            area += (r1 - r0) * (c1 - c0)
        # the boxes are exactly the window's elements: as many elements as box area, all distinct
        # (a view with root rows, t._rows: unit column stride, so distinct when its rows do not overlap)
        if area != n or not (
                (t._rows is not None and (stops[0] - starts[0] == 1 or t._strides[0] >= stops[1] - starts[1]))
                or _injective([b - a for a, b in zip(starts, stops)], t._strides)):
            boxes = _segments(t, starts, stops)
            if boxes is None:
                ent[2] = False
                return
            area = n
        ent[1].extend(boxes)
        ent[3] += area

    def quick_store(self, buf, mask, atomic) -> bool:
        """Whether a store (``atomic``: None or the atomic type) of a tile with ``mask`` into
        ``buf`` needs no shadow work beyond :meth:`defer_store` (a defined tile into a clean
        buffer, or a plain store of one into a deferred buffer): the GM fast paths may take it."""
        return mask is None and (buf.id in self.clean or (atomic is None and buf.id in self.pending))

    def settled(self, buf, box=None) -> bool:
        """Before a read of ``buf``'s shadow (a load, scalar read or gather of a buffer not in
        :attr:`clean`; ``box``: the read's root footprint, a box or a list of boxes, if known):
        False if the shadow need not be read (the deferred stores covered the whole buffer: it
        is clean now; or they covered ``box``: the buffer stays deferred), else True with the
        shadow filled."""
        bid = buf.id
        ent = self.pending.get(bid)
        if ent is None:
            return True
        if ent[2] and ent[1]:
            idx = ent[4]
            nb = len(ent[1])
            if idx is None or idx[0] != nb:  # (re)build the index of the written boxes
                rebuilds = 0 if idx is None else idx[5] + 1
                if rebuilds > 64:  # reads and writes interleave: fill once instead of indexing again and again
                    del self.pending[bid]
                    self._fill(buf, ent)
                    return True
                bs = coalesce(ent[1] if idx is None else idx[1] + ent[1][idx[0]:])
                bs.sort()
                idx = ent[4] = (nb, bs, [b[0] for b in bs], max(b[1] - b[0] for b in bs), None, rebuilds)
            numel = buf.shadow.numel()
            if ent[3] >= numel:
                if idx[4] is None:
                    C = buf.C
                    idx = ent[4] = idx[:4] + (_union_covers(idx[1], numel // C, C), idx[5])
                if idx[4]:
                    del self.pending[bid]
                    self.clean.add(bid)
                    if bid in self.clean:
                        self.stale.add(bid)
                        return False
                    self._fill(buf, ent)
                    return True
            if box is not None and _boxes_inside(box, idx):
                return False
        del self.pending[bid]
        self._fill(buf, ent)
        return True

    def materialize(self, buf) -> None:
        """Before a write of ``buf``'s shadow (a store of an undefined tile, an atomic add):
        fill a deferred shadow (or zero the never-filled shadow of a clean buffer)."""
        bid = buf.id
        ent = self.pending.pop(bid, None)
        if ent is not None:
            self._fill(buf, ent)
        elif bid in self.stale:
            self.stale.discard(bid)
            buf.shadow.zero_()

    @staticmethod
    def _fill(buf, ent) -> None:
        """The shadow a deferred buffer would have now: its raw tag, zero where stored."""
        buf.shadow.fill_(buf.id)
        for t, starts, stops in ent[0]:
            t.smask()[tuple(map(slice, starts, stops))].zero_()

    # ---- tagging ------------------------------------------------------------------
    def _taint(self, oid: int, blk, how: str, site: str | None = None) -> int:
        if blk is not None:
            key = (oid, blk.task.id, blk.idx, how)
        else:
            key = (oid, None, site, how)
        tag = self._index.get(key)
        if tag is None:
            if blk is not None:
                cons = Consumer(blk.task.id, blk.task.name, blk.idx, _operation_site() or blk.task.site, how)
            else:
                cons = Consumer(None, "orchestration", None, site or "<unknown>", how)
            tag = TAINT_BASE + len(self.taints)
            self.taints.append((oid, cons))
            self._index[key] = tag
        return tag

    def consume(self, mask: torch.Tensor, blk, how: str = "load") -> torch.Tensor:
        """Turn the raw allocation tags in ``mask`` into taint tags naming
        ``blk`` (a Block; None in orchestration) as first consumer. Works in
        place (``mask`` may be a view of a shadow) and returns ``mask``."""
        raw = (mask > 0) & (mask < TAINT_BASE)
        if not bool(raw.any()):
            return mask
        vals = mask[raw]
        first = int(vals[0])
        if bool((vals == first).all()):
            mask[raw] = self._taint(first, blk, how)
            return mask
        for oid in torch.unique(vals).tolist():
            mask[mask == oid] = self._taint(int(oid), blk, how)
        return mask

    def consume_scalar(self, tag: int, blk, how: str = "scalar read", site: str | None = None) -> int:
        """The tag a scalar read of an element tagged ``tag`` carries."""
        if 0 < tag < TAINT_BASE:
            return self._taint(tag, blk, how, site)
        return tag

    def window_undefined(self, buf, m: torch.Tensor) -> bool:
        """Whether the shadow window ``m`` of ``buf`` (not in :attr:`clean`) holds an
        undefined element. A window found defined counts towards the re-check of the whole
        shadow that puts ``buf`` into :attr:`clean` when it is all defined."""
        if bool(m.any()):
            return True
        bid = buf.id
        spent = self._spent.get(bid, 0) + m.numel()
        if spent >= buf.shadow.numel():
            spent = 0
            if not bool(buf.shadow.any()):
                self.clean.add(bid)
        self._spent[bid] = spent
        return False

    def release(self) -> None:
        """End of the program: hand every shadow of its buffers to the pool of
        :func:`new_shadow` (each ``Buffer.shadow`` becomes None)."""
        pool = _POOL
        for buf in self.program.buffers:
            sh = buf.shadow
            if sh is None:
                continue
            buf.shadow = None
            n = sh.numel()
            if n and sh.is_contiguous() and sh.storage_offset() == 0 and pool.nbytes + 4 * n <= pool.LIMIT:
                pool.free.setdefault(n, []).append(sh.view(-1))
                pool.nbytes += 4 * n

    # ---- naming ---------------------------------------------------------------------
    def tile_origin(self, name, shape, dtype, site: str) -> int:
        """The raw tag of an uninitialised on-chip buffer created at ``site`` (one per site, name,
        shape and dtype: a loop creating the same buffer again shares its origin)."""
        key = (site, name, tuple(shape), dtype)
        tag = self._tile_index.get(key)
        if tag is None:
            if len(self.tiles) >= TAINT_BASE - TILE_BASE - 1:  # never in practice; keep the tags apart
                return TILE_BASE + len(self.tiles) - 1
            tag = TILE_BASE + len(self.tiles)
            self.tiles.append(TileOrigin(tag, name, shape, dtype, site))
            self._tile_index[key] = tag
        return tag

    def origin(self, tag: int):
        """(origin Buffer or TileOrigin, Consumer or None) of a non-zero tag."""
        if tag >= TAINT_BASE:
            oid, cons = self.taints[tag - TAINT_BASE]
        else:
            oid, cons = tag, None
        if oid >= TILE_BASE:
            return self.tiles[oid - TILE_BASE], cons
        return self.program.buffers[oid - 1], cons

    def describe(self, tag: int) -> str:
        """One line naming the allocation an undefined value came from and
        its first consumer."""
        buf, cons = self.origin(tag)
        text = f"origin: {_describe_buffer(buf)}"
        if cons is not None:
            text += f"; first consumed undefined by {cons}"
        return text


def _dtype_name(dt: torch.dtype) -> str:
    try:
        from pto.language.dtypes import from_torch
        return str(from_torch(dt))
    except Exception:  # noqa: BLE001 - naming only
        return str(dt)


def _describe_buffer(buf) -> str:
    what = f"{list(buf.shape)} {_dtype_name(buf.dtype)}"
    if buf.kind == "tile":
        named = f" {buf.name!r}" if buf.name else ""
        return (f"on-chip buffer{named} {what} created at {buf.site} (pl.create_tile: uninitialised, and "
                f"not written before it was read)")
    if buf.kind == "scratch":
        why = ("init_value dropped by the mutation hook" if getattr(buf, "init_dropped", False)
               else "no init_value, and not written before it was read")
        return f"allocation {buf.name!r} {what} at {buf.site} ({why})"
    kind = "PartialOut" if getattr(buf, "partial", False) else "Out"
    return f"{kind} parameter {buf.name!r} {what} (read before the program wrote it)"


def undefined_box(bad: torch.Tensor) -> list[list[int]]:
    """Bounding box ``[[lo, hi), ...]`` per dim of the True elements of ``bad``."""
    idx = bad.nonzero()
    return [[int(idx[:, d].min()), int(idx[:, d].max()) + 1] for d in range(bad.dim())]


def _box_text(box: list[list[int]]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def _writers(program, buf, box) -> list[str]:
    """Names of the tasks with a write/atomic footprint on ``buf`` overlapping
    the root 2-D box of the N-d bounding ``box`` (for the error message)."""
    shape = buf.shape
    if len(box) >= 2:
        r0 = r1 = 0
        stride = 1
        for d in range(len(shape) - 2, -1, -1):
            r0 += box[d][0] * stride
            r1 += (box[d][1] - 1) * stride
            stride *= shape[d]
        r1 += 1
        c0, c1 = box[-1]
    else:
        r0, r1, c0, c1 = 0, 1, box[0][0], box[0][1]
    out = []
    for t in program.graph.tasks:
        for b, k, (a0, a1, b0, b1) in t.footprints:
            if b is buf and k != 0 and a0 < r1 and r0 < a1 and b0 < c1 and c0 < b1:
                out.append(f"{t.name!r} (#{t.id})")
                break
    return out


def check_outputs(program) -> None:
    """End of a check-mode run: raise every race and every output problem found.

    Every element of every Out/InOut argument that the program wrote must be defined,
    and every element of a ``pl.Out`` argument must have been written. Elements of an
    Out argument still tagged with the argument's own raw id were never written: an
    error for ``pl.Out``, allowed for ``pl.PartialOut`` (the caller's values stay there).

    Raises:
        RaceError: the races the race checker recorded (all of them, grouped; see
            ``RaceChecker.report``), followed by the output problems if there are any.
        UndefinedOutputError: one section per output problem (all outputs, not only the
            first), the first on top: the output, the bounding box of its undefined
            elements, the origin allocation (name, shape, dtype, file:line), the first
            task (and block) that consumed it undefined, and the tasks that wrote the box;
            further origins are listed by name. For a ``pl.Out`` with unwritten
            elements: the output, their count and bounding box.
    """
    problems = output_problems(program)
    races = program.races.report() if program.races is not None else None
    if races is not None:
        if problems:
            races.args = (f"{races}\n  and {len(problems)} output problem(s):\n  - "
                          + "\n  - ".join(p.replace("\n  ", "\n      ") for p in problems),)
        raise races
    if problems:
        raise UndefinedOutputError(_join(problems, "output problems"))


def _join(messages: list, what: str) -> str:
    """One message of several: the first (its first line tagged with the count), then the
    others as indented ``- `` items."""
    if len(messages) == 1:
        return messages[0]
    head, sep, rest = messages[0].partition("\n")
    text = f"{head} [{len(messages)} {what} in all; every one below]{sep}{rest}"
    return text + "".join("\n  - " + m.replace("\n  ", "\n      ") for m in messages[1:])


def output_problems(program) -> list:
    """The messages of the output problems of a check-mode run, in argument order: per
    Out/InOut argument, its undefined written elements (grouped by origin allocation) and,
    for a ``pl.Out``, the elements the program never wrote (see :func:`check_outputs`)."""
    san = program.sanitizer
    problems = []
    for p, _caller, g in program.args:
        buf = g.buf
        if buf.direction not in (OUT, INOUT) or buf.shadow is None:
            continue
        sh = buf.shadow
        if buf.id in san.clean or not san.settled(buf) or not bool(sh.any()):  # the common case: all written and defined
            continue
        bad = sh != 0
        unwritten = None
        if buf.direction == OUT:
            unwritten = sh == buf.id
            bad &= ~unwritten
            if buf.partial or not bool(unwritten.any()):
                unwritten = None
        if bool(bad.any()):
            problems.append(_undefined_text(program, san, p.name, buf, sh, bad))
        if unwritten is not None:
            problems.append(_unwritten_text(program, p.name, buf, unwritten))
    return problems


def _undefined_text(program, san, name: str, buf, sh: torch.Tensor, bad: torch.Tensor) -> str:
    """The message for the undefined written elements ``bad`` of output ``name``."""
    tags = torch.unique(sh[bad]).tolist()
    per_origin: dict[int, list] = {}
    for tag in tags:
        ob, cons = san.origin(int(tag))
        per_origin.setdefault(ob.id, [ob, []])[1].append(cons)
    ob, conses = per_origin[min(per_origin)]
    known = [c for c in conses if c is not None]
    first = min(known, key=Consumer.key) if known else None
    box = undefined_box(bad)
    lines = [f"kernel {program.name}: output {name!r} {list(buf.shape)} has {int(bad.sum())} undefined "
             f"written element(s) in box {_box_text(box)}",
             f"origin: {_describe_buffer(ob)}"]
    if first is not None:
        lines.append(f"first consumed undefined by {first}")
    writers = _writers(program, buf, box)
    if writers:
        lines.append(f"written to {name!r} by task(s) {', '.join(writers[:4])}"
                     f"{' ...' if len(writers) > 4 else ''}")
    if len(per_origin) > 1:
        others = [repr(v[0].name) for k, v in sorted(per_origin.items()) if k != ob.id]
        lines.append(f"other undefined origins: {', '.join(others)}")
    return "\n  ".join(lines)


def _unwritten_text(program, name: str, buf, unwritten: torch.Tensor) -> str:
    """The message for elements of a ``pl.Out`` the program never wrote."""
    return (f"kernel {program.name}: output {name!r} {list(buf.shape)} has {int(unwritten.sum())} element(s) the "
            f"program never wrote, in box {_box_text(undefined_box(unwritten))}; every element of a pl.Out must "
            f"be written (a kernel that leaves part of an output alone on purpose declares it "
            f"pl.PartialOut[...]: its unwritten elements keep the caller's values)")


def short_site(site: str) -> str:
    """``file:line`` with the directory stripped (for compact tables)."""
    path, _, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else site
