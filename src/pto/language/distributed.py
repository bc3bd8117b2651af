"""The distributed DSL: ``import pto.language.distributed as pld`` (hw-native-sys/pypto `docs/en/user/`).

Window buffers are per-rank tensors that peers write into (RDMA-visible HCCL windows on the
device). A kernel names them through parameters annotated ``pld.DistributedTensor[[...], dt]``
(``pl.InOut[...]`` of it is accepted and means the same). Inside a task block:

* ``pld.tile.remote_store(tile, target, peer, offsets, atomic=None)``: write the tile's
  valid region into ``peer``'s copy of window ``target`` at ``offsets`` (no ordering);
* ``pld.tensor.put(dst, peer, src, dst_offsets, src_offsets, shape, atomic=None)``: the same
  for a region of a local GM tensor ``src`` (read through a tile, so the read is a footprint);
* ``pld.system.notify(target, peer, offsets, value, op)``: ``Set`` or ``AtomicAdd`` ``value``
  into ``peer``'s signal element of window ``target``, after every earlier store of this
  rank to ``peer`` (data before signal);
* ``pld.system.wait(signal, offsets, expected, cmp=WaitCmp.Ge)``: block until the local
  signal element compares true; a task containing a wait is a task that depends on the
  remote event (the peers' notifies), and tasks reading the window after it name it in
  ``deps=`` as on the device.

Each rank is one process; the transport is torch.distributed (``pto.runtime.distributed``,
docs/distributed.md), installed by :func:`pto.runtime.distributed.init`. Without it the world
is one rank (``world_size() == 1``, ``rank() == 0``) and every peer is this process.

Deviations: a window buffer is a typed torch tensor (``alloc_window_buffer`` takes bytes or
``shape, dtype``; ``window`` views it); targets of stores and notifies are whole window
parameters (offsets in the window's own coordinates).
"""

from __future__ import annotations

import enum
import re
import sys
import threading
from types import SimpleNamespace as _NS

import torch

from pto.errors import DslError
from pto.language import _ctx
from pto.language.dtypes import as_dtype
from pto.language.typing import IN, TensorType

__all__ = ["DistributedTensor", "WindowType", "WindowBuffer", "NotifyOp", "WaitCmp", "alloc_window_buffer",
           "window", "world_size", "rank", "remote_store", "put", "notify", "wait", "tile", "tensor", "system"]

# installed by pto.runtime.distributed.init(); None: a world of one rank in this process
_world = None
# a rank run as a thread of this process (pto.runtime.distributed.run_threads) sees its own world
_thread = threading.local()


class NotifyOp(enum.Enum):
    """What a notify does to the peer's signal element."""

    Set = "set"
    AtomicAdd = "atomic_add"


class WaitCmp(enum.Enum):
    """How a wait compares the local signal element with ``expected``."""

    Ge = "ge"
    Eq = "eq"


class WindowType(TensorType):
    """Annotation of a window-bound parameter (``pld.DistributedTensor[[dims], dtype]``).

    Always bound by reference with direction In: peers write its storage from outside the
    program, so it is neither copied in nor copied back; local code writes it only through
    ``remote_store`` / ``put`` / ``notify`` (to its own rank).
    """

    __slots__ = ()

    def with_direction(self, direction: str, partial: bool = False) -> "WindowType":
        """``pl.InOut[pld.DistributedTensor[...]]``: the same window annotation (direction In)."""
        return WindowType(self.dims, self.dtype, IN)

    def __repr__(self) -> str:
        return f"pld.DistributedTensor[{list(self.dims) if self.dims is not None else '...'}, {self.dtype}]"


class _DistributedTensorFactory:
    """``pld.DistributedTensor[[dims], dtype]``."""

    def __getitem__(self, item):
        if not (isinstance(item, tuple) and len(item) == 2):
            raise DslError("use pld.DistributedTensor[[dim, ...], dtype]")
        dims, dtype = item
        return WindowType(list(dims), dtype, IN)

    def __repr__(self) -> str:
        return "pld.DistributedTensor"


DistributedTensor = _DistributedTensorFactory()


class WindowBuffer:
    """A per-rank window buffer (``pld.alloc_window_buffer``): ``nbytes`` bytes of storage
    that :func:`window` views as typed tensors. Every rank allocates the same windows in the
    same order (SPMD host code), which is how a peer's window is addressed."""

    def __init__(self, name: str, nbytes: int):
        self.name = name
        self.nbytes = nbytes
        self.storage = torch.zeros(nbytes, dtype=torch.uint8)

    def __repr__(self) -> str:
        return f"<pld window buffer {self.name!r}: {self.nbytes} B>"


def _lhs(depth: int = 2) -> str | None:
    f = sys._getframe(depth)
    try:
        import linecache
        m = re.match(r"\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)", linecache.getline(f.f_code.co_filename, f.f_lineno))
        return m.group(1) if m else None
    finally:
        del f


def world():
    """This thread's rank world (``run_threads``), else the installed world
    (``pto.runtime.distributed.World``), else the one-rank local world."""
    global _world
    w = getattr(_thread, "world", None)
    if w is not None:
        return w
    if _world is None:
        from importlib import import_module
        _world = import_module("pto.runtime.distributed").local_world()
    return _world


def world_size() -> int:
    """Number of ranks (a host loop bound); 1 without torch.distributed."""
    return world().size


def rank() -> int:
    """This process's rank in ``[0, world_size())``."""
    return world().rank


def alloc_window_buffer(size, dtype=None, *, name: str | None = None) -> WindowBuffer:
    """Declare a window buffer of ``size`` bytes (or ``shape=size, dtype``) on every rank.

    Host-level (outside a running program). The name comes from ``name=`` or the assignment
    target (``recv_x = pld.alloc_window_buffer(...)``); it appears in every error naming the
    window.

    Returns:
        a :class:`WindowBuffer`, zero-filled.

    Raises:
        DslError: called inside a program, or a size that is not a positive integer / shape.
    """
    if _ctx.state.program is not None:
        raise DslError("pld.alloc_window_buffer is host-level: call it outside @pl.jit programs")
    if dtype is not None:
        dt = as_dtype(dtype)
        shape = [size] if isinstance(size, int) else list(size)
        nel = 1
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
                raise DslError(f"pld.alloc_window_buffer: bad shape {shape}")
            nel *= d
        nbytes = nel * torch.empty((), dtype=dt.torch).element_size()
    else:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise DslError(f"pld.alloc_window_buffer: size must be a positive number of bytes, got {size!r}")
        nbytes = size
    return world().alloc(name or _lhs() or "window", nbytes)


def window(buf: WindowBuffer, shape, dtype=None, *, offset_bytes: int = 0, name: str | None = None) -> torch.Tensor:
    """A typed view ``[shape] dtype`` of window buffer ``buf`` at ``offset_bytes`` (the tensor
    a kernel's ``pld.DistributedTensor`` parameter binds to). Views of one buffer in the same
    order on every rank address the same peer storage.

    Returns:
        a torch tensor sharing ``buf``'s storage (registered as a window).

    Raises:
        DslError: not a WindowBuffer, a view that does not fit, or a misaligned offset.
    """
    if not isinstance(buf, WindowBuffer):
        raise DslError(f"pld.window: expected a buffer from pld.alloc_window_buffer, got {type(buf).__name__}")
    dt = as_dtype(dtype if dtype is not None else "int8") if not hasattr(dtype, "torch") else dtype
    shape = [int(d) for d in ([shape] if isinstance(shape, int) else shape)]
    esz = torch.empty((), dtype=dt.torch).element_size()
    nel = 1
    for d in shape:
        nel *= d
    if offset_bytes % esz or offset_bytes < 0 or offset_bytes + nel * esz > buf.nbytes:
        raise DslError(f"pld.window: view {shape} {dt} at byte {offset_bytes} does not fit window buffer "
                       f"{buf.name!r} of {buf.nbytes} bytes (or is not {esz}-byte aligned)")
    t = buf.storage[offset_bytes:offset_bytes + nel * esz].view(dt.torch).view(shape)
    return world().register_window(name or _lhs() or buf.name, t)


def _block(what: str):
    blk = _ctx.state.block
    if blk is None:
        raise DslError(f"{what} must be used inside a task block")
    return blk


def _peer(what: str, peer) -> int:
    from pto.language.typing import as_int
    p = as_int(peer, f"the peer of {what}")
    n = world().size
    if not 0 <= p < n:
        raise DslError(f"{what}: peer {p} outside [0, world_size={n})")
    return p


def remote_store(tile, target, peer, offsets, *, atomic=None) -> None:
    """Store ``tile``'s valid region into ``peer``'s window ``target`` at ``offsets``.

    Args:
        tile: a Tile (dtype must equal the window's).
        target: a window parameter (``pld.DistributedTensor``).
        peer: destination rank (this rank allowed).
        offsets: one index per window dim.
        atomic: ``None`` (plain store) or ``pl.AtomicType.Add`` (accumulate).

    Raises:
        DslError: outside a block, a target that is not a window parameter, a bad peer,
            offsets / shape outside the window, or a dtype mismatch.
    """
    blk = _block("pld.tile.remote_store")
    from pto.language.tile_ops import Tile
    if not isinstance(tile, Tile):
        raise DslError(f"pld.tile.remote_store: expected a Tile, got {type(tile).__name__}")
    data = tile.data
    if tile.valid is not None:
        data = data[tuple(slice(0, v) for v in tile.valid)]
    world().store(blk, target, _peer("pld.tile.remote_store", peer), offsets, data,
                  atomic is not None and getattr(atomic, "name", str(atomic)).lower().endswith("add"))


def put(dst, peer, src, dst_offsets, src_offsets, shape, *, atomic=None) -> None:
    """Copy the ``shape`` region of local GM tensor ``src`` at ``src_offsets`` into ``peer``'s
    window ``dst`` at ``dst_offsets`` (staged through a tile, as TPUT is; ``atomic=Add``
    accumulates). Side effect only; no ordering of its own.

    Raises:
        DslError: as :func:`remote_store`, or a source region outside ``src``.
    """
    _block("pld.tensor.put")
    from pto.language.tensor_ops import slice as _slice
    remote_store(_slice(src, list(shape), list(src_offsets)), dst, peer, dst_offsets, atomic=atomic)


def notify(target, peer, offsets, value=1, op=NotifyOp.AtomicAdd) -> None:
    """Deposit ``value`` into ``peer``'s signal element ``target[offsets]`` (``Set`` or
    ``AtomicAdd``), ordered after this rank's earlier stores to ``peer``.

    Raises:
        DslError: outside a block, a target that is not an integer window parameter, a bad
            peer or offsets.
    """
    blk = _block("pld.system.notify")
    if not isinstance(op, NotifyOp):
        raise DslError(f"pld.system.notify: op must be pld.NotifyOp.Set or .AtomicAdd, got {op!r}")
    from pto.language.typing import as_int
    world().notify(blk, target, _peer("pld.system.notify", peer), offsets, as_int(value, "a notify value"), op)


def wait(signal, offsets, expected, cmp=WaitCmp.Ge) -> None:
    """Block until the local signal element ``signal[offsets]`` compares true with
    ``expected`` (``Ge``: ``>=``, ``Eq``: ``==``).

    Raises:
        DistributedError: the condition did not hold within the world's timeout, or a peer
            died meanwhile; names this rank, the window, the counter and its value.
        DslError: outside a block or a signal that is not an integer window parameter.
    """
    blk = _block("pld.system.wait")
    if not isinstance(cmp, WaitCmp):
        raise DslError(f"pld.system.wait: cmp must be pld.WaitCmp.Ge or .Eq, got {cmp!r}")
    from pto.language.typing import as_int
    world().wait(blk, signal, offsets, as_int(expected, "a wait value"), cmp)


tile = _NS(remote_store=remote_store)
tensor = _NS(put=put)
system = _NS(notify=notify, wait=wait)
