"""Tiles and tile operations: the one place that defines the numerics of the DSL.

A :class:`Tile` is an on-chip value: a torch tensor (``data``), an optional
definedness mask (``mask``, check mode only; ``None`` means all defined) and an
optional valid shape (``valid``: per-dim extents of the meaningful top-left
region; elements outside it are padding).

Rules shared by every op (hw-native-sys/pypto `docs/en/user/`):

* no implicit dtype promotion and no implicit broadcast between tiles of
  different shapes (use the ``row_expand_*`` / ``col_expand_*`` family);
* a Python number (or a defined scalar) on either side selects the scalar form; the scalar
  takes the tile's dtype, so a number outside an integer tile's range is a DslError (no wrap);
* ops compute over the full physical tile, padding included;
* matmul accumulates BF16/FP16/FP32 operands in FP32 and INT8 operands in exact
  INT32;
* definedness masks propagate: elementwise AND, reductions ALL along the
  reduced axis, matmul out[i, j] = ALL(A[i, :]) AND ALL(B[:, j]), gathers move
  masks with the data (docs/dsl.md). A mask is an INT32 tensor holding,
  per element, 0 when defined or else a positive undefinedness tag that names
  the allocation the value came from and the task that first consumed it
  (pto/runtime/sanitizer.py), so that the AND is a ``maximum`` and every
  undefined element still names its origin. Ops may share a mask tensor
  between input and result; in-place updates go through ``Tile.own_mask``.

Every op raises :class:`pto.DslError` on a rank, shape or dtype it does not
accept, naming the op and the offending operand.

Graph-only mode (``RunConfig(execute=False)``, :mod:`pto.language.graph_only`): an operand
whose ``data`` is a torch ``meta`` tensor is unknown; the op checks its operands as always,
counts its tile ops and flops as a real run would, and returns an unknown tile of the result's
shape and dtype without computing (``sort32`` / ``mrgsort`` of unknown values: the ties
assumption).
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import time

import torch
from torch.nn.functional import linear as _linear

from pto.errors import ConfigError, DslError
from pto.language import _ctx
from pto.language import graph_only as _go
from pto.language.dtypes import (BF16, FP16, FP32, INT8, INT16, INT32, INT64, UINT8, UINT32, DType, as_dtype,
                                 from_torch)
from pto.language.typing import ScalarValue, as_int, concrete

_meta = _go.meta  # a shape-only tile value (graph-only mode)
_state = _ctx.state  # the per-thread DSL state (one object for the process; its attributes are per thread)
_MetaScalar = _go.MetaScalar

__all__ = [
    "Tile", "PadValue", "full", "arange", "cast", "add", "sub", "mul", "div", "maximum",
    "minimum", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "row_sum", "row_max",
    "row_min", "col_sum", "col_max", "row_expand", "row_expand_mul", "row_expand_div",
    "row_expand_sub", "row_expand_add", "col_expand", "col_expand_mul", "col_expand_add",
    "col_expand_sub", "col_expand_div", "col_expand_expdif", "gather", "transpose", "matmul",
    "matmul_acc", "set_validshape", "fillpad", "tile_reshape", "tile_slice", "tile_assemble",
    "CAST_MODES", "cmp", "select", "MaskPattern", "sort32", "mrgsort", "CMP_MODES",
]


class PadValue:
    """Pad fill modes for :func:`fillpad` and slice ``pad_value``."""

    zero = "zero"
    min = "min"
    max = "max"


def _count(flops: int = 0, kind: str | None = None) -> None:
    """Count one tile op of ``flops`` in the current block; ``kind`` (the op's name, ``"add_s"``
    for a tile-number form) is also counted in ``Block.vk`` (the simulator's per-kind latency)."""
    blk = _state.block
    if blk is not None:
        blk.ops += 1
        blk.flops += flops
        if kind is not None:
            vk = blk.vk
            if vk is None:
                blk.vk = {kind: 1}
            else:
                vk[kind] = vk.get(kind, 0) + 1


# torch dtype -> the tensor method converting to it: the same tensor as ``.to(dtype)`` (values,
# strides: both keep the memory format), at about 0.5 µs less per call (no overload parsing)
_TO = {torch.float32: torch.Tensor.float, torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half,
       torch.float64: torch.Tensor.double, torch.int64: torch.Tensor.long, torch.int32: torch.Tensor.int,
       torch.int16: torch.Tensor.short, torch.int8: torch.Tensor.char, torch.uint8: torch.Tensor.byte,
       torch.bool: torch.Tensor.bool}


def _to(x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """``x.to(dt)`` through the dtype's own conversion method where it has one (:data:`_TO`)."""
    conv = _TO.get(dt)
    return x.to(dt) if conv is None else conv(x)


class Tile:
    """An on-chip tile value.

    Args:
        data: the values, any rank (kernels use rank 1-3), any DSL dtype.
        mask: INT32 tensor of the same shape: 0 = defined, k > 0 = undefined,
            originating from allocation k; None = all defined.
        valid: per-dim extents of the valid region, or None for the full tile.

    Python operators map to the DSL ops (``a + b`` is ``pl.add(a, b)``, ``a / b`` is
    ``pl.div(a, b)``, ``-a`` is ``pl.neg``, ``abs(a)`` is ``pl.abs``), with their dtype and
    shape rules and errors. The comparisons ``< <= > >= == !=`` are ``pl.cmp`` and give a BOOL
    tile (``==`` / ``!=`` with something that is neither a tile nor a number, e.g. ``None``, is
    Python's identity test; tiles hash by identity, so dicts and sets of tiles work as before).
    A tile has no truth value: ``if t``, ``if t == 0``, ``and`` / ``or`` / ``not`` on a tile are a
    DslError (use ``pl.select`` or ``pl.read``). Operators with no DSL op are a DslError naming
    the operator, the operands and what to write instead: ``//`` (``pl.div`` truncates integer
    quotients toward zero, Python's ``//`` floors them), ``%`` and ``divmod``, ``**``, ``@``
    (``pl.matmul``) and the bitwise ``& | ^ ~ << >>``.
    """

    # _vals: see tensor_ops._tile_value; _ib: (data, data._version, bound) of an integer tile whose
    # values are known to satisfy |v| <= bound while data is that tensor at that version (set by
    # the INT8 matmuls; never set by __init__, read with getattr)
    __slots__ = ("data", "mask", "valid", "_mown", "_vals", "_ib")
    __array_priority__ = 100

    def __init__(self, data: torch.Tensor, mask: torch.Tensor | None = None, valid=None):
        self.data = data
        self.mask = mask
        self.valid = valid
        # _mown (unset: False): ops pass masks through by reference; mutate only an owned copy

    def own_mask(self) -> torch.Tensor:
        """This tile's mask as a private tensor, ready for in-place updates
        (created all-defined when absent, copied once when possibly shared)."""
        if not getattr(self, "_mown", False):
            self.mask = (torch.zeros(self.data.shape, dtype=torch.int32) if self.mask is None
                         else self.mask.clone())
            self._mown = True
        return self.mask

    @property
    def shape(self) -> tuple:
        """Physical shape of the tile (a tuple of ints)."""
        return tuple(self.data.shape)

    @property
    def dtype(self) -> DType:
        """DSL dtype of the elements."""
        return from_torch(self.data.dtype)

    @property
    def valid_shape(self) -> tuple:
        """Valid extents per dim (the full shape when no valid shape is set)."""
        return self.valid if self.valid is not None else self.shape

    def __repr__(self) -> str:
        extra = "" if self.valid is None else f", valid={list(self.valid)}"
        undef = "" if self.mask is None else f", undefined={int((self.mask != 0).sum())}"
        return f"Tile({list(self.shape)}, {self.dtype}{extra}{undef})"

    def numpy(self):
        """The values as a numpy array (a view of ``data``)."""
        return self.data.numpy()

    # operators -------------------------------------------------------------
    def __add__(self, o): return _binary("add", self, o, torch.add)  # = add(self, o), one call less
    def __radd__(self, o): return add(self, o)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return _binary("mul", self, o, torch.mul)  # = mul(self, o)
    def __rmul__(self, o): return mul(self, o)
    def __truediv__(self, o): return div(self, o)
    def __rtruediv__(self, o): return div(o, self)
    def __floordiv__(self, o): _no_floordiv(self, o)
    def __rfloordiv__(self, o): _no_floordiv(o, self)
    def __neg__(self): return neg(self)
    def __abs__(self): return abs(self)
    # comparisons are pl.cmp (a BOOL tile; `3 < t` arrives here as t > 3); == / != with anything
    # that is no tile operand (None, a string) stays Python's identity test
    def __lt__(self, o): return cmp(self, o, "lt")
    def __le__(self, o): return cmp(self, o, "le")
    def __gt__(self, o): return cmp(self, o, "gt")
    def __ge__(self, o): return cmp(self, o, "ge")
    def __eq__(self, o): return cmp(self, o, "eq") if _cmp_operand(o) else NotImplemented
    def __ne__(self, o): return cmp(self, o, "ne") if _cmp_operand(o) else NotImplemented
    __hash__ = object.__hash__  # by identity, as before (dicts and sets of tiles never call __eq__)
    def __bool__(self): _no_truth(self)
    def __mod__(self, o): _no_operator("%", self, o)
    def __rmod__(self, o): _no_operator("%", o, self)
    def __divmod__(self, o): _no_operator("divmod", self, o)
    def __rdivmod__(self, o): _no_operator("divmod", o, self)
    def __pow__(self, o, m=None): _no_operator("**", self, o)
    def __rpow__(self, o, m=None): _no_operator("**", o, self)
    def __matmul__(self, o): _no_operator("@", self, o)
    def __rmatmul__(self, o): _no_operator("@", o, self)
    def __and__(self, o): _no_operator("&", self, o)
    def __rand__(self, o): _no_operator("&", o, self)
    def __or__(self, o): _no_operator("|", self, o)
    def __ror__(self, o): _no_operator("|", o, self)
    def __xor__(self, o): _no_operator("^", self, o)
    def __rxor__(self, o): _no_operator("^", o, self)
    def __lshift__(self, o): _no_operator("<<", self, o)
    def __rlshift__(self, o): _no_operator("<<", o, self)
    def __rshift__(self, o): _no_operator(">>", self, o)
    def __rrshift__(self, o): _no_operator(">>", o, self)
    def __invert__(self): _no_operator("~", None, self)

    def __getitem__(self, key):
        """A sub-tile (slices) or element tile (ints drop their dims, torch semantics).

        Raises:
            DslError: an index or slice bound outside the tile (negative ones included),
                a strided slice, more indices than dims, or an unsupported index kind.
        """
        key = tile_key(self.data.shape, key, "tile subscript")
        self._own_before_view()
        data = self.data[key]
        if self.mask is None:
            return Tile(data, None)
        # check mode: the view's mask is a view of this tile's own mask, so a write through the
        # sub-tile defines the parent's elements too, as its data aliases the parent's
        view = Tile(data, self.own_mask()[key])
        view._mown = True
        return view

    def __len__(self) -> int:
        """Extent of dim 0 (torch semantics).

        Raises:
            DslError: a 0-dim tile (it has no dim 0).
        """
        if self.data.dim() == 0:
            raise DslError("len() of a 0-dim tile: it has no dim 0")
        return self.data.shape[0]

    def __iter__(self):
        """``for row in tile``: the sub-tiles ``tile[0]``, ``tile[1]``, .. along dim 0 (torch
        semantics: each drops dim 0), then stops.

        Raises:
            DslError: a 0-dim tile (nothing to iterate over).
        """
        for i in range(len(self)):
            yield self[i]

    def _own_before_view(self) -> None:
        """Before a sub-tile or reshape shares this tile's storage: a tile that is a no-copy
        view of an In parameter takes a private copy first, so a later write through any of
        the views is seen by all of them (tile views alias, as UB views do) and never by the
        caller's input."""
        d = self.data
        if d._base is not None and not d.is_meta:
            from pto.language.tensor_ops import aliases_readonly  # tensor_ops imports this module
            if aliases_readonly(d):
                self.data = d.clone()

    def __setitem__(self, key, value):
        key = tile_key(self.data.shape, key, "tile subscript assign")
        if self.data.is_meta or isinstance(value, _MetaScalar) or (type(value) is Tile and value.data.is_meta):
            if isinstance(value, Tile) and value.data.dtype != self.data.dtype:
                raise DslError(f"tile subscript assign: dtype {value.dtype} into {self.dtype} tile")
            self.data = _meta(self.data.shape, self.data.dtype)  # graph-only mode: the tile becomes unknown
            return
        from pto.language.tensor_ops import aliases_readonly  # tensor_ops imports this module
        if aliases_readonly(self.data):  # a no-copy load of an In parameter: copy before writing
            self.data = self.data.clone()
        if isinstance(value, ScalarValue):
            x = value.value
            if not _int_fits(x, self.data.dtype):
                if value.defined:
                    _int_range_error("tile subscript assign", x, self.data.dtype)
                x = 0  # an undefined value (check mode): the element is marked undefined below
            self.data[key] = x
            if self.mask is not None or not value.defined:
                self.own_mask()[key] = 0 if value.defined else value.oid
            return
        v = _as_tile(value, "tile subscript assign") if not isinstance(value, (int, float)) else value
        if isinstance(v, Tile):
            if v.data.dtype != self.data.dtype:
                raise DslError(f"tile subscript assign: dtype {v.dtype} into {self.dtype} tile")
            self.data[key] = v.data
            if v.mask is not None or self.mask is not None:
                self.own_mask()[key] = 0 if v.mask is None else v.mask
        else:
            if isinstance(v, float) and not self.data.dtype.is_floating_point and not v.is_integer():
                raise DslError(f"tile subscript assign: fractional value {v} into an integer tile ({self.dtype}); "
                               "cast it first")
            if not _int_fits(v, self.data.dtype):
                _int_range_error("tile subscript assign", v, self.data.dtype)
            self.data[key] = v
            if self.mask is not None:
                self.own_mask()[key] = 0


def _no_floordiv(a, b):
    """``a // b`` with a tile on either side: a DslError naming the operands and the op to use.
    Python's ``//`` floors; the DSL's division (``pl.div``, the ``/`` operator) is IEEE on float
    tiles and truncates toward zero on integer tiles, so mapping ``//`` to it would give another
    quotient for negative operands, and there is no flooring division op."""
    raise DslError(f"'//' on a tile ({a!r} // {b!r}): no DSL op floors a quotient; use pl.div (the '/' "
                   "operator: IEEE division on float tiles, truncation toward zero on integer tiles), "
                   "and for a floored quotient pl.cast(a / b, dtype, mode='floor') on float tiles")


def _cmp_operand(o) -> bool:
    """``o`` can be the right side of ``pl.cmp`` (a tile, a tensor, a number, a scalar):
    ``tile == o`` is then an elementwise comparison, otherwise Python's identity test."""
    return isinstance(o, (Tile, torch.Tensor, int, float, ScalarValue))


# operator -> what to write instead (the DSL has no op for these operators)
_NO_OP_HINTS = {
    "%": "no DSL op computes a remainder; on integer tiles a - (a / b) * b is the remainder with the "
         "sign of a (C's %; Python's % floors), on float tiles a - b * pl.cast(pl.cast(a / b, pl.INT32, "
         "mode='trunc'), a.dtype)",
    "divmod": "no DSL op computes a remainder; the quotient is a / b (pl.div), the remainder "
              "a - (a / b) * b on integer tiles",
    "**": "no DSL op raises to a power; use pl.mul(x, x) for a square, pl.sqrt / pl.rsqrt / pl.recip for "
          "** 0.5 / ** -0.5 / ** -1, pl.exp(pl.log(x) * p) for positive x",
    "@": "use pl.matmul(a, b, out_dtype=...) (BF16/FP16/FP32 accumulate in FP32, INT8 x INT8 -> INT32)",
}
_BITWISE_HINT = ("the DSL has no bitwise tile ops; on BOOL masks (pl.cmp) a & b is pl.select(a, b, False), "
                 "a | b is pl.select(a, a, b), ~a is pl.cmp(a, False, 'eq')")


def _no_operator(sym: str, a, b):
    """A Python operator ``sym`` with a tile operand that no DSL op implements: a DslError naming
    the operator, the operands (shape and dtype of a tile) and what to write instead. Inside a
    block the runtime adds the kernel, task, block and kernel-source ``file:line``."""
    shown = (f"{sym}{b!r}" if a is None else f"{sym}({a!r}, {b!r})" if sym == "divmod"
             else f"{a!r} {sym} {b!r}")
    raise DslError(f"'{sym}' on a tile ({shown}): {_NO_OP_HINTS.get(sym, _BITWISE_HINT)}")


def _no_truth(t):
    """``bool(tile)``: a DslError (a tile holds many values; an ``if`` on one is a classic bug)."""
    raise DslError(f"the truth value of a tile ({t!r}) is undefined: a tile holds many values (a tile, or "
                   "a tile comparison such as t == 0 or t < x, used in an if / while / and / or / not / "
                   "assert); use pl.select(mask, a, b) for an elementwise choice, or pl.read(t, [i, j]) "
                   "for one element as a Python number")


def tile_key(shape, key, op: str) -> tuple:
    """Check a tile subscript ``key`` against the tile ``shape`` and return it as a tuple of
    ints and unit-step slices with explicit bounds (an ``...`` expands to full slices).

    Tile subscripts follow the GM subscript rules: every index and slice bound must lie inside
    the tile (no negative indices, no clamping of a slice past the end), steps other than 1
    are not supported.

    Raises:
        DslError: naming ``op``, the dim, the bound and the tile shape.
    """
    if type(key) is not tuple:
        key = (key,)
    if len(key) <= len(shape):
        # fast path: in-bounds ints and unit-step slices with int or omitted bounds (the same key
        # as the general loop below, which handles everything else and raises the errors)
        out = []
        for k, n in zip(key, shape):
            tk = type(k)
            if tk is int:
                if 0 <= k < n:
                    out.append(k)
                    continue
            elif tk is slice and k.step is None:
                a, b = k.start, k.stop
                if a is None:
                    a = 0
                if b is None:
                    b = n
                if type(a) is int and type(b) is int and 0 <= a <= b <= n:
                    out.append(slice(a, b))
                    continue
            break
        else:
            return tuple(out)
    if any(k is Ellipsis for k in key):
        at = [i for i, k in enumerate(key) if k is Ellipsis]
        if len(at) > 1:
            raise DslError(f"{op}: more than one '...' in the index")
        i = at[0]
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise DslError(f"{op}: {len(key)} indices for a rank-{len(shape)} tile {list(shape)}")
    out = []
    for d, k in enumerate(key):
        n = shape[d]
        if type(k) is slice:
            if k.step is not None and _index(k.step, op, d, "a slice step") != 1:
                raise DslError(f"{op}: strided slices are not supported (dim {d} of tile {list(shape)})")
            a = 0 if k.start is None else _index(k.start, op, d, "a slice start")
            b = n if k.stop is None else _index(k.stop, op, d, "a slice stop")
            if not 0 <= a <= b <= n:
                raise DslError(f"{op}: window [{a}, {b}) out of bounds of dim {d} (extent {n}) "
                               f"of tile {list(shape)}")
            out.append(slice(a, b))
        else:
            i = _index(k, op, d, "an index")
            if not 0 <= i < n:
                raise DslError(f"{op}: index {i} out of bounds of dim {d} (extent {n}) of tile {list(shape)}")
            out.append(i)
    return tuple(out)


def _index(v, op: str, d: int, what: str) -> int:
    """An int index or bound (anything with ``__index__``: a defined ScalarValue, a numpy or 0-dim
    torch integer); DslError for a float, a bool or anything else."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise DslError(f"{op}: {what} of dim {d} must be an int, got {v!r}")


def _as_tile(x, op: str) -> Tile:
    if isinstance(x, Tile):
        return x
    if isinstance(x, torch.Tensor):
        from_torch(x.dtype)  # DslError for a dtype with no pto dtype (float64)
        return Tile(x)
    if hasattr(x, "buf") and hasattr(x, "name"):  # a GMTensor (tensor_ops imports this module)
        blk = _state.block
        hint = ("load a tile from it first (" if blk is not None else
                "tile math runs inside a task (pl.at / pl.spmd) on tiles loaded there (")
        raise DslError(f"{op}: expected a tile, got GM tensor {x.name!r} {list(x.shape)}; {hint}"
                       f"{x.name}[a:b, c:d] or pl.slice)")
    raise DslError(f"{op}: expected a tile, got {type(x).__name__}")


def _and(a, b):
    """Combine two definedness masks (None = all defined)."""
    if a is None:
        return b
    if b is None:
        return a
    return torch.maximum(a, b)


# (min, max) of every integer torch dtype (float and BOOL tiles are not range-checked)
_INT_RANGE = {d.torch: (d.min, d.max) for d in (INT8, INT16, INT32, INT64, UINT8, UINT32)}


_SCALAR_HINT = " (no implicit promotion: a scalar takes the tile's dtype; cast the tile to a wider dtype first)"


def _int_fits(v, tdtype: torch.dtype) -> bool:
    """False when ``v`` is a Python int or float outside the range of the integer torch dtype
    ``tdtype``; True otherwise (any value with a float or BOOL dtype, a bool, a symbol)."""
    if type(v) is not int and type(v) is not float:
        return True
    r = _INT_RANGE.get(tdtype)
    return r is None or r[0] <= v <= r[1]


def _int_range_error(op: str, v, tdtype: torch.dtype, hint: str = ""):
    """Raise the DslError for the Python number ``v`` outside the range of the integer torch
    dtype ``tdtype``, naming ``op``, the value and the range, then ``hint``."""
    r = _INT_RANGE[tdtype]
    raise DslError(f"{op}: value {v} out of range of {from_torch(tdtype)} [{r[0]}, {r[1]}]{hint}")


def _scalar(x, op: str):
    """(value, undefined-origin id or 0) for a scalar operand."""
    if isinstance(x, ScalarValue):
        return x.value, 0 if x.defined else x.oid
    if isinstance(x, (int, float, bool)):
        return x, 0
    raise DslError(f"{op}: expected a tile or a number, got {type(x).__name__}")


def _binary(op: str, a, b, fn):
    if type(a) is Tile and type(b) is Tile:  # fast path: two tiles of one dtype and shape
        ad, bd = a.data, b.data
        dt = ad.dtype
        if bd.dtype is dt and ad.shape == bd.shape:  # torch dtypes are singletons
            out = _meta(ad.shape, dt) if ad.is_meta or bd.is_meta else fn(ad, bd)  # meta: graph-only mode
            if out.dtype is not dt:
                out = _to(out, dt)
            blk = _state.block
            if blk is not None:  # _count(out.numel(), op), inlined
                blk.ops += 1
                blk.flops += out.numel()
                vk = blk.vk
                if vk is None:
                    blk.vk = {op: 1}
                else:
                    vk[op] = vk.get(op, 0) + 1
            am, bm = a.mask, b.mask
            return Tile(out, bm if am is None else am if bm is None else torch.maximum(am, bm), a.valid)
    elif type(a) is Tile and (type(b) is int or type(b) is float):
        ad = a.data  # fast path: a tile and a plain int (or a float with a float tile)
        dt = ad.dtype
        if (type(b) is int or dt.is_floating_point) and not ad.is_meta:
            # an int not in every integer dtype's range (0 .. 127) is checked against this tile's
            if type(b) is int and not 0 <= b <= 127 and not _int_fits(b, dt):
                _int_range_error(f"pl.{op}", b, dt, _SCALAR_HINT)
            out = fn(ad, _fp32_number(b) if dt is torch.float32 and fn in _FP32_SCALAR_FNS else b)
            if out.dtype is not dt:
                out = _to(out, dt)
            blk = _state.block
            if blk is not None:  # _count(out.numel(), op + "_s"), inlined
                blk.ops += 1
                blk.flops += out.numel()
                kind = _SCALAR_KIND.get(op) or op + "_s"
                vk = blk.vk
                if vk is None:
                    blk.vk = {kind: 1}
                else:
                    vk[kind] = vk.get(kind, 0) + 1
            return Tile(out, a.mask, a.valid)
    if not isinstance(a, Tile):
        if isinstance(b, Tile):
            a, b = b, a
        else:
            a = _as_tile(a, op)
    if isinstance(b, torch.Tensor):
        b = _as_tile(b, op)
    if isinstance(b, Tile):
        if a.data.dtype != b.data.dtype:
            raise DslError(f"pl.{op}: dtype mismatch {a.dtype} vs {b.dtype} (no implicit promotion; use pl.cast)")
        if a.data.shape != b.data.shape:
            raise DslError(f"pl.{op}: shape mismatch {list(a.shape)} vs {list(b.shape)} "
                           "(no implicit broadcast; use the row_expand_/col_expand_ ops)")
        out = _meta(a.data.shape, a.data.dtype) if a.data.is_meta or b.data.is_meta else fn(a.data, b.data)
        mask = _and(a.mask, b.mask)
    else:
        v, oid = _scalar(b, f"pl.{op}")
        if isinstance(v, float) and not a.data.dtype.is_floating_point:
            if not v.is_integer():
                raise DslError(f"pl.{op}: fractional scalar {v} with a {a.dtype} tile (no implicit promotion; "
                               "cast the tile to a float dtype first)")
            v = int(v)
        if not oid and not _int_fits(v, a.data.dtype):
            _int_range_error(f"pl.{op}", v, a.data.dtype, _SCALAR_HINT)  # (an undefined scalar's elements come out undefined)
        # graph-only mode: an unknown tile or scalar gives an unknown (meta) result
        out = _meta(a.data.shape, a.data.dtype) if a.data.is_meta or isinstance(b, _MetaScalar) else fn(a.data, v)
        mask = a.mask if not oid else _and(a.mask, torch.full(a.data.shape, oid, dtype=torch.int32))
    if out.dtype != a.data.dtype:
        out = _to(out, a.data.dtype)
    _count(out.numel(), op if isinstance(b, Tile) else op + "_s")
    return Tile(out, mask, a.valid)


_SCALAR_KIND = {op: op + "_s" for op in ("add", "sub", "mul", "div", "maximum", "minimum")}  # Block.vk kinds

# an FP32 tensor op (add, sub, mul, div, a comparison) with a Python number operand wraps the
# number in a 0-dim tensor per call (and casts it to FP32 in the op): a kept 0-dim FP32 tensor of
# the same value gives the same result (the kernels read the FP32 value either way) at about half
# the cost. Not for 0 / -0 (the keys 0.0 and -0.0 collide), NaN (never equal to a key) or other
# dtypes (BF16 / FP16 kernels read a number at FP32 precision, a BF16 tensor would round it first)
_FP32_SCALAR_FNS = frozenset((torch.add, torch.sub, torch.mul, torch.div))
_FP32_SCALARS: dict = {}
_FP32_SCALARS_MAX = 4096


def _number_operand(d: torch.Tensor, v):
    """The number ``v`` as the second operand of a torch op on ``d``: for an FP32 ``d`` and a plain
    int or float other than 0, -0 and NaN (and ints torch takes: 64 bits), the kept 0-dim FP32
    tensor ``torch.tensor(v, dtype=torch.float32)`` (never written); otherwise ``v`` itself."""
    return v if d.dtype is not torch.float32 else _fp32_number(v)


def _fp32_number(v):
    """:func:`_number_operand` of ``v`` for an FP32 tensor operand."""
    tv = type(v)
    if not (tv is float or (tv is int and -(1 << 63) <= v < (1 << 63))) or v != v or v == 0:
        return v
    t = _FP32_SCALARS.get(v)
    if t is None:
        if len(_FP32_SCALARS) >= _FP32_SCALARS_MAX:
            _FP32_SCALARS.clear()
        t = _FP32_SCALARS[v] = torch.tensor(v, dtype=torch.float32)
    return t


def add(a, b) -> Tile:
    """Elementwise ``a + b`` (same shape and dtype, or tile and number)."""
    return _binary("add", a, b, torch.add)


def sub(a, b) -> Tile:
    """Elementwise ``a - b`` (same shape and dtype, or tile minus number)."""
    if not isinstance(a, Tile) and isinstance(b, Tile):
        if not _int_fits(a, b.data.dtype):  # number - tile: named as the sub it is
            _int_range_error("pl.sub", a, b.data.dtype, _SCALAR_HINT)
        return add(neg(b), a)
    return _binary("sub", a, b, torch.sub)


def mul(a, b) -> Tile:
    """Elementwise ``a * b`` (same shape and dtype, or tile and number)."""
    return _binary("mul", a, b, torch.mul)


def _check_int_divisor(op: str, a, b) -> None:
    """DslError naming ``op`` and the divisor when the divisor ``b`` of an integer-tile division
    (``a`` or ``b`` the tile) holds a zero: integers have no infinity."""
    tile = a if isinstance(a, Tile) else b
    if not isinstance(tile, Tile) or tile.data.dtype.is_floating_point:
        return
    d = b.data if isinstance(b, Tile) else b.value if isinstance(b, ScalarValue) else b
    if isinstance(b, _MetaScalar) or isinstance(d, torch.Tensor) and d.is_meta:
        return  # graph-only mode: an unknown divisor is not checked
    if isinstance(d, torch.Tensor):
        n = int((d == 0).sum())
        if not n:
            return
        what = (f"the divisor {b!r} holds {n} zero{'s' if n > 1 else ''}; padding takes part: fill a padded "
                "divisor first, e.g. pl.fillpad(t, pl.PadValue.max)")
    elif isinstance(d, (int, float)) and d == 0:
        what = f"the divisor is {d!r}"
    else:
        return
    raise DslError(f"pl.{op}: integer division by zero ({what})")


def div(a, b, high_precision: bool = False) -> Tile:
    """Elementwise ``a / b``: IEEE division on float tiles (x/0 is ±inf); on integer tiles the
    exact quotient truncated toward zero, for every value of every integer dtype (C's ``/``;
    ``MIN / -1`` of a signed dtype wraps to ``MIN``, two's complement as in add and mul).

    Raises:
        DslError: an integer divisor that is zero somewhere (no integer infinity), plus the
            shape and dtype rules of every elementwise op.
    """
    if type(a) is Tile and a.data.dtype.is_floating_point:  # float tile / anything: IEEE
        return _binary("div", a, b, torch.div)
    if type(b) is Tile and b.data.dtype.is_floating_point and not isinstance(a, Tile):
        return _binary("div", b, a, _rdiv)  # number / float tile: one IEEE division
    _check_int_divisor("div", a, b)
    if not isinstance(a, Tile) and isinstance(b, Tile):
        return _binary("div", b, a, lambda x, y: _tdiv(y, x))  # number / tile: one division
    return _binary("div", a, b, _tdiv)


def _rdiv(x, y) -> torch.Tensor:
    """``y / x``: the reflected IEEE division of a number ``y`` by a float tensor ``x``."""
    return torch.div(y, x)


def _tdiv(x, y) -> torch.Tensor:
    """``x / y`` of torch operands (tensors of one dtype, broadcastable, or one of them a Python
    number): IEEE division for floats; for integers the exact quotient truncated toward zero, for
    every value (not through FP32, which is inexact past 2^24). ``MIN / -1`` of a signed dtype
    wraps to ``MIN`` (two's complement, as add and mul overflow) and never traps: a number -1 is
    a negation, a tile divisor of INT32 divides in INT64 and of INT64 divides by 1 where it holds
    -1 and negates; INT8 / INT16 / UINT8 divide in C int. UINT32 divides in INT64 (torch has no
    UINT32 integer division). BOOL keeps true division (the quotient cast back to BOOL). Zero
    divisors are the caller's check."""
    t = x if isinstance(x, torch.Tensor) else y
    dt = t.dtype
    if dt.is_floating_point or dt is torch.bool:
        return torch.div(x, y)
    if dt is torch.uint32:
        return torch.div(_i64(x), _i64(y), rounding_mode="trunc").to(dt)
    if not isinstance(y, torch.Tensor):  # tile / number
        return torch.neg(x) if y == -1 else torch.div(x, y, rounding_mode="trunc")
    if dt is torch.int32:
        return torch.div(_i64(x), y.to(torch.int64), rounding_mode="trunc").to(dt)
    if dt is torch.int64:
        m = y == -1
        q = torch.div(x, torch.where(m, 1, y), rounding_mode="trunc")
        return torch.where(m, torch.neg(q), q)
    return torch.div(x, y, rounding_mode="trunc")


def _i64(v):
    """A tensor operand widened to INT64 (a Python number as it is)."""
    return v.to(torch.int64) if isinstance(v, torch.Tensor) else v


def maximum(a, b) -> Tile:
    """Elementwise maximum (tile-tile or tile-number)."""
    return _binary("maximum", a, b, lambda x, y: torch.maximum(x, y) if isinstance(y, torch.Tensor)
                   else torch.clamp(x, min=y))


def minimum(a, b) -> Tile:
    """Elementwise minimum (tile-tile or tile-number)."""
    return _binary("minimum", a, b, lambda x, y: torch.minimum(x, y) if isinstance(y, torch.Tensor)
                   else torch.clamp(x, max=y))


def _unary(op: str, x, fn, float_only: bool = True) -> Tile:
    if type(x) is not Tile:
        x = _as_tile(x, f"pl.{op}")
    d = x.data
    if float_only and not d.dtype.is_floating_point:
        raise DslError(f"pl.{op}: needs a float tile, got {x.dtype}")
    blk = _state.block
    if blk is not None:  # _count(d.numel(), op), inlined
        blk.ops += 1
        blk.flops += d.numel()
        vk = blk.vk
        if vk is None:
            blk.vk = {op: 1}
        else:
            vk[op] = vk.get(op, 0) + 1
    if d.is_meta:  # graph-only mode
        return Tile(_meta(d.shape, d.dtype), x.mask, x.valid)
    return Tile(fn(d), x.mask, x.valid)


def neg(x) -> Tile:
    """Elementwise ``-x``."""
    return _unary("neg", x, torch.neg, float_only=False)


def abs(x) -> Tile:  # noqa: A001 - DSL name
    """Elementwise ``|x|``."""
    return _unary("abs", x, torch.abs, float_only=False)


def exp(x) -> Tile:
    """Elementwise natural exponential (float tiles)."""
    return _unary("exp", x, torch.exp)


def log(x) -> Tile:
    """Elementwise natural logarithm (float tiles; log(0) = -inf)."""
    return _unary("log", x, torch.log)


def sqrt(x) -> Tile:
    """Elementwise square root (float tiles)."""
    return _unary("sqrt", x, torch.sqrt)


def rsqrt(x, high_precision: bool = False) -> Tile:
    """Elementwise ``1/sqrt(x)``; ``high_precision`` selects the accurate device
    path, which on the CPU is the same IEEE result."""
    return _unary("rsqrt", x, torch.rsqrt)


def recip(x, high_precision: bool = False) -> Tile:
    """Elementwise ``1/x`` (float tiles)."""
    return _unary("recip", x, torch.reciprocal)


# ---- constants -------------------------------------------------------------

def _tile_shape(op: str, shape, what: str) -> list:
    """``shape`` as a list of non-negative ints (DslError naming ``op`` otherwise; ``what``
    names one dim in the message of a dim that is not an int)."""
    if not isinstance(shape, (list, tuple)):
        raise DslError(f"{op}: shape must be a list of dims, got {type(shape).__name__} {shape!r}")
    dims = [as_int(s, what) for s in shape]
    if any(d < 0 for d in dims):
        raise DslError(f"{op}: negative dim in shape {dims}")
    return dims


def _fit_float(v, tdt: torch.dtype) -> float:
    """A number (float or int) past the finite range of the float dtype ``tdt`` rounded to it (IEEE
    round-to-nearest: +-inf from ``max + ulp / 2`` on), as a store or a tile op rounds it; torch's
    ``full`` would raise instead of rounding."""
    top = torch.finfo(tdt).max
    if -top <= v <= top or (isinstance(v, float) and not math.isfinite(v)):  # in range, or already +-inf / NaN
        return v
    try:
        return float(torch.tensor(float(v), dtype=torch.float64).to(tdt).item())
    except OverflowError:  # an int past FP64's range
        return math.inf if v > 0 else -math.inf


def _check_int_fill(value, is_float: bool, dt: DType) -> None:
    """The checks of an integer ``pl.full`` fill value (a Python number, or a symbol read from
    data under a parametric recording, whose comparisons are guarded): ``is_float`` says whether
    it is a float.

    Raises:
        DslError: a fractional float, or a value outside ``dt``'s range.
    """
    if is_float and not value.is_integer():
        raise DslError(f"pl.full: float value {value} for integer dtype {dt}")
    if not dt.min <= value <= dt.max:
        raise DslError(f"pl.full: value {value} out of range of {dt} [{dt.min}, {dt.max}]")


def full(shape, dtype, value) -> Tile:
    """A tile of ``shape`` filled with ``value`` (an int for integer dtypes).

    Raises:
        DslError: a shape that is not a list of non-negative ints, a value that is not a
            number (a string, a tile), a fractional value on an integer dtype, or an integer
            value out of the dtype's range.
    """
    dt = as_dtype(dtype)
    tv = type(value)
    if (tv is float or tv is int) and type(shape) is list and len(shape) == 2:
        s0, s1 = shape  # fast path: a plain number into a [rows, cols] tile (the checks below, in short)
        if type(s0) is int and type(s1) is int and s0 >= 0 and s1 >= 0:
            if dt.is_int:
                _check_int_fill(value, tv is float, dt)
            elif dt.is_float and not -65504.0 <= value <= 65504.0:  # past FP16's max, the narrowest float range
                value = _fit_float(value, dt.torch)
            _count()
            if value == 0 and (tv is int or math.copysign(1.0, value) > 0):  # +0: zeros, sizes as arguments (cheaper)
                return Tile(torch.zeros(s0, s1, dtype=dt.torch))
            return Tile(torch.full(shape, value, dtype=dt.torch))
    tag = 0
    meta_value = isinstance(value, _MetaScalar)
    if isinstance(value, ScalarValue) and value.symbolic:
        # a value read from data under a parametric recording (runtime/symbolic.py): the same
        # checks (guarded by their outcomes), and the fill takes its expression
        shape = _tile_shape("pl.full", shape, "a tile dim")
        if dt.is_int:
            _check_int_fill(value, type(value.v) is float, dt)
        _count()
        return Tile(torch.full(shape, value, dtype=dt.torch))
    if isinstance(value, ScalarValue):  # an undefined value fills an undefined tile (no error yet)
        tag = 0 if value.defined else value.oid
        value = value.value
    if not isinstance(value, numbers.Number):  # ints (bool too), floats, numpy scalars
        what = "a tile (use the tile itself, or pl.row_expand / pl.col_expand)" if isinstance(value, Tile) else \
            f"{type(value).__name__} {value!r}"
        raise DslError(f"pl.full: value must be a number, got {what}")
    shape = _tile_shape("pl.full", shape, "a tile dim")
    if dt.is_int and isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_int_fill(value, isinstance(value, float), dt)
    elif dt.is_float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = _fit_float(value if isinstance(value, int) else float(value), dt.torch)
    _count()
    if meta_value:  # graph-only mode: filled with an unknown value
        return Tile(_meta(shape, dt.torch))
    mask = torch.full(shape, tag, dtype=torch.int32) if tag else None
    return Tile(torch.full(shape, value, dtype=dt.torch), mask)


def arange(start, shape, dtype=INT32, descending: bool = False) -> Tile:
    """Consecutive integers ``start, start+1, ...`` (or descending) in a ``[1, N]`` tile.

    Leading dims must be 1 (hw-native-sys/pypto `docs/en/user/`). Dtypes INT16, INT32, UINT32.
    Numbers past the dtype's range wrap (two's complement, as integer ``add`` does), INT64 too.

    Raises:
        DslError: a shape that is not a non-empty list of non-negative ints, leading dims
            other than 1, or a non-integer dtype.
    """
    dt = as_dtype(dtype)
    shape = _tile_shape("pl.arange", shape, "an arange dim")
    if not shape:
        raise DslError("pl.arange: shape must have at least one dim ([1, N] or [N])")
    if any(s != 1 for s in shape[:-1]):
        raise DslError(f"pl.arange: leading dims must be 1, got shape {shape}")
    if not dt.is_int:
        raise DslError(f"pl.arange: integer dtype required, got {dt}")
    n = shape[-1]
    start = as_int(start, "an arange start")
    if type(start) is not int or type(n) is not int:
        # a start or length read from data under a parametric recording (runtime/symbolic.py): no
        # template (a dict key would pin the value); the same torch calls as a first tile
        v = torch.arange(start, start - n, -1) if descending else torch.arange(start, start + n)
        _count()
        return Tile(v.reshape(shape).to(dt.torch))
    key = (start, tuple(shape), bool(descending), dt.torch)
    v = _ARANGE.get(key)
    if v is None:  # the first tile of this kind: made as always, then kept as a template
        lo, hi = (start - n + 1, start) if descending else (start, start + n - 1)
        if n and (lo < -(1 << 63) or hi >= 1 << 63):
            # numbers past INT64 (torch.arange raises): the same two's complement wrap as below,
            # reduced mod 2^64 first (the cast to a narrower dtype then keeps the low bits)
            v = torch.tensor([(x + (1 << 63)) % (1 << 64) - (1 << 63)
                              for x in (range(start, start - n, -1) if descending else range(start, start + n))],
                             dtype=torch.int64)
        else:
            v = torch.arange(start, start - n, -1) if descending else torch.arange(start, start + n)
        v = v.reshape(shape).to(dt.torch)
        if len(_ARANGE) >= _ARANGE_MAX:
            _ARANGE.clear()
        _ARANGE[key] = v.clone()
    else:
        v = v.clone()  # the same values, one torch call instead of three
    _count()
    return Tile(v)


_ARANGE: dict = {}  # (start, shape, descending, torch dtype) -> template tile data (never handed out)
_ARANGE_MAX = 1024


# ---- cast --------------------------------------------------------------------

CAST_MODES = {"none": 0, "rint": 1, "round": 2, "floor": 3, "ceil": 4, "trunc": 5, "odd": 6}
_MODE_BY_CODE = {v: k for k, v in CAST_MODES.items()}
_INT_VIEW = {2: torch.int16, 4: torch.int32}


def _step(r: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Next representable value of r's float dtype toward +inf (up) or -inf."""
    nbits = r.element_size() * 8
    u = r.view(_INT_VIEW[r.element_size()]).to(torch.int64) & ((1 << nbits) - 1)
    sign_bit = 1 << (nbits - 1)
    neg = u >= sign_bit
    zero = (u & (sign_bit - 1)) == 0
    inc = u + 1
    dec = u - 1
    res = torch.where(up,
                      torch.where(neg, torch.where(zero, torch.ones_like(u), dec), inc),
                      torch.where(neg, inc, torch.where(zero, torch.full_like(u, sign_bit + 1), dec)))
    res = torch.where(res >= sign_bit, res - (1 << nbits), res)
    return res.to(_INT_VIEW[r.element_size()]).view(r.dtype)


def _round_to_float(v: torch.Tensor, dst: torch.dtype, mode: str) -> torch.Tensor:
    """Round float64 values ``v`` to float dtype ``dst`` under ``mode``, rounding the
    exact value once.

    torch converts float64 to BF16/FP16 through FP32, which can round twice (an
    INT32 just above a BF16 midpoint lands on the midpoint, then on the even
    side). The conversion is only used to find one neighbour; the representable
    neighbours ``lo <= v <= hi`` are then chosen between exactly. Beyond the
    largest finite value the next value up is taken as ``max + ulp`` (IEEE
    overflow: nearest modes give inf from ``max + ulp/2`` on; trunc saturates).
    """
    c = v.to(dst)
    if dst == torch.float32 and mode in ("none", "rint"):
        return c  # float64 -> float32 is a single correctly rounded conversion
    cd = c.to(torch.float64)
    if torch.equal(cd, v):
        return c  # every value representable: no rounding in any mode
    down = torch.zeros(v.shape, dtype=torch.bool)
    lo = torch.where(cd > v, _step(c, down), c)
    hi = torch.where(cd < v, _step(c, ~down), c)
    if mode == "floor":
        return lo
    if mode == "ceil":
        return hi
    if mode == "trunc":
        return torch.where(v >= 0, lo, hi)
    if mode not in ("none", "rint", "round"):
        raise DslError(f"pl.cast: mode {mode!r} is not supported for float targets")
    lo_d, hi_d = lo.to(torch.float64), hi.to(torch.float64)
    # an infinite neighbour of a finite value stands for max + ulp (same spacing as below max)
    hi_v = torch.where(torch.isinf(hi_d) & torch.isfinite(lo_d), 2 * lo_d - _step(lo, down).to(torch.float64), hi_d)
    lo_v = torch.where(torch.isinf(lo_d) & torch.isfinite(hi_d), 2 * hi_d - _step(hi, ~down).to(torch.float64), lo_d)
    dl, dh = v - lo_v, hi_v - v
    nearest = torch.where(dl < dh, lo, hi)
    if mode == "round":
        tie_pick = torch.where(v >= 0, hi, lo)
    else:
        lo_even = (lo.view(_INT_VIEW[lo.element_size()]) & 1) == 0
        tie_pick = torch.where(lo_even, lo, hi)
    out = torch.where(dl == dh, tie_pick, nearest)
    return torch.where(torch.isnan(v) | (lo_d == hi_d), c, out)


def _round_to_int(v: torch.Tensor, mode: str) -> torch.Tensor:
    if mode in ("rint", "none"):
        return torch.round(v)  # half to even
    if mode == "round":
        return torch.sign(v) * torch.floor(torch.abs(v) + 0.5)
    if mode == "floor":
        return torch.floor(v)
    if mode == "ceil":
        return torch.ceil(v)
    if mode == "trunc":
        return torch.trunc(v)
    raise DslError(f"pl.cast: mode {mode!r} is not supported for integer targets")


_FP32_ROUNDABLE = (torch.float32, torch.bfloat16, torch.float16)  # widen to FP32 exactly


def _float_to_int32_range(src: torch.Tensor, dst, mode: str) -> torch.Tensor:
    """``src`` (FP32 / BF16 / FP16) rounded by ``mode`` to the integer dtype ``dst`` of at most
    4 bytes, saturating, NaN -> 0: the same values as the FP64 path, computed in FP32.

    Rounding an FP32 value to an integer is exact in FP32 (every FP32 of magnitude >= 2^23 is
    an integer already); ``round`` (ties away from zero) is ``trunc(v)`` plus ``sign(v)`` where
    the fraction ``v - trunc(v)`` (exact) is at least 1/2. The clamp to the target range in
    FP32 may round the top bound up (2^31 - 1 -> 2^31); the INT64 clamp after it restores it. A
    target of at most 2 bytes has bounds FP32 holds exactly: the clamped values convert directly."""
    v = src.float()
    if mode == "trunc":  # the conversions below truncate toward zero: torch.trunc first gives the same values
        v = torch.nan_to_num(v, 0.0).clamp_(float(dst.min), float(dst.max))
    else:
        if mode == "round":
            t = torch.trunc(v)
            v = torch.where((v - t).abs_() >= 0.5, t + torch.sign(v), t)
        else:
            v = _round_to_int(v, mode)
            if v is src:
                v = v.clone()
        v = v.nan_to_num_(0.0).clamp_(float(dst.min), float(dst.max))
    if dst.itemsize <= 2:
        return _to(v, dst.torch)
    return _to(v.long().clamp_(dst.min, dst.max), dst.torch)


_EXACT_CASTS: dict = {}  # (source torch dtype, float target torch dtype) -> every value converts exactly


_INT_ROUND_MODES = frozenset(("none", "rint", "round", "floor", "ceil", "trunc"))  # CAST_MODES except "odd"


def _int_in_fp32(x: Tile) -> bool:
    """Whether every value of the non-empty INT32 / INT64 tile ``x`` lies in ``[-2^24, 2^24]``
    (so converts to FP32 exactly): its known bound (``Tile._ib``, an INT8 matmul's), else its
    extrema."""
    bound = _int_bound(x)
    if bound is not None and bound <= 1 << 24:
        return True
    lo, hi = torch.aminmax(x.data)
    return -(1 << 24) <= lo.item() and hi.item() <= 1 << 24


def _exact_float_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every ``src`` value is exactly representable in the float dtype ``dst``
    (bool; a float no wider, except BF16 -> FP16; an integer of at most 2 bytes into FP32)."""
    hit = _EXACT_CASTS.get((src, dst))
    if hit is None:
        hit = _EXACT_CASTS[(src, dst)] = (
            src == torch.bool
            or (src.is_floating_point and torch.finfo(src).bits <= torch.finfo(dst).bits
                and not (src == torch.bfloat16 and dst == torch.float16))
            or (not src.is_floating_point and src.itemsize <= 2 and dst == torch.float32))
    return hit


def _one_call_casts() -> dict:
    """``{(source torch dtype, target torch dtype, mode name): conversion}`` for the casts
    :func:`cast`'s general path does in one torch call: a copy to the same dtype, and a float
    target the source converts to exactly or, from a float (or INT32 to FP32), in a nearest-even
    mode (``.to``)."""
    out = {}
    dts = [d.torch for d in (BF16, FP16, FP32, INT8, INT16, INT32, INT64, UINT8, UINT32)] + [torch.bool]
    for s in dts:
        for d in dts:
            for mode in CAST_MODES:
                if mode == "odd":
                    continue
                if s == d:
                    out[(s, d, mode)] = torch.Tensor.clone
                elif d.is_floating_point and d in _TO and (
                        _exact_float_cast(s, d) or (s.is_floating_point and mode in ("none", "rint"))
                        or (s == torch.int32 and d == torch.float32 and mode in ("none", "rint"))):
                    # INT32 -> FP32 is one correctly rounded (RNE) conversion, as INT32 -> FP64 (exact) -> FP32
                    out[(s, d, mode)] = _TO[d]
    return out


_ONE_CALL_CASTS = _one_call_casts()


def cast(x, target_type, mode="round") -> Tile:
    """Convert a tile to ``target_type`` with an Ascend rounding mode.

    Modes (name or code): ``none``/0 (nearest-even when precision is lost),
    ``rint``/1 (nearest, ties to even), ``round``/2 (nearest, ties away from
    zero; the default), ``floor``/3, ``ceil``/4, ``trunc``/5 (toward zero).
    ``odd``/6 is rejected. Float to integer casts saturate at the target range
    (NaN becomes 0); integer narrowing saturates too. Widening casts are exact.
    A narrowing cast rounds the exact source value once (INT32 -> BF16 is not
    rounded through FP32 first); INT64 sources beyond 2^53 are first rounded to
    float64.
    Reference: hw-native-sys/pypto `docs/en/user/`.

    Raises:
        DslError: unknown mode, mode ``odd``, or a non-tile operand. A Python number or
            scalar ``x`` is a scalar cast (see ``compat_ops.cast_scalar``).
    """
    if type(x) is Tile and type(target_type) is DType:
        # fast paths: a cast the general path below does in one conversion (or a copy); a float
        # to a narrow integer and an integer known in [-2^24, 2^24] to FP32, as the general path
        # does them (the same torch calls) without its dispatch
        src = x.data
        sdt = src.dtype
        conv = _ONE_CALL_CASTS.get((sdt, target_type.torch, mode))
        if not src.is_meta:
            if conv is not None:
                out = conv(src)
            elif mode in _INT_ROUND_MODES and sdt in _FP32_ROUNDABLE and target_type.is_int and target_type.itemsize <= 4:
                out = _float_to_int32_range(src, target_type, mode)
            elif (target_type is FP32 and (sdt is torch.int32 or sdt is torch.int64) and mode in _INT_ROUND_MODES
                  and src.numel() and _int_in_fp32(x)):
                out = src.float()
            else:
                out = None
            if out is not None:
                blk = _state.block
                if blk is not None:  # _count(src.numel(), "cast"), inlined
                    blk.ops += 1
                    blk.flops += src.numel()
                    vk = blk.vk
                    if vk is None:
                        blk.vk = {"cast": 1}
                    else:
                        vk["cast"] = vk.get("cast", 0) + 1
                return Tile(out, x.mask, x.valid)
    if isinstance(x, (int, float, ScalarValue)) and not isinstance(x, bool):
        from pto.language.compat_ops import cast_scalar  # the scalar form (pl.cast(idx, pl.INDEX))
        return cast_scalar(x, target_type, mode)
    x = _as_tile(x, "pl.cast")
    dst = as_dtype(target_type)
    if isinstance(mode, int):
        if mode not in _MODE_BY_CODE:
            raise DslError(f"pl.cast: unknown mode code {mode}")
        mode = _MODE_BY_CODE[mode]
    if mode not in CAST_MODES or mode == "odd":
        raise DslError(f"pl.cast: unsupported mode {mode!r}; use one of none, rint, round, floor, ceil, trunc")
    src = x.data
    _count(src.numel(), "cast")
    if src.is_meta:  # graph-only mode
        return Tile(_meta(src.shape, dst.torch), x.mask, x.valid)
    if src.dtype == dst.torch:
        return Tile(src.clone(), x.mask, x.valid)
    if dst.torch == torch.bool:
        out = src != 0
    elif dst.is_float:
        exact = _exact_float_cast(src.dtype, dst.torch)
        if not exact and dst.torch == torch.float32 and src.dtype in (torch.int32, torch.int64) and src.numel():
            # an integer of magnitude <= 2^24 is exact in FP32: the common INT32 matmul accumulator
            # takes one conversion (the general path below gives the same values, at 8x the cost)
            exact = _int_in_fp32(x)
        if exact or (src.dtype.is_floating_point and mode in ("none", "rint")):
            out = _to(src, dst.torch)  # float -> narrower float: one correctly rounded (RNE) conversion
        else:
            out = _round_to_float(src.to(torch.float64), dst.torch, mode)
    else:
        if src.dtype in _FP32_ROUNDABLE and dst.itemsize <= 4:
            out = _float_to_int32_range(src, dst, mode)
        elif src.dtype.is_floating_point:
            v = _round_to_int(src.to(torch.float64), mode)
            big = v >= float(dst.max)  # float(INT64 max) is 2^63: exactly the values that overflow
            small = v <= float(dst.min)
            mid = torch.where(big | small | torch.isnan(v), torch.zeros_like(v), v).to(torch.int64)
            out = torch.where(big, dst.max, torch.where(small, dst.min, mid)).to(dst.torch)
        else:
            out = src.to(torch.int64).clamp(dst.min, dst.max).to(dst.torch)
    return Tile(out, x.mask, x.valid)


# ---- reductions and expands --------------------------------------------------

def _int_bound(x: Tile):
    """The known bound ``B`` of the integer tile ``x`` (``|v| <= B`` for every element) while its
    data is unchanged since the bound was set (``Tile._ib``), else None."""
    ib = getattr(x, "_ib", None)
    if ib is not None and ib[0] is x.data and ib[1] == x.data._version:
        return ib[2]
    return None


def _need_rank2(op: str, x) -> Tile:
    x = _as_tile(x, f"pl.{op}")
    if x.data.dim() != 2:
        raise DslError(f"pl.{op}: needs a rank-2 tile, got shape {list(x.shape)}")
    return x


def _reduce(op: str, x, dim: int, fn) -> Tile:
    if type(x) is not Tile or x.data.dim() != 2:
        x = _need_rank2(op, x)
    if x.data.is_meta:  # graph-only mode
        shape = list(x.data.shape)
        if not shape[dim] and ("max" in op or "min" in op):  # as a real run's torch reduction refuses it
            raise DslError(f"pl.{op}: the tile {shape} has no elements along dim {dim} to reduce")
        shape[dim] = 1
        _count(x.data.numel(), op)
        return Tile(_meta(shape, x.data.dtype))
    d = x.data
    try:
        out = fn(d, dim)
    except (IndexError, RuntimeError):
        if d.shape[dim]:
            raise
        raise DslError(f"pl.{op}: the tile {list(d.shape)} has no elements along dim {dim} to reduce") from None
    mask = None if x.mask is None else x.mask.amax(dim=dim, keepdim=True)
    blk = _state.block
    if blk is not None:  # _count(d.numel(), op), inlined
        blk.ops += 1
        blk.flops += d.numel()
        vk = blk.vk
        if vk is None:
            blk.vk = {op: 1}
        else:
            vk[op] = vk.get(op, 0) + 1
    return Tile(out, mask)


def _sum_keepdim(d: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum along ``dim`` (kept), floats accumulated in FP32, in ``d``'s dtype."""
    if d.dtype is torch.float32:  # the FP32 sum, without the (same) accumulation dtype to parse
        return d.sum(dim, True)
    s = d.sum(dim, True, dtype=torch.float32) if d.dtype.is_floating_point else d.sum(dim, True)
    return s if s.dtype is d.dtype else _to(s, d.dtype)


def row_sum(x, tmp_tile=None) -> Tile:
    """Sum along the last axis: ``[M, N] -> [M, 1]``; padding participates."""
    return _reduce("row_sum", x, 1, _sum_keepdim)


def row_max(x, tmp_tile=None) -> Tile:
    """Max along the last axis: ``[M, N] -> [M, 1]``."""
    return _reduce("row_max", x, 1, lambda d, a: d.amax(a, True))


def row_min(x, tmp_tile=None) -> Tile:
    """Min along the last axis: ``[M, N] -> [M, 1]``."""
    return _reduce("row_min", x, 1, lambda d, a: d.amin(a, True))


def col_sum(x, tmp_tile=None) -> Tile:
    """Sum along the first axis: ``[M, N] -> [1, N]``."""
    return _reduce("col_sum", x, 0, _sum_keepdim)


def col_max(x, tmp_tile=None) -> Tile:
    """Max along the first axis: ``[M, N] -> [1, N]``."""
    return _reduce("col_max", x, 0, lambda d, a: d.amax(a, True))


def _expand(op: str, lhs, rhs, axis: str, fn) -> Tile:
    if type(lhs) is Tile and type(rhs) is Tile:  # fast path: rank-2 tiles of one dtype, rhs [M, 1] / [1, N]
        ld, rd = lhs.data, rhs.data
        ls, rs = ld.shape, rd.shape
        dt = ld.dtype
        if len(ls) == 2 and len(rs) == 2 and rd.dtype is dt and not (ld.is_meta or rd.is_meta):
            m, n = ls
            r0, r1 = rs
            if (r0 == m and r1 == 1) if axis == "row" else (r0 == 1 and r1 == n):
                out = fn(ld, rd)  # [m, n]
                mask = lhs.mask
                if rhs.mask is not None:
                    mask = _and(mask, rhs.mask.expand(m, n).contiguous())
                blk = _state.block
                if blk is not None:  # _count(out.numel(), op), inlined
                    blk.ops += 1
                    blk.flops += m * n
                    vk = blk.vk
                    if vk is None:
                        blk.vk = {op: 1}
                    else:
                        vk[op] = vk.get(op, 0) + 1
                return Tile(out if out.dtype is dt else _to(out, dt), mask, lhs.valid)
    lhs = _need_rank2(op, lhs)
    rhs = _need_rank2(op, rhs)
    m, n = lhs.shape
    want = (m, 1) if axis == "row" else (1, n)
    if rhs.shape != want:
        raise DslError(f"pl.{op}: rhs must be {list(want)} for lhs {list(lhs.shape)}, got {list(rhs.shape)}")
    if lhs.data.dtype != rhs.data.dtype:
        raise DslError(f"pl.{op}: dtype mismatch {lhs.dtype} vs {rhs.dtype}")
    if lhs.data.is_meta or rhs.data.is_meta:  # graph-only mode
        _count(lhs.data.numel(), op)
        return Tile(_meta(lhs.data.shape, lhs.data.dtype), None, lhs.valid)
    out = fn(lhs.data, rhs.data)
    mask = lhs.mask
    if rhs.mask is not None:
        mask = _and(mask, rhs.mask.expand(m, n).contiguous())  # broadcast the [M,1] / [1,N] mask
    _count(out.numel(), op)
    dt = lhs.data.dtype
    return Tile(out if out.dtype is dt else _to(out, dt), mask, lhs.valid)


def _expand_div(op: str, lhs, rhs, axis: str) -> Tile:
    """``row_expand_div`` / ``col_expand_div``: IEEE on float tiles, the exact quotient truncated
    toward zero on integer tiles (as :func:`div`).

    Raises:
        DslError: an integer divisor that is zero somewhere, or the rank / shape / dtype rules
            of the expand ops.
    """
    if type(lhs) is Tile and lhs.data.dtype.is_floating_point:
        return _expand(op, lhs, rhs, axis, torch.div)
    _check_int_divisor(op, lhs, rhs)
    return _expand(op, lhs, rhs, axis, _tdiv)


def row_expand(lhs, rhs) -> Tile:
    """Broadcast the ``[M, 1]`` column ``rhs`` to ``lhs``'s shape ``[M, N]``."""
    return _expand("row_expand", lhs, rhs, "row", lambda a, b: b.expand_as(a).clone())


def row_expand_mul(lhs, rhs) -> Tile:
    """``lhs[M, N] * rhs[M, 1]`` per row."""
    return _expand("row_expand_mul", lhs, rhs, "row", torch.mul)


def row_expand_div(lhs, rhs) -> Tile:
    """``lhs[M, N] / rhs[M, 1]`` per row, with :func:`div`'s numerics; a zero in an
    integer ``rhs`` is a DslError (:func:`_expand_div`)."""
    return _expand_div("row_expand_div", lhs, rhs, "row")


def row_expand_sub(lhs, rhs) -> Tile:
    """``lhs[M, N] - rhs[M, 1]`` per row."""
    return _expand("row_expand_sub", lhs, rhs, "row", torch.sub)


def row_expand_add(lhs, rhs) -> Tile:
    """``lhs[M, N] + rhs[M, 1]`` per row."""
    return _expand("row_expand_add", lhs, rhs, "row", torch.add)


def col_expand(lhs, rhs) -> Tile:
    """Broadcast the ``[1, N]`` row ``rhs`` down to ``lhs``'s shape ``[M, N]``."""
    return _expand("col_expand", lhs, rhs, "col", lambda a, b: b.expand_as(a).clone())


def col_expand_mul(lhs, rhs) -> Tile:
    """``lhs[M, N] * rhs[1, N]`` per column."""
    return _expand("col_expand_mul", lhs, rhs, "col", torch.mul)


def col_expand_add(lhs, rhs) -> Tile:
    """``lhs[M, N] + rhs[1, N]`` per column."""
    return _expand("col_expand_add", lhs, rhs, "col", torch.add)


def col_expand_sub(lhs, rhs) -> Tile:
    """``lhs[M, N] - rhs[1, N]`` per column."""
    return _expand("col_expand_sub", lhs, rhs, "col", torch.sub)


def col_expand_div(lhs, rhs) -> Tile:
    """``lhs[M, N] / rhs[1, N]`` per column, with :func:`div`'s numerics; a zero in an
    integer ``rhs`` is a DslError (:func:`_expand_div`)."""
    return _expand_div("col_expand_div", lhs, rhs, "col")


def col_expand_expdif(lhs, rhs) -> Tile:
    """``exp(lhs[M, N] - rhs[1, N])`` fused (softmax numerator along columns)."""
    return _expand("col_expand_expdif", lhs, rhs, "col", lambda a, b: torch.exp(a - b))


# ---- data movement inside a tile ----------------------------------------------

def gather(x, dim: int = -1, index=None, mask_pattern=None, output_dtype=None) -> Tile:
    """Index form: ``out[b, k] = x[b, index[b, k]]`` (rank 2, last dim only).

    ``index`` is an INT32 (or INT16/INT64) tile with the same number of rows as
    ``x`` (or one row, broadcast to every row). The definedness mask moves with
    the data; an undefined index (check mode) yields an undefined element
    instead of a range error.

    Mask form ``gather(x, mask_pattern=P, output_dtype=dt)``: keep the lanes of the last dim
    that the periodic pattern ``P`` (:class:`MaskPattern`) selects; the last dim shrinks by the
    period (2 for ``P0101`` / ``P1010``, 4 for the one-lane patterns, 1 for ``P1111``).
    ``output_dtype`` reinterprets kept 32-bit lanes (FP32 <-> INT32 / UINT32 bits), e.g. the
    index lanes of :func:`sort32` pairs.

    Raises:
        DslError: wrong rank or dim, non-integer index, an index out of range; for the mask
            form an unknown pattern, a period that does not divide the last dim, or an
            ``output_dtype`` that is not a 32-bit reinterpretation.
    """
    if mask_pattern is not None:
        if index is not None:
            raise DslError("pl.gather: give index= or mask_pattern=, not both")
        return _gather_mask(x, mask_pattern, output_dtype)
    x = _need_rank2("gather", x)
    if index is None:
        raise DslError("pl.gather: index= is required")
    idx = _as_tile(index, "pl.gather")
    if dim not in (-1, 1):
        raise DslError(f"pl.gather: only dim=-1 is supported, got {dim}")
    if idx.data.dtype.is_floating_point or idx.data.dim() != 2:
        raise DslError(f"pl.gather: index must be a rank-2 integer tile, got {idx}")
    if x.data.is_meta or idx.data.is_meta:  # graph-only mode: an unknown index is not range-checked
        if idx.shape[0] not in (1, x.shape[0]):
            raise DslError(f"pl.gather: index rows {idx.shape[0]} != x rows {x.shape[0]}")
        _count(x.shape[0] * idx.shape[1])
        return Tile(_meta([x.shape[0], idx.shape[1]], x.data.dtype))
    ii = idx.data.long()
    if idx.mask is not None:  # undefined indices gather an undefined element, not an error
        ii = torch.where(idx.mask != 0, 0, ii)
    xr, xc = x.data.shape
    ir, ic = ii.shape
    if ir == 1 and xr != 1:
        ii = ii.expand(xr, ic)
    elif ir != xr:
        raise DslError(f"pl.gather: index rows {ir} != x rows {xr}")
    if ii.numel():
        lo, hi = torch.aminmax(ii)  # one reduction for both bounds
        lo, hi = int(lo), int(hi)
        if lo < 0 or hi >= xc:
            raise DslError(f"pl.gather: index out of range [0, {xc}): min {lo}, max {hi}")
    out = torch.gather(x.data, 1, ii)
    mask = None
    if x.mask is not None:
        mask = torch.gather(x.mask, 1, ii)
    if idx.mask is not None:
        m = idx.mask if idx.mask.shape == ii.shape else idx.mask.expand_as(ii).contiguous()
        mask = _and(mask, m)
    _count(out.numel())
    return Tile(out, mask)


def transpose(x, axis1: int = 0, axis2: int = 1) -> Tile:
    """Swap two axes of a tile (the result is a fresh contiguous tile).

    Raises:
        DslError: an axis outside the tile's rank.
    """
    x = _as_tile(x, "pl.transpose")
    rank = x.data.dim()
    for a in (axis1, axis2):
        if isinstance(a, bool) or not isinstance(a, int) or not -rank <= a < rank:
            raise DslError(f"pl.transpose: axis {a!r} out of range for a rank-{rank} tile {list(x.shape)}")
    axis1, axis2 = axis1 % rank, axis2 % rank
    out = x.data.transpose(axis1, axis2).contiguous()
    mask = None if x.mask is None else x.mask.transpose(axis1, axis2).contiguous()
    valid = None
    if x.valid is not None:
        v = list(x.valid)
        v[axis1], v[axis2] = v[axis2], v[axis1]
        valid = tuple(v)
    _count(out.numel(), "transpose")
    return Tile(out, mask, valid)


def tile_reshape(x, shape) -> Tile:
    """Reinterpret a tile's dims (same element count, row-major)."""
    if type(x) is Tile and type(shape) in (list, tuple) and len(shape) == 2:
        s0, s1 = shape  # fast path: [rows, cols] ints (the same reshape as below, sizes as arguments)
        d = x.data
        if type(s0) is int and type(s1) is int and s0 >= 0 and s1 >= 0 and s0 * s1 == d.numel():
            if d._base is not None:
                x._own_before_view()
                d = x.data
            m = x.mask
            return Tile(d.reshape(s0, s1), None if m is None else m.reshape(s0, s1))
    x = _as_tile(x, "pl.reshape")
    shape = [as_int(s, "a reshape dim") for s in shape]
    if math.prod(shape) != x.data.numel():
        raise DslError(f"pl.reshape: cannot reshape tile {list(x.shape)} to {shape}")
    x._own_before_view()
    return Tile(x.data.reshape(shape), None if x.mask is None else x.mask.reshape(shape))


def tile_slice(x, shape, offsets) -> Tile:
    """A sub-tile of ``shape`` at ``offsets`` (a copy)."""
    if type(x) is Tile and x.mask is None and len(shape) == 2 and len(offsets) == 2:
        # fast path: an in-bounds window of a rank-2 all-defined tile at int offsets; one
        # as_strided view (the same sizes, strides and offset as slicing) cloned, as below
        d = x.data
        o0, o1 = offsets
        s0, s1 = shape
        if type(o0) is int and type(o1) is int and type(s0) is int and type(s1) is int and d.dim() == 2:
            n0, n1 = d.shape
            if 0 <= o0 and 0 <= s0 and o0 + s0 <= n0 and 0 <= o1 and 0 <= s1 and o1 + s1 <= n1 and not d.is_meta:
                st0, st1 = st = d.stride()
                if s0 > 1 and st1 == 1 and s1 == n1 == st0:  # whole rows of contiguous rows: the same copy, cheaper
                    return Tile(d.narrow_copy(0, o0, s0))
                if s0 > 1 and st1 == 1:  # the clone of such a view is contiguous: one copying call
                    return Tile(torch.as_strided_copy(d, (s0, s1), st, d.storage_offset() + o0 * st0 + o1 * st1))
                return Tile(d.as_strided((s0, s1), st, d.storage_offset() + o0 * st0 + o1 * st1).clone())
    x = _as_tile(x, "pl.slice")
    if len(shape) != x.data.dim() or len(offsets) != x.data.dim():
        raise DslError(f"pl.slice: tile {list(x.shape)} has rank {x.data.dim()}, got shape {list(shape)} "
                       f"offsets {list(offsets)}")
    key = []
    for d, (o, s) in enumerate(zip(offsets, shape)):
        o, s = as_int(o, "a slice offset"), as_int(s, "a slice dim")
        if o < 0 or o + s > x.shape[d]:
            raise DslError(f"pl.slice: window [{o}, {o + s}) out of tile dim {d} of extent {x.shape[d]}")
        key.append(slice(o, o + s))
    key = tuple(key)
    if x.data.is_meta:  # graph-only mode
        return Tile(_meta([k.stop - k.start for k in key], x.data.dtype))
    return Tile(x.data[key].clone(), None if x.mask is None else x.mask[key].clone())


def tile_assemble(dst, src, offsets) -> Tile:
    """A copy of tile ``dst`` with tile ``src`` written at ``offsets``.

    Raises:
        DslError: ranks that differ, a non-int offset, or ``src`` reaching outside ``dst``.
    """
    if type(dst) is Tile and type(src) is Tile and dst.mask is None and src.mask is None and len(offsets) == 2:
        # fast path: rank-2 all-defined tiles of one dtype, the source inside the target at int
        # offsets: the target's copy with the window overwritten, as below
        dd, sd = dst.data, src.data
        o0, o1 = offsets
        if (type(o0) is int and type(o1) is int and dd.dim() == 2 and sd.dim() == 2 and dd.dtype is sd.dtype
                and not dd.is_meta and not sd.is_meta):
            s0, s1 = sd.shape
            if 0 <= o0 and o0 + s0 <= dd.shape[0] and 0 <= o1 and o1 + s1 <= dd.shape[1]:
                st0, st1 = st = dd.stride()
                if dd.storage_offset() == 0 and dd.is_contiguous():
                    # one call: a copy of the target (contiguous, offset 0, as its clone) with the window set
                    return Tile(torch.as_strided_scatter(dd, sd, (s0, s1), st, o0 * st0 + o1 * st1), None, dst.valid)
                out = dd.clone()
                st0, st1 = st = out.stride()
                out.as_strided((s0, s1), st, o0 * st0 + o1 * st1).copy_(sd)
                return Tile(out, None, dst.valid)
    dst = _as_tile(dst, "pl.assemble")
    src = _as_tile(src, "pl.assemble")
    if len(offsets) != dst.data.dim() or src.data.dim() != dst.data.dim():
        raise DslError(f"pl.assemble: rank mismatch: target tile {list(dst.shape)}, source tile {list(src.shape)}, "
                       f"offsets {list(offsets)}")
    key = []
    for d, (o, s) in enumerate(zip(offsets, src.shape)):
        o = _index(o, "pl.assemble", d, "an offset")
        if o < 0 or o + s > dst.shape[d]:
            raise DslError(f"pl.assemble: source tile {list(src.shape)} at offset {o} of dim {d} spans [{o}, {o + s}), "
                           f"out of bounds of the target tile's extent {dst.shape[d]} (shape {list(dst.shape)})")
        key.append(slice(o, o + s))
    if dst.data.is_meta or src.data.is_meta:  # graph-only mode: the assembled tile is unknown
        return Tile(_meta(dst.data.shape, dst.data.dtype), None, dst.valid)
    out = Tile(dst.data.clone(), None if dst.mask is None else dst.mask.clone(), dst.valid)
    out._mown = out.mask is not None
    out[tuple(key)] = src
    return out


# ---- matmul ----------------------------------------------------------------------

_FLOAT_MM = (torch.bfloat16, torch.float16, torch.float32)

# INT8 x INT8 -> INT32 GEMM backend: "int" (torch._int_mm) or "float" (the operands widened to
# FP32, or FP64 past K = 1024, and one floating-point GEMM): both give the exact integer sums, so
# the choice changes speed only. torch._int_mm is 10-30x faster than the float GEMM on some CPUs
# and 10-30x slower on others (measured on an AMD EPYC), so by default a probe
# times both once per process; PTO_INT8_GEMM=int|float fixes it.
_INT8_GEMM = [os.environ.get("PTO_INT8_GEMM", "").strip().lower() or None]


def _int8_gemm_backend() -> str:
    """``"int"`` or ``"float"``: the faster exact INT8 GEMM on this machine (``_INT8_GEMM``),
    probed once on a ``[64, 256] x [256, 64]`` product (a few ms) unless PTO_INT8_GEMM set it.

    Raises:
        ConfigError: PTO_INT8_GEMM set to anything but ``int`` or ``float``.
    """
    mode = _INT8_GEMM[0]
    if mode is None:
        def best(f) -> float:
            f()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
            return min(times)

        with torch._C.DisableTorchFunction():  # unseen by a recorder (replay, block templates)
            g = torch.Generator().manual_seed(0)
            a = torch.randint(-128, 128, (64, 256), dtype=torch.int8, generator=g)
            b = torch.randint(-128, 128, (256, 64), dtype=torch.int8, generator=g)
            t_int = best(lambda: torch._int_mm(a, b))
            t_float = best(lambda: _int8_mm_float(a, b))
        mode = _INT8_GEMM[0] = "int" if t_int <= t_float else "float"
    elif mode not in ("int", "float"):
        raise ConfigError(f"PTO_INT8_GEMM must be 'int' or 'float', got {mode!r}")
    return mode


def _int8_mm_float(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [..., M, K] @ b [..., K, N]`` of INT8 tensors as INT32, through a floating-point GEMM
    (``torch.matmul``: ``torch.mm`` for 2-D operands): each product is at most ``2^14`` in
    magnitude, so with ``K <= 1024`` every partial sum is an integer of at most ``2^24``, which
    FP32 holds exactly in any summation order; past that FP64 (exact to ``2^53``). Equal to
    ``torch._int_mm(a, b)`` bit for bit."""
    wide = torch.float32 if a.shape[-1] << 14 <= 1 << 24 else torch.float64
    return torch.matmul(a.to(wide), b.to(wide)).to(torch.int32)


def _int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a [M, K] @ b [K, N]`` of INT8 tensors as INT32 (``K <= 2^17``, no empty dim), on
    the faster backend of :func:`_int8_gemm_backend`."""
    mode = _INT8_GEMM[0]
    if mode != "int" and mode != "float":
        mode = _int8_gemm_backend()  # the probe, or the ConfigError of a bad PTO_INT8_GEMM
    return torch._int_mm(a, b) if mode == "int" else _int8_mm_float(a, b)


def matmul(a, b, out_dtype=None, a_trans: bool = False, b_trans: bool = False) -> Tile:
    """``a[M, K] @ b[K, N]`` on the cube unit (``b_trans``: b stored ``[N, K]``).

    BF16/FP16/FP32 operands accumulate in FP32; INT8 x INT8 accumulates exactly
    in INT32. ``out_dtype`` must equal the accumulator dtype (FP32 or INT32).
    Rank-3 operands are a batched matmul.

    Raises:
        DslError: operand ranks other than 2 x 2 or 3 x 3, a batch mismatch, mixed operand
            dtypes, unsupported dtypes, a K mismatch, or an ``out_dtype`` other than the
            accumulator dtype.
    """
    if type(a) is Tile and type(b) is Tile and a.mask is None and b.mask is None:
        # fast path: rank-2 all-defined operands of one dtype whose K agree (the general path below
        # computes the same product with the same kernels: torch.matmul of 2-D operands is torch.mm,
        # F.linear(x, w) without a bias is torch.mm(x, w.t()), and .float() of an FP32 tensor is itself)
        ad, bd = a.data, b.data
        sa, sb = ad.shape, bd.shape
        dt = ad.dtype
        if len(sa) == 2 and len(sb) == 2 and bd.dtype is dt and not (ad.is_meta or bd.is_meta):
            m, k = (sa[1], sa[0]) if a_trans else sa
            kb, n = (sb[1], sb[0]) if b_trans else sb
            if k == kb:
                out = None
                if dt is torch.float32 or dt in _FLOAT_MM:
                    if out_dtype is None or out_dtype is FP32:
                        if dt is not torch.float32:
                            ad, bd = ad.float(), bd.float()  # = A.float(), B.float() of the views below
                        if b_trans and not a_trans:
                            out = _linear(ad, bd)
                        else:
                            out = torch.mm(ad.t() if a_trans else ad, bd.t() if b_trans else bd)
                elif dt is torch.int8 and k <= (1 << 17) and m and k and n:
                    if out_dtype is None or out_dtype is INT32:
                        out = _int8_mm(ad.t() if a_trans else ad, bd.t() if b_trans else bd)
                if out is not None:
                    blk = _state.block
                    if blk is not None:  # _count, then the cube counters, as below
                        blk.ops += 1
                        blk.flops += 2 * m * n * k
                        blk.cube = True
                        blk.mm += 1
                    t = Tile(out)
                    if dt is torch.int8:
                        try:
                            t._ib = (out, out._version, k << 14)  # |int8 x int8| <= 2^14 per product
                        except RuntimeError:  # an inference-mode tensor has no version counter
                            pass
                    return t
    a = _as_tile(a, "pl.matmul")
    b = _as_tile(b, "pl.matmul")
    if {a.data.dim(), b.data.dim()} == {2, 3} and (a if a.data.dim() == 3 else b).shape[0] == 1:
        # a rank-3 operand with a unit batch (pypto-lib's wo_a[g:g + 1, ...]) times a rank-2 one:
        # the 2-D product, the unit batch dim kept
        def unbatch(t):
            return Tile(t.data[0], None if t.mask is None else t.mask[0]) if t.data.dim() == 3 else t
        out = matmul(unbatch(a), unbatch(b), out_dtype, a_trans, b_trans)
        return Tile(out.data.unsqueeze(0), None if out.mask is None else out.mask.unsqueeze(0))
    if a.data.dim() not in (2, 3) or b.data.dim() != a.data.dim():
        raise DslError(f"pl.matmul: operands must both be rank 2 ([M, K] @ [K, N]) or both rank 3 (batched), "
                       f"got {list(a.shape)} and {list(b.shape)}")
    if a.data.dim() == 3 and a.shape[0] != b.shape[0]:
        raise DslError(f"pl.matmul: batch mismatch, a is {list(a.shape)} and b is {list(b.shape)}")
    A = a.data.transpose(-1, -2) if a_trans else a.data
    B = b.data.transpose(-1, -2) if b_trans else b.data
    if A.shape[-1] != B.shape[-2]:
        raise DslError(f"pl.matmul: K mismatch, a is {list(A.shape)} and b is {list(B.shape)}"
                       f"{' (b_trans)' if b_trans else ''}")
    if A.is_meta or B.is_meta:  # graph-only mode: the shape and the counters only
        return _meta_matmul(a, b, A, B, out_dtype)
    if A.dtype in _FLOAT_MM and B.dtype in _FLOAT_MM:
        if A.dtype != B.dtype:
            raise DslError(f"pl.matmul: operand dtypes differ ({a.dtype} vs {b.dtype})")
        acc = FP32
        out = torch.matmul(A.float(), B.float())  # = .to(torch.float32), cheaper
    elif A.dtype == torch.int8 and B.dtype == torch.int8:
        acc = INT32
        if A.dim() == 2 and A.numel() and B.numel() and A.shape[-1] <= (1 << 17):
            # exact INT32 sums (|sum| <= K * 2^14 < 2^31) on this machine's faster backend
            out = _int8_mm(A, B)
        else:  # batched, empty or K past 2^17: the exact floating-point form
            out = _int8_mm_float(A, B)
    else:
        raise DslError(f"pl.matmul: unsupported operand dtypes {a.dtype} x {b.dtype} "
                       "(BF16/FP16/FP32 pairs or INT8 x INT8)")
    if out_dtype is not None and as_dtype(out_dtype) is not acc:
        raise DslError(f"pl.matmul: out_dtype must be the accumulator dtype {acc}, got {as_dtype(out_dtype)}")
    mask = None
    if a.mask is not None or b.mask is not None:
        ma = a.mask.transpose(-1, -2) if (a.mask is not None and a_trans) else a.mask
        mb = b.mask.transpose(-1, -2) if (b.mask is not None and b_trans) else b.mask
        rows = torch.zeros(A.shape[:-1], dtype=torch.int32) if ma is None else ma.amax(dim=-1)
        cols = torch.zeros(B.shape[:-2] + B.shape[-1:], dtype=torch.int32) if mb is None else mb.amax(dim=-2)
        mask = torch.maximum(rows.unsqueeze(-1), cols.unsqueeze(-2))
    _count(2 * out.numel() * A.shape[-1])
    blk = _state.block
    if blk is not None:
        blk.cube = True
        blk.mm += 1
    return Tile(out, mask)


def _meta_matmul(a: Tile, b: Tile, A: torch.Tensor, B: torch.Tensor, out_dtype) -> Tile:
    """:func:`matmul` of shape-only operands (graph-only mode): the dtype rules, the counters
    and an unknown ``[.., M, N]`` result of the accumulator dtype."""
    if A.dtype in _FLOAT_MM and B.dtype in _FLOAT_MM and A.dtype == B.dtype:
        acc = FP32
    elif A.dtype == torch.int8 and B.dtype == torch.int8:
        acc = INT32
    else:
        raise DslError(f"pl.matmul: unsupported operand dtypes {a.dtype} x {b.dtype} "
                       "(BF16/FP16/FP32 pairs or INT8 x INT8)")
    if out_dtype is not None and as_dtype(out_dtype) is not acc:
        raise DslError(f"pl.matmul: out_dtype must be the accumulator dtype {acc}, got {as_dtype(out_dtype)}")
    shape = list(A.shape[:-1]) + [B.shape[-1]]
    _count(2 * math.prod(shape) * A.shape[-1])
    blk = _state.block
    if blk is not None:
        blk.cube = True
        blk.mm += 1
    return Tile(_meta(shape, acc.torch))


def matmul_acc(acc, a, b, a_trans: bool = False, b_trans: bool = False, init_cond=None) -> Tile:
    """``acc + a @ b`` (K-loop accumulation; acc FP32 or INT32, matching the operands).

    ``init_cond``: when true, ``a @ b`` overwrites ``acc`` (its old contents, possibly an
    uninitialised buffer, are not read): the first step of a K loop written as one call.

    Raises:
        DslError: as :func:`matmul`, or an accumulator of the wrong dtype/shape.
    """
    acc = _as_tile(acc, "pl.matmul_acc")
    part = matmul(a, b, a_trans=a_trans, b_trans=b_trans)
    if part.data.dtype != acc.data.dtype or part.shape != acc.shape:
        raise DslError(f"pl.matmul_acc: accumulator {acc} does not match product {part}")
    if init_cond is not None and concrete(init_cond, "a matmul_acc init_cond"):
        return part
    if acc.data.is_meta or part.data.is_meta:  # graph-only mode
        return Tile(_meta(acc.data.shape, acc.data.dtype))
    out = Tile(acc.data + part.data, _and(acc.mask, part.mask))
    ba, bp = _int_bound(acc), _int_bound(part)
    if ba is not None and bp is not None:  # |acc + part| <= |acc| + |part|
        try:
            out._ib = (out.data, out.data._version, ba + bp)
        except RuntimeError:  # an inference-mode tensor has no version counter
            pass
    return out


# ---- valid shape -----------------------------------------------------------------

def set_validshape(x, valid_rows, valid_cols) -> Tile:
    """Declare the meaningful top-left ``[valid_rows, valid_cols]`` region of a
    rank-2 tile (metadata only; no data moves).

    Raises:
        DslError: a non-rank-2 tile or extents outside the tile.
    """
    x = _need_rank2("set_validshape", x)
    vr, vc = as_int(valid_rows, "a valid row count"), as_int(valid_cols, "a valid col count")
    if not (0 <= vr <= x.shape[0] and 0 <= vc <= x.shape[1]):
        raise DslError(f"pl.set_validshape: [{vr}, {vc}] outside tile {list(x.shape)}")
    return Tile(x.data, x.mask, (vr, vc))


def _pad_scalar(dtype: torch.dtype, pad) -> float | int:
    if pad in (PadValue.zero, 0):
        return 0
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        if pad in (PadValue.min, -math.inf):
            return info.min
        if pad in (PadValue.max, math.inf):
            return info.max
    else:
        info = torch.iinfo(dtype) if dtype != torch.bool else None
        if info is not None and pad in (PadValue.min, -math.inf):
            return info.min
        if info is not None and pad in (PadValue.max, math.inf):
            return info.max
    raise DslError(f"pl.fillpad: pad value must be PadValue.zero/min/max, got {pad!r}")


def fillpad(x, pad_value=PadValue.zero) -> Tile:
    """Materialise the padding: elements outside the valid region become 0, the
    most negative finite value (``min``) or the largest (``max``). The padded
    elements are defined. The result's valid region is the full tile.

    Raises:
        DslError: an unknown pad value.
    """
    x = _as_tile(x, "pl.fillpad")
    v = _pad_scalar(x.data.dtype, pad_value)
    _count(x.data.numel())
    if x.data.is_meta:  # graph-only mode
        return Tile(_meta(x.data.shape, x.data.dtype), None if x.valid is None else x.mask)
    if x.valid is None:
        return Tile(x.data.clone(), x.mask)
    data = torch.full_like(x.data, v)
    key = tuple(slice(0, int(e)) for e in x.valid)
    data[key] = x.data[key]
    mask = None
    if x.mask is not None:
        mask = torch.zeros_like(x.mask)
        mask[key] = x.mask[key]
    return Tile(data, mask)


# ---- compare / select, sort and merge (the top-k primitives of the indexers) -------------------

CMP_MODES = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


def cmp(lhs, rhs, cmp_mode: str = "eq") -> Tile:
    """Elementwise comparison ``lhs <op> rhs`` as a BOOL tile (1 = true).

    ``cmp_mode`` is one of ``eq ne lt le gt ge``. ``rhs`` is a tile of ``lhs``'s shape and
    dtype, or a number (the scalar form). IEEE rules: any comparison with NaN is false except
    ``ne``. The definedness mask is the AND of the operands' masks. The Python comparison
    operators on a tile are this op (``t < x`` is ``cmp(t, x, "lt")``, ``t == x`` is
    ``cmp(t, x, "eq")``); a number takes the tile's dtype, as in every scalar form.

    Raises:
        DslError: an unknown ``cmp_mode``, the shape / dtype rules of every elementwise op, or a
            number that is fractional or outside the range of an integer ``lhs``'s dtype.
    """
    fn = CMP_MODES.get(cmp_mode)
    if fn is None:
        raise DslError(f"pl.cmp: cmp_mode must be one of {sorted(CMP_MODES)}, got {cmp_mode!r}")
    lhs = _as_tile(lhs, "pl.cmp")
    if isinstance(rhs, (Tile, torch.Tensor)):
        rhs = _as_tile(rhs, "pl.cmp")
        if rhs.data.dtype != lhs.data.dtype or rhs.data.shape != lhs.data.shape:
            raise DslError(f"pl.cmp: operands must match in shape and dtype, got {lhs} and {rhs}")
        unknown = lhs.data.is_meta or rhs.data.is_meta  # graph-only mode
        out = _meta(lhs.data.shape, torch.bool) if unknown else fn(lhs.data, rhs.data)
        mask = _and(lhs.mask, rhs.mask)
    else:
        if isinstance(rhs, ScalarValue) and rhs.symbolic and type(rhs.v) is int and not lhs.data.dtype.is_floating_point:
            # an int symbol (program cache, block templates: runtime/symbolic.py) stays one: the torch
            # op records its expression; the range check below compares it (guards on its outcome)
            r = _INT_RANGE.get(lhs.data.dtype)
            if r is not None and not (r[0] <= rhs and rhs <= r[1]):
                _int_range_error("pl.cmp", rhs.value, lhs.data.dtype, _SCALAR_HINT)
            v, oid = rhs, 0
        else:
            v, oid = _scalar(rhs, "pl.cmp")
        if not oid and not lhs.data.dtype.is_floating_point and not getattr(v, "symbolic", False):
            if isinstance(v, float) and not v.is_integer():
                raise DslError(f"pl.cmp: fractional scalar {v} with a {lhs.dtype} tile (no implicit promotion; "
                               "cast the tile to a float dtype first)")
            if not _int_fits(v, lhs.data.dtype):
                _int_range_error("pl.cmp", v, lhs.data.dtype, _SCALAR_HINT)
        unknown = lhs.data.is_meta or isinstance(rhs, _MetaScalar)  # graph-only mode
        out = _meta(lhs.data.shape, torch.bool) if unknown else fn(lhs.data, _number_operand(lhs.data, v))
        mask = lhs.mask if not oid else _and(lhs.mask, torch.full(lhs.data.shape, oid, dtype=torch.int32))
    _count(out.numel())
    return Tile(out, mask, lhs.valid)


def select(mask, a, b) -> Tile:
    """Elementwise ``mask ? a : b``: ``mask`` a BOOL tile (e.g. from :func:`cmp`), ``a`` a tile,
    ``b`` a tile of ``a``'s shape and dtype or a number. The result's definedness is the
    chosen operand's definedness AND the mask's.

    Raises:
        DslError: a non-BOOL mask, shapes that differ, dtypes that differ, or a fractional
            number or one outside the dtype's range with an integer tile.
    """
    m = _as_tile(mask, "pl.select")
    a = _as_tile(a, "pl.select")
    if m.data.dtype != torch.bool:
        raise DslError(f"pl.select: mask must be a BOOL tile (pl.cmp), got {m.dtype}")
    if m.data.shape != a.data.shape:
        raise DslError(f"pl.select: mask {list(m.shape)} and operand {list(a.shape)} differ in shape")
    if isinstance(b, (Tile, torch.Tensor)):
        b = _as_tile(b, "pl.select")
        if b.data.dtype != a.data.dtype or b.data.shape != a.data.shape:
            raise DslError(f"pl.select: operands must match in shape and dtype, got {a} and {b}")
        bd, bm = b.data, b.mask
    else:
        v, oid = _scalar(b, "pl.select")
        if isinstance(v, float) and not a.data.dtype.is_floating_point and not v.is_integer():
            raise DslError(f"pl.select: fractional value {v} with a {a.dtype} tile")
        if not _int_fits(v, a.data.dtype):
            if not oid:
                _int_range_error("pl.select", v, a.data.dtype, _SCALAR_HINT)
            v = 0  # an undefined scalar (check mode): its elements are marked undefined
        if isinstance(v, (int, float)) and not isinstance(v, bool) and a.data.dtype.is_floating_point:
            v = _fit_float(v, a.data.dtype)
        # graph-only mode: an unknown operand gives an unknown result (torch's meta full_like runs in Python)
        unknown = isinstance(b, _MetaScalar) or a.data.is_meta or m.data.is_meta
        bd = _meta(a.data.shape, a.data.dtype) if unknown else torch.full_like(a.data, v)
        bm = torch.full(a.data.shape, oid, dtype=torch.int32) if oid else None
    if m.data.is_meta or a.data.is_meta or bd.is_meta:  # graph-only mode
        _count(a.data.numel())
        return Tile(_meta(a.data.shape, a.data.dtype), None, a.valid)
    out = torch.where(m.data, a.data, bd)
    mask_out = None
    if a.mask is not None or bm is not None:
        am = a.mask if a.mask is not None else torch.zeros(a.data.shape, dtype=torch.int32)
        bmm = bm if bm is not None else torch.zeros(a.data.shape, dtype=torch.int32)
        mask_out = torch.where(m.data, am, bmm)
    mask_out = _and(mask_out, m.mask)
    _count(out.numel())
    return Tile(out, mask_out, a.valid)


class MaskPattern:
    """Lane patterns of :func:`gather`'s mask form (hw-native-sys/pypto `docs/en/user/`). The rightmost
    character is lane 0: ``P0101`` keeps the even lanes, ``P1010`` the odd lanes (the indices of
    sort32 / mrgsort pairs), ``P0001 .. P1000`` one lane of every 4, ``P1111`` all lanes."""

    P0101, P1010, P0001, P0010, P0100, P1000, P1111 = 1, 2, 3, 4, 5, 6, 7


# pattern id -> (period, kept lane offsets inside the period)
_MASK_LANES = {1: (2, (0,)), 2: (2, (1,)), 3: (4, (0,)), 4: (4, (1,)), 5: (4, (2,)), 6: (4, (3,)),
               7: (1, (0,))}
_BITS32 = (torch.float32, torch.int32, torch.uint32)


def _gather_mask(x, mask_pattern, output_dtype) -> Tile:
    """Mask form of :func:`gather` (see there)."""
    x = _need_rank2("gather", x)
    lanes = _MASK_LANES.get(mask_pattern if not isinstance(mask_pattern, bool) else None)
    if lanes is None:
        raise DslError(f"pl.gather: unknown mask_pattern {mask_pattern!r}; use pl.MaskPattern.P0101 .. P1111")
    period, keep = lanes
    n = x.shape[1]
    if n % period:
        raise DslError(f"pl.gather: mask_pattern period {period} does not divide the last dim {n}")
    data = x.data[:, keep[0]::period].contiguous()
    mask = None if x.mask is None else x.mask[:, keep[0]::period].contiguous()
    if output_dtype is not None:
        dt = as_dtype(output_dtype).torch
        if dt != data.dtype:
            if data.dtype not in _BITS32 or dt not in _BITS32:
                raise DslError(f"pl.gather: output_dtype reinterprets 32-bit lanes (FP32 / INT32 / UINT32), "
                               f"got {x.dtype} -> {as_dtype(output_dtype)}")
            data = data.view(dt)
    _count(data.numel())
    return Tile(data, mask)


def _pairs(x, op: str) -> Tile:
    """A rank-2 FP32 tile of interleaved (value, index-bits) pairs."""
    x = _need_rank2(op, x)
    if x.data.dtype != torch.float32:
        raise DslError(f"pl.{op}: value/index pairs are FP32 lanes, got {x.dtype}")
    if x.shape[1] % 2:
        raise DslError(f"pl.{op}: pair tile needs an even last dim, got {list(x.shape)}")
    return x


def _stable_desc(pairs: torch.Tensor, pmask, groups: int):
    """Stable descending sort of the pairs inside each of ``groups`` equal lane groups per row."""
    rows, lanes = pairs.shape
    v = pairs.view(rows, groups, lanes // (2 * groups), 2)
    order = torch.sort(v[..., 0], dim=-1, descending=True, stable=True).indices
    idx = order.unsqueeze(-1).expand(-1, -1, -1, 2)
    out = torch.gather(v, 2, idx).reshape(rows, lanes)
    mask = None
    if pmask is not None:
        # a pair moves as one: its mask is the AND of its two lanes
        m = pmask.view(rows, groups, lanes // (2 * groups), 2).amax(dim=-1, keepdim=True).expand(-1, -1, -1, 2)
        mask = torch.gather(m, 2, idx).reshape(rows, lanes).contiguous()
    return out, mask


def sort32(src, idx) -> Tile:
    """Sort every run of 32 consecutive values of each row descending, carrying an index along.

    ``src`` is a rank-2 FP32 tile ``[R, N]`` (``N`` a multiple of 32); ``idx`` a UINT32 or
    INT32 tile ``[R, N]`` or ``[1, N]`` (broadcast to every row; kernels seed it with
    ``pl.arange(0, [1, N], pl.UINT32)``). The result is ``[R, 2N]`` FP32: pairs ``(value,
    index)`` interleaved, the index stored as its raw 32 bits in the odd lanes (read them with
    ``pl.gather(out, mask_pattern=pl.MaskPattern.P1010, output_dtype=pl.INT32)``).

    Tie order: **stable** -- equal values keep their input order, so with an ascending index
    seed the lower index comes first (torch ``sort(descending=True, stable=True)``). NaN sorts
    first (torch's descending order). Each pair's definedness is the AND of its value's and
    index's.

    Raises:
        DslError: ranks other than 2, a non-FP32 ``src``, ``N`` not a multiple of 32, or an
            ``idx`` of another dtype or shape.
    """
    src = _need_rank2("sort32", src)
    ix = _need_rank2("sort32", idx)
    if src.data.dtype != torch.float32:
        raise DslError(f"pl.sort32: src must be FP32, got {src.dtype}")
    rows, n = src.shape
    if n % 32:
        raise DslError(f"pl.sort32: last dim {n} is not a multiple of 32")
    if ix.data.dtype not in (torch.int32, torch.uint32) or ix.shape[1] != n or ix.shape[0] not in (1, rows):
        raise DslError(f"pl.sort32: idx must be an INT32/UINT32 [1, {n}] or [{rows}, {n}] tile, got {ix}")
    if ix.data.is_meta:  # graph-only mode: unknown indices, unknown pairs
        _count(rows * 2 * n * 5)
        return Tile(_meta([rows, 2 * n], torch.float32))
    if src.data.is_meta:
        # graph-only mode, the ties assumption (pto.language.graph_only): unknown values sort as
        # equal values (placeholder 0.0), so the stable sort leaves the index lanes in input order
        _go.count_sort()
        bits = ix.data.view(torch.float32).expand(rows, n)
        _count(rows * 2 * n * 5)
        return Tile(torch.stack([torch.zeros(rows, n), bits], dim=-1).reshape(rows, 2 * n))
    bits = ix.data.view(torch.float32).expand(rows, n)
    pairs = torch.stack([src.data, bits], dim=-1).reshape(rows, 2 * n)
    pmask = None
    if src.mask is not None or ix.mask is not None:
        sm = src.mask if src.mask is not None else torch.zeros(rows, n, dtype=torch.int32)
        im = ix.mask.expand(rows, n) if ix.mask is not None else torch.zeros(rows, n, dtype=torch.int32)
        pmask = torch.stack([sm, im], dim=-1).reshape(rows, 2 * n)
    out, mask = _stable_desc(pairs, pmask, n // 32)
    _count(out.numel() * 5)
    return Tile(out, mask)


def _check_runs(x: torch.Tensor, run_lanes: int, op: str) -> None:
    rows, lanes = x.shape
    v = x.view(rows, -1, run_lanes // 2, 2)[..., 0]
    if v.shape[-1] > 1 and bool((v[..., 1:] > v[..., :-1]).any()):
        raise DslError(f"pl.{op}: input runs of {run_lanes} lanes are not sorted descending "
                       "(merge sorted runs from pl.sort32 / an earlier pl.mrgsort)")


def mrgsort(*srcs, block_len=None, exhausted: bool = False, tmp=None) -> Tile:
    """Merge sorted runs of (value, index) pairs, descending (hw-native-sys/pypto `docs/en/user/`).

    Format 1 ``mrgsort(src, block_len=L)``: ``src`` ``[R, M]`` FP32 pair lanes holding sorted
    runs of ``L`` lanes (``L`` even; ``M`` a multiple of ``L``); every 4 consecutive runs merge
    into one run of ``4L`` lanes (a last group of fewer runs merges what it has).
    Format 2 ``mrgsort(a, b[, c, d])``: 2-4 sorted pair tiles with the same row count merge
    into one ``[R, sum M_i]`` run.

    Tie order: stable -- among equal values the pair from the earlier run (format 1) or the
    earlier argument (format 2) comes first; after :func:`sort32` with an ascending index seed
    this keeps equal values in ascending index order end to end. ``exhausted`` and ``tmp``
    are accepted for source compatibility (on the device they select the early-exit mode and
    the scratch tile) and do not change the result.

    Raises:
        DslError: a non-FP32 or odd-width pair tile, a ``block_len`` that does not divide the
            width, runs that are not sorted descending, mixed row counts, format 1 with more
            than one source or format 2 with ``block_len`` or with 1 or more than 4 sources.
    """
    if block_len is not None:
        if len(srcs) != 1:
            raise DslError(f"pl.mrgsort: format 1 (block_len=) takes one source, got {len(srcs)}")
        x = _pairs(srcs[0], "mrgsort")
        L = as_int(block_len, "block_len")
        rows, m = x.shape
        if L <= 0 or L % 2 or m % L:
            raise DslError(f"pl.mrgsort: block_len={L} must be even and divide the width {m}")
        if x.data.is_meta:  # graph-only mode
            _count(rows * m * 2)
            return Tile(_meta([rows, m], torch.float32))
        _check_runs(x.data, L, "mrgsort")
        group = 4 * L
        pad = (-m) % group
        data, mask = x.data, x.mask
        if pad:  # the last group has fewer runs: merge it on its own
            head = m - (m % group)
            out_h, mask_h = _stable_desc(data[:, :head], None if mask is None else mask[:, :head],
                                         max(head // group, 1)) if head else (data[:, :0], None)
            out_t, mask_t = _stable_desc(data[:, head:], None if mask is None else mask[:, head:], 1)
            out = torch.cat([out_h, out_t], dim=1)
            mout = None if mask is None else torch.cat([mask_h if head else mask[:, :0], mask_t], dim=1)
        else:
            out, mout = _stable_desc(data, mask, m // group)
        _count(out.numel() * 2)
        return Tile(out, mout)
    if not 2 <= len(srcs) <= 4:
        raise DslError(f"pl.mrgsort: format 2 merges 2 to 4 sorted tiles, got {len(srcs)}")
    tiles = [_pairs(s, "mrgsort") for s in srcs]
    rows = tiles[0].shape[0]
    if any(t.shape[0] != rows for t in tiles):
        raise DslError(f"pl.mrgsort: sources differ in row count: {[list(t.shape) for t in tiles]}")
    if any(t.data.is_meta for t in tiles):  # graph-only mode
        width = sum(t.shape[1] for t in tiles)
        _count(rows * width * 2)
        return Tile(_meta([rows, width], torch.float32))
    for t in tiles:
        _check_runs(t.data, t.shape[1], "mrgsort")
    data = torch.cat([t.data for t in tiles], dim=1)
    mask = None
    if any(t.mask is not None for t in tiles):
        mask = torch.cat([t.mask if t.mask is not None else torch.zeros(t.data.shape, dtype=torch.int32)
                          for t in tiles], dim=1)
    out, mout = _stable_desc(data, mask, 1)
    _count(out.numel() * 2)
    return Tile(out, mout)
