"""Symbolic scalars of a parametric recording (the program cache, runtime/replay.py).

While the program cache records a run, a number the program reads from a tensor (``item``,
``tolist``: ``pl.read`` and the tile reads behind it) comes back as a :class:`Sym`: the number
read (``v``) and an expression over the recording's scalar reads (``n``). Arithmetic on symbols
gives symbols; a torch operation handed one records its expression, evaluated at replay from
that replay's reads. Every other way a number can leave the symbolic world records a *guard*
the replay checks before going on:

* a comparison (``<``, ``==``, ...) and ``bool``: the outcome (``s < 4`` was True);
* ``__index__``, ``__int__``, ``__float__``, ``__hash__``, ``repr`` / ``str`` / ``format``, the
  ``value`` attribute of a :class:`~pto.language.typing.ScalarValue` (what DSL code reads from a
  scalar it cannot keep symbolic) and anything else: the exact value.

A Sym is not an ``int`` or ``float`` subclass on purpose: CPython hands the digits of an int
subclass to C code (list indexing, ``range``, ``struct``, torch's argument parser) without
calling any method, which would let a read value steer the program unguarded. A Sym is a
:class:`~pto.language.typing.ScalarValue` (defined), so the DSL's scalar paths accept it. Its
``__class__`` is its number's (``int`` / ``float``), so ``isinstance`` answers as in a plain run;
``type(s)``, ``id(s)`` and ``is`` cannot be intercepted, so while a recording runs, the first call
of every code object outside pto's DSL and runtime, torch and the standard library is examined
(:func:`observes_identity`): one that loads the builtin ``type`` or ``id`` or compares by ``is``
(other than with None, a bool, a str or ``...``) stops the recording before it runs. Not seen: C
extension code, and ``type`` / ``id`` handed to a function only on a later call than its first.

Expressions are tuples ``(op, a, b)`` / ``(op, a)`` over leaves ``("R", k)`` (the value of read
number ``k``) and ``("L", k, path)`` (element ``path`` of the list read ``k``); any other value
is a constant. :func:`evaluate` computes one from the reads of a replay and :func:`source`
writes it as Python for the generated replay code.
"""

from __future__ import annotations

import math
import operator
import sys

from pto.language.typing import ScalarValue

__all__ = ["Sym", "evaluate", "source", "concrete_of", "has_sym", "observes_identity", "trusted"]

_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
        "%": operator.mod, "**": operator.pow, "&": operator.and_, "|": operator.or_, "^": operator.xor,
        "<<": operator.lshift, ">>": operator.rshift,
        "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}
_UN = {"neg": operator.neg, "abs": abs, "~": operator.invert, "floor": math.floor, "ceil": math.ceil,
       "trunc": math.trunc, "round": round}
_UN_SRC = {"neg": "(-{})", "abs": "abs({})", "~": "(~{})", "floor": "F({})", "ceil": "C({})", "trunc": "T({})",
           "round": "round({})"}
NAMESPACE = {"F": math.floor, "C": math.ceil, "T": math.trunc}  # what :func:`source` expects in scope


class Sym(ScalarValue):
    """A number read from data during a recording (module docstring).

    Attributes:
        v: the number read (an int or a float) or computed from reads.
        n: its expression.
        rec: the recorder it belongs to (guards go there while it records).
    """

    __slots__ = ("v", "n", "rec", "lin", "depth")
    symbolic = True

    def __init__(self, v, n, rec, lin=None, depth=0):
        if depth > MAX_DEPTH and rec.active:
            # a long chain (a running sum of reads): the recording computes it into a register once
            n = rec.materialize(n)
            lin, depth = None, 0
        self.v = v
        self.n = n
        self.rec = rec
        self.depth = depth
        # an int expression as a linear form ({leaf: coefficient}, constant), so that ``(p + 4) - p``
        # is the plain int 4 (a window's extent is no symbol); None for anything else
        self.lin = lin if lin is not None else ({n: 1}, 0) if type(v) is int and type(n) is tuple and (
            n[0] == "R" or n[0] == "L") else None
        self.defined = True
        self.origin = "a value read during a recording"
        self.oid = 0

    @property
    def __class__(self):
        """The class of the value (``int`` or ``float``): ``isinstance(s, int)``,
        ``isinstance(s, numbers.Integral)`` and ``s.__class__`` answer as for the plain number. The
        answer needs no guard: a read's type follows from its tensor's dtype (part of the key) and
        an arithmetic result's from its operands' (``**`` guards its exponent's sign).
        ``type(s)`` stays :class:`Sym`; code that calls ``type`` or ``id`` or compares by ``is``
        makes the recording give up (:func:`observes_identity`)."""
        return type(self.v)

    def __getattr__(self, name):
        """An attribute of the number a Sym does not define (``bit_length``, ``real``,
        ``numerator``, ``hex``, ...): the number's, with a guard on its exact value, so that
        ``hasattr`` and ``try: v.bit_length()`` answer as in a plain run."""
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._exact(), name)

    # ---- leaving the symbolic world: guards -----------------------------------------------
    def _exact(self):
        """The concrete value, with a guard on it."""
        rec = self.rec
        if rec.active and not rec.quiet:
            rec.guard_exact(self.n, self.v)
        return self.v

    @property
    def value(self):
        """The concrete value (a guard on it: the caller steers by it)."""
        return self._exact()

    def _need(self, use: str):
        return self._exact()

    def __index__(self):
        v = self.v
        if type(v) is not int:
            raise TypeError(f"'{type(v).__name__}' read from data cannot be interpreted as an integer")
        rec = self.rec
        if rec.active and not rec.quiet:
            # torch's argument parser calls __index__ while matching a signature, before the
            # recorder sees the call: the guard waits for the next event, and a torch call made by
            # the same bytecode instruction (that parser) cancels it (recorder.pending_index)
            f = sys._getframe(1)
            rec.pending_index(self.n, v, f, f.f_lasti)
        return v

    def __int__(self):
        return int(self._exact())

    def __float__(self):
        return float(self._exact())

    def __complex__(self):
        return complex(self._exact())

    def __hash__(self):
        return hash(self._exact())

    def __repr__(self):
        return repr(self._exact())

    def __str__(self):
        return str(self._exact())

    def __format__(self, spec):
        return format(self._exact(), spec)

    def __bool__(self):
        out = bool(self.v)
        rec = self.rec
        if rec.active and not rec.quiet:
            rec.guard_outcome(("!=", self.n, 0), out)
        return out

    def is_integer(self):
        """``float.is_integer`` of the value (a guard on the outcome)."""
        v = self.v
        out = v.is_integer() if type(v) is float else True
        rec = self.rec
        if rec.active and not rec.quiet and type(v) is float:
            rec.guard_outcome(("==", ("floor", self.n), self.n), out) if math.isfinite(v) else rec.guard_exact(
                self.n, v)
        return out

    # ---- arithmetic stays symbolic ------------------------------------------------------------
    def _mine(self, o):
        """(value, expression) of operand ``o``, or None when it is not a number."""
        t = type(o)
        if t is Sym:
            if o.rec is self.rec:
                return o.v, o.n
            return o.v, o.v  # a symbol of another (finished) recording: a constant here
        if t is int or t is float or t is bool:
            return o, o
        if isinstance(o, (int, float)) and not isinstance(o, ScalarValue):
            return o, o
        return None

    def _bin(self, other, op):
        m = self._mine(other)
        if m is None:
            return NotImplemented
        v = _BIN[op](self.v, m[0])
        if self.lin is not None and (op == "+" or op == "-" or op == "*") and type(v) is int:
            lin = _linear(op, self.lin, _lin_of(other, self.rec))
            if lin is not None:
                if not lin[0]:
                    return v  # no read left in it: a plain number
                return Sym(v, (op, self.n, m[1]), self.rec, lin, 1 + max(self.depth, _depth(other)))
        return Sym(v, (op, self.n, m[1]), self.rec, None, 1 + max(self.depth, _depth(other)))

    def _rbin(self, other, op):
        m = self._mine(other)
        if m is None:
            return NotImplemented
        v = _BIN[op](m[0], self.v)
        if self.lin is not None and (op == "+" or op == "-" or op == "*") and type(v) is int:
            lin = _linear(op, _lin_of(other, self.rec), self.lin)
            if lin is not None:
                if not lin[0]:
                    return v
                return Sym(v, (op, m[1], self.n), self.rec, lin, 1 + max(self.depth, _depth(other)))
        return Sym(v, (op, m[1], self.n), self.rec, None, 1 + max(self.depth, _depth(other)))

    def _cmp(self, other, op):
        m = self._mine(other)
        if m is None:
            return NotImplemented
        out = _BIN[op](self.v, m[0])
        rec = self.rec
        if rec.active and not rec.quiet:
            rec.guard_outcome((op, self.n, m[1]), out)
        return out

    def _un(self, op):
        return Sym(_UN[op](self.v), (op, self.n), self.rec, None, self.depth + 1)

    __add__ = lambda s, o: s._bin(o, "+")
    __radd__ = lambda s, o: s._rbin(o, "+")
    __sub__ = lambda s, o: s._bin(o, "-")
    __rsub__ = lambda s, o: s._rbin(o, "-")
    __mul__ = lambda s, o: s._bin(o, "*")
    __rmul__ = lambda s, o: s._rbin(o, "*")
    __truediv__ = lambda s, o: s._bin(o, "/")
    __rtruediv__ = lambda s, o: s._rbin(o, "/")
    __floordiv__ = lambda s, o: s._bin(o, "//")
    __rfloordiv__ = lambda s, o: s._rbin(o, "//")
    __mod__ = lambda s, o: s._bin(o, "%")
    __rmod__ = lambda s, o: s._rbin(o, "%")
    __and__ = lambda s, o: s._bin(o, "&")
    __rand__ = lambda s, o: s._rbin(o, "&")
    __or__ = lambda s, o: s._bin(o, "|")
    __ror__ = lambda s, o: s._rbin(o, "|")
    __xor__ = lambda s, o: s._bin(o, "^")
    __rxor__ = lambda s, o: s._rbin(o, "^")
    __lshift__ = lambda s, o: s._bin(o, "<<")
    __rlshift__ = lambda s, o: s._rbin(o, "<<")
    __rshift__ = lambda s, o: s._bin(o, ">>")
    __rrshift__ = lambda s, o: s._rbin(o, ">>")
    __lt__ = lambda s, o: s._cmp(o, "<")
    __le__ = lambda s, o: s._cmp(o, "<=")
    __gt__ = lambda s, o: s._cmp(o, ">")
    __ge__ = lambda s, o: s._cmp(o, ">=")
    __eq__ = lambda s, o: s._cmp(o, "==")
    __ne__ = lambda s, o: s._cmp(o, "!=")
    __neg__ = lambda s: s._un("neg")
    __abs__ = lambda s: s._un("abs")
    __invert__ = lambda s: s._un("~")
    __floor__ = lambda s: s._un("floor")
    __ceil__ = lambda s: s._un("ceil")
    __trunc__ = lambda s: s._un("trunc")

    def __pos__(self):
        return self

    def __pow__(self, other, mod=None):
        if mod is not None:
            return pow(self._exact(), other, mod)
        m = self._mine(other)
        if m is None:
            return NotImplemented
        if type(other) is Sym and type(self.v) is int and type(m[0]) is int:
            _ = other >= 0  # int ** int is an int only for a non-negative exponent: a guard on its sign
        return Sym(self.v ** m[0], ("**", self.n, m[1]), self.rec, None, 1 + max(self.depth, _depth(other)))

    def __rpow__(self, other):
        m = self._mine(other)
        if m is None:
            return NotImplemented
        if type(self.v) is int and type(m[0]) is int:
            _ = self >= 0
        return Sym(m[0] ** self.v, ("**", m[1], self.n), self.rec, None, 1 + max(self.depth, _depth(other)))

    def __round__(self, ndigits=None):
        if ndigits is not None:
            return round(self._exact(), ndigits)
        return self._un("round")

    def __divmod__(self, other):
        q, r = self // other, self % other
        return (q, r) if q is not NotImplemented and r is not NotImplemented else NotImplemented

    def __rdivmod__(self, other):
        q, r = other // self, other % self
        return q, r

    def __array__(self, dtype=None, copy=None):
        """NumPy takes the exact value (a guard), as for a plain number."""
        import numpy
        return numpy.asarray(self._exact(), dtype=dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """A torch call handed a symbol directly (torch's argument parser then defers to this
        method, or to the recorder, which records its expression): outside a recording it takes
        the number."""
        return func(*concrete_of(args), **concrete_of(kwargs or {}))

    def __reduce_ex__(self, protocol):
        return (type(self._exact()), (self._exact(),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


_OWN = frozenset(("v", "n", "rec", "lin", "depth", "defined", "origin", "oid"))  # slots (Sym.__getattr__)
MAX_DEPTH = 24  # deepest expression kept inline (deeper ones become a register of their own)


def _depth(o) -> int:
    return o.depth if type(o) is Sym else 0


def _lin_of(o, rec):
    """The linear form of operand ``o`` (an int, or a Sym of recorder ``rec``), or None."""
    t = type(o)
    if t is int:
        return ({}, o)
    if t is Sym:
        if o.rec is not rec:
            return ({}, o.v) if type(o.v) is int else None
        return o.lin
    return None


def _linear(op: str, a, b):
    """The linear form of ``a op b`` (``+``, ``-``; ``*`` when one side is a constant), or None."""
    if a is None or b is None:
        return None
    (ca, ka), (cb, kb) = a, b
    if op == "*":
        if ca and cb:
            return None
        if not ca:
            ca, ka, cb, kb = cb, kb, ca, ka
        return ({x: c * kb for x, c in ca.items() if c * kb}, ka * kb)
    sign = 1 if op == "+" else -1
    out = dict(ca)
    for x, c in cb.items():
        c = out.get(x, 0) + sign * c
        if c:
            out[x] = c
        else:
            out.pop(x, None)
    return (out, ka + sign * kb)


def evaluate(node, reads: dict):
    """The value of expression ``node`` for the reads ``reads`` ({read number: value})."""
    if type(node) is not tuple:
        return node
    op = node[0]
    if op == "R":
        return reads[node[1]]
    if op == "L":
        v = reads[node[1]]
        for i in node[2]:
            v = v[i]
        return v
    if len(node) == 2:
        return _UN[op](evaluate(node[1], reads))
    return _BIN[op](evaluate(node[1], reads), evaluate(node[2], reads))


def source(node, leaf, const) -> str:
    """Python source of expression ``node``: ``leaf(node)`` writes a read leaf, ``const(value)`` a
    constant (the code runs with :data:`NAMESPACE` in scope)."""
    if type(node) is not tuple:
        return const(node)
    op = node[0]
    if op == "R" or op == "L":
        return leaf(node)
    if len(node) == 2:
        return _UN_SRC[op].format(source(node[1], leaf, const))
    return f"({source(node[1], leaf, const)} {op} {source(node[2], leaf, const)})"


_TRUSTED: list = []  # directory prefixes whose code handles symbols by design or never tells them apart


def _trusted_dirs() -> list:
    if not _TRUSTED:
        import os
        import sysconfig
        import torch
        here = os.path.dirname(os.path.abspath(__file__))
        dirs = [here, os.path.join(os.path.dirname(here), "language"), os.path.dirname(torch.__file__)]
        dirs += {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
        _TRUSTED.extend(os.path.join(d, "") for d in dirs)
    return _TRUSTED


_NOT_NUMBERS = (type(None), bool, str, bytes, type(Ellipsis))


def trusted(code) -> bool:
    """True for code of pto's DSL and runtime, torch and the standard library (code object
    ``code``): it handles symbols by design or tells them apart only as isinstance does."""
    fn = code.co_filename
    return fn.startswith("<frozen") or any(fn.startswith(d) for d in _trusted_dirs())


def observes_identity(frame) -> str | None:
    """What the code of ``frame`` does that tells a :class:`Sym` from the plain number it stands
    for, or None. A Sym answers ``isinstance`` and ``__class__`` like its number, but not
    ``type(s)`` (always Sym), ``id(s)`` or ``s is 3`` / ``a is b`` (small ints are one object in
    a plain run; two reads are two Syms): no method is called, so no guard can be taken, and the
    recording must not go on (runtime/replay.py gives up on it: the call runs plain and the key
    goes back to exact keys). Reported: a name resolving to the builtin ``type`` or ``id``
    (loaded as a global, a builtin, a closure variable or an argument of this call), an ``is``
    / ``is not`` comparison whose right operand is not a None / bool / str / bytes / ``...``
    constant, and ``operator.is_`` / ``is_not`` (by value, or any attribute of those names). Code
    of pto's DSL and runtime, torch and the standard library is trusted (None, :func:`trusted`);
    C extension code is not examined.

    Raises:
        nothing: unreadable bytecode is reported as such (a string).
    """
    code = frame.f_code
    fn = code.co_filename
    if trusted(code):
        return None
    import builtins
    import dis
    import operator
    bad = (builtins.type, builtins.id, operator.is_, operator.is_not)
    glb, blt = frame.f_globals, frame.f_builtins
    try:
        prev = None
        for ins in dis.get_instructions(code):
            op = ins.opname
            if op == "LOAD_GLOBAL" or op == "LOAD_NAME":
                name = ins.argval
                obj = glb[name] if name in glb else blt.get(name)
                if any(obj is b for b in bad):
                    return f"{name}() at {fn}:{ins.positions.lineno if ins.positions else '?'}"
            elif (op == "LOAD_ATTR" or op == "LOAD_METHOD") and ins.argval in ("is_", "is_not", "id"):
                return f"{ins.argval} at {fn}:{ins.positions.lineno if ins.positions else '?'}"
            elif op == "IS_OP":
                if not (prev is not None and prev.opname == "LOAD_CONST" and isinstance(prev.argval, _NOT_NUMBERS)):
                    return f"an 'is' comparison at {fn}:{ins.positions.lineno if ins.positions else '?'}"
            prev = ins
        loc = frame.f_locals  # arguments and closure variables bound to type / id
    except Exception as e:  # noqa: BLE001 - cannot tell: report it
        return f"unreadable code {code.co_name} at {fn}: {e}"
    for name, obj in loc.items():
        if any(obj is b for b in bad):
            return f"{name} (= {obj.__name__}) in {code.co_name} at {fn}"
    return None


def concrete_of(x):
    """``x`` with every :class:`Sym` inside (tuples, lists, dicts, slices) replaced by its value,
    without guards; ``x`` itself when it holds none."""
    t = type(x)
    if t is Sym:
        return x.v
    if t is tuple or t is list:
        out = [concrete_of(y) for y in x]
        if all(a is b for a, b in zip(out, x)):
            return x
        return out if t is list else tuple(out)
    if t is slice:
        a, b, c = concrete_of(x.start), concrete_of(x.stop), concrete_of(x.step)
        return x if a is x.start and b is x.stop and c is x.step else slice(a, b, c)
    if t is dict:
        out = {k: concrete_of(v) for k, v in x.items()}
        return x if all(out[k] is v for k, v in x.items()) else out
    return x


def has_sym(x) -> bool:
    """True when ``x`` (a value, tuple, list, dict or slice) holds a :class:`Sym`."""
    t = type(x)
    if t is Sym:
        return True
    if t is tuple or t is list:
        return any(has_sym(y) for y in x)
    if t is slice:
        return has_sym(x.start) or has_sym(x.stop) or has_sym(x.step)
    if t is dict:
        return any(has_sym(v) for v in x.values())
    return False
