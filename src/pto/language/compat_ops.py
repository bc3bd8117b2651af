"""DSL constructs that pypto-lib kernels use and pto's own kernels need rarely.

Reference: hw-native-sys/pypto `docs/en/user/`, the construct table of the
compatibility issue. Every construct here is numerically defined on the CPU:

* ``pl.create_tile(shape, dtype)`` / ``pl.create_l1(shape, dtype)``: an
  uninitialised on-chip buffer (a Tile). Its contents are undefined: NaN (floats)
  or the 0xAB byte pattern (integers) in check mode, zeros otherwise.
* ``pl.array.create(n, dtype)`` / ``pl.Array[n, dtype]``: a small on-core array
  (task ids for ``deps=`` fan-in); elements start at -1 for ``pl.TASK_ID`` (the
  invalid id, ignored by ``deps=``) and 0 otherwise.
* ``pl.concat(a, b, ...)``: tiles joined along the last dim.
* ``for lane in pl.split_aiv(2, mode=pl.SplitMode.NONE)``: the two vector lanes of
  a core group, run one after the other; ``pl.split(mode)`` is a placement hint.
* ``pl.prefetch(...)``: an L2 warm-up, no effect on values.
* ``pl.gather_row(dst, src, dst_offsets, src_offsets, shapes, valid_shape=None,
  transpose=False)``: a GM window copied into part of a tile.
* ``pl.cast`` of a scalar (:func:`cast_scalar`), ``pl.const(v, dtype)``; ``pl.move`` and
  ``pl.tile.transpose_view`` (layout only: the same values, transposed for the view).
* ``@pl.program`` classes of ``@pl.function(type=pl.FunctionType...)`` methods (the older
  class-based API, :class:`ProgramClass`) and ``@pl.jit.host`` (:class:`HostFunction`).
* ``mode.pypto``: set by ``pto.compat`` while a pypto script runs; it makes
  ``pl.create_tensor`` inside a task an on-chip buffer (pypto lowers it to
  ``tile.create``) and a write to an ``In`` parameter a warning (pypto infers
  InOut) instead of DslErrors. pto's own kernels run with it off.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace as _NS

import torch

from pto.errors import DslError
from pto.language import _ctx
from pto.language.dtypes import TASK_ID, as_dtype
from pto.language.tile_ops import Tile, _as_tile, _count
from pto.language.typing import ScalarValue, as_int

__all__ = ["mode", "create_tile", "create_l1", "Array", "array", "concat", "SplitMode", "split_aiv", "split",
           "prefetch", "gather_row", "cast_scalar", "written_in", "bind_dynamic", "FunctionType", "function",
           "program", "ProgramClass", "ProgramFunction", "HostFunction", "const", "move", "transpose_view", "KernelType", "SyncAllMode",
           "get_block_num"]


class _Mode:
    """Switches of the pypto compatibility layer (see the module docstring)."""

    __slots__ = ("pypto", "_warned")

    def __init__(self):
        self.pypto = False
        self._warned: set = set()


mode = _Mode()


_site = _ctx.user_site


def _poisoned(shape, dt) -> torch.Tensor:
    """Contents of a fresh on-chip buffer: undefined (poisoned) in check mode, zeros otherwise."""
    data = torch.zeros(shape, dtype=dt.torch)
    if not _ctx.state.check:
        return data
    if data.dtype.is_floating_point:
        data.fill_(float("nan"))
    elif data.dtype != torch.bool:
        data.view(torch.uint8).fill_(0xAB)
    return data


def create_tile(shape, dtype, target_memory=None, addr=None, size=None, valid_shape=None, name=None) -> Tile:
    """An uninitialised on-chip buffer ``[shape]`` of ``dtype`` (pypto ``tile.create``).

    Args:
        shape: tile dims (ints).
        dtype: element dtype.
        target_memory, addr, size: placement (inert on the CPU).
        valid_shape: optional valid extents.

    Returns:
        Tile whose contents are undefined: NaN / 0xAB bytes in check mode, zeros otherwise;
        write it (``pl.assemble``, ``pl.gather_row``, subscript assign) before reading. In
        check mode every element carries an undefinedness tag naming this line (as a GM
        scratch tensor's do), so an element that reaches an output without being written is
        an UndefinedOutputError naming the buffer, even when the tile math discarded the
        poison values (a ``maximum`` against 0xAB..., a ``cmp`` against NaN).

    Raises:
        DslError: outside a task block, or a negative dim.
    """
    if _ctx.state.block is None:
        raise DslError(f"pl.create_tile: an on-chip buffer needs a task (pl.at / pl.spmd){_site()}")
    dt = as_dtype(dtype)
    dims = [as_int(s, "a tile dim") for s in shape]
    if any(d < 0 for d in dims):
        raise DslError(f"pl.create_tile: negative dim in {dims}{_site()}")
    _count()
    valid = None if valid_shape is None else tuple(as_int(v, "a valid extent") for v in valid_shape)
    data = _poisoned(dims, dt)
    mask = None
    if _ctx.state.check:  # every element undefined until written, named by this line
        prog = _ctx.state.program
        san = getattr(prog, "sanitizer", None)
        if san is not None:
            f = _ctx.user_frame()
            site = _ctx.frame_site(f) if f is not None else "<unknown>"  # as an allocation names its line
            mask = torch.full(dims, san.tile_origin(name, dims, data.dtype, site), dtype=torch.int32)
    tile = Tile(data, mask, valid)
    if mask is not None:
        tile._mown = True  # a private mask: writes into the buffer clear it in place
    return tile


def create_l1(shape, dtype, transpose: bool = False) -> Tile:
    """An uninitialised L1 (Mat) buffer, filled by :func:`gather_row` and fed to ``pl.matmul``.

    ``transpose`` is the ZN layout for a ``b_trans`` consumer (a layout, no effect on values).
    Same contents and errors as :func:`create_tile`.
    """
    return create_tile(shape, dtype)


class _ArrayType:
    """The annotation ``pl.Array[n, dtype]`` (an array parameter of a helper)."""

    __slots__ = ("n", "dtype")

    def __init__(self, n, dtype):
        self.n, self.dtype = n, dtype

    def __repr__(self) -> str:
        return f"pl.Array[{self.n}, {self.dtype}]"


class Array(list):
    """A fixed-length on-core array of scalars (``pl.array.create(n, dtype)``).

    Elements are Python ints/floats; ``arr[i] = v`` updates in place and ``deps=[arr]``
    waits on every valid task id in it. ``pl.Array[n, dtype]`` is its annotation.
    """

    __slots__ = ("dtype",)

    def __class_getitem__(cls, item):
        n, dt = item
        return _ArrayType(n, as_dtype(dt))

    def __setitem__(self, i, v):
        if isinstance(i, slice):
            raise DslError("pl.Array: slice assignment is not supported; assign one element")
        n = len(self)
        i = as_int(i, "an array index")
        if not 0 <= i < n:
            raise DslError(f"pl.Array: index {i} out of range of an array of {n}{_site()}")
        super().__setitem__(i, v)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list.__getitem__(self, i)
        n = len(self)
        i = as_int(i, "an array index")
        if not 0 <= i < n:
            raise DslError(f"pl.Array: index {i} out of range of an array of {n}{_site()}")
        return list.__getitem__(self, i)


def _array_create(n, dtype) -> Array:
    """``pl.array.create(n, dtype)``: an :class:`Array` of ``n`` elements (-1 for TASK_ID, else 0).

    Raises:
        DslError: a negative or non-integral length.
    """
    dt = as_dtype(dtype)
    n = as_int(n, "an array length")
    if n < 0:
        raise DslError(f"pl.array.create: negative length {n}")
    arr = Array([-1 if dt == TASK_ID else (0.0 if dt.is_float else 0)] * n)
    arr.dtype = dt
    return arr


array = _NS(create=_array_create)


def concat(*tiles) -> Tile:
    """Tiles of equal leading dims and dtype joined along the last dim (``[M, a] + [M, b] -> [M, a+b]``).

    Accepts ``concat(a, b, ...)`` or ``concat([a, b, ...])``; definedness masks join with the data.

    Raises:
        DslError: fewer than one tile, differing dtypes, ranks or leading dims.
    """
    if len(tiles) == 1 and isinstance(tiles[0], (list, tuple)):
        tiles = tuple(tiles[0])
    if not tiles:
        raise DslError("pl.concat: needs at least one tile")
    ts = [_as_tile(t, "pl.concat") for t in tiles]
    first = ts[0]
    for t in ts[1:]:
        if t.data.dtype != first.data.dtype:
            raise DslError(f"pl.concat: dtypes differ ({first.dtype} and {t.dtype}); cast first")
        if t.data.dim() != first.data.dim() or t.shape[:-1] != first.shape[:-1]:
            raise DslError(f"pl.concat: shapes {list(first.shape)} and {list(t.shape)} differ beyond the last dim")
    _count()
    if any(t.data.is_meta for t in ts):  # graph-only mode: an unknown part makes the whole tile unknown
        from pto.language.graph_only import meta
        return Tile(meta(list(first.shape[:-1]) + [sum(t.shape[-1] for t in ts)], first.data.dtype))
    data = torch.cat([t.data for t in ts], dim=-1)
    mask = None
    if any(t.mask is not None for t in ts):
        mask = torch.cat([t.mask if t.mask is not None else torch.zeros(t.data.shape, dtype=torch.int32)
                          for t in ts], dim=-1)
    return Tile(data, mask)


class SplitMode:
    """How ``pl.split_aiv`` / ``pl.split`` divide a region between the two vector lanes (placement)."""

    NONE = "none"
    UP_DOWN = "up_down"
    LEFT_RIGHT = "left_right"


def split_aiv(n: int = 2, mode=SplitMode.NONE):  # noqa: ARG001 - placement only
    """``for lane in pl.split_aiv(2, mode=...)``: the body runs once per vector lane (0, 1, ...),
    one lane after the other; the kernel uses ``lane`` to pick disjoint work.

    Raises:
        DslError: outside a task block, or a lane count below 1.
    """
    if _ctx.state.block is None:
        raise DslError(f"pl.split_aiv must run inside a task (pl.at / pl.spmd){_site()}")
    n = as_int(n, "a lane count")
    if n < 1:
        raise DslError(f"pl.split_aiv: lane count {n} must be at least 1")
    return iter(range(n))


def split(mode=SplitMode.NONE):
    """``optimizations=[pl.split(mode)]`` on ``pl.at``: a placement hint (no effect on values)."""
    return ("split", mode)


def prefetch(*args, **kwargs) -> None:  # noqa: ARG001 - L2 warm-up only
    """An L2 cache warm-up of a GM window: no effect on values or dependencies."""
    return None


def gather_row(dst, src, dst_offsets, src_offsets, shapes, valid_shape=None, transpose: bool = False) -> Tile:
    """Copy the GM window ``src[src_offsets : src_offsets + shapes]`` into tile ``dst`` at ``dst_offsets``.

    Only ``valid_shape`` (default ``shapes``) is read and written: bounds apply to the
    written region. With ``transpose`` the window lands transposed (a GM row becomes a tile
    column at ``dst_offsets``). Returns a new tile (rebind it: ``kv = pl.gather_row(kv, ...)``).
    The read is recorded as the task's footprint like any load.

    Args:
        dst: a Tile (e.g. from ``pl.create_l1``), rank 2.
        src: a rank-2 GM tensor of dst's dtype.

    Raises:
        DslError: outside a task, ranks other than 2, dtypes that differ, or a region out of bounds.
    """
    from pto.language.tensor_ops import GMTensor, _load  # tensor_ops imports this module's users lazily

    if _ctx.state.block is None:
        raise DslError(f"pl.gather_row must run inside a task{_site()}")
    dst = _as_tile(dst, "pl.gather_row")
    if not isinstance(src, GMTensor):
        raise DslError(f"pl.gather_row: source must be a GM tensor, got {type(src).__name__}{_site()}")
    if dst.data.dim() != 2 or src.data.dim() != 2:
        raise DslError(f"pl.gather_row: needs a rank-2 tile and tensor, got {list(dst.shape)} and {list(src.shape)}")
    if dst.data.dtype != src.data.dtype:
        raise DslError(f"pl.gather_row: tile {dst.dtype} and {src.name} {src.dtype} differ{_site()}")
    ext = [as_int(v, "a gather_row extent") for v in (valid_shape if valid_shape is not None else shapes)]
    so = [as_int(v, "a gather_row offset") for v in src_offsets]
    do = [as_int(v, "a gather_row offset") for v in dst_offsets]
    if any(e <= 0 for e in ext):
        return dst
    for d in range(2):
        if so[d] < 0 or so[d] + ext[d] > src.shape[d]:
            raise DslError(f"pl.gather_row: source rows/cols [{so[d]}, {so[d] + ext[d]}) out of dim {d} of "
                           f"{src.name} (extent {src.shape[d]}){_site()}")
    piece = _load(src, so, [a + e for a, e in zip(so, ext)], None, None, checked=True)
    if transpose:
        piece = Tile(piece.data.t(), None if piece.mask is None else piece.mask.t())
    rows, cols = piece.shape
    if do[0] < 0 or do[1] < 0 or do[0] + rows > dst.shape[0] or do[1] + cols > dst.shape[1]:
        raise DslError(f"pl.gather_row: a [{rows}, {cols}] region at {do} does not fit the tile {list(dst.shape)}"
                       f"{_site()}")
    out = Tile(dst.data.clone(), None if dst.mask is None else dst.mask.clone(), dst.valid)
    out._mown = out.mask is not None
    out[do[0]:do[0] + rows, do[1]:do[1] + cols] = piece
    return out


def cast_scalar(x, target_type, mode_="round"):
    """``pl.cast`` of a scalar: an int target (INDEX, INT32, ...) truncates a float toward zero
    (a C scalar conversion) and checks the range; a float target rounds to that dtype's
    precision (nearest-even). Definedness of a ScalarValue is kept.

    Raises:
        DslError: an integer result out of the target's range, or a bool target.
    """
    if isinstance(x, ScalarValue):
        out = cast_scalar(x.value, target_type, mode_)
        return out if x.defined else ScalarValue(out, False, x.origin, x.oid)
    dt = as_dtype(target_type)
    if dt.is_int:
        v = x if isinstance(x, int) else (math.trunc(x) if math.isfinite(x) else None)
        if v is None or not dt.min <= v <= dt.max:
            raise DslError(f"pl.cast: scalar {x!r} out of range of {dt}{_site()}")
        return int(v)
    if dt.is_float:
        return float(torch.tensor(float(x), dtype=torch.float64).to(dt.torch).item())
    return bool(x)


def written_in(t) -> None:
    """A store into the In parameter ``t``: a DslError, or under ``pto pypto`` a warning
    (once per parameter; pypto infers InOut) after which the parameter is writable."""
    if not mode.pypto:
        raise DslError(f"{t.name}: parameter is declared In (read-only); declare it pl.Out or pl.InOut "
                       f"to write it{_site()}")
    key = (id(t.buf.program), t.name)
    if key not in mode._warned:
        mode._warned.add(key)
        f = _ctx.user_frame()
        warnings.warn_explicit(f"{t.name}: parameter is declared In but written; pypto infers InOut, so pto "
                               "follows (declare it pl.InOut)", UserWarning,
                               f.f_code.co_filename if f is not None else "<kernel>", f.f_lineno if f is not None else 0)
    t.buf.readonly = False


def bind_dynamic(self, dim: int, dynvar) -> None:
    """``t.bind_dynamic(dim, DYN)`` in a ``@pl.jit`` body: marks dim ``dim`` of a parameter as
    runtime-dynamic. Shapes bind per call on the CPU, so there is no run-time effect.

    Raises:
        DslError: ``dim`` outside the tensor's rank.
    """
    rank = self.data.dim()
    if isinstance(dim, bool) or not isinstance(dim, int) or not -rank <= dim < rank:
        raise DslError(f"{self.name}.bind_dynamic: dim {dim!r} outside rank {rank}{_site()}")



# ---- the class-based program API and the host entry ------------------------------------------

class FunctionType:
    """Kinds of ``@pl.function`` in a ``@pl.program`` class.

    ``InCore`` (and the cube/vector variants AIC, AIV, Group): calling it from orchestration is
    one task of one block; ``Orchestration`` / ``Opaque``: runs its body as orchestration
    (Opaque bodies open their own ``pl.at`` scopes); ``Inline``: spliced into the caller.
    """

    Opaque = "opaque"
    Orchestration = "orchestration"
    InCore = "incore"
    Inline = "inline"
    AIC = "aic"
    AIV = "aiv"
    Group = "group"


_TASK_KINDS = (FunctionType.InCore, FunctionType.AIC, FunctionType.AIV, FunctionType.Group)


class _MethodCall:
    """A ``@pl.function`` bound to its program instance (what ``self.name`` gives)."""

    __slots__ = ("pf", "obj")

    def __init__(self, pf, obj):
        self.pf, self.obj = pf, obj

    def __call__(self, *args, **kwargs):
        pf = self.pf
        if _ctx.state.program is None:
            return pf.entry(self.obj)(*args, **kwargs)
        if pf.kind in _TASK_KINDS and _ctx.state.block is None:
            from pto.language.control import at
            with at(name_hint=pf.fn.__name__):
                return pf.fn(self.obj, *args, **kwargs)
        return pf.fn(self.obj, *args, **kwargs)


class ProgramFunction:
    """``@pl.function(type=pl.FunctionType...)``: a method of a ``@pl.program`` class."""

    def __init__(self, fn, kind=FunctionType.Opaque):
        self.fn = fn
        self.kind = kind
        self.__name__ = fn.__name__
        self._entries: dict = {}

    def __get__(self, obj, cls=None):
        return self if obj is None else _MethodCall(self, obj)

    def entry(self, obj):
        """The ``@pl.jit`` entry running this function (``self`` bound to ``obj``) as a program."""
        import functools
        import inspect

        from pto.language.jit import JitFunction

        jf = self._entries.get(id(obj))
        if jf is None:
            fn = self.fn

            @functools.wraps(fn)
            def bound(*args, **kwargs):
                return fn(obj, *args, **kwargs)

            sig = inspect.signature(fn)
            params = list(sig.parameters.values())[1:]
            bound.__signature__ = sig.replace(parameters=params)
            bound.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "self"}
            jf = self._entries[id(obj)] = JitFunction(bound)
        return jf


def function(fn=None, type=FunctionType.Opaque, attrs=None, **_opts):  # noqa: A002 - pypto's keyword
    """``@pl.function`` / ``@pl.function(type=pl.FunctionType.InCore)``: see :class:`FunctionType`."""
    if fn is None:
        return lambda f: ProgramFunction(f, type)
    return ProgramFunction(fn, type)


class ProgramClass:
    """``@pl.program`` over a class of ``@pl.function`` methods.

    ``prog.entry`` is the ``@pl.jit`` entry: the Orchestration function, else the single
    Opaque function, else the function named ``main``. Calling ``prog(...)`` runs it.

    Raises:
        DslError: no function, or no way to pick the entry.
    """

    def __init__(self, cls):
        self.cls = cls
        self.__name__ = cls.__name__
        self.functions = {k: v for k, v in vars(cls).items() if isinstance(v, ProgramFunction)}
        if not self.functions:
            raise DslError(f"@pl.program {cls.__name__}: no @pl.function methods")
        self.instance = cls.__new__(cls)
        orch = [f for f in self.functions.values() if f.kind == FunctionType.Orchestration]
        opaque = [f for f in self.functions.values() if f.kind == FunctionType.Opaque]
        pick = (orch if len(orch) == 1 else opaque if len(opaque) == 1 else
                [f for f in self.functions.values() if f.__name__ == "main"] or
                (list(self.functions.values()) if len(self.functions) == 1 else []))
        if len(pick) != 1:
            raise DslError(f"@pl.program {cls.__name__}: cannot pick the entry among {list(self.functions)}; "
                           "mark one FunctionType.Orchestration")
        self.entry = pick[0].entry(self.instance)

    def __call__(self, *args, **kwargs):
        return self.entry(*args, **kwargs)

    def run(self, *args, config=None, **kwargs):
        """Run the entry as a program; returns the ``pto.runtime.Program``."""
        return self.entry.run(*args, config=config, **kwargs)


def program(cls) -> ProgramClass:
    """``@pl.program``: the class-based program API (see :class:`ProgramClass`)."""
    return ProgramClass(cls)


class _Skipped:
    """What a chip program called with ``device=`` another rank returns on this rank."""

    result = None

    def __repr__(self) -> str:
        return "<chip program of another rank>"


_SKIPPED = _Skipped()


class HostFunction:
    """``@pl.jit.host``: the host-level orchestrator. On one device it is plain Python that
    calls ``@pl.jit`` chip programs; ``run(..., config=...)`` runs it with every chip program
    under that RunConfig and returns the last chip Program.

    Across ranks (``pld``, one process per rank) every rank runs the host function: a chip
    program called with ``device=r`` runs only on rank ``r`` (the reference's ``for r in
    pl.range(pld.world_size()): kernel(..., device=r)`` runs each rank's own program), and in
    a world of more than one rank each chip program ends with the ranks' end-of-program
    exchange (``pto.runtime.distributed``).
    """

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        return self._call(None, [], args, kwargs)

    def _call(self, config, last, args, kwargs):
        st = _ctx.state
        factory = st.program_factory

        def on_rank(jf, a, kw, cfg):
            dev = kw.pop("device", None) if "device" in kw else None
            from pto.language import distributed as pld
            if dev is not None and dev != pld.rank():
                return _SKIPPED
            prog = factory(jf, a, kw, cfg if cfg is not None else config)
            if pld.world_size() > 1:
                pld.world().end_program(prog)
            last.append(prog)
            return prog

        st.program_factory = on_rank
        try:
            return self.fn(*args, **kwargs)
        finally:
            st.program_factory = factory

    def signature(self):
        """(inspect.Signature, {name: annotation}) of the host function."""
        import inspect
        return inspect.signature(self.fn), inspect.get_annotations(self.fn, eval_str=True)

    def run(self, *args, config=None, **kwargs):
        """Call the host function with every chip program it starts run under ``config``.

        Returns:
            the last chip ``Program`` it ran (None if none).
        """
        last = []
        self._call(config, last, args, kwargs)
        return last[-1] if last else None


def const(value, dtype):
    """``pl.const(v, dtype)``: a typed scalar literal (the value as :func:`cast_scalar` makes it)."""
    return cast_scalar(value, dtype)


def move(x, target_memory=None, **_placement):
    """``pl.move(tile, target_memory=...)``: a move between on-chip memories; the same values."""
    return _as_tile(x, "pl.move")


def transpose_view(x) -> Tile:
    """``pl.tile.transpose_view(t)``: the rank-2 tile ``t`` read transposed (a layout view; the values
    of ``t.T``).

    Raises:
        DslError: a tile that is not rank 2.
    """
    x = _as_tile(x, "pl.tile.transpose_view")
    if x.data.dim() != 2:
        raise DslError(f"pl.tile.transpose_view: needs a rank-2 tile, got {list(x.shape)}")
    valid = None if x.valid is None else (x.valid[1], x.valid[0])
    return Tile(x.data.t().contiguous(), None if x.mask is None else x.mask.t().contiguous(), valid)


class KernelType:
    """Core types of ``pl.system.syncall(core_type=...)`` (which cores a barrier waits for; on the
    CPU every block of the task takes part)."""

    AIC = "aic"
    AIV = "aiv"
    MIX = "mix"


class SyncAllMode:
    """``pl.system.syncall(mode=...)``: the FFTS hard barrier or the GM-polling soft one (the same
    barrier on the CPU)."""

    HARD = "hard"
    SOFT = "soft"


def get_block_num() -> int:
    """``pl.tile.get_block_num()``: the number of blocks of the running task (1 for ``pl.at``).

    Raises:
        DslError: outside a task block.
    """
    blk = _ctx.state.block
    if blk is None:
        raise DslError(f"pl.tile.get_block_num() used outside a task block{_site()}")
    return blk.task.n_blocks
