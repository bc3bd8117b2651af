"""GM tensors and the operations that move data between GM and tiles.

A :class:`GMTensor` is a view of a root GM buffer (a caller argument or a
``pl.create_tensor`` allocation). Inside a task block, reading a window
(``x[a:b, c:d]``, ``pl.slice``, ``pl.load``, ``pl.read``) loads a :class:`Tile`
and records a read footprint; writing (``y[...] = tile``, ``pl.assemble``,
``pl.store``, ``pl.write``) records a write, or an atomic add with
``atomic=pl.AtomicType.Add``. In orchestration, slicing and reshaping give
zero-copy views and GM writes are rejected (they belong in a task).

Footprints are boxes on the root buffer, in the root's 2-D coordinates
``[rows = prod(shape[:-1]), cols = shape[-1]]`` (docs/dsl.md); a view
whose window does not map onto a box is recorded by its bounding box.
"""

from __future__ import annotations

import builtins
import math

import numpy as _np
import torch

from pto.errors import DslError
from pto.language import _ctx
from pto.language import graph_only as _go
from pto.language import tile_ops as _tile_ops
from pto.language.dtypes import as_dtype
from pto.language.tile_ops import (_INT_RANGE, PadValue, Tile, _int_fits, _int_range_error, _pad_scalar, tile_assemble, tile_key,
                                   tile_reshape, tile_slice)
from pto.language.typing import ScalarValue, as_int, concrete

__all__ = ["GMTensor", "AtomicType", "create_tensor", "slice", "reshape", "assemble", "read",
           "write", "write_values", "arange_runs", "arange_rows", "store_rows", "read_elements", "load", "gather_rows", "store", "dim", "max", "min", "R", "W", "A"]

R, W, A = 0, 1, 2  # footprint kinds: read, plain write, atomic add
_pyslice = slice


class AtomicType:
    """Combine modes of ``pl.assemble`` / ``pl.store`` into GM."""

    Add = "add"
    None_ = None


def _idx(v, what: str) -> int:
    if type(v) is int:
        return v
    return as_int(v, what)


def _row_intervals(base: int, spans: list) -> list:
    """Row intervals ``[(r0, r1), ...]`` covered by the row offsets
    ``base + sum(i_k * q_k)`` for ``i_k`` in ``[a_k, b_k)``; ``spans`` are
    ``(q, a, b)`` with more than one index, sorted by ``q`` descending."""
    if not spans:
        return [(base, base + 1)]
    contiguous = spans[-1][0] == 1 and all(spans[k][0] == spans[k + 1][0] * (spans[k + 1][2] - spans[k + 1][1])
                                           for k in range(len(spans) - 1))
    if contiguous:
        lo = base + sum(a * q for q, a, _ in spans)
        hi = base + sum((b - 1) * q for q, _, b in spans)
        return [(lo, hi + 1)]
    q, a, b = spans[0]
    if len(spans) == 1:  # one strided dim (q > 1): one row per index
        return [(r, r + 1) for r in range(base + a * q, base + (b - 1) * q + 1, q)]
    inner = _row_intervals(0, spans[1:])  # the same intervals for every index, shifted by its rows
    return [(base + i * q + r0, base + i * q + r1) for i in range(a, b) for r0, r1 in inner]


class GMTensor:
    """A view of a root GM buffer.

    Attributes:
        data: the torch view (shape, dtype, strides of this view).
        buf: the root buffer record (owned by the runtime: id, name, origin,
            2-D width ``C``, base storage offset, shadow mask in check mode).
        name: the parameter or allocation name, for messages.
    """

    __slots__ = ("data", "buf", "name", "_off", "_strides", "_smask", "_shape", "_rows", "_itemsize", "_fast")

    def __init__(self, data: torch.Tensor, buf, name: str, facts=None):
        """``facts``: ``(storage offset, strides, shape, element size)`` of ``data`` when the
        caller knows them (a view it just made), saving the metadata reads."""
        self.data = data
        self.buf = buf
        self.name = name
        if facts is None:
            self._off = data.storage_offset() - buf.base_off
            self._strides = data.stride()
            self._shape = tuple(data.shape)
            self._itemsize = data.element_size()
        else:
            off, self._strides, self._shape, self._itemsize = facts
            self._off = off - buf.base_off
        self._smask = None
        # (base row, base column, rows per dim-0 step) of a 2-D view whose rows are root rows
        C = buf.C
        st = self._strides
        self._rows = ((self._off // C, self._off % C, st[0] // C)
                      if len(st) == 2 and st[1] == 1 and st[0] % C == 0 else None)
        # the box fast paths of other views (see box): a rank-1 view with unit stride,
        # (base row, base column); a rank-3 view with a unit last stride whose other dims are
        # both root-row dims (kind 0, rows per step q0, q1) or a root-row dim and a column dim
        # narrower than a root row (kind 1, q0 and the column stride)
        self._fast = None
        if len(st) == 1:
            if st[0] == 1:
                self._fast = (self._off // C, self._off % C)
        elif len(st) == 2:
            if self._rows is None and st[1] == 1 and 0 < st[0] < C:
                # a view whose rows are narrower than a root row (a [T, 2, D] root seen as [2T, D]):
                # (offset, row stride, None)
                self._fast = (self._off, st[0], None)
        elif len(st) == 3 and st[2] == 1 and C > 1 and st[0] > 0 and st[1] > 0 and st[0] % C == 0:
            if st[1] % C == 0:
                self._fast = (0, self._off // C, self._off % C, st[0] // C, st[1] // C)
            elif st[1] < C:
                self._fast = (1, self._off // C, self._off % C, st[0] // C, st[1])

    # ---- metadata --------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Shape of this view (a tuple of ints)."""
        return self._shape

    @property
    def dtype(self):
        """DSL dtype of the elements."""
        return as_dtype(self.data.dtype)

    def __repr__(self) -> str:
        return f"GMTensor({self.name!r}, {list(self.shape)}, {self.dtype})"

    def __len__(self) -> int:
        return self.data.shape[0]

    # ---- no math on GM tensors -----------------------------------------------
    def _no_math(self, op: str, *_):
        raise DslError(f"{self.name}: {op} on a GM tensor {list(self.shape)}; tile math needs tiles: inside a "
                       f"task (pl.at / pl.spmd), load one with a window such as {self.name}[a:b, c:d] or "
                       f"pl.slice, compute on it and store the result{_where()}")

    __add__ = __radd__ = lambda s, o: s._no_math("'+'")
    __sub__ = __rsub__ = lambda s, o: s._no_math("'-'")
    __mul__ = __rmul__ = lambda s, o: s._no_math("'*'")
    __truediv__ = __rtruediv__ = lambda s, o: s._no_math("'/'")
    __floordiv__ = __rfloordiv__ = lambda s, o: s._no_math("'//'")
    __mod__ = __rmod__ = lambda s, o: s._no_math("'%'")
    __pow__ = __rpow__ = lambda s, o: s._no_math("'**'")
    __matmul__ = __rmatmul__ = lambda s, o: s._no_math("'@'")
    __and__ = __rand__ = lambda s, o: s._no_math("'&'")
    __or__ = __ror__ = lambda s, o: s._no_math("'|'")
    __xor__ = __rxor__ = lambda s, o: s._no_math("'^'")
    __lt__ = lambda s, o: s._no_math("'<'")
    __le__ = lambda s, o: s._no_math("'<='")
    __gt__ = lambda s, o: s._no_math("'>'")
    __ge__ = lambda s, o: s._no_math("'>='")
    __neg__ = lambda s: s._no_math("unary '-'")
    __abs__ = lambda s: s._no_math("abs()")

    def bind_dynamic(self, dim: int, dynvar) -> None:
        """pypto's marker that dim ``dim`` is runtime-dynamic; no effect here (shapes bind per call).

        Raises:
            DslError: ``dim`` outside the rank.
        """
        from pto.language.compat_ops import bind_dynamic
        bind_dynamic(self, dim, dynvar)

    def smask(self):
        """The shadow definedness view matching this view (check mode only)."""
        if self._smask is None:
            sh = self.buf.shadow
            self._smask = sh.as_strided(self.data.shape, self._strides, sh.storage_offset() + self._off)
        return self._smask

    def box(self, starts, stops):
        """Root 2-D footprint of the window ``[starts, stops)`` of this view:
        a box ``(r0, r1, c0, c1)`` (half-open), a list of such boxes when the
        window's root rows are not one interval (e.g. one stream of a
        ``[T, N, D]`` tensor over several tokens), or None when it is empty."""
        C = self.buf.C
        rows = self._rows
        if rows is not None:  # fast path, same result as the general loop below
            a0, a1 = starts
            b0, b1 = stops
            br, bc, q = rows
            if b0 <= a0 or b1 <= a1:
                return None
            if bc + b1 <= C and (q == 1 or b0 - a0 == 1):
                return (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1)
        elif self._fast is not None:  # rank-1, narrow-row rank-2 and rank-3 fast paths, same results as the general loop
            f = self._fast
            if len(f) == 3:  # rows narrower than a root row: the flat span's root rows
                a0, a1 = starts
                b0, b1 = stops
                if b0 <= a0 or b1 <= a1:
                    return None
                off, st0, _ = f
                f_lo = off + a0 * st0 + a1
                f_hi = off + (b0 - 1) * st0 + b1 - 1
                return _span_boxes(f_lo, f_hi, C)
            if len(f) == 2:
                a, = starts
                b, = stops
                if b <= a:
                    return None
                br, bc = f
                if bc + b <= C:
                    return (br, br + 1, bc + a, bc + b)
            else:
                a0, a1, a2 = starts
                b0, b1, b2 = stops
                if b0 <= a0 or b1 <= a1 or b2 <= a2:
                    return None
                kind, br, bc, q0, q1 = f
                n0, n1 = b0 - a0, b1 - a1
                if kind == 0:  # rows, rows, columns
                    # the rows form one interval: a single row, one dim of unit row step, or two
                    # nested dims whose inner one has unit row step and spans the outer's step
                    if n0 == 1:
                        one = n1 == 1 or q1 == 1
                    elif n1 == 1:
                        one = q0 == 1
                    else:
                        one = (q1 == 1 and q0 == n1) or (q0 == 1 and q1 == n0)
                    if one and bc + b2 <= C:
                        return (br + a0 * q0 + a1 * q1, br + (b0 - 1) * q0 + (b1 - 1) * q1 + 1, bc + a2, bc + b2)
                else:  # rows, columns (q1: the column stride), columns
                    c1 = bc + (b1 - 1) * q1 + b2
                    if c1 <= C and (n0 == 1 or q0 == 1):
                        return (br + a0 * q0, br + (b0 - 1) * q0 + 1, bc + a1 * q1 + a2, c1)
        off = self._off
        c_lo = c_hi = 0
        f_lo = f_hi = off
        mixed = False
        row_dims = []
        for a, b, s in zip(starts, stops, self._strides):
            if b <= a:
                return None
            f_lo += a * s
            f_hi += (b - 1) * s
            if s % C == 0:
                row_dims.append((s // C, a, b))
            else:
                c_lo += a * s
                c_hi += (b - 1) * s
                if s > C:
                    mixed = True
        br, bc = divmod(off, C)
        c_lo += bc
        c_hi += bc
        if not mixed and c_hi >= C and c_lo // C == c_hi // C:
            k = c_lo // C  # the window's columns lie in one later root row of each row: shift rows, not widen
            br, c_lo, c_hi = br + k, c_lo - k * C, c_hi - k * C
        if mixed or c_hi >= C:
            return _span_boxes(f_lo, f_hi, C)
        base = br
        spans = []
        for q, a, b in row_dims:
            if b - a > 1 and q > 0:
                spans.append((q, a, b))
            else:
                base += a * q
        spans.sort(reverse=True)
        intervals = _row_intervals(base, spans)
        if len(intervals) == 1:
            r0, r1 = intervals[0]
            return (r0, r1, c_lo, c_hi + 1)
        return [(r0, r1, c_lo, c_hi + 1) for r0, r1 in intervals]

    # ---- subscript sugar ---------------------------------------------------
    def _parse(self, key):
        """(starts, stops, dropped dims) of a subscript key."""
        shape = self._shape
        if type(key) is tuple and len(key) == 2 == len(shape):  # fast path: x[a:b, c:d] with int bounds
            k0, k1 = key
            if type(k0) is _pyslice and type(k1) is _pyslice and k0.step is None and k1.step is None:
                a0, b0, a1, b1 = k0.start, k0.stop, k1.start, k1.stop
                if (type(a0) is int and type(b0) is int and type(a1) is int and type(b1) is int
                        and 0 <= a0 <= b0 <= shape[0] and 0 <= a1 <= b1 <= shape[1]):
                    return [a0, a1], [b0, b1], ()
        if type(key) is not tuple:
            key = (key,)
        if any(k is None for k in key):
            raise DslError(f"{self.name}: new axes (None) in a subscript are not supported; use pl.reshape{_where()}")
        if any(k is Ellipsis for k in key):
            at = [i for i, k in enumerate(key) if k is Ellipsis]
            if len(at) > 1:
                raise DslError(f"{self.name}: more than one '...' in a subscript{_where()}")
            key = key[:at[0]] + (_pyslice(None),) * (len(shape) - len(key) + 1) + key[at[0] + 1:]
        if len(key) > len(shape):
            raise DslError(f"{self.name}: {len(key)} indices for a rank-{len(shape)} tensor")
        starts, stops, drop = [], [], []
        for d, k in enumerate(key):
            if type(k) is _pyslice:
                if k.step is not None and k.step != 1:
                    raise DslError(f"{self.name}: strided slices are not supported")
                a, b = k.start, k.stop
                a = 0 if a is None else a if type(a) is int else _idx(a, "a slice start")
                b = shape[d] if b is None else b if type(b) is int else _idx(b, "a slice stop")
                starts.append(a)
                stops.append(b)
            else:
                i = k if type(k) is int else _idx(k, "an index")
                starts.append(i)
                stops.append(i + 1)
                drop.append(d)
        for d in range(len(key), len(shape)):
            starts.append(0)
            stops.append(shape[d])
        for d, a, b, n in zip(range(len(shape)), starts, stops, shape):
            if a < 0 or b > n or a > b:
                raise DslError(f"{self.name}: window [{a}, {b}) out of bounds of dim {d} (extent {shape[d]}) "
                               f"of shape {list(shape)}{_where()}")
        return starts, stops, drop

    def __getitem__(self, key):
        if type(key) is tuple and len(key) == 2:  # x[a:b, c:d] (omitted bounds are the dim's): the fast path
            k0, k1 = key
            if type(k0) is _pyslice and type(k1) is _pyslice and k0.step is None and k1.step is None:
                a0, b0, a1, b1 = k0.start, k0.stop, k1.start, k1.stop
                if len(self._shape) != 2:
                    self._parse(key)  # the index-count error of the general path
                if a0 is None or b0 is None or a1 is None or b1 is None:
                    a0, b0, a1, b1 = _omitted_bounds(a0, b0, a1, b1, self._shape)
                t = _load_rows(self, a0, b0, a1, b1)
                if t is not None:
                    return t
        starts, stops, drop = self._parse(key)
        if len(drop) == len(self._shape):
            return _read_elem(self, starts)
        if _ctx.state.block is None:
            return self._view(starts, stops, drop)
        t = _load(self, starts, stops, None, None, checked=True)
        if drop:
            keep = [s for d, s in enumerate(t.shape) if d not in drop]
            t = Tile(t.data.reshape(keep), None if t.mask is None else t.mask.reshape(keep))
        return t

    def __setitem__(self, key, value):
        blk = self.buf.program.cur_block  # the running block (state.block), without the thread-local lookup
        rows = self._rows
        if (blk is not None and rows is not None and type(value) is Tile and value.valid is None
                and type(key) is tuple and len(key) == 2):
            # fast path for y[a:b, c:d] = tile in a block (plain tensor, outside check mode; omitted
            # bounds are the dim's); the same effects as _parse + _store: checks, copy, footprint,
            # byte count
            k0, k1 = key
            if type(k0) is _pyslice and type(k1) is _pyslice and k0.step is None and k1.step is None:
                a0, b0, a1, b1 = k0.start, k0.stop, k1.start, k1.stop
                shape = self._shape
                if a0 is None or b0 is None or a1 is None or b1 is None:
                    a0, b0, a1, b1 = _omitted_bounds(a0, b0, a1, b1, shape)
                buf = self.buf
                src = value.data
                vs = src.shape
                if (type(a0) is int and type(b0) is int and type(a1) is int and type(b1) is int
                        and 0 <= a0 < b0 <= shape[0] and 0 <= a1 < b1 <= shape[1]
                        and len(vs) == 2 and vs[0] == b0 - a0 and vs[1] == b1 - a1
                        and rows[1] + b1 <= buf.C and (rows[2] == 1 or b0 - a0 == 1)
                        and not buf.slow and not buf.readonly
                        and (buf.shadow is None or buf.program.sanitizer.quick_store(buf, value.mask, None))
                        and src.dtype == self.data.dtype):
                    if buf.undo is not None:  # an argument written in place: keep what the store overwrites
                        st0, st1 = self._strides
                        buf.save_window(vs, self._strides, buf.base_off + self._off + a0 * st0 + a1 * st1)
                    if b1 - a1 == shape[1]:  # whole rows: a row-slice assignment (the same copy, cheaper)
                        self.data[a0:b0] = src
                    else:  # one as_strided view: the same view as data[key], cheaper
                        st0, st1 = self._strides
                        self.data.as_strided(vs, self._strides, buf.base_off + self._off + a0 * st0 + a1 * st1).copy_(src)
                    br, bc, q = rows
                    box = (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1)
                    blk.fp.append((buf, box, W))
                    blk.bytes += (b0 - a0) * (b1 - a1) * self._itemsize
                    blk.st += 1
                    if buf.shadow is not None and buf.id in buf.program.sanitizer.pending:
                        buf.program.sanitizer.defer_rows(self, (a0, a1), (b0, b1), box)
                    return
        starts, stops, drop = self._parse(key)
        shape = [b - a for a, b in zip(starts, stops)]
        if type(value) is Tile and value.valid is None and list(value.data.shape) == shape:
            _store(self, starts, value, None, stops)  # fast path: a full tile of the window's shape
            return
        if isinstance(value, (int, float, ScalarValue)) and not isinstance(value, bool):
            if math.prod(shape) != 1:
                raise DslError(f"{self.name}: assigning a number to a window of shape {shape}; use pl.full")
            write(self, starts, value)
            return
        if isinstance(value, GMTensor):
            raise DslError(f"{self.name}: subscript assign of GM tensor {value.name!r}: GM-to-GM copies go "
                           f"through a tile inside a task (pl.at / pl.spmd), where {value.name}[...] loads one"
                           f"{_where()}")
        if not isinstance(value, Tile):
            raise DslError(f"{self.name}: subscript assign needs a tile, got {type(value).__name__}{_where()}")
        if list(value.shape) != shape:
            if value.valid is not None and all(v <= w for v, w in zip(value.valid, shape)) \
                    and len(value.valid) == len(shape):
                pass  # a padded tile whose valid region fits the window: the store writes that region
            elif ([s for s in value.shape if s != 1] != [s for s in shape if s != 1]
                  or value.valid is not None):
                # only unit dims may differ (x[i, :] = row tile): anything else would be a silent reshape
                raise DslError(f"{self.name}: tile of shape {list(value.shape)}"
                               f"{'' if value.valid is None else f' (valid {list(value.valid)})'} "
                               f"assigned to window {shape}: the shapes differ beyond unit dims "
                               f"(pl.reshape the tile first if that is meant){_where()}")
            else:
                value = Tile(value.data.reshape(shape), None if value.mask is None else value.mask.reshape(shape))
        _store(self, starts, value, None)

    def _view(self, starts, stops, drop=()):
        key = tuple(_pyslice(a, b) for a, b in zip(starts, stops))
        v = self.data[key]
        if drop:
            v = v.reshape([s for d, s in enumerate(v.shape) if d not in drop])
        return GMTensor(v, self.buf, self.name)


def _load_rows(t: GMTensor, a0, b0, a1, b1):
    """The fast path of ``t[a0:b0, a1:b1]`` in a block: a 2-D view whose rows are root rows
    (``t._rows``), int bounds of a non-empty window inside it, a plain tensor outside check mode
    (or a clean one in it). The same effects as ``_parse`` + :func:`_load`: bounds check,
    footprint, byte and load counts, a copied tile (or the view of a no-copy In argument).
    Returns None, having done nothing, whenever a condition fails (the general path then runs
    and raises what it raises)."""
    buf = t.buf
    blk = buf.program.cur_block  # the running block (state.block), without the thread-local lookup
    rows = t._rows
    if blk is None or rows is None:
        return None
    shape = t._shape
    if not (type(a0) is int and type(b0) is int and type(a1) is int and type(b1) is int
            and 0 <= a0 < b0 <= shape[0] and 0 <= a1 < b1 <= shape[1]
            and rows[1] + b1 <= buf.C and (rows[2] == 1 or b0 - a0 == 1)
            and not buf.slow and (buf.shadow is None or buf.id in buf.program.sanitizer.clean)):
        return None
    br, bc, q = rows
    st0, st1 = t._strides
    n0, n1 = b0 - a0, b1 - a1
    d = t.data
    off = buf.base_off + t._off + a0 * st0 + a1 * st1
    blk.fp.append((buf, (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1), R))
    blk.bytes += n0 * n1 * t._itemsize
    blk.ld += 1
    if d.is_meta:
        return Tile(_go.meta((n0, n1), d.dtype))
    if not buf.no_copy:  # a copy, in one torch call where that gives the same tile as below
        if n1 == shape[1] and st0 == n1:  # whole rows of a view with contiguous rows
            return Tile(d.narrow_copy(0, a0, n0))
        if n0 > 1:  # the clone below of such a view is contiguous, as as_strided_copy's result
            return Tile(torch.as_strided_copy(d, (n0, n1), t._strides, off))
    src = d.as_strided((n0, n1), t._strides, off)  # the view data[key], one call
    # as _load; the view (n0, n1 > 0) is contiguous iff (n1 == 1 or st1 == 1) and (n0 == 1 or st0 == n1)
    return Tile(src if buf.no_copy and (n1 == 1 or st1 == 1) and (n0 == 1 or st0 == n1) else src.clone())


def _omitted_bounds(a0, b0, a1, b1, shape) -> tuple:
    """The bounds of a 2-D subscript ``x[a0:b0, a1:b1]`` of ``shape`` with the omitted (None) ones
    replaced by the dim's start or extent."""
    return (0 if a0 is None else a0, shape[0] if b0 is None else b0,
            0 if a1 is None else a1, shape[1] if b1 is None else b1)


def _window(t: GMTensor, starts, stops) -> torch.Tensor:
    """The view ``t.data[starts[d]:stops[d], ...]`` (bounds already checked) as one ``as_strided``
    call: the same storage, sizes, strides and offset as slicing, at about half its cost."""
    st = t._strides
    off = t.buf.base_off + t._off
    for a, s in zip(starts, st):
        off += a * s
    return t.data.as_strided([b - a for a, b in zip(starts, stops)], st, off)


def _where() -> str:
    blk = _ctx.state.block
    f = _ctx.user_frame()
    site = f" at {_ctx.frame_site(f)}" if f is not None else ""
    if blk is not None:
        return f" (task {blk.task.name!r} block {blk.idx}{site})"
    return site


def aliases_readonly(d: torch.Tensor) -> bool:
    """Whether the tile data ``d`` is a view of an In parameter of the running program (a
    no-copy load, or a sub-tile / reshape of one): a tile write must copy it first."""
    if d._base is None:
        return False
    prog = _ctx.state.program
    if prog is None:
        return False
    return d.untyped_storage().data_ptr() in prog.no_copy_storages


def _prog_block(what: str):
    blk = _ctx.state.block
    if blk is None:
        raise DslError(f"{what} must run inside a task (pl.at / pl.spmd){_where()}")
    return blk


def _load(t: GMTensor, starts, stops, valid, pad, checked: bool = False) -> Tile:
    """Load the window [starts, stops) of t; with ``valid`` only the top-left
    valid extents are read and the rest is padding (zero unless ``pad``).
    ``checked``: the window is already known to be in bounds."""
    blk = _ctx.state.block
    buf = t.buf
    if buf.slow:
        _slow(t, "read")
    if valid is not None:
        shape = [b - a for a, b in zip(starts, stops)]
        valid = tuple(_idx(v, "a valid extent") for v in valid)
        if len(valid) != len(shape):
            raise DslError(f"{t.name}: valid_shape {list(valid)} has the wrong rank for window {shape}")
        for d, v in enumerate(valid):
            if not 0 <= v <= shape[d]:
                raise DslError(f"{t.name}: valid_shape {list(valid)} outside window {shape}{_where()}")
            if starts[d] + v > t.data.shape[d]:
                raise DslError(f"{t.name}: valid window [{starts[d]}, {starts[d] + v}) out of bounds of dim {d} "
                               f"(extent {t.data.shape[d]}){_where()}")
        vstops = [a + v for a, v in zip(starts, valid)]
    elif checked:
        vstops = stops
    else:
        for d, a, b, n in zip(range(len(stops)), starts, stops, t._shape):
            if b > n or a < 0:
                raise DslError(f"{t.name}: window [{a}, {b}) out of bounds of dim {d} "
                               f"(extent {n}){_where()}")
        vstops = stops
    src = _window(t, starts, vstops)
    box = t.box(starts, vstops)
    if buf.go is not None:  # graph-only mode: an unknown window loads an unknown (meta) tile
        src = buf.go.load(src, box, blk)
    if box is not None:  # manual_dep tensors too: the race checker needs them
        if type(box) is list:
            blk.fp.extend((buf, b, R) for b in box)
        else:
            blk.fp.append((buf, box, R))
    blk.bytes += src.numel() * src.element_size()
    blk.ld += 1
    mask = None
    if (buf.shadow is not None and box is not None and buf.id not in buf.program.sanitizer.clean
            and buf.program.sanitizer.settled(buf, box)):
        m = t.smask()[tuple(map(_pyslice, starts, vstops))]
        if buf.program.sanitizer.window_undefined(buf, m):
            mask = buf.program.consume_undefined(m.clone(), blk, "load")
            if buf.lazy_poison:  # an Out argument's undefined elements read as the poison pattern
                src = buf.program.poisoned(src, mask)
    if src.is_meta:  # graph-only mode: an unknown tile (a meta clone is slower than a new one)
        return Tile(_go.meta([b - a for a, b in zip(starts, stops)], src.dtype), None, valid)
    # an In argument nobody writes during the run (Buffer.no_copy: a store into it is a DslError)
    # hands out a contiguous window without a copy; tile writes copy such a tile first
    # (Tile.__setitem__, pl.write: aliases_readonly)
    view = buf.no_copy and src.is_contiguous()
    if valid is None:
        return Tile(src if view else src.clone(), mask)
    if vstops == stops:
        return Tile(src if view else src.clone(), mask, valid)
    fill = 0 if pad is None else _pad_scalar(src.dtype, pad)
    pads = []  # (before, after) per dim, last dim first: the valid values, then the pad value
    for n, v in zip(reversed(shape), reversed(valid)):
        pads += (0, n - v)
    data = torch.constant_pad_nd(src, pads, fill)
    if mask is not None:
        vkey = tuple(_pyslice(0, b - a) for a, b in zip(starts, vstops))
        full_mask = torch.zeros(shape, dtype=torch.int32)
        full_mask[vkey] = mask
        mask = full_mask
    return Tile(data, mask, valid)


_ATOMIC_INT = (torch.int32, torch.int16, torch.int8)  # integer dtypes an atomic add accepts


def _store_rows(t: GMTensor, a0: int, a1: int, tile: Tile, atomic) -> bool:
    """The fast path of :func:`_store` for a rank-2 tile (its valid region) at the int offsets
    ``(a0, a1)`` of a 2-D view with a box fast path (``t._rows``, or ``t._fast``: rows narrower
    than a root row), inside a block of a plain run (no shadow, no held-back atomic adds, not
    graph-only). Does what ``_store`` does (bounds,
    copy or add, footprint, byte and store counts) and returns True; returns False, having done
    nothing, whenever any condition fails (``_store`` then runs and raises what it raises)."""
    buf = t.buf
    blk = buf.program.cur_block
    src = tile.data
    d = t.data
    if (blk is None or buf.slow or buf.readonly or src.dtype != d.dtype or src.dim() != 2 or d.is_meta
            or (buf.shadow is not None and not buf.program.sanitizer.quick_store(buf, tile.mask, atomic))):
        return False
    v = tile.valid
    if v is None:
        n0, n1 = src.shape
    else:  # the valid region: the top-left view data[:v0, :v1], as _store takes it
        if len(v) != 2:
            return False
        n0, n1 = v
        m0, m1 = src.shape
        if type(n0) is not int or type(n1) is not int or not (0 < n0 <= m0 and 0 < n1 <= m1):
            return False
        if n1 == m1:  # the view src[:n0, :n1] (the whole tile when n0 == m0: the same values to copy)
            if n0 < m0:
                src = src[:n0]
        else:
            src = src.as_strided((n0, n1), src.stride(), src.storage_offset())
    b0, b1 = a0 + n0, a1 + n1
    shape = t._shape
    if not (0 <= a0 < b0 <= shape[0] and 0 <= a1 < b1 <= shape[1]):
        return False
    rows = t._rows
    if rows is not None:
        br, bc, q = rows
        if bc + b1 > buf.C or (q != 1 and n0 != 1):
            return False
        box = (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1)
    else:  # another 2-D view with a box fast path (rows narrower than a root row)
        box = t.box((a0, a1), (b0, b1))
        if type(box) is not tuple:
            return False
    if atomic is not None and (atomic != AtomicType.Add or buf.program.defer_atomics
                               or not (d.dtype.is_floating_point or d.dtype in _ATOMIC_INT)):
        return False
    st0, st1 = t._strides
    off = buf.base_off + t._off + a0 * st0 + a1 * st1  # the window's first element in the storage
    if buf.undo is not None:  # an argument written in place: keep what the store overwrites
        buf.save_window((n0, n1), t._strides, off)
    if atomic is None:
        if n1 == shape[1]:  # whole rows: a row-slice assignment (the same copy, cheaper)
            d[a0:b0] = src
        else:
            d.as_strided((n0, n1), t._strides, off).copy_(src)
        kind = W
    else:
        d.as_strided((n0, n1), t._strides, off).add_(src)
        kind = A
    blk.fp.append((buf, box, kind))
    blk.bytes += n0 * n1 * t._itemsize
    blk.st += 1
    if buf.shadow is not None and buf.id in buf.program.sanitizer.pending:
        if rows is not None:  # the box is exactly the window's elements
            buf.program.sanitizer.defer_rows(t, (a0, a1), (b0, b1), box)
        else:
            buf.program.sanitizer.defer_store(t, (a0, a1), (b0, b1), box)
    return True


def _load_padded_rows(t: GMTensor, a0: int, a1: int, s0: int, s1: int, v0, v1):
    """The fast path of :func:`_load` for a ``[s0, s1]`` window at ``(a0, a1)`` of a 2-D view with
    a row-box fast path (``t._rows``) whose int valid extents ``(v0, v1)`` are non-zero and at
    most the window's, inside a block of a plain run (no shadow, not graph-only, zero padding):
    the valid window's footprint, bytes and load count, and the zero-padded tile. Returns None,
    having done nothing, whenever any condition fails (``_load`` then runs and raises what it
    raises)."""
    rows = t._rows
    buf = t.buf
    blk = buf.program.cur_block
    if (rows is None or blk is None or type(v0) is not int or type(v1) is not int or buf.slow
            or (buf.shadow is not None and buf.id not in buf.program.sanitizer.clean)):
        return None
    shape = t._shape
    b0, b1 = a0 + v0, a1 + v1
    br, bc, q = rows
    if not (0 <= a0 and 0 < v0 <= s0 and b0 <= shape[0] and 0 <= a1 and 0 < v1 <= s1 and b1 <= shape[1]
            and bc + b1 <= buf.C and (q == 1 or v0 == 1)):
        return None
    d = t.data
    n0, n1 = shape
    if (v0 < s0 or v1 < s1) and (b0 == n0 or v0 == s0) and (b1 == n1 or v1 == s1):
        # the window reaches the view's end on every dim it pads: one constant_pad_nd of the view
        # itself, cropping (negative pads) what lies outside the window: the same padded tile
        if d.is_meta:
            return None
        blk.fp.append((buf, (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1), R))
        blk.bytes += v0 * v1 * t._itemsize
        blk.ld += 1
        return Tile(torch.constant_pad_nd(d, [-a1, s1 - v1 + b1 - n1, -a0, s0 - v0 + b0 - n0], 0), None, (v0, v1))
    st0, st1 = t._strides
    src = d.as_strided((v0, v1), t._strides, buf.base_off + t._off + a0 * st0 + a1 * st1)
    if src.is_meta:
        return None
    blk.fp.append((buf, (br + a0 * q, br + (b0 - 1) * q + 1, bc + a1, bc + b1), R))
    blk.bytes += v0 * v1 * t._itemsize
    blk.ld += 1
    if v0 == s0 and v1 == s1:
        return Tile(src if buf.no_copy and src.is_contiguous() else src.clone(), None, (v0, v1))
    return Tile(torch.constant_pad_nd(src, [0, s1 - v1, 0, s0 - v0], 0), None, (v0, v1))


def _store(t: GMTensor, starts, tile: Tile, atomic, stops=None) -> None:
    """Write ``tile`` (its valid region) at ``starts``; ``stops``: the window,
    already known to be in bounds and to match the tile."""
    blk = _ctx.state.block
    if blk is None:
        _prog_block(f"writing {t.name}")
    buf = t.buf
    if buf.slow:
        _slow(t, "write", atomic is not None)
    if buf.readonly:
        from pto.language.compat_ops import written_in
        written_in(t)  # DslError; under pto pypto a warning (pypto infers InOut)
    if tile.data.dtype != t.data.dtype:
        raise DslError(f"{t.name}: storing a {tile.dtype} tile into a {t.dtype} tensor (cast first){_where()}")
    ext = tile.valid if tile.valid is not None else tile.data.shape
    if stops is None:
        if len(starts) != t.data.dim():
            raise DslError(f"{t.name}: {len(starts)} offsets for a rank-{t.data.dim()} tensor{_where()}")
        if len(ext) != len(starts):
            raise DslError(f"{t.name}: storing a rank-{len(ext)} tile {list(tile.shape)} at {len(starts)} offsets "
                           f"of a rank-{t.data.dim()} tensor; pl.reshape the tile to rank {t.data.dim()} first"
                           f"{_where()}")
        stops = [a + e for a, e in zip(starts, ext)]
        for d, a, b, n in zip(range(len(stops)), starts, stops, t._shape):
            if a < 0 or b > n:
                raise DslError(f"{t.name}: store window [{a}, {b}) out of bounds of dim {d} "
                               f"(extent {n}){_where()}")
    src = tile.data if tile.valid is None else tile.data[tuple(_pyslice(0, e) for e in ext)]
    dst = _window(t, starts, stops)
    if atomic is not None:
        if atomic != AtomicType.Add:
            raise DslError(f"{t.name}: unknown atomic type {atomic!r}")
        if not (dst.dtype.is_floating_point or dst.dtype in (torch.int32, torch.int16, torch.int8)):
            raise DslError(f"{t.name}: atomic add on dtype {t.dtype} is not supported")
    if buf.undo is not None:  # an argument written in place: keep what the store overwrites
        buf.save_view(dst)
    box = None
    if buf.go is not None or dst.is_meta:  # graph-only mode: no float storage, unknown masks
        if buf.go is not None:
            box = t.box(starts, stops)
            buf.go.store(dst, src, box, atomic is not None, blk)
    elif atomic is None:
        dst.copy_(src)
    elif buf.program.defer_atomics:  # schedule-sensitivity run: the add is applied later, in another order
        buf.program.defer_atomic(buf, blk, dst, src, t.box(starts, stops))
    else:
        dst.add_(src)
    if box is None:
        box = t.box(starts, stops)
    if box is not None:
        kind = W if atomic is None else A
        if type(box) is list:
            blk.fp.extend((buf, b, kind) for b in box)
        else:
            blk.fp.append((buf, box, kind))
    blk.bytes += src.numel() * src.element_size()
    blk.st += 1
    if buf.shadow is not None:
        san = buf.program.sanitizer
        clean = san.clean
        if tile.mask is None and atomic is None and buf.id in san.pending:  # deferred shadow: record the window
            san.defer_store(t, starts, stops, box)
        elif tile.mask is not None or buf.id not in clean:  # a defined tile into a clean buffer keeps it clean
            san.materialize(buf)
            sm = t.smask()[tuple(map(_pyslice, starts, stops))]
            m = None if tile.mask is None else (tile.mask if tile.valid is None else
                                                 tile.mask[tuple(_pyslice(0, e) for e in ext)])
            if m is not None:
                clean.discard(buf.id)
            if atomic is None:
                if m is None:
                    sm.zero_()
                else:
                    sm.copy_(m)
            else:
                if bool(sm.any()):  # adding onto undefined consumes it: the sum stays undefined
                    buf.program.consume_undefined(sm, blk, "atomic add onto undefined")
                if m is not None:
                    torch.maximum(sm, m, out=sm)
        buf.written = True


def _slow(t: GMTensor, what: str, atomic: bool = False) -> None:
    """An access to a buffer the fast paths skip (``buf.slow``): a freed one is a use after
    free (DslError); one holding atomic adds held back by a schedule-sensitivity run gets
    them applied first, unless this access is an atomic add itself."""
    buf = t.buf
    if buf.freed:
        raise DslError(f"{t.name}: {what} after its scope ended (use after free){_where()}")
    if not atomic and buf.pending:
        buf.program.flush_atomics(buf)


def _read_elem(t: GMTensor, idx):
    buf = t.buf
    if buf.slow:
        _slow(t, "read")
    off = t.buf.base_off + t._off
    for i, st in zip(idx, t._strides):
        off += i * st
    blk = _ctx.state.block
    if buf.go is not None:  # graph-only mode: a MetaScalar for an unknown element
        value = buf.go.read(t, idx, off, blk)
    elif t.data.is_meta:
        value = _go.MetaScalar(_go.read_origin(t.name, idx), t.data.dtype)
    else:
        value = t.data.as_strided((), (), off).item()  # the element data[idx], one view instead of one per dim
    box = t.box(idx, [i + 1 for i in idx])
    if blk is not None:
        # manual_dep tensors too, as for a tile load: derivation skips them, the race checker needs them
        if type(box) is list:
            blk.fp.extend((buf, b, R) for b in box)
        elif box is not None:
            blk.fp.append((buf, box, R))
        blk.bytes += t.data.element_size()
        blk.ld += 1
    else:
        buf.program.orchestration_read(buf, box)
    if buf.shadow is not None and buf.id not in buf.program.sanitizer.clean and buf.program.sanitizer.settled(buf, box):
        tag = int(t.smask()[tuple(idx)])
        if tag == 0:
            return value  # defined: a plain number, as outside check mode
        site = None
        if blk is None:
            f = _ctx.user_frame()
            site = _ctx.frame_site(f) if f is not None else None
        tag = buf.program.consume_scalar(tag, blk, site)
        return ScalarValue(value, False, f"{buf.name}{list(idx)}; {buf.program.describe_undefined(tag)}", tag)
    return value


# ---- public ops ---------------------------------------------------------------

def create_tensor(shape, dtype, init_value=None, capacity=None, manual_dep: bool = False,
                  layout=None, name: str | None = None) -> GMTensor:
    """Allocate a GM tensor from the ring heap (orchestration only).

    Args:
        shape: list of dims; entries may be runtime values (``max(t, 16)``).
        dtype: element dtype.
        init_value: fill at allocation (no task, no edge). ``0`` for any dtype,
            ``-1`` and other integers for integer sentinels, floats only for
            float dtypes. None leaves the contents undefined (stale heap bytes;
            NaN / a garbage pattern in check mode).
        capacity: compile-time bound of a runtime-sized shape: an int bounds
            dim 0, a list bounds each dim (None entries unbounded).
        manual_dep: exclude the tensor from dependency derivation (creator
            retention stays).
        name: name for messages; defaults to the assignment target on the
            calling source line.

    Returns:
        GMTensor: the new tensor.

    Raises:
        DslError: called inside a task, a negative dim, or a dtype with no pto dtype (float64).
        BindError: an ``init_value`` not representable in ``dtype``.
        CapacityError: a dim above its declared capacity.
        HeapExhaustedError: the ring heap cannot hold the tensor.
    """
    prog = _ctx.program("pl.create_tensor")
    if _ctx.state.block is not None:
        from pto.language import compat_ops
        if compat_ops.mode.pypto:  # pypto lowers it to an on-chip buffer (tile.create)
            tile = compat_ops.create_tile(shape, dtype, name=name)
            if init_value is not None:  # filled at creation: every element defined
                from pto.runtime.heap import validate_init_value
                validate_init_value(name or "tile", as_dtype(dtype), init_value)
                tile.data.fill_(init_value)
                tile.mask = None
            return tile
        raise DslError(f"pl.create_tensor is orchestration-only; it was called inside a task{_where()}")
    f = _ctx.user_frame()
    try:
        dt = as_dtype(dtype)
    except DslError as e:
        raise DslError(f"pl.create_tensor: {e}{_where()}") from None
    return prog.new_tensor([_idx(s, "a tensor dim") for s in shape], dt, init_value, capacity,
                           manual_dep, name, f)


def slice(t, shape, offsets, valid_shape=None, pad_value=None, drop_dims=None, valid_shapes=None):  # noqa: A001
    """A window of ``shape`` at ``offsets`` of a tensor or tile.

    Inside a task, a GM tensor window is loaded into a tile (read footprint);
    with ``valid_shape`` only the valid top-left extents are read and the rest
    of the tile is padding (zero, or ``pad_value``). In orchestration a GM
    tensor window is a zero-copy view. A tile window is a sub-tile.
    ``valid_shapes`` is the older spelling of ``valid_shape``.

    Raises:
        DslError: a window out of bounds, or ranks that do not match.
    """
    valid_shape = valid_shape if valid_shape is not None else valid_shapes
    if (type(t) is GMTensor and pad_value is None and not drop_dims and len(shape) == 2 and len(offsets) == 2
            and t.buf.program.cur_block is not None):
        # fast path: a 2-D window in a block whose valid shape (if any) is the whole window is
        # x[a:b, c:d] (its own fast path; the same tile, footprint and counters as _load)
        a0, a1 = offsets
        s0, s1 = shape
        if (type(a0) is int and type(a1) is int and type(s0) is int and type(s1) is int
                and (valid_shape is None or (len(valid_shape) == 2 and type(valid_shape[0]) is int
                                             and type(valid_shape[1]) is int and valid_shape[0] == s0
                                             and valid_shape[1] == s1))):
            out = _load_rows(t, a0, a0 + s0, a1, a1 + s1)
            if out is None:
                out = t[a0:a0 + s0, a1:a1 + s1]
            return out if valid_shape is None else Tile(out.data, out.mask, (s0, s1))
        if (valid_shape is not None and type(a0) is int and type(a1) is int and type(s0) is int
                and type(s1) is int and len(valid_shape) == 2):
            # fast path: a padded 2-D window (valid extents smaller than the window)
            out = _load_padded_rows(t, a0, a1, s0, s1, valid_shape[0], valid_shape[1])
            if out is not None:
                return out
    if isinstance(t, Tile):
        out = tile_slice(t, shape, offsets)
    else:
        if not isinstance(t, GMTensor):
            raise DslError(f"pl.slice: expected a tensor or tile, got {type(t).__name__}")
        if len(shape) != t.data.dim() or len(offsets) != t.data.dim():
            raise DslError(f"pl.slice: {t.name} has rank {t.data.dim()}, got shape {list(shape)} "
                           f"offsets {list(offsets)}")
        starts = [_idx(o, "a slice offset") for o in offsets]
        stops = [a + _idx(s, "a slice dim") for a, s in zip(starts, shape)]
        if _ctx.state.block is None:
            for d, (a, b) in enumerate(zip(starts, stops)):
                if a < 0 or b > t.data.shape[d]:
                    raise DslError(f"pl.slice: {t.name} window [{a}, {b}) out of bounds of dim {d} "
                                   f"(extent {t.data.shape[d]}){_where()}")
            out = t._view(starts, stops)
            return out if not drop_dims else reshape(out, [s for d, s in enumerate(out.shape) if d not in drop_dims])
        out = _load(t, starts, stops, valid_shape, pad_value)
        valid_shape = None
    if valid_shape is not None:
        out = Tile(out.data, out.mask, tuple(_idx(v, "a valid extent") for v in valid_shape))
    if drop_dims:
        out = tile_reshape(out, [s for d, s in enumerate(out.shape) if d not in drop_dims])
    return out


def load(t: GMTensor, offsets, shapes, valid_shape=None, valid_shapes=None, target_memory=None) -> Tile:
    """Explicit GM -> tile copy of the window ``shapes`` at ``offsets`` (inside a task).

    Raises:
        DslError: outside a task, or a window out of bounds.
    """
    _prog_block(f"pl.load of {getattr(t, 'name', t)}")
    return slice(t, shapes, offsets, valid_shape=valid_shape if valid_shape is not None else valid_shapes)


def gather_rows(t: GMTensor, rows, col_offset=0, cols=None) -> Tile:
    """Rows ``rows`` of the rank-2 GM tensor ``t`` as one tile (inside a task): ``out[i, :] =
    t[rows[i], col_offset : col_offset + cols]``, ``[len(rows), cols]`` in ``t``'s dtype
    (``cols`` defaults to the rest of the row). One GM row gather instead of a load per row; the
    read footprint is the rows' own (one box per run of consecutive rows: the union of what
    ``len(rows)`` one-row loads would record, never the bounding box of all rows). The block
    counts one GM load per such run (a run of consecutive rows is one copy, as a slice of it
    would be; the simulator's per-load latency). Row indices are Python ints (read them with
    ``pl.read``); repeats are allowed.

    Raises:
        DslError: outside a task, a ``t`` that is not a rank-2 GM tensor, a column window or a
            row index out of bounds (naming the entry).
    """
    blk = _prog_block(f"pl.gather_rows of {getattr(t, 'name', t)}")
    if not isinstance(t, GMTensor) or t.data.dim() != 2:
        raise DslError(f"pl.gather_rows: needs a rank-2 GM tensor, got {t!r}{_where()}")
    n, width = t._shape
    c0 = _idx(col_offset, "a gather_rows column offset")
    c1 = width if cols is None else c0 + _idx(cols, "a gather_rows column count")
    if c0 < 0 or c1 > width or c1 <= c0:
        raise DslError(f"{t.name}: gather_rows columns [{c0}, {c1}) out of bounds of dim 1 (extent {width}){_where()}")
    buf = t.buf
    if (type(rows) is list and rows and set(map(type, rows)) == _INT_ONLY
            and 0 <= builtins.min(rows) and builtins.max(rows) < n and not buf.slow and buf.go is None and t._rows is not None and t._rows[2] == 1
            and t._rows[1] + c1 <= buf.C):
        # fast path: in-bounds int rows of a view whose rows are root rows (the checks in C, the
        # runs of consecutive rows from one comparison per row; the same tile, boxes, loads and
        # bytes as below)
        sel = torch.tensor(rows, dtype=torch.int64)
        d = t.data
        st0, st1 = t._strides
        if d.is_meta:  # graph-only mode, a shape-only tensor: an unknown tile (torch's meta index_select runs in Python)
            data = _go.meta([len(rows), c1 - c0], d.dtype)
        else:
            data = (d if c0 == 0 and c1 == width else
                    d.as_strided((n, c1 - c0), (st0, st1), buf.base_off + t._off + c0 * st1)).index_select(0, sel)
        br, bc, _ = t._rows
        cut = [k for k in range(1, len(rows)) if rows[k] != rows[k - 1] + 1]  # where a new run starts
        cut.append(len(rows))
        fp = blk.fp
        i = 0
        for j in cut:
            fp.append((buf, (br + rows[i], br + rows[j - 1] + 1, bc + c0, bc + c1), R))
            i = j
        blk.ld += len(cut)
        return _gathered(t, blk, sel, c0, c1, data)
    idx = [_idx(r, "a gather_rows row index") for r in rows]
    for i, r in enumerate(idx):
        if not 0 <= r < n:
            raise DslError(f"{t.name}: gather_rows entry {i} is row {r}, out of bounds of dim 0 (extent {n}){_where()}")
    if buf.slow or buf.go is not None or not idx:  # per-row loads (remote / graph-only tensors)
        parts = [_load(t, [r, c0], [r + 1, c1], None, None, checked=True) for r in idx]
        if blk is not None and parts:  # one GM load per run of consecutive rows, as below
            blk.ld -= len(idx) - sum(1 for i in range(len(idx)) if i == 0 or idx[i] != idx[i - 1] + 1)
        if not parts:
            return Tile(torch.empty([0, c1 - c0], dtype=t.data.dtype))
        if any(p.data.is_meta for p in parts):  # graph-only mode: an unknown row makes the tile unknown
            return Tile(_go.meta([len(idx), c1 - c0], t.data.dtype))
        data = torch.cat([p.data for p in parts])
        mask = None
        if any(p.mask is not None for p in parts):
            mask = torch.cat([p.mask if p.mask is not None else torch.zeros(p.data.shape, dtype=torch.int32)
                              for p in parts])
        return Tile(data, mask)
    sel = torch.tensor(idx, dtype=torch.int64)
    data = t.data[:, c0:c1].index_select(0, sel)
    fp = blk.fp
    i, n_idx = 0, len(idx)
    while i < n_idx:  # one box and one GM load per run of consecutive rows: the union of the one-row boxes
        j = i + 1
        while j < n_idx and idx[j] == idx[i] + (j - i):
            j += 1
        blk.ld += 1
        box = t.box((idx[i], c0), (idx[i] + j - i, c1))
        if type(box) is list:
            fp.extend((buf, b, R) for b in box)
        elif box is not None:
            fp.append((buf, box, R))
        i = j
    return _gathered(t, blk, sel, c0, c1, data)


def _span_boxes(f_lo: int, f_hi: int, C: int):
    """Root boxes covering the flat element range ``[f_lo, f_hi]`` of a buffer whose root rows are
    ``C`` elements wide: one box inside a row, else up to three (the first row's tail, the whole
    rows between, the last row's head). Every element of a window whose flat extent is that range
    lies inside them, so a window that crosses root rows (a reshaped or flat view) records no
    element outside its extent: two blocks writing disjoint runs of a flat view do not overlap."""
    r0, r1 = f_lo // C, f_hi // C
    c_lo, c_hi = f_lo - r0 * C, f_hi - r1 * C + 1
    if r0 == r1:
        return (r0, r0 + 1, c_lo, c_hi)
    boxes = []
    if c_lo:
        boxes.append((r0, r0 + 1, c_lo, C))
        r0 += 1
    tail = None
    if c_hi < C:
        tail = (r1, r1 + 1, 0, c_hi)
        r1 -= 1
    if r1 >= r0:
        boxes.append((r0, r1 + 1, 0, C))
    if tail is not None:
        boxes.append(tail)
    return boxes[0] if len(boxes) == 1 else boxes


_INT_ONLY = {int}


def _gathered(t: GMTensor, blk, sel: torch.Tensor, c0: int, c1: int, data: torch.Tensor) -> Tile:
    """The end of :func:`gather_rows`: the gathered ``data`` (rows ``sel``, columns ``[c0, c1)`` of
    ``t``) counted as bytes of ``blk``, and in check mode its definedness mask, as a tile."""
    buf = t.buf
    blk.bytes += data.numel() * data.element_size()
    mask = None
    if buf.shadow is not None and buf.id not in buf.program.sanitizer.clean and buf.program.sanitizer.settled(buf):
        m = t.smask()[:, c0:c1].index_select(0, sel)
        if buf.program.sanitizer.window_undefined(buf, m):
            mask = buf.program.consume_undefined(m, blk, "load")
            if buf.lazy_poison:  # an Out argument's undefined elements read as the poison pattern
                data = buf.program.poisoned(data, mask)
    return Tile(data, mask)


def store(tile: Tile, offsets, out_tensor: GMTensor, shapes=None, atomic=None) -> GMTensor:
    """Tile -> GM at ``offsets``; writes the tile's valid region; ``atomic=Add``
    accumulates into the target. Returns ``out_tensor``.

    ``shapes``: the stored window. Of the tile's rank and within its extents it selects the
    top-left sub-tile (pypto-lib stores ``[1, 1]`` of a ``[1, 8]`` tile this way); otherwise
    the tile is reshaped to it (same element count).

    Raises:
        DslError: outside a task, dtype mismatch, or a window out of bounds.
    """
    if shapes is not None and list(shapes) != list(tile.shape):
        if len(shapes) == tile.data.dim() and all(_idx(s, "a store shape") <= n for s, n in zip(shapes, tile.shape)):
            valid = tile.valid_shape
            tile = tile_slice(tile, shapes, [0] * len(shapes))
            if tile.shape != tuple(valid) and any(v < s for v, s in zip(valid, tile.shape)):
                tile = Tile(tile.data, tile.mask, tuple(min(v, s) for v, s in zip(valid, tile.shape)))
        else:
            tile = tile_reshape(tile, shapes)
    _store(out_tensor, [_idx(o, "a store offset") for o in offsets], tile, atomic)
    return out_tensor


def assemble(dst, src, offsets, atomic=None):
    """Write tile ``src`` into ``dst`` at ``offsets``; returns the updated ``dst``.

    With a GM target (inside a task) this is a store, or an atomic add with
    ``atomic=pl.AtomicType.Add`` (the target must be zeroed beforehand, e.g.
    by ``create_tensor(..., init_value=0)``). With a tile target it returns a
    new tile.

    Raises:
        DslError: as :func:`store`.
    """
    if (type(dst) is GMTensor and type(src) is Tile and len(offsets) == 2 and len(dst._shape) == 2
            and (dst._rows is not None or dst._fast is not None)):
        o0, o1 = offsets  # fast path: a 2-D tile at int offsets of a plain 2-D GM view
        if type(o0) is int and type(o1) is int and _store_rows(dst, o0, o1, src, atomic):
            return dst
    if isinstance(dst, Tile):
        if atomic is not None:
            raise DslError("pl.assemble: atomic add needs a GM target")
        return tile_assemble(dst, src, offsets)
    if not isinstance(src, Tile):
        raise DslError(f"pl.assemble: source must be a tile, got {type(src).__name__}")
    extra = src.data.dim() - dst.data.dim()
    if extra > 0 and src.valid is None and all(s == 1 for s in src.shape[:extra]):
        src = tile_reshape(src, src.shape[extra:])  # leading unit dims (a unit-batch matmul result)
    if len(offsets) != dst.data.dim() or src.data.dim() != dst.data.dim():
        raise DslError(f"pl.assemble: rank mismatch: {dst.name} rank {dst.data.dim()}, "
                       f"tile {list(src.shape)}, offsets {list(offsets)}{_where()}")
    _store(dst, [_idx(o, "an assemble offset") for o in offsets], src, atomic)
    return dst


def read(src, idx):
    """Scalar element read from a GM tensor or tile.

    In orchestration the read waits for the producer (eager execution already
    did). Returns a Python number; in check mode an undefined element comes
    back as an undefined :class:`ScalarValue` (naming its origin allocation),
    which raises UndefinedValueError when used as an index, loop bound or
    branch condition and propagates through arithmetic and tile ops.
    """
    if type(src) is GMTensor and type(idx) in (list, tuple):
        # fast path: in-bounds int indices of a plain rank-1 / rank-2 view with a box fast path
        # (the general path below reads the same element, with the same footprint and counters)
        buf = src.buf
        if not buf.slow and (buf.shadow is None or buf.id in buf.program.sanitizer.clean):
            shape = src._shape
            rows = src._rows
            box = None
            if rows is not None and len(idx) == 2:
                i, j = idx
                br, bc, q = rows
                if type(i) is int and type(j) is int and 0 <= i < shape[0] and 0 <= j < shape[1] and bc + j < buf.C:
                    st0, st1 = src._strides
                    off = buf.base_off + src._off + i * st0 + j * st1
                    box = (br + i * q, br + i * q + 1, bc + j, bc + j + 1)
            elif len(idx) == 1 and len(shape) == 1 and src._fast is not None:
                i, = idx
                br, bc = src._fast
                if type(i) is int and 0 <= i < shape[0] and bc + i < buf.C:
                    off = buf.base_off + src._off + i
                    box = (br, br + 1, bc + i, bc + i + 1)
            if box is not None and not src.data.is_meta:
                value = src.data.as_strided((), (), off).item()
                blk = buf.program.cur_block
                if blk is not None:
                    blk.fp.append((buf, box, R))
                    blk.bytes += src._itemsize
                    blk.ld += 1
                else:
                    buf.program.orchestration_read(buf, box)
                return value
    elif type(src) is Tile and src.mask is None:
        # fast path: in-bounds int indices into an all-defined tile (the general path below
        # reads the same element and raises the errors)
        d = src.data
        vals = getattr(src, "_vals", None)
        if vals is not None and vals[0] is d and vals[2] is not None and type(idx) in (list, tuple):
            # the tile's values as a Python list (_tile_value), still current: one list lookup
            lst = vals[2]
            if len(idx) == 2 and type(lst[0]) is list:
                i, j = idx
                if (type(i) is int and type(j) is int and 0 <= i < len(lst) and 0 <= j < len(lst[0])
                        and vals[1] == d._version):
                    return lst[i][j]
            elif len(idx) == 1 and type(lst[0]) is not list:
                i, = idx
                if type(i) is int and 0 <= i < len(lst) and vals[1] == d._version:
                    return lst[i]
        key = (idx,) if type(idx) is int else tuple(idx) if type(idx) in (list, tuple) else ()
        shape = d.shape
        if len(key) == len(shape) and key:
            for i, n in zip(key, shape):
                if type(i) is not int or not 0 <= i < n:
                    break
            else:
                if d.is_meta:  # graph-only mode: an unknown tile element
                    return _go.MetaScalar(_go.read_origin("tile element", key), d.dtype)
                return _tile_value(src, d, key)
    if not isinstance(idx, (list, tuple)):
        idx = [idx]
    if isinstance(src, Tile):
        key = _tile_element("read", src, idx)
        if src.data.is_meta:  # graph-only mode: an unknown tile element
            return _go.MetaScalar(_go.read_origin("tile element", key), src.data.dtype)
        v = src.data[key].item()
        if src.mask is not None:
            tag = int(src.mask[key])
            if tag:
                prog = _ctx.state.program
                origin = prog.describe_undefined(tag) if prog is not None and prog.sanitizer else ""
                return ScalarValue(v, False, f"tile element {list(key)}; {origin}", tag)
        return v
    if not isinstance(src, GMTensor):
        raise DslError(f"pl.read: expected a tensor or tile, got {type(src).__name__}")
    idx = [_idx(i, "an index") for i in idx]
    _check_element_index("read", src, idx)
    return _read_elem(src, idx)


def read_values(src, idx, n: int) -> list:
    """``n`` consecutive elements along the last dim of a GM tensor or tile, as a Python list.

    ``pl.read_values(x, [i, j], n)`` is ``[pl.read(x, [i, j + k]) for k in range(n)]`` in one
    call: the same numbers, the same effects in the same order (inside a task: one element
    footprint, one GM load and its bytes per element; in orchestration: ``n`` orchestration
    reads), and in check mode an undefined element is an undefined :class:`ScalarValue` at its
    place in the list (the others are plain numbers). An index row read this way is as visible
    to the sanitizer as read element by element.

    Args:
        src: GM tensor or tile of rank >= 1.
        idx: the first element's index, one int per dim.
        n: how many elements (``idx[-1] .. idx[-1] + n - 1``); 0 gives ``[]``.

    Raises:
        DslError: ``n`` negative or not an int, an index out of bounds (the first element past
            the last dim names it, as ``pl.read`` would), an empty ``idx``, or ``src`` not a
            tensor or tile (also when ``n`` is 0).
    """
    n = _idx(n, "a read_values count")
    if n < 0:
        raise DslError(f"pl.read_values: negative count {n}{_where()}")
    if not isinstance(idx, (list, tuple)):
        idx = [idx]
    if not isinstance(src, (Tile, GMTensor)):
        raise DslError(f"pl.read_values: expected a tensor or tile, got {type(src).__name__}{_where()}")
    if not idx:
        raise DslError(f"pl.read_values: an empty index; give the first element's index, one int per dim"
                       f"{_where()}")
    if n == 0:
        return []
    head, j0 = list(idx[:-1]), idx[-1]
    if type(src) is Tile and src.mask is None and not src.data.is_meta:
        d = src.data
        if (len(idx) == d.dim() and type(j0) is int and 0 <= j0 and j0 + n <= d.shape[-1]
                and all(type(i) is int and 0 <= i < s for i, s in zip(head, d.shape))):
            # the view d[head, j0:j0 + n] as one as_strided call: the numbers item() gives, one conversion
            return d.as_strided((n,), (d.stride()[-1],), _offset(d, idx)).tolist()
    elif isinstance(src, GMTensor):
        buf = src.buf
        blk = _ctx.state.block
        d = src.data
        if (not buf.slow and buf.go is None and (buf.shadow is None or buf.id in buf.program.sanitizer.clean)
                and not d.is_meta
                and len(idx) == d.dim() and type(j0) is int and 0 <= j0 and j0 + n <= d.shape[-1]
                and all(type(i) is int and 0 <= i < s for i, s in zip(head, d.shape))):
            off = buf.base_off + src._off
            for i, st in zip(idx, src._strides):
                off += i * st
            st_last = src._strides[-1]
            boxes = _element_boxes(src, idx, n, R)
            values = d.as_strided((n,), (st_last,), off).tolist()
            if blk is None:  # orchestration: n orchestration reads
                for _, box, _ in boxes:
                    buf.program.orchestration_read(buf, box)
                return values
            blk.fp.extend(boxes)
            blk.bytes += n * d.element_size()
            blk.ld += n
            return values
    return [read(src, [*head, j0 + k]) for k in range(n)]  # the general path: element by element


def _element_boxes(t: GMTensor, idx: list, n: int, kind: int) -> list:
    """The footprint records ``(buf, box, kind)`` of the ``n`` in-bounds elements ``t[*idx[:-1],
    idx[-1] + k]``, in order: what ``n`` element reads or writes record (``t.box`` of each, a
    list of boxes spread, None skipped), from the view's box fast path where it has one."""
    buf = t.buf
    head, j0 = idx[:-1], idx[-1]
    rows, fast = t._rows, t._fast
    if rows is not None and len(idx) == 2:
        br, bc, q = rows
        if bc + j0 + n <= buf.C:  # a row of root columns (GMTensor.box's fast path, element by element)
            r = br + idx[0] * q
            return [(buf, (r, r + 1, c, c + 1), kind) for c in range(bc + j0, bc + j0 + n)]
    elif fast is not None and len(idx) == 1 and len(fast) == 2:
        br, bc = fast
        if bc + j0 + n <= buf.C:
            return [(buf, (br, br + 1, c, c + 1), kind) for c in range(bc + j0, bc + j0 + n)]
    first = t.box(idx, [i + 1 for i in idx])
    last_idx = [*head, j0 + n - 1]
    last = t.box(last_idx, [i + 1 for i in last_idx])
    if (t._strides[-1] == 1 and type(first) is tuple and type(last) is tuple and first[3] - first[2] == 1
            and last[:2] == first[:2] and last[2] - first[2] == n - 1):
        # every element in one root row, consecutive columns: its box is (r0, r1, c, c + 1)
        r0, r1, c0 = first[0], first[1], first[2]
        return [(buf, (r0, r1, c, c + 1), kind) for c in range(c0, c0 + n)]
    out = []
    for k in range(n):
        e = [*head, j0 + k]
        box = t.box(e, [i + 1 for i in e])
        if type(box) is list:
            out.extend((buf, b, kind) for b in box)
        elif box is not None:
            out.append((buf, box, kind))
    return out


_VALS_MAX = 1 << 16  # largest tile (elements) whose values pl.read caches as a Python list


def _tile_value(tile: Tile, d: torch.Tensor, key: tuple):
    """``d[key].item()`` for the in-bounds int ``key`` of ``tile`` (``d`` its data). From the
    second read of a rank-1 or rank-2 tile on, the values come from a Python list of the whole
    tile (``tolist``: the same numbers as ``item``), kept while the tensor's in-place version
    counter is unchanged: a kernel reading a tile element by element (index lists) pays one
    conversion instead of one torch call per element."""
    vals = getattr(tile, "_vals", None)
    if vals is not None and vals[0] is d:
        try:
            version = d._version
        except RuntimeError:  # an inference-mode tensor has no version counter
            return _item(d, key)
        if vals[1] == version:
            lst = vals[2]
            if lst is None:
                if len(key) > 2 or d.numel() > _VALS_MAX:
                    return _item(d, key)
                lst = d.tolist()
                tile._vals = (d, version, lst)
            return lst[key[0]] if len(key) == 1 else lst[key[0]][key[1]]
    try:
        tile._vals = (d, d._version, None)  # first read: remember it, convert on the next one
    except RuntimeError:
        pass
    return _item(d, key)


def _item(d: torch.Tensor, key) -> int | float | bool:
    """``d[key].item()`` for the in-bounds int ``key`` (one per dim): ``d.item()`` for a
    one-element ``d`` (no view), else through one 0-dim view."""
    if d.numel() == 1:
        return d.item()
    return d.as_strided((), (), _offset(d, key)).item()


def _offset(d: torch.Tensor, key) -> int:
    """The storage offset (elements) of the element ``d[key]`` (one int per dim)."""
    off = d.storage_offset()
    for i, st in zip(key, d.stride()):
        off += i * st
    return off


def _check_element_index(op: str, t: GMTensor, idx: list) -> None:
    """Raise DslError (naming ``pl.<op>`` and the tensor) unless ``idx`` has one in-bounds
    int per dim of ``t``."""
    if len(idx) != t.data.dim():
        raise DslError(f"pl.{op}: {len(idx)} indices for {t.name} of rank {t.data.dim()}")
    for d, i in enumerate(idx):
        if not 0 <= i < t.data.shape[d]:
            raise DslError(f"pl.{op}: index {i} out of bounds of dim {d} of {t.name} "
                           f"(extent {t.data.shape[d]}){_where()}")


def _tile_element(op: str, t: Tile, idx) -> tuple:
    """The key of one tile element: one in-bounds int per dim (DslError otherwise, naming ``pl.<op>``)."""
    if len(idx) != t.data.dim():
        raise DslError(f"pl.{op}: {len(idx)} indices for a tile of rank {t.data.dim()} {list(t.shape)}{_where()}")
    return tile_key(t.data.shape, tuple(idx), f"pl.{op}")


def write(dst, idx, value):
    """Scalar element store into a GM tensor (inside a task) or a tile.

    Raises:
        DslError: a destination that is not a GM tensor or a tile, a GM write outside a task, an
            index out of bounds, a fractional value into an integer dtype, or a number outside an
            integer dtype's range.
    """
    if type(dst) is Tile and dst.mask is None and type(idx) in (list, tuple) and (
            (type(value) is int and (value >= 0 or dst.data.dtype is not torch.uint8)) or (
            type(value) is float and (dst.data.dtype.is_floating_point or value.is_integer()))):
        # fast path: a plain number at in-bounds int indices of an all-defined tile (as below; a
        # number out of the dtype's range raises in torch, except a negative one into UINT8, which
        # torch wraps: that one takes the general path and its DslError)
        d = dst.data
        shape = d.shape
        if len(idx) == len(shape) and not d.is_meta:
            off = d.storage_offset()
            for i, n, st in zip(idx, shape, d.stride()):  # bounds, and the element's storage offset
                if type(i) is not int or not 0 <= i < n:
                    break
                off += i * st
            else:
                if d._base is not None and aliases_readonly(d):
                    d = dst.data = d.clone()
                    off = _offset(d, idx)
                try:
                    d.as_strided((), (), off).fill_(value)  # the element d[idx] set as d[idx] = value would
                    return dst
                except RuntimeError:  # a value out of an integer dtype's range: the checks below raise
                    pass
    if not isinstance(dst, (Tile, GMTensor)):  # before anything reads dst.data or dst.dtype
        got = f"{type(dst).__name__} {dst!r}" if isinstance(dst, (int, float, str)) else type(dst).__name__
        raise DslError(f"pl.write: expected a GM tensor or a tile to write into, got {got}{_where()}")
    if not isinstance(idx, (list, tuple)):
        idx = [idx]
    idx = [_idx(i, "an index") for i in idx]
    undefined = isinstance(value, ScalarValue) and not value.defined
    oid = value.oid if undefined else 0
    # a program-cache symbol (parametric recording, runtime/symbolic.py) is stored as itself: the
    # torch store records its expression; its fractional check is guarded by the outcome
    v = value.value if isinstance(value, ScalarValue) and not value.symbolic else value
    if ((isinstance(v, float) or isinstance(v, ScalarValue) and type(v.v) is float)
            and not dst.data.dtype.is_floating_point and not v.is_integer()):
        what = f"integer tile ({dst.dtype})" if isinstance(dst, Tile) else f"integer tensor {dst.name} ({dst.dtype})"
        raise DslError(f"pl.write: fractional value {v} into {what}; cast it first{_where()}")
    if isinstance(dst, Tile):
        idx = _tile_element("write", dst, idx)
        v = _int_in_range(dst, v, undefined)
        if isinstance(value, _go.MetaScalar) or dst.data.is_meta:  # graph-only mode: the tile becomes unknown
            dst.data = _go.meta(dst.data.shape, dst.data.dtype)
            return dst
        if aliases_readonly(dst.data):
            dst.data = dst.data.clone()
        if type(v) is float and dst.data.dtype.is_floating_point:
            # rounded to the dtype as a GM write and pl.write_values round it (past FP32's range:
            # inf); torch's own float -> FP32 element assignment raises on overflow instead
            v = torch.tensor(v, dtype=dst.data.dtype)
        dst.data[idx] = v
        if dst.mask is not None or undefined:
            dst.own_mask()[tuple(idx)] = oid
        return dst
    _check_element_index("write", dst, idx)
    v = _int_in_range(dst, v, undefined)
    if isinstance(value, _go.MetaScalar):  # graph-only mode: an unknown element
        t = Tile(_go.meta([1] * len(idx), dst.data.dtype))
    else:
        t = Tile(torch.tensor(v, dtype=dst.data.dtype).reshape([1] * len(idx)),
                 None if not undefined else torch.full([1] * len(idx), oid, dtype=torch.int32))
    _store(dst, idx, t, None)
    return dst


def write_values(dst, idx, values):
    """``values[k]`` into ``dst[*idx[:-1], idx[-1] + k]`` for every ``k``, in one call; returns ``dst``.

    ``pl.write_values(y, [i, j], vals)`` is ``for k, v in enumerate(vals): pl.write(y, [i, j + k], v)``:
    the same elements, the same effects (a tile: the values, its definedness mask in check mode,
    no counted op; a GM tensor inside a task: one element footprint, one GM store and its bytes
    per element, the sanitizer's shadow as each write leaves it) and the same errors, raised at
    the first element that fails after the ones before it were written. Plain numbers into a
    tile or into a GM tensor of a plain run take one torch copy; anything else (undefined or
    symbolic values, graph-only tensors, check mode on GM, an argument written in place) goes
    element by element.

    Args:
        dst: tile or GM tensor of rank >= 1, any dtype.
        idx: the first element's index, one int per dim.
        values: list or tuple of numbers (Python ints / floats, or scalars read with ``pl.read``);
            ``len(values)`` consecutive elements along the last dim (``[]`` writes nothing).

    Raises:
        DslError: ``dst`` not a tile or GM tensor, ``values`` not a list or tuple, an empty
            ``idx``, and what ``pl.write`` raises for an element (a GM write outside a task, an
            index out of bounds, a fractional value into an integer dtype, a number outside an
            integer dtype's range).
    """
    if not isinstance(dst, (Tile, GMTensor)):
        raise DslError(f"pl.write_values: expected a GM tensor or a tile to write into, got {type(dst).__name__}"
                       f"{_where()}")
    if type(values) not in (list, tuple):
        raise DslError(f"pl.write_values: values must be a list or tuple of numbers, got {type(values).__name__}"
                       f"{_where()}")
    if not isinstance(idx, (list, tuple)):
        idx = [idx]
    if not idx:
        raise DslError(f"pl.write_values: an empty index; give the first element's index, one int per dim"
                       f"{_where()}")
    n = len(values)
    if n == 0:
        return dst
    head, j0 = list(idx[:-1]), idx[-1]
    d = dst.data
    if (not d.is_meta and len(idx) == d.dim() and type(j0) is int and 0 <= j0 and j0 + n <= d.shape[-1]
            and all(type(i) is int and 0 <= i < s for i, s in zip(head, d.shape)) and _plain_values(values, d.dtype)):
        if type(dst) is Tile and dst.mask is None:
            if d._base is not None and aliases_readonly(d):
                d = dst.data = d.clone()
            # the view d[head, j0:j0 + n] set as n element writes would
            d.as_strided((n,), (d.stride()[-1],), _offset(d, idx)).copy_(_host_values(values, d.dtype))
            return dst
        elif type(dst) is GMTensor:
            buf = dst.buf
            blk = _ctx.state.block
            if (blk is not None and not buf.slow and not buf.readonly and buf.go is None and buf.shadow is None
                    and buf.undo is None):
                off = buf.base_off + dst._off
                for i, st in zip(idx, dst._strides):
                    off += i * st
                d.as_strided((n,), (dst._strides[-1],), off).copy_(_host_values(values, d.dtype))
                blk.fp.extend(_element_boxes(dst, idx, n, W))  # one element box per write, as _store's
                blk.bytes += n * dst._itemsize
                blk.st += n
                return dst
    for k, v in enumerate(values):  # the general path: element by element
        write(dst, [*head, j0 + k], v)
    return dst


def arange_runs(shape, dtype, fill, runs) -> Tile:
    """A ``[1, N]`` integer tile of ``fill`` with runs of consecutive integers: for each ``(col,
    start, n)`` of ``runs``, columns ``col .. col + n - 1`` hold ``start .. start + n - 1`` (a later
    run overwrites an earlier one where they overlap).

    ``pl.arange_runs([1, N], dt, fill, runs)`` is ``t = pl.full([1, N], dt, fill)`` then ``t =
    pl.assemble(t, pl.arange(start, [1, n], dt), [0, col])`` per run: the same tile, counted as
    those tile ops (``1 + len(runs)``; the tile assembles count none), in one torch call when
    every number fits ``dt``. For index rows made of page segments (a sliding-window row
    through a block table).

    Args:
        shape: ``[1, N]`` or ``[N]``, ints (any other shape is the composition above: the runs
            in its first row).
        dtype: an integer dtype.
        fill: int, the value outside the runs.
        runs: list or tuple of ``(col, start, n)`` int triples, ``n >= 0``.

    Raises:
        DslError: what ``pl.full``, ``pl.arange`` and ``pl.assemble`` raise for the same tile
            (a non-integer dtype with a run, a fill outside the dtype's range or fractional, a
            negative run length, a run reaching outside the tile); ``runs`` not a list of triples.
    """
    if type(runs) not in (list, tuple):
        raise DslError(f"pl.arange_runs: runs must be a list of (col, start, n) triples, got {runs!r}{_where()}")
    dt = as_dtype(dtype)
    r = _INT_RANGE.get(dt.torch)
    if (r is not None and type(shape) in (list, tuple) and len(shape) in (1, 2) and all(type(x) is int for x in shape)
            and (len(shape) == 1 or shape[0] == 1) and shape[-1] >= 0 and type(fill) is int and r[0] <= fill <= r[1]):
        width = shape[-1]
        vals = [fill] * width
        for run in runs:
            if type(run) is not tuple or len(run) != 3:
                break
            col, start, n = run
            if not (type(col) is int and type(start) is int and type(n) is int and 0 <= n and 0 <= col
                    and col + n <= width and r[0] <= start and start + n - 1 <= r[1]):
                break  # the general path below says what is wrong (or wraps as pl.arange does)
            vals[col:col + n] = range(start, start + n)
        else:
            data = _host_values(vals if len(shape) == 1 else [vals], dt.torch).clone()  # a tile of its own
            blk = _ctx.state.block
            if blk is not None:  # one pl.full and one pl.arange per run (tile_ops._count, no kind)
                blk.ops += 1 + len(runs)
            return Tile(data)
    if any(type(run) not in (list, tuple) or len(run) != 3 for run in runs):
        raise DslError(f"pl.arange_runs: runs must be a list of (col, start, n) triples, got {runs!r}{_where()}")
    t = _tile_ops.full(shape, dtype, fill)
    lead = [0] * (len(t.shape) - 1)  # the general path: the ops it stands for
    for col, start, n in runs:
        t = tile_assemble(t, _tile_ops.arange(start, [1] * len(lead) + [n], dtype), [*lead, col])
    return t


def _host_values(values: list, dtype: torch.dtype) -> torch.Tensor:
    """The plain numbers ``values`` (a list, or a list of one list) as a CPU tensor over a numpy
    array, to be copied from (about 4x cheaper than ``torch.tensor`` of a Python list): in
    ``dtype`` itself for an integer dtype (the values are in its range), FP64 for a float dtype
    (exact for floats and ints up to 2**53; the copy into ``dtype`` rounds as ``pl.write``
    does). The tensor is made outside torch's function modes (a program-cache recording keeps
    it as a constant, right for values that are not read from data): copy from it, or clone it
    before it is handed out."""
    return torch.from_numpy(_np.array(values, dtype=_NP_DTYPE.get(dtype, _np.float64)))


def _plain_values(values, dtype: torch.dtype) -> bool:
    """Whether every value is a plain number that :func:`write` stores into a ``dtype`` element
    without an error or a conversion of its own: ints in range for an integer dtype, ints of at
    most 2**53 in magnitude (exact in FP64) or floats for a float dtype; False for BOOL."""
    types = set(map(type, values))
    r = _INT_RANGE.get(dtype)
    if r is not None:
        return types == _INT_ONLY and r[0] <= builtins.min(values) and builtins.max(values) <= r[1]
    if not dtype.is_floating_point or not types <= _NUMBER_TYPES:
        return False
    return types == _FLOAT_ONLY or all(-_EXACT_INT <= v <= _EXACT_INT for v in values if type(v) is int)


_NUMBER_TYPES, _FLOAT_ONLY, _EXACT_INT = {int, float}, {float}, 1 << 53
_NP_DTYPE = {torch.int8: _np.int8, torch.int16: _np.int16, torch.int32: _np.int32, torch.int64: _np.int64,
             torch.uint8: _np.uint8, torch.uint32: _np.uint32}


def _int_in_range(dst, v, undefined: bool):
    """``v`` for :func:`write` into the integer tile or tensor ``dst``: a plain number outside the
    dtype's range is a DslError (as ``pl.full`` says it), or 0 when it is an undefined value's
    (check mode: the element is marked undefined, any number in range stands for it)."""
    if not _int_fits(v, dst.data.dtype):
        if undefined:
            return 0
        _int_range_error("pl.write", v, dst.data.dtype, _where())
    return v


def reshape(x, shape):
    """Reinterpret dims (same element count, row-major): a GM view or a tile.

    Raises:
        DslError: element counts differ, or the GM view is not contiguous.
    """
    if isinstance(x, Tile):
        return tile_reshape(x, shape)
    if not isinstance(x, GMTensor):
        raise DslError(f"pl.reshape: expected a tensor or tile, got {type(x).__name__}")
    shape = [_idx(s, "a reshape dim") for s in shape]
    if math.prod(shape) != x.data.numel():
        raise DslError(f"pl.reshape: cannot reshape {x.name} {list(x.shape)} to {shape}")
    try:
        v = x.data.view(shape)
    except RuntimeError:
        raise DslError(f"pl.reshape: {x.name} view {list(x.shape)} is not contiguous; cannot reshape to {shape}") from None
    facts = None
    if x._strides == _row_major(x._shape) and 0 not in x._shape and all(type(s) is int for s in shape):
        # a view of a row-major view keeps its storage offset and is row-major: its facts
        # without reading them back (the same values as GMTensor.__init__ reads)
        facts = (x.buf.base_off + x._off, _row_major(shape), tuple(shape), x._itemsize)
    return GMTensor(v, x.buf, x.name, facts)


def _row_major(shape) -> tuple:
    """The strides (in elements) of a row-major tensor of ``shape``: what ``view`` gives a
    view of a row-major tensor (a unit dim's stride is the next dim's stride times its extent)."""
    n = len(shape)
    if n == 2:
        return (shape[1], 1)
    if n == 1:
        return (1,)
    st = [1] * n
    for i in range(n - 2, -1, -1):
        st[i] = st[i + 1] * shape[i + 1]
    return tuple(st)


def dim(t, axis: int) -> int:
    """Runtime extent of dim ``axis`` of a GM tensor or tile (an int; negative axes count from the end).

    Raises:
        DslError: not a tensor or tile, or an axis outside its rank.
    """
    if not isinstance(t, (GMTensor, Tile)):
        raise DslError(f"pl.tensor.dim: expected a tensor or tile, got {type(t).__name__}")
    rank = t.data.dim()
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise DslError(f"pl.tensor.dim: axis {axis!r} out of range for {getattr(t, 'name', 'tile')} of rank {rank} "
                       f"{list(t.shape)}{_where()}")
    return int(t.data.shape[axis])


def _scalar_pair(op: str, a, b) -> None:
    """DslError unless ``a`` and ``b`` are scalars (pl.max / pl.min are not tile ops)."""
    for v in (a, b):
        if not isinstance(v, (int, float, ScalarValue)):
            kind = "a tile" if isinstance(v, Tile) else "a GM tensor" if isinstance(v, GMTensor) else type(v).__name__
            raise DslError(f"pl.{op}: takes two scalars, got {kind}; for tiles use pl.{op}imum (elementwise) "
                           f"or pl.row_{op} (a row reduction){_where()}")


def _extreme(op: str, a, b, pick):
    """``pick(a, b)`` of two scalars (ScalarValue definedness propagates)."""
    if type(a) is not int or type(b) is not int:
        _scalar_pair(op, a, b)
    if isinstance(a, ScalarValue) or isinstance(b, ScalarValue):
        a_ = a if isinstance(a, ScalarValue) else ScalarValue(a, True)
        return a_._bin(b, pick)
    return pick(a, b)


def max(a, b):  # noqa: A001 - DSL name
    """Scalar maximum of two scalars (not a reduction).

    Raises:
        DslError: an operand that is not a scalar (a tile: use ``pl.maximum`` / ``pl.row_max``).
    """
    return _extreme("max", a, b, lambda x, y: x if x >= y else y)


def min(a, b):  # noqa: A001 - DSL name
    """Scalar minimum of two scalars (not a reduction).

    Raises:
        DslError: an operand that is not a scalar (a tile: use ``pl.minimum`` / ``pl.row_min``).
    """
    return _extreme("min", a, b, lambda x, y: x if x <= y else y)


def store_rows(dst, rows, src, col=0, src_rows=None):
    """Tile rows into rows ``rows`` of the rank-2 GM tensor ``dst`` (inside a task), in one call;
    returns ``dst``.

    ``pl.store_rows(y, rows, t, c, src_rows)`` is ``for k, r in enumerate(rows): pl.assemble(y,
    pl.slice(t, [1, w], [src_rows[k], 0]), [r, c])`` with ``w = t.shape[1]`` (``src_rows``
    defaults to ``0 .. len(rows) - 1``); with a list of ``[1, w]`` tiles as ``src`` it is
    ``pl.assemble(y, src[k], [rows[k], c])`` (``src_rows`` then not given). The same effects in
    the same order: per row one write footprint box, one GM store and its bytes (the simulator's
    per-store latency), a repeated row keeps the later one, and the same errors, raised at the
    first row that fails after the ones before it were stored. In-bounds int rows and plain
    all-defined tiles into a plain tensor take one torch row copy; anything else (check mode,
    graph-only, a repeated row, symbolic values) goes row by row. For scatters of rows through an
    index map (state rows by slot, cache rows by destination) built in Python.

    Args:
        dst: rank-2 GM tensor (a view whose rows are root rows takes the one-copy path).
        rows: list or tuple of destination row indices (ints, or scalars read with ``pl.read``).
        src: a rank-2 tile, or a list or tuple of ``[1, w]`` tiles (one per row).
        col: the first destination column (int).
        src_rows: with a tile ``src``: the tile row stored at each ``rows[k]``, ``len(rows)``
            entries (default ``0 .. len(rows) - 1``).

    Raises:
        DslError: ``rows`` / ``src_rows`` not a list or tuple or of different lengths, ``src_rows``
            with a list ``src``, and what ``pl.slice`` and ``pl.assemble`` raise for a row (a store
            outside a task, a window out of bounds, dtypes that differ).
    """
    if type(rows) not in (list, tuple):
        raise DslError(f"pl.store_rows: rows must be a list or tuple of row indices, got {type(rows).__name__}"
                       f"{_where()}")
    listed = type(src) in (list, tuple)
    if listed:
        if src_rows is not None:
            raise DslError(f"pl.store_rows: src_rows goes with a tile source, got a list of tiles{_where()}")
        if len(src) != len(rows):
            raise DslError(f"pl.store_rows: {len(src)} source tiles for {len(rows)} rows{_where()}")
    elif src_rows is None:
        src_rows = range(len(rows))
    elif type(src_rows) not in (list, tuple) or len(src_rows) != len(rows):
        raise DslError(f"pl.store_rows: src_rows must be a list or tuple of {len(rows)} tile rows, got {src_rows!r}"
                       f"{_where()}")
    if not listed and not isinstance(src, Tile):
        raise DslError(f"pl.store_rows: src must be a tile or a list of tiles, got {type(src).__name__}{_where()}")
    n = len(rows)
    if n == 0:
        return dst
    if type(dst) is GMTensor and dst._rows is not None and len(dst._shape) == 2 and type(col) is int:
        buf = dst.buf
        blk = buf.program.cur_block
        d = dst.data
        data = None
        if listed:
            t0 = src[0]
            if all(type(t) is Tile and t.mask is None and t.valid is None for t in src):
                parts = [t.data for t in src]
                w = t0.data.shape[-1] if t0.data.dim() == 2 else -1
                if all(p.dim() == 2 and p.shape[0] == 1 and p.shape[1] == w and p.dtype == d.dtype and not p.is_meta
                       for p in parts):
                    data = torch.cat(parts)
        elif (type(src) is Tile and src.mask is None and src.data.dim() == 2 and src.data.dtype == d.dtype
              and not src.data.is_meta):
            w = src.data.shape[1]
            m = src.data.shape[0]
            if set(map(type, src_rows)) == _INT_ONLY and 0 <= builtins.min(src_rows) and builtins.max(src_rows) < m:
                data = src.data if list(src_rows) == list(range(m)) else src.data.index_select(
                    0, torch.tensor(list(src_rows), dtype=torch.int64))
        shape = dst._shape
        br, bc, q = dst._rows
        if (data is not None and blk is not None and not buf.slow and not buf.readonly and buf.go is None
                and buf.shadow is None and not d.is_meta and set(map(type, rows)) == _INT_ONLY
                and 0 <= builtins.min(rows) and builtins.max(rows) < shape[0] and 0 <= col and 0 < w
                and col + w <= shape[1] and bc + col + w <= buf.C and len(set(rows)) == n):
            # fast path: distinct in-bounds rows of a view whose rows are root rows, a plain
            # buffer: the rows in one index copy, a box, a store and its bytes per row, as the
            # one-row stores (_store_rows) record them
            st0, st1 = dst._strides
            off = buf.base_off + dst._off + col * st1
            if buf.undo is not None:  # an argument written in place: keep what the stores overwrite,
                k = 0  # one window per run of consecutive rows (the same elements as a save per row)
                while k < n and buf.undo is not None:
                    j = k + 1
                    while j < n and rows[j] == rows[k] + (j - k):
                        j += 1
                    buf.save_window((j - k, w), dst._strides, off + rows[k] * st0)
                    k = j
            d.as_strided((shape[0], w), (st0, st1), off).index_copy_(0, torch.tensor(rows, dtype=torch.int64), data)
            c0, c1 = bc + col, bc + col + w
            blk.fp.extend([(buf, (br + r * q, br + r * q + 1, c0, c1), W) for r in rows])
            blk.bytes += n * w * dst._itemsize
            blk.st += n
            return dst
    for k, r in enumerate(rows):  # the general path: row by row
        if listed:
            assemble(dst, src[k], [r, col])
        else:
            assemble(dst, slice(src, [1, src.shape[-1]], [src_rows[k], 0]), [r, col])
    return dst


def arange_rows(shape, dtype, fill, rows) -> list:
    """``[pl.arange_runs(shape, dtype, fill, runs) for runs in rows]`` in one call: a list of
    ``len(rows)`` ``[1, N]`` integer tiles, row ``m`` the fill with the runs ``rows[m]``.

    The same tiles, counted as those tile ops (``1 + len(rows[m])`` per row: one ``pl.full`` and
    one ``pl.arange`` per run, no kind), the same errors (raised at the first row that fails
    after the ones before it were built). When every row takes :func:`arange_runs`' one-call path
    the rows are built in one numpy array and one torch tensor, each tile a row view of it
    (disjoint rows: a write into one tile is not seen by another). For the index rows of many
    tokens at once (sliding-window rows through a block table), to be stored with
    :func:`store_rows`.

    Args:
        shape: ``[1, N]``, ints (any other shape is the composition above).
        dtype: an integer dtype.
        fill: int, the value outside the runs.
        rows: list or tuple of run lists, each as :func:`arange_runs`' ``runs`` (``(col, start, n)``
            int triples).

    Raises:
        DslError: ``rows`` not a list or tuple, and what :func:`arange_runs` raises for a row.
    """
    if type(rows) not in (list, tuple):
        raise DslError(f"pl.arange_rows: rows must be a list of run lists, got {type(rows).__name__}{_where()}")
    if not rows:
        return []
    dt = as_dtype(dtype)
    r = _INT_RANGE.get(dt.torch)
    if (r is not None and type(shape) in (list, tuple) and len(shape) == 2 and type(shape[0]) is int
            and shape[0] == 1 and type(shape[1]) is int and shape[1] >= 0 and type(fill) is int
            and r[0] <= fill <= r[1] and dt.torch in _NP_DTYPE):
        width = shape[1]
        lo, hi = r
        arr = _np.full((len(rows), width), fill, dtype=_NP_DTYPE[dt.torch])
        n_ops = 0
        ok = True
        for m, runs in enumerate(rows):
            if type(runs) not in (list, tuple):
                ok = False
                break
            n_ops += 1 + len(runs)
            for run in runs:  # arange_runs' checks of its one-call path
                if type(run) is not tuple or len(run) != 3:
                    ok = False
                    break
                col, start, n = run
                if not (type(col) is int and type(start) is int and type(n) is int and 0 <= n and 0 <= col
                        and col + n <= width and lo <= start and start + n - 1 <= hi):
                    ok = False
                    break
                if n:
                    arr[m, col:col + n] = _np.arange(start, start + n)
            if not ok:
                break
        if ok:
            data = torch.from_numpy(arr).clone()  # a tensor of its own (not the recording's constant)
            blk = _ctx.state.block
            if blk is not None:  # per row one pl.full and one pl.arange per run (tile_ops._count, no kind)
                blk.ops += n_ops
            return [Tile(row) for row in data.split(1)]
    return [arange_runs(shape, dtype, fill, runs) for runs in rows]  # the general path: row by row


def read_elements(src, idxs) -> list:
    """``[pl.read(src, i) for i in idxs]`` in one call: the elements of a GM tensor at the indices
    ``idxs`` (each a list or tuple of ints, one per dim; repeats allowed), as a Python list.

    The same numbers and effects in the same order: inside a task one element footprint, one GM
    load and its bytes per index, in orchestration one orchestration read per index; graph-only
    tensors, symbolic indices, views without a box fast path and, in check mode, a buffer not
    known all defined (its shadow) go index by index through ``pl.read`` (its errors, raised at
    the first index that fails; an undefined element comes back as an undefined scalar).
    In-bounds int indices of a plain rank-1 or rank-2 view take one indexed gather of the view,
    in check mode too when the buffer is all defined (as ``pl.read``'s own fast path). For the table
    entries a kernel reads at data-dependent places (a block table per token).

    Raises:
        DslError: ``idxs`` not a list or tuple, and what ``pl.read`` raises for an index.
    """
    if type(idxs) not in (list, tuple):
        raise DslError(f"pl.read_elements: idxs must be a list or tuple of indices, got {type(idxs).__name__}"
                       f"{_where()}")
    n = len(idxs)
    if n == 0:
        return []
    if type(src) is GMTensor:
        buf = src.buf
        d = src.data
        shape = src._shape
        rank = len(shape)
        if (not buf.slow and buf.go is None and (buf.shadow is None or buf.id in buf.program.sanitizer.clean)
                and not d.is_meta and rank in (1, 2)
                and all(type(i) in (list, tuple) and len(i) == rank for i in idxs)):
            cols = [i[-1] for i in idxs]
            boxes = None
            if rank == 1 and src._fast is not None and len(src._fast) == 2:
                if set(map(type, cols)) == _INT_ONLY and 0 <= builtins.min(cols) and builtins.max(cols) < shape[0]:
                    br, bc = src._fast
                    if bc + builtins.max(cols) < buf.C:
                        boxes = [(buf, (br, br + 1, bc + c, bc + c + 1), R) for c in cols]
                        sel = torch.tensor(cols, dtype=torch.int64)
                        values = d.as_strided((shape[0],), src._strides, buf.base_off + src._off).index_select(
                            0, sel).tolist()
            elif rank == 2 and src._rows is not None:
                rws = [i[0] for i in idxs]
                if (set(map(type, cols)) == _INT_ONLY and set(map(type, rws)) == _INT_ONLY
                        and 0 <= builtins.min(cols) and builtins.max(cols) < shape[1]
                        and 0 <= builtins.min(rws) and builtins.max(rws) < shape[0]):
                    br, bc, q = src._rows
                    if bc + builtins.max(cols) < buf.C:
                        boxes = [(buf, (br + r * q, br + r * q + 1, bc + c, bc + c + 1), R) for r, c in zip(rws, cols)]
                        st0, st1 = src._strides
                        flat = torch.tensor([r * st0 + c * st1 for r, c in zip(rws, cols)], dtype=torch.int64)
                        span = (shape[0] - 1) * st0 + (shape[1] - 1) * st1 + 1  # the view's elements, flat
                        values = d.as_strided((span,), (1,), buf.base_off + src._off).index_select(0, flat).tolist()
            if boxes is not None:
                blk = _ctx.state.block
                if blk is None:  # orchestration: n orchestration reads
                    for _, box, _ in boxes:
                        buf.program.orchestration_read(buf, box)
                    return values
                blk.fp.extend(boxes)
                blk.bytes += n * src._itemsize
                blk.ld += n
                return values
    return [read(src, list(i) if type(i) in (list, tuple) else i) for i in idxs]  # the general path
