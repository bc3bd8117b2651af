"""Graph-only mode, the runtime side (``pto.RunConfig(execute=False)``; docs/graph_only.md).

The language side (:mod:`pto.language.graph_only`) defines known and unknown values. Here:

* **Storage.** Arguments and ``pl.create_tensor`` allocations of float and INT8 / UINT8 dtypes
  are shape-only (torch ``meta``); integer (16 bits and more) and BOOL tensors keep real
  storage: the caller's tensor for an argument (never written back), a private zeroed tensor
  for an allocation (its ``init_value`` if it has one). The ring heap plans every allocation
  as in a real run (same offsets, same ``heap_peak_bytes``) without backing memory, so FLASH-
  size programs fit any heap size one asks for.
* **Unknown masks.** A real-storage buffer keeps a per-element unknown mask in its root 2-D
  coordinates: storing an unknown tile marks its box, storing a known tile clears it; a load
  that touches an unknown element gives an unknown tile, a scalar read of one gives a
  :class:`pto.language.graph_only.MetaScalar`.
* **Assumptions.** :func:`register_assumption` names an allocation (its name and the file that
  allocates it) whose values graph-only mode cannot compute and supplies them instead: the
  allocation gets real storage filled by the assumption, and unknown or assumption-derived
  stores into it (e.g. a top-k under the sort ties assumption) are ignored; known stores
  still write (a hash layer's routes from its table). Values read from an assumed buffer, and everything a
  block computes after reading one, are *assumption-derived*: ``ProgramStats.assumed_reads``
  counts those reads (tile loads and scalar reads), ``ProgramStats.assumed_footprints`` the
  footprint boxes of the blocks that made them and of the task launched right after an
  orchestration read of one (its block count may follow from it). Known stores of such a block
  mark their buffer assumption-derived too.

The graph, footprints, edges and heap statistics of a program whose footprints do not depend on
float data equal those of a real run exactly (tests/runtime/test_graph_only.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from pto.errors import ConfigError
from pto.language.graph_only import MetaScalar, is_index_dtype, meta, read_origin

__all__ = ["Assumption", "register_assumption", "assumptions", "GraphOnlyState", "BufferState"]


@dataclass(frozen=True)
class Assumption:
    """Values graph-only mode takes for an allocation it cannot compute.

    Attributes:
        name: allocation name (``name=`` or the assignment target of ``pl.create_tensor``).
        module: file name (basename, e.g. ``"moe.py"``) of the allocating source line.
        fill: ``fill(shape, dtype, program) -> torch.Tensor`` of that shape and torch dtype.
        description: one line for the docs and ``pto graph --graph-only`` output.
    """

    name: str
    module: str
    fill: Callable
    description: str


_ASSUMPTIONS: dict[tuple[str, str], Assumption] = {}


def register_assumption(name: str, module: str, fill: Callable, description: str) -> Assumption:
    """Register (or replace) the assumption for allocation ``name`` made in file ``module``.

    Raises:
        ConfigError: an empty name or module, or a ``fill`` that is not callable.
    """
    if not name or not module or not callable(fill):
        raise ConfigError(f"register_assumption: need a name, a module file name and a callable fill, got "
                          f"{name!r}, {module!r}, {fill!r}")
    a = Assumption(name, os.path.basename(module), fill, description)
    _ASSUMPTIONS[(a.name, a.module)] = a
    return a


def assumptions() -> list[Assumption]:
    """The registered assumptions, in registration order."""
    return list(_ASSUMPTIONS.values())


def _boxes(box) -> list:
    return [] if box is None else box if type(box) is list else [box]


class BufferState:
    """Graph-only record of one buffer with computed values (``Buffer.go``): an index tensor (real
    storage) or a scratch allocation of any dtype, whose float values are kept in real storage
    made on the first known store (``real``; None until then). ``unknown``: None (all known),
    True (all unknown) or a BOOL ``[rows, C]`` mask in the root's 2-D coordinates.
    ``assumption``: the :class:`Assumption` that filled it (unknown stores are then ignored);
    ``derived``: it holds assumption-derived values."""

    __slots__ = ("state", "buf", "unknown", "assumption", "derived", "real", "fill")

    def __init__(self, state: "GraphOnlyState", buf, unknown=None, assumption: Assumption | None = None,
                 fill=0):
        self.state, self.buf, self.unknown, self.assumption = state, buf, unknown, assumption
        self.derived = assumption is not None
        self.real = None if buf.data.is_meta else buf.data
        self.fill = fill  # the known contents of a shape-only buffer before its first known store

    def _window(self, v: torch.Tensor) -> torch.Tensor:
        """The real-storage window matching the view ``v`` of the buffer's data (same sizes,
        strides and storage offset); a shape-only buffer gets its storage here."""
        if not v.is_meta:
            return v
        if self.real is None:
            buf = self.buf
            n = buf.nbytes // buf.data.element_size()
            self.real = torch.full((n,), self.fill, dtype=buf.data.dtype)
        return self.real.as_strided(v.shape, v.stride(), v.storage_offset())

    def _unknown_in(self, box) -> bool:
        u = self.unknown
        if u is None:
            return False
        if u is True:
            return box is not None
        # the mask's bytes as UINT8: torch's BOOL any over a strided window is ~9x slower (85 against
        # 9 us for [128, 512] with 1 thread, milliseconds with 2 while the other core is busy)
        u8 = u.view(torch.uint8)
        return any(bool(u8[r0:r1, c0:c1].any()) for r0, r1, c0, c1 in _boxes(box))

    def _mark(self, box, unknown: bool) -> None:
        u = self.unknown
        if u is None and not unknown or u is True and unknown:
            return
        if u is True or u is None:
            buf = self.buf
            rows = buf.nbytes // buf.data.element_size() // buf.C
            if type(box) is tuple and box[0] == 0 and box[1] == rows and box[2] == 0 and box[3] == buf.C:
                self.unknown = True if unknown else None  # the whole buffer
                return
            u = self.unknown = torch.full((rows, buf.C), u is True, dtype=torch.bool)
        for r0, r1, c0, c1 in _boxes(box):
            u[r0:r1, c0:c1] = unknown

    def load(self, src: torch.Tensor, box, blk) -> torch.Tensor:
        """The loaded window ``src`` (a view of the data), or an unknown tile of its shape."""
        if self.derived:
            self.state.derived_read(blk)
        if self._unknown_in(box):
            return src if src.is_meta else meta(src.shape, src.dtype)
        return self._window(src)

    def store(self, dst: torch.Tensor, src: torch.Tensor, box, atomic: bool, blk) -> None:
        """Store (or atomically add) the tile data ``src`` into the window ``dst``."""
        derived = blk is not None and self.state.block_derived(blk)
        if src.is_meta or derived and self.assumption is not None:
            if self.assumption is None:
                self._mark(box, True)
            return  # an assumed allocation keeps its values against unknown or other assumed ones
        if derived:
            self.derived = True
        w = self._window(dst)
        if atomic:
            w.add_(src)
        else:
            w.copy_(src)
            self._mark(box, False)

    def read(self, t, idx, off: int, blk):
        """A scalar element of GM view ``t`` at ``idx`` (storage offset ``off``): its value, or a
        MetaScalar for an unknown one."""
        box = t.box(idx, [i + 1 for i in idx])
        if self._unknown_in(box):
            return MetaScalar(read_origin(t.name, idx), t.data.dtype)
        if self.derived:
            self.state.derived_read(blk)
        return self._window(t.data.as_strided((), (), off)).item()


class GraphOnlyState:
    """Graph-only bookkeeping of one program (``Program.go``): assumption counters and the
    blocks that read assumption-derived values."""

    def __init__(self, prog):
        self.prog = prog
        self.sorts = 0
        self.assumed_reads = 0
        self.assumed_footprints = 0
        self._derived_blocks: set = set()  # id() of the running blocks that read derived values
        self._derived_task = -1  # id of the task launched after an orchestration read of one

    # ---- storage ---------------------------------------------------------------------
    def bind(self, t: torch.Tensor) -> torch.Tensor:
        """The storage an argument ``t`` gets: shape-only for a float / INT8 tensor, the
        caller's tensor (read only; never written back) for an index tensor."""
        if t.is_meta:
            return t
        if not is_index_dtype(t.dtype):
            return meta(t.shape, t.dtype)
        return t

    def attach(self, buf, assumption: Assumption | None = None) -> None:
        """Give ``buf`` its graph-only record: every scratch allocation (unknown until written,
        as it is undefined; known if it has an ``init_value``) and every argument with real
        storage; a shape-only argument (weights, activations) has none: it is unknown throughout."""
        if buf.data.is_meta:
            if buf.kind != "scratch":
                return
            init = buf.init_value
            buf.go = BufferState(self, buf, unknown=True if init is None else None, fill=0 if init is None else init)
        else:
            buf.go = BufferState(self, buf, unknown=None, assumption=assumption)
        buf.slow = True  # the GM fast paths skip it: its accesses go through the record

    def allocate(self, name: str, site: str, shape, dtype, init_value) -> tuple:
        """``(storage, assumption or None)`` of a scratch allocation: the assumption's values, else
        shape-only storage (its values, if any become known, live in the record's lazily made
        ``real`` storage; see :class:`BufferState`)."""
        a = _ASSUMPTIONS.get((name, os.path.basename(site.rsplit(":", 1)[0])))
        if a is not None:
            data = a.fill(tuple(shape), dtype.torch, self.prog)
            if tuple(data.shape) != tuple(shape) or data.dtype != dtype.torch or data.is_meta:
                raise ConfigError(f"graph-only assumption {a.name!r} ({a.module}) filled a {data.dtype} "
                                  f"{list(data.shape)} tensor for the allocation {list(shape)} {dtype} at {site}")
            return data.contiguous(), a
        return meta(shape, dtype.torch), None

    # ---- assumption accounting -------------------------------------------------------
    def derived_read(self, blk) -> None:
        """A read of an assumption-derived value by block ``blk`` (None: the orchestration)."""
        self.assumed_reads += 1
        if blk is None:
            self._derived_task = len(self.prog.graph.tasks)
        else:
            self._derived_blocks.add(id(blk))

    def block_derived(self, blk) -> bool:
        """Whether block ``blk`` read assumption-derived values (or belongs to the task launched
        after an orchestration read of one)."""
        return id(blk) in self._derived_blocks or blk.task.id == self._derived_task

    def end_block(self, blk) -> None:
        """At the end of block ``blk``: count its footprints if they may follow from an assumption."""
        if self._derived_blocks or self._derived_task >= 0:
            if self.block_derived(blk):
                self.assumed_footprints += len(blk.fp) if blk.fp else 0
                self._derived_blocks.discard(id(blk))

    def finish(self, stats) -> None:
        """Copy the counters into the program's ProgramStats."""
        stats.graph_only = True
        stats.assumed_reads = self.assumed_reads
        stats.assumed_footprints = self.assumed_footprints
        stats.assumed_sorts = self.sorts
