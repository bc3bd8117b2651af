"""Ring-heap GM allocator with allocation-time initialisation.

Scratch tensors are carved out of one persistent byte buffer (the "GM heap"),
so an uninitialised tensor really holds stale bytes from earlier programs,
as on the device. Allocation order is a ring: a new tensor goes after the
newest one, wrapping to the start; memory is reclaimed when scopes end, in
FIFO order from the oldest end and at once from the newest end (the device
keeps one ring per scope depth, so an inner scope reuses its bytes while an
outer tensor stays live; one ring reclaimed at both ends behaves the same for
nested scopes). A tensor freed in the middle waits for an end to reach it. A
request that fits nowhere is a :class:`pto.HeapExhaustedError` naming the
request and the high-water mark.

``init_value`` fills the tensor as part of the allocation (no task, no edge).
In check mode, undefined storage is poisoned: NaN for floats, the byte
pattern 0xAB for integers (hw-native-sys/pypto `docs/en/user/`).
"""

from __future__ import annotations

import math
import threading
from collections import deque

import torch

from pto.errors import BindError, HeapExhaustedError

__all__ = ["Buffer", "RingHeap", "POISON_BYTE", "validate_init_value"]

POISON_BYTE = 0xAB
_ALIGN = 512
# the idle backing buffer by size (at most one, kept for the next program: stale bytes carry over
# as on the device); a running program owns its buffer, so programs in two threads never share one
_STORAGE: dict[int, torch.Tensor] = {}
_STORAGE_LOCK = threading.Lock()
# what one undo-log save costs besides its bytes, in bytes (a clone call is about 1 µs, a few KB of
# copying): Buffer.save_view saves the whole buffer once the window saves would cost twice as much
_UNDO_SAVE_BYTES = 4096
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction


class Buffer:
    """A root GM buffer: a caller argument or a heap allocation.

    Attributes:
        id: program-unique id (> 0; also the origin id in definedness masks).
        name, site: for messages (``site`` is ``file:line`` of the allocation
            or the parameter's kernel).
        kind: ``"arg"`` or ``"scratch"``; ``direction`` for args (in/out/inout);
            ``partial``: a ``pl.PartialOut`` argument (unwritten elements allowed).
        nbytes, offset: size and heap offset (offset None for arguments).
        C: width of the root's 2-D footprint coordinates (``shape[-1]``).
        shadow: INT32 definedness mask shaped like the root (check mode), 0 =
            defined, else an undefinedness tag (see runtime/sanitizer.py).
        untracked: excluded from dependency derivation (``manual_dep=True``).
        tasks_before: tasks and join nodes submitted before the allocation (its
            place in the orchestration order; 0 for arguments); the simulator
            runs an ``init_value`` fill at that point of the AICPU stream.
    """

    __slots__ = ("id", "name", "site", "kind", "direction", "shape", "dtype", "nbytes", "offset", "base_off",
                 "C", "shadow", "untracked", "freed", "program", "init_value", "init_dropped", "written",
                 "readonly", "no_copy", "data", "scope", "partial", "tasks_before", "slow", "pending", "go", "undo",
                 "lazy_poison")

    def __init__(self, bid, name, site, kind, data: torch.Tensor, program, direction="in", offset=None,
                 init_value=None, untracked=False, facts=None):
        """``facts``: ``(shape tuple, torch dtype, nbytes, storage offset)`` of ``data`` when the
        caller knows them (a heap view it just made), saving the metadata reads."""
        self.id = bid
        self.name = name
        self.site = site
        self.kind = kind
        self.direction = direction
        if facts is None:
            self.shape = shape = tuple(data.shape)
            self.dtype = data.dtype
            self.nbytes = data.nbytes  # numel * element size
            self.base_off = data.storage_offset()
        else:
            self.shape, self.dtype, self.nbytes, self.base_off = facts
            shape = self.shape
        self.offset = offset
        self.C = (shape[-1] or 1) if shape else 1
        self.shadow = None
        self.untracked = untracked
        self.freed = False
        self.program = program
        self.init_value = init_value
        self.init_dropped = False  # init_value ignored by the mutation hook (sanitizer.drop_init_values)
        self.written = False
        self.readonly = False
        # tile loads of it may hand out views instead of copies: an In argument nobody writes during
        # the run (not a pld window, which peers and remote_store write; not under pypto
        # compatibility, where a written In argument becomes InOut); set by Program binding
        self.no_copy = False
        self.data = data
        self.scope = 0
        self.partial = False  # a pl.PartialOut argument: unwritten elements are allowed
        # check mode, an Out argument's private copy: its storage is not filled with the poison
        # pattern; a load hands out the pattern for the elements its shadow says are undefined
        # (program.poisoned), which is what a load of eagerly poisoned storage gives
        self.lazy_poison = False
        self.tasks_before = 0  # tasks and join nodes submitted before the allocation (orchestration order)
        # the GM access fast paths must not touch it: freed, or holding atomic adds held back by a
        # schedule-sensitivity run (RunConfig.block_order; ``pending`` lists them)
        self.slow = False
        self.pending = None
        self.go = None  # graph-only record of a real-storage buffer (pto.runtime.graph_only.BufferState)
        # an Out/InOut argument written in place (the caller's tensor): the bytes its stores saved
        # so far in the program's undo log (Program.undo), None when its stores need not save
        # (a scratch buffer, an argument worked on in a private copy, or one saved whole already)
        self.undo = None

    def save_window(self, shape, strides, offset: int) -> None:
        """Before a store into an argument written in place (``undo`` not None): keep the
        window ``as_strided(shape, strides, offset)`` of the storage (``offset`` in elements, from
        the storage start) it is about to overwrite; see :meth:`save_view`."""
        n = 1
        for s in shape:
            n *= s
        if self._saves_whole(n * self.data.element_size()):
            self.save_view(self.data)  # the whole buffer (see save_view): no view to build
            return
        with _NO_TORCH_FUNCTION():
            self.save_view(self.data.as_strided(shape, strides, offset))

    def save_view(self, view: torch.Tensor) -> None:
        """Before a store into an argument written in place (``undo`` not None): append
        ``(view, its current values)`` to the program's undo log, which restores them in reverse
        order if the program raises (``Program.execute``). The whole buffer is saved instead (and
        its later stores save nothing) when the window is a quarter of it or more (a kernel writing
        that much of an output usually writes all of it) or once the saves of this buffer, with an
        allowance of ``_UNDO_SAVE_BYTES`` per save for the call, would cost twice its size (at most
        about three times the cheaper choice; a kernel whose windows each write a part of the
        buffer once saves each window, the buffer's size in all, not the windows and then the whole
        buffer again at the last one). The copies are made with torch function modes off (a
        program-cache recording does not see them)."""
        with _NO_TORCH_FUNCTION():
            n = view.numel() * view.element_size()
            if self._saves_whole(n):
                view = self.data
                self.undo = None
            else:
                self.undo += _UNDO_SAVE_BYTES + n
            self.program.undo.append((view, view.clone()))

    def _saves_whole(self, n: int) -> bool:
        """Whether saving a window of ``n`` bytes saves the whole buffer instead (:meth:`save_view`)."""
        return 4 * n >= self.nbytes or self.undo + _UNDO_SAVE_BYTES + n >= 2 * self.nbytes

    def __repr__(self) -> str:
        return f"Buffer(#{self.id} {self.name!r} {list(self.shape)} {self.dtype} at {self.site})"


def validate_init_value(name: str, dtype, init_value) -> None:
    """Check that ``init_value`` can fill a tensor of DSL ``dtype``.

    Raises:
        BindError: a float value on an integer dtype, an integer out of the
            dtype's range, a finite value past FP32's, a non-number (a BOOL tensor
            takes True, False, 0 or 1), or a non-zero fill of a BF16/FP16 tensor
            (rejected by the device runtime).
    """
    if dtype.name == "BOOL":
        if init_value not in (0, 1) or isinstance(init_value, float):
            raise BindError(f"create_tensor {name!r}: init_value of a BOOL tensor must be True, False, 0 or 1, "
                            f"got {init_value!r}")
        return
    if isinstance(init_value, bool) or not isinstance(init_value, (int, float)):
        raise BindError(f"create_tensor {name!r}: init_value must be a number, got {init_value!r}")
    if dtype.is_int:
        if isinstance(init_value, float):  # even an integral one: write the int
            raise BindError(f"create_tensor {name!r}: float init_value {init_value} on integer dtype {dtype}; "
                            f"an integer dtype takes an int init_value")
        if not dtype.min <= init_value <= dtype.max:
            raise BindError(f"create_tensor {name!r}: init_value {init_value} out of range of {dtype}")
    elif dtype.name in ("BF16", "FP16") and init_value != 0:
        raise BindError(f"create_tensor {name!r}: non-zero init_value {init_value} on {dtype} is not supported "
                        "by the device runtime (only 0); use FP32 or fill with a task")
    elif dtype.name == "FP32" and math.isfinite(init_value) and abs(init_value) > _FP32_MAX:
        raise BindError(f"create_tensor {name!r}: init_value {init_value} out of range of {dtype} "
                        f"(largest finite {_FP32_MAX:.6g}; write float('inf') for an infinite fill)")


_FP32_MAX = torch.finfo(torch.float32).max


class RingHeap:
    """FIFO ring allocator over a persistent byte buffer of ``size_bytes``.

    Args:
        size_bytes: heap capacity in bytes (>= 1024).
        backing: reserve the backing bytes (False: plan offsets and peaks only, graph-only
            mode; :meth:`view` is then unavailable).

    Raises:
        HeapExhaustedError: from :meth:`alloc` when a request does not fit.
    """

    def __init__(self, size_bytes: int, backing: bool = True):
        self.size = int(size_bytes)
        st = None
        if backing:
            with _STORAGE_LOCK:
                st = _STORAGE.pop(self.size, None)
            if st is None:
                st = torch.empty(self.size, dtype=torch.uint8)
        self.storage = st
        self._typed: dict = {}  # torch dtype -> the backing buffer viewed as that dtype (see view)
        self.live: deque = deque()  # [offset, size, freed]
        self._unfreed: dict = {}  # offset -> its live entry not freed yet (offsets of those are distinct)
        self.head = 0
        self.in_use = 0
        self.peak = 0
        self.total = 0
        self.count = 0

    def _fits(self, size: int):
        """Offset where ``size`` bytes fit after the newest allocation, or None.

        Not wrapped (newest after oldest): free space is the end of the buffer,
        then the start up to the oldest allocation. Wrapped: only the gap
        between the newest and the oldest allocation.
        """
        if not self.live:
            return 0 if size <= self.size else None
        first = self.live[0][0]
        last_off, last_size, _ = self.live[-1]
        end = last_off + last_size
        if last_off >= first:
            if end + size <= self.size:
                return end
            return 0 if size <= first else None
        return end if end + size <= first else None

    def alloc(self, nbytes: int, what) -> int:
        """Reserve ``nbytes`` (rounded up to 512) and return the byte offset.

        Args:
            what: the request for the error message: a string, or a callable returning one
                (called only when the request does not fit).

        Raises:
            HeapExhaustedError: naming ``what``, the request, the heap size, the
                bytes in use and the high-water mark.
        """
        size = -(-nbytes // _ALIGN) * _ALIGN or _ALIGN
        live = self.live
        if live:  # after the newest allocation (_fits, inline for the common case)
            last = live[-1]
            end = last[0] + last[1]
            off = end if last[0] >= live[0][0] and end + size <= self.size else self._fits(size)
        else:
            off = 0 if size <= self.size else None
        if off is None:
            if callable(what):
                what = what()
            raise HeapExhaustedError(
                f"heap exhausted: request {what} of {nbytes} bytes does not fit; heap {self.size} bytes, "
                f"{self.in_use} in use by {sum(1 for e in self.live if not e[2])} live tensors, "
                f"high-water mark {self.peak} bytes (raise RunConfig(heap_bytes=...))")
        e = [off, size, False]
        live.append(e)
        self._unfreed[off] = e
        self.head = off + size
        self.in_use = in_use = self.in_use + size
        if in_use > self.peak:
            self.peak = in_use
        self.total += size
        self.count += 1
        return off

    def free(self, offset: int) -> None:
        """Release the allocation at ``offset``. Memory returns from both ends of
        the ring: the oldest allocations in FIFO order, and the newest ones as
        soon as they are freed (an inner scope's tensors, so that a loop whose
        iterations allocate and free reuses the same bytes while an outer
        tensor stays live). A tensor freed in the middle waits for an end."""
        e = self._unfreed.pop(offset, None)  # the entry a scan of ``live`` would find first
        if e is not None:
            e[2] = True
            self.in_use -= e[1]
        while self.live and self.live[0][2]:
            self.live.popleft()
        while self.live and self.live[-1][2]:
            self.live.pop()
        self.head = self.live[-1][0] + self.live[-1][1] if self.live else 0

    def release(self) -> None:
        """Hand the backing buffer back for the next program (its bytes stay as they are);
        the previously idle one, if any, is dropped. Called once, when the program ends."""
        if self.storage is None:
            return
        with _STORAGE_LOCK:
            _STORAGE.clear()
            _STORAGE[self.size] = self.storage

    def view(self, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
        """The typed tensor of ``shape`` at byte ``offset``."""
        shape = tuple(shape)
        return self.view_at(shape, contiguous_strides(shape), offset // dtype.itemsize, dtype)

    def view_at(self, shape: tuple, strides: tuple, elem_offset: int, dtype: torch.dtype) -> torch.Tensor:
        """The typed tensor of ``shape`` with ``strides`` (:func:`contiguous_strides`) at element
        offset ``elem_offset`` (the byte offset divided by the element size)."""
        typed = self._typed.get(dtype)
        if typed is None:  # the whole backing buffer as ``dtype`` elements (one view per dtype)
            isz = dtype.itemsize
            typed = self._typed[dtype] = self.storage[:self.size // isz * isz].view(dtype)
        # one as_strided view: the same sizes, contiguous strides and storage offset (in elements)
        # as slicing the bytes, reinterpreting them and reshaping (offsets are 512-byte aligned)
        return typed.as_strided(shape, strides, elem_offset)


_STRIDES: dict = {}  # shape tuple -> its contiguous strides (contiguous_strides)


def contiguous_strides(shape: tuple) -> tuple:
    """The contiguous strides (in elements) of ``shape``, as torch gives them (a dim of extent 0
    or 1 counts as 1); cached per shape."""
    strides = _STRIDES.get(shape)
    if strides is None:
        out = []
        st = 1
        for s in reversed(shape):
            out.append(st)
            st *= s if s > 1 else 1
        strides = tuple(reversed(out))
        if len(_STRIDES) > 10_000:
            _STRIDES.clear()
        _STRIDES[shape] = strides
    return strides
