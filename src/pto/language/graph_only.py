"""Graph-only mode, the language side (``pto.RunConfig(execute=False)``; docs/graph_only.md).

In graph-only mode a program runs its orchestration and records tasks, blocks, footprints,
edges and the heap plan exactly as a real run does, but **values are computed only where
they are known**:

* a *known* value is one that follows from integer inputs (block tables, positions, slot
  mappings, token ids, expert tables), constants (``pl.full``, ``pl.arange``) and other known
  values; it is computed for real, with the same torch code as a real run;
* everything that follows from a shape-only tensor (float weights, activations, caches: torch
  ``meta`` tensors, shape and dtype without storage) is *unknown*: a tile op with an unknown
  operand returns a ``meta`` tile of the right shape and dtype without computing anything.

Tiles are wholly known or wholly unknown; GM buffers with real storage keep a per-element
unknown mask (runtime side: ``pto.runtime.graph_only``). Reading an unknown element as a
scalar (``pl.read``) gives a :class:`MetaScalar`: it flows through arithmetic and tile ops
(the result is unknown), and raises :class:`pto.errors.GraphOnlyError` naming the kernel, the
read and the use site as soon as it would decide an index, a bound, a branch or a Python
number, unless an assumption (``pto.runtime.graph_only.register_assumption``) supplies the
values of the allocation it was read from.

One assumption lives in the tile ops themselves: :func:`pto.language.tile_ops.sort32` and
``mrgsort`` of unknown values treat the values as **ties**. Both sorts are stable, so the
index lanes come out in input order (known, real) while the value lanes stay unknown: a
top-k built on them selects the first ``k`` candidates of the valid range (the whole valid
range when it has at most ``k`` entries), the conservative selection of a sparse-attention
indexer. Each such sort counts in ``ProgramStats.assumed_sorts``.
"""

from __future__ import annotations

import os

import torch

from pto.errors import GraphOnlyError
from pto.language import _ctx
from pto.language.typing import ScalarValue

__all__ = ["MetaScalar", "meta", "is_index_dtype", "count_sort"]

_META = torch.device("meta")


_METAS: dict = {}  # (shape, dtype) -> one shared meta tensor (it has no values to change)


def meta(shape, dtype: torch.dtype) -> torch.Tensor:
    """A shape-only (torch ``meta``) tensor of ``shape`` and torch ``dtype``: no storage, no values.
    One tensor per shape and dtype is shared (tile ops never change a tile's tensor in place)."""
    key = (tuple(shape), dtype)
    t = _METAS.get(key)
    if t is None:
        if len(_METAS) > 50_000:
            _METAS.clear()
        t = _METAS[key] = torch.empty(key[0], dtype=dtype, device=_META)
    return t


def is_index_dtype(dtype: torch.dtype) -> bool:
    """Whether graph-only mode keeps real storage for a GM tensor of torch ``dtype``: integer
    dtypes of 16 bits and more and BOOL (block tables, positions, slot mappings, ids, counts).
    Floats and INT8 / UINT8 (quantised weights and activations) are shape-only."""
    return not dtype.is_floating_point and dtype not in (torch.int8, torch.uint8)


def count_sort() -> None:
    """Count one sort of unknown values under the ties assumption (module docstring); the
    running block's results become assumption-derived."""
    prog = _ctx.state.program
    if prog is not None and getattr(prog, "go", None) is not None:
        prog.go.sorts += 1
        prog.go.derived_read(_ctx.state.block)


class MetaScalar(ScalarValue):
    """A scalar read from an unknown element in graph-only mode (module docstring).

    Arithmetic with numbers and other scalars gives another MetaScalar; a tile op taking it
    returns an unknown tile. Using it as an index, loop bound, branch condition, dictionary
    key or Python ``int`` / ``float`` raises :class:`pto.errors.GraphOnlyError`.

    Args:
        origin: what was read, e.g. ``"routes[3, 1] (read at moe.py:120)"``.
        dtype: torch dtype of the element (the placeholder ``value`` is 0 of that kind).
    """

    __slots__ = ("dtype",)

    def __init__(self, origin: str, dtype: torch.dtype | None = None):
        float_kind = dtype is not None and dtype.is_floating_point
        super().__init__(0.0 if float_kind else 0, False, origin, 0)
        self.dtype = dtype

    def _need(self, use: str):
        f = _ctx.user_frame()
        site = f" at {_ctx.frame_site(f)}" if f is not None else ""
        prog = _ctx.state.program
        kernel = f"kernel {prog.name}: " if prog is not None else ""
        blk = _ctx.state.block
        where = f" (task {blk.task.name!r} block {blk.idx})" if blk is not None else " (orchestration)"
        raise GraphOnlyError(
            f"{kernel}graph-only mode (RunConfig(execute=False)): a value computed from shape-only data was used "
            f"as {use}{site}{where}; it was read from {self.origin}. Graph-only mode does not compute float "
            f"data: register an assumption for the allocation it comes from "
            f"(pto.runtime.graph_only.register_assumption) or run with execute=True")

    def _bin(self, other, fn):
        if isinstance(other, (int, float, bool, ScalarValue)):
            return MetaScalar(self.origin, self.dtype)
        return NotImplemented

    def _rbin(self, other, fn):
        if isinstance(other, (int, float, bool)):
            return MetaScalar(self.origin, self.dtype)
        return NotImplemented

    def __neg__(self):
        return MetaScalar(self.origin, self.dtype)

    __abs__ = __invert__ = __pos__ = __neg__

    def __repr__(self) -> str:
        return f"MetaScalar(unknown, from {self.origin})"


# pto's runtime and language packages: a read's origin is the first frame outside both
_RUNTIME_DIRS = (os.path.join(os.path.dirname(_ctx._LANGUAGE_DIR.rstrip(os.sep)), "runtime") + os.sep,
                 _ctx._LANGUAGE_DIR)


def read_origin(name: str, idx) -> str:
    """``"name[i, j] (read at file:line)"`` for a :class:`MetaScalar`'s origin: the kernel's line
    (past the runtime's frames too: a buffer with real storage is read by runtime/graph_only.py)."""
    f = _ctx.user_frame()
    while f is not None and f.f_code.co_filename.startswith(_RUNTIME_DIRS):
        f = f.f_back
    site = f" (read at {_ctx.frame_site(f)})" if f is not None else ""
    return f"{name}{list(idx)}{site}"
