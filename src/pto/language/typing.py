"""Parameter annotations and scalar values of the DSL.

``pl.Tensor[[T, D], pl.BF16]`` is a GM tensor parameter (direction In);
``pl.Out[...]`` and ``pl.InOut[...]`` set the direction; ``pl.PartialOut[...]`` is
an Out the program may leave partly unwritten on purpose; ``pl.Scalar[pl.INT32]``
is a by-value scalar; ``pl.dynamic("T")`` is a symbolic dimension bound on first
use and checked for agreement across arguments (docs/dsl.md).
"""

from __future__ import annotations

import operator

from pto.errors import DslError, UndefinedValueError
from pto.language.dtypes import DType, as_dtype

__all__ = ["Tensor", "Out", "InOut", "PartialOut", "Scalar", "dynamic", "DynVar", "TensorType",
           "ScalarType", "ScalarValue", "IN", "OUT", "INOUT", "as_int"]

IN, OUT, INOUT = "in", "out", "inout"


class DynVar:
    """A symbolic dimension. Every dim of a kernel's annotations with this name (the same
    object, or another ``pl.dynamic`` of the same name) must bind to the same extent within one
    call, as ``pto run --dim NAME=N`` and ``Program.dyn_dims`` name them."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"pl.dynamic({self.name!r})"


def dynamic(name: str) -> DynVar:
    """A symbolic dimension called ``name`` (dtype INDEX)."""
    return DynVar(name)


class TensorType:
    """Annotation of a GM tensor parameter: dims (ints or DynVar), dtype, direction.

    ``partial`` (only with direction ``out``): ``pl.PartialOut``, an output whose unwritten
    elements keep the caller's values; check mode neither poisons it nor reports its
    unwritten elements (a plain ``pl.Out`` must be written everywhere).
    """

    __slots__ = ("dims", "dtype", "direction", "partial")

    def __init__(self, dims, dtype, direction=IN, partial: bool = False):
        if dims is not None:
            for d in dims:
                if isinstance(d, bool) or not isinstance(d, (int, DynVar)):
                    raise DslError(f"tensor annotation dims must be ints or pl.dynamic, got {d!r}")
                if isinstance(d, int) and d < 0:
                    raise DslError(f"tensor annotation dims must not be negative, got {list(dims)}")
            dims = tuple(dims)
        self.dims = dims
        self.dtype = as_dtype(dtype) if dtype is not None else None
        self.direction = direction
        self.partial = partial and direction == OUT

    def with_direction(self, direction: str, partial: bool = False) -> "TensorType":
        """The same annotation with direction ``in`` / ``out`` / ``inout`` (``partial``: PartialOut)."""
        return TensorType(self.dims, self.dtype, direction, partial)

    def __repr__(self) -> str:
        inner = f"pl.Tensor[{list(self.dims) if self.dims is not None else '...'}, {self.dtype}]"
        if self.direction == IN:
            return inner
        word = "PartialOut" if self.partial else "Out" if self.direction == OUT else "InOut"
        return f"pl.{word}[{inner}]"


class _TensorFactory:
    """``pl.Tensor[[dims], dtype]``; bare ``pl.Tensor`` accepts any shape and dtype."""

    def __getitem__(self, item):
        if not (isinstance(item, tuple) and len(item) == 2):
            raise DslError("use pl.Tensor[[dim, ...], dtype]")
        dims, dtype = item
        return TensorType(list(dims), dtype)

    def __repr__(self) -> str:
        return "pl.Tensor"


class _DirFactory:
    def __init__(self, direction: str, word: str, partial: bool = False):
        self.direction = direction
        self.word = word
        self.partial = partial

    def __getitem__(self, item):
        if isinstance(item, _TensorFactory):
            return TensorType(None, None, self.direction, self.partial)
        if not isinstance(item, TensorType):
            raise DslError(f"pl.{self.word}[...] takes a pl.Tensor[...] annotation, got {item!r}")
        return item.with_direction(self.direction, self.partial)

    def __repr__(self) -> str:
        return f"pl.{self.word}"


Tensor = _TensorFactory()
Out = _DirFactory(OUT, "Out")
InOut = _DirFactory(INOUT, "InOut")
# An Out the program may leave partly unwritten on purpose (e.g. rows of requests that do not
# compress): unwritten elements keep the caller's values, check mode does not report them.
PartialOut = _DirFactory(OUT, "PartialOut", partial=True)


class ScalarType:
    """Annotation of a by-value scalar parameter of a given dtype."""

    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = as_dtype(dtype)

    def __repr__(self) -> str:
        return f"pl.Scalar[{self.dtype}]"


class _ScalarFactory:
    def __getitem__(self, dtype):
        return ScalarType(dtype)


Scalar = _ScalarFactory()


class ScalarValue:
    """A scalar read from an undefined GM or tile element in check mode: a
    number plus a definedness bit, the origin text and the undefinedness tag
    (``oid``; see pto/runtime/sanitizer.py).

    Arithmetic with numbers and other ScalarValues propagates definedness;
    with a tile the tile op takes it as an undefined scalar operand. Using an
    undefined value as an index, loop bound, branch condition, dict key or
    Python ``int``/``float`` raises :class:`pto.UndefinedValueError` at once
    (docs/dsl.md), naming the use site and the origin. ``pl.read``
    returns plain Python numbers for defined elements and outside check mode.
    """

    __slots__ = ("value", "defined", "origin", "oid")
    symbolic = False  # True for the program cache's symbols (pto.runtime.symbolic.Sym)

    def __init__(self, value, defined: bool, origin: str = "", oid: int = 0):
        self.value = value
        self.defined = defined
        self.origin = origin
        self.oid = oid  # allocation id the undefined value came from

    def _need(self, use: str):
        if not self.defined:
            from pto.language import _ctx
            f = _ctx.user_frame()
            site = f" at {_ctx.frame_site(f)}" if f is not None else ""
            blk = _ctx.state.block
            where = f" (task {blk.task.name!r} block {blk.idx})" if blk is not None else ""
            raise UndefinedValueError(
                f"undefined scalar used as {use}{site}{where}: it was read from "
                f"{self.origin or 'an undefined element'}")
        return self.value

    def __index__(self):
        return int(self._need("an index or loop bound"))

    def __int__(self):
        return int(self._need("an integer"))

    def __float__(self):
        return float(self._need("a float"))

    def __bool__(self):
        return bool(self._need("a branch condition"))

    def __repr__(self) -> str:
        return f"ScalarValue({self.value!r}{'' if self.defined else ', undefined'})"

    def __hash__(self):
        return hash(self._need("a dictionary key"))

    def _bin(self, other, fn):
        if isinstance(other, ScalarValue):
            src = self if not self.defined else other
            return ScalarValue(fn(self.value, other.value), self.defined and other.defined,
                               src.origin, src.oid)
        if not isinstance(other, (int, float, bool)):
            return NotImplemented  # e.g. a Tile: its reflected op takes the scalar with its mask
        return ScalarValue(fn(self.value, other), self.defined, self.origin, self.oid)

    def _rbin(self, other, fn):
        if not isinstance(other, (int, float, bool)):
            return NotImplemented
        return ScalarValue(fn(other, self.value), self.defined, self.origin, self.oid)

    __add__ = lambda s, o: s._bin(o, lambda a, b: a + b)
    __radd__ = lambda s, o: s._rbin(o, lambda a, b: a + b)
    __sub__ = lambda s, o: s._bin(o, lambda a, b: a - b)
    __rsub__ = lambda s, o: s._rbin(o, lambda a, b: a - b)
    __mul__ = lambda s, o: s._bin(o, lambda a, b: a * b)
    __rmul__ = lambda s, o: s._rbin(o, lambda a, b: a * b)
    __truediv__ = lambda s, o: s._bin(o, lambda a, b: a / b)
    __rtruediv__ = lambda s, o: s._rbin(o, lambda a, b: a / b)
    __floordiv__ = lambda s, o: s._bin(o, lambda a, b: a // b)
    __rfloordiv__ = lambda s, o: s._rbin(o, lambda a, b: a // b)
    __mod__ = lambda s, o: s._bin(o, lambda a, b: a % b)
    __rmod__ = lambda s, o: s._rbin(o, lambda a, b: a % b)
    __pow__ = lambda s, o: s._bin(o, lambda a, b: a ** b)
    __rpow__ = lambda s, o: s._rbin(o, lambda a, b: a ** b)
    __and__ = lambda s, o: s._bin(o, lambda a, b: a & b)
    __rand__ = lambda s, o: s._rbin(o, lambda a, b: a & b)
    __or__ = lambda s, o: s._bin(o, lambda a, b: a | b)
    __ror__ = lambda s, o: s._rbin(o, lambda a, b: a | b)
    __xor__ = lambda s, o: s._bin(o, lambda a, b: a ^ b)
    __rxor__ = lambda s, o: s._rbin(o, lambda a, b: a ^ b)
    __lshift__ = lambda s, o: s._bin(o, lambda a, b: a << b)
    __rlshift__ = lambda s, o: s._rbin(o, lambda a, b: a << b)
    __rshift__ = lambda s, o: s._bin(o, lambda a, b: a >> b)
    __rrshift__ = lambda s, o: s._rbin(o, lambda a, b: a >> b)
    __lt__ = lambda s, o: s._bin(o, lambda a, b: a < b)
    __le__ = lambda s, o: s._bin(o, lambda a, b: a <= b)
    __gt__ = lambda s, o: s._bin(o, lambda a, b: a > b)
    __ge__ = lambda s, o: s._bin(o, lambda a, b: a >= b)
    __eq__ = lambda s, o: s._bin(o, lambda a, b: a == b)
    __ne__ = lambda s, o: s._bin(o, lambda a, b: a != b)
    __neg__ = lambda s: ScalarValue(-s.value, s.defined, s.origin, s.oid)
    __abs__ = lambda s: ScalarValue(abs(s.value), s.defined, s.origin, s.oid)
    __invert__ = lambda s: ScalarValue(~s.value, s.defined, s.origin, s.oid)


def concrete(v, use: str = "a value"):
    """A plain Python number from an int/float/bool or a defined ScalarValue."""
    if isinstance(v, ScalarValue):
        return v._need(use)
    return v


def as_int(v, use: str) -> int:
    """A Python int from ``v`` used as ``use`` (an index, a bound, a dim, a block count).

    Accepts ints and anything with ``__index__`` (numpy and 0-dim torch integers, a defined
    ScalarValue holding an int); never truncates.

    Raises:
        DslError: a float (even an integral one), a bool, a ``pl.dynamic`` dim (pointing to
            ``pl.tensor.dim``) or a non-number, naming ``use`` and the kernel source line.
        UndefinedValueError: an undefined ScalarValue (check mode).
    """
    if type(v) is int:
        return v
    if isinstance(v, ScalarValue):
        if v.symbolic and type(v.v) is int:
            return v  # a symbolic int of a program-cache recording (runtime/symbolic.py) stays symbolic
        v = v._need(use)
    if isinstance(v, DynVar):
        from pto.language import _ctx
        f = _ctx.user_frame()
        site = f" at {_ctx.frame_site(f)}" if f is not None else ""
        raise DslError(f"{use} is the symbolic dim pl.dynamic({v.name!r}){site}, which has no value outside an "
                       f"annotation; use its runtime extent: pl.tensor.dim(x, axis) of a parameter x annotated "
                       f"with {v.name} (e.g. {v.name.lower()} = pl.tensor.dim(x, 0))")
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    from pto.language import _ctx
    f = _ctx.user_frame()
    site = f" at {_ctx.frame_site(f)}" if f is not None else ""
    raise DslError(f"{use} must be an int, got {type(v).__name__} {v!r}{site} (pto never truncates; write "
                   f"int(...) or use // if that is meant)")
