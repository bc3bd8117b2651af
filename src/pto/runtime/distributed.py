"""Ranks, window buffers, remote stores and notifications on torch.distributed (docs/distributed.md).

One process per rank. The device offers one-sided RDMA writes into a peer's window and remote
atomics on signal words; gloo (torch.distributed on CPU) offers two-sided point-to-point
``send`` / ``recv``. The mapping (docs/distributed.md):

* a window is a torch tensor of the same shape on every rank (window ids follow the SPMD
  allocation order, so ``(window id, offsets)`` addresses the same storage everywhere);
* every rank runs one receiver thread per peer that loops on ``dist.recv`` from that peer and
  applies what arrives to its own windows under a lock: a ``remote_store`` / ``put`` is one
  message (window id, offsets, shape, dtype, the bytes), a ``notify`` another (window id,
  element, value, Set / AtomicAdd) -- one-sided for the sender's kernel, which never waits
  for the peer to post anything;
* messages between two ranks travel in one FIFO channel, so a notify arrives after every
  store the same rank sent before it (the reference's data-before-signal rule);
* ``wait`` blocks the task on a condition variable until the local signal element compares
  true, a peer's connection fails (the peer died) or ``timeout_s`` passes; both failures
  raise :class:`pto.errors.DistributedError` naming the rank, the window and the counter;
* a store or notify to this rank itself is applied at once in the calling thread.

After a program in check mode (:func:`run`), every rank sends an end marker to every peer
and waits for theirs, so all traffic of the program has been applied, then runs the
cross-rank race check: a task that read a window region a peer wrote during the program must be
reachable in the task graph from a task whose wait acquired that write (a notify from the
writer, issued after the write, counted toward the satisfied condition), else RaceError
naming both ranks and both tasks. Stores into a rank's own window are ordered by its graph.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import torch

import pto.language.distributed as pld
from pto.errors import ConfigError, DistributedError, DslError, RaceError

__all__ = ["World", "Window", "init", "shutdown", "local_world", "run", "spawn", "run_threads", "default_timeout_s",
           "RemoteEvent", "GlooTransport", "ThreadTransport"]

_PUT, _NOTIFY, _END, _CLOSE, _STATUS = 1, 2, 3, 4, 5
TIMEOUT_ENV = "PTO_DIST_TIMEOUT"


def default_timeout_s() -> float:
    """Seconds a wait may block: ``PTO_DIST_TIMEOUT`` (default 120).

    Raises:
        ConfigError: a value that is not a positive number.
    """
    raw = os.environ.get(TIMEOUT_ENV, "120")
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ConfigError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return v


@dataclass
class Window:
    """One registered window view: id (SPMD order), name, the local tensor."""

    id: int
    name: str
    tensor: torch.Tensor

    def box(self, offsets, shape) -> tuple:
        """Half-open root 2-D box ``(r0, r1, c0, c1)`` covering the N-d region (rows are the
        flattened leading dims, as task footprints count them)."""
        dims = list(self.tensor.shape)
        if len(dims) == 1:
            return (0, 1, offsets[0], offsets[0] + shape[0])

        def flat(idx):
            r = 0
            for i, d in zip(idx, dims[:-1]):
                r = r * d + i
            return r
        lo = flat(offsets[:-1])
        hi = flat([o + s - 1 for o, s in zip(offsets[:-1], shape[:-1])]) + 1
        return (lo, hi, offsets[-1], offsets[-1] + shape[-1])


@dataclass
class RemoteEvent:
    """A satisfied wait: the task (program-local id and name) that waited, the window, the
    element, the value it waited for and, per source rank, how many of that rank's stores it
    acquired (stores numbered in send order)."""

    task_id: int
    task_name: str
    window: str
    element: tuple
    expected: int
    acquired: dict = field(default_factory=dict)


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


class World:
    """The ranks of this run as seen from one process (see the module docstring).

    Attributes:
        size, rank: world size and this process's rank.
        timeout_s: how long a wait may block before it fails.
        windows: registered window views in SPMD order.
        events: the satisfied waits of the running program (:class:`RemoteEvent`).
    """

    def __init__(self, size: int = 1, rank: int = 0, timeout_s: float | None = None, transport=None):
        self.size, self.rank = size, rank
        self.timeout_s = default_timeout_s() if timeout_s is None else float(timeout_s)
        self.windows: list[Window] = []
        self._by_key: dict = {}
        self.buffers: list = []
        self.cv = threading.Condition(threading.RLock())  # re-entrant: _drain applies under it
        self.transport = transport
        self.dead: dict[int, str] = {}
        self.epoch = 0  # programs finished (end markers sent)
        self.ends = [0] * size  # end markers received per peer
        self.sent_puts = [0] * size  # stores sent per destination (their sequence numbers)
        self.recv_puts = [0] * size  # stores received per source
        self.writes: list = []  # (src, src task name, src task id, window id, box, seq, epoch)
        self.notifies: dict = {}  # (window id, element) -> {src: stores acquired by the latest notify}
        self.events: list[RemoteEvent] = []
        self._stash: dict[int, list] = {}  # source -> messages waiting for a window (see receive)
        self.statuses: list[dict] = [{} for _ in range(size)]  # per source: agreement number -> error or None
        self._agreed = 0  # agreements made (agree)

    # ---- windows ----------------------------------------------------------------------------
    def alloc(self, name: str, nbytes: int):
        """A new :class:`pld.WindowBuffer` of ``nbytes`` (kept alive by the world)."""
        buf = pld.WindowBuffer(name, nbytes)
        self.buffers.append(buf)
        return buf

    def register_window(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Register view ``t`` as the next window (id = registration order)."""
        with self.cv:
            w = Window(len(self.windows), name, t)
            self.windows.append(w)
            self._by_key[(t.data_ptr(), tuple(t.shape), t.dtype)] = w
        self._drain()
        return t

    def window_of(self, gm, what: str) -> Window:
        """The window a kernel parameter ``gm`` (GMTensor) is bound to.

        Raises:
            DslError: ``gm`` is not a whole window parameter.
        """
        data = getattr(gm, "data", None)
        w = None if data is None else self._by_key.get((data.data_ptr(), tuple(data.shape), data.dtype))
        if w is None and data is not None and data.is_meta:
            # graph-only mode binds a float window parameter shape-only: the window of the
            # parameter's name, else the only one of its shape and dtype
            same = [v for v in self.windows if tuple(v.tensor.shape) == tuple(data.shape) and v.tensor.dtype == data.dtype]
            named = [v for v in same if v.name == getattr(gm, "name", None)]
            w = named[0] if len(named) == 1 else same[0] if len(same) == 1 else None
        if w is None:
            name = getattr(gm, "name", type(gm).__name__)
            raise DslError(f"{what}: {name!r} is not a window (pass a tensor from pld.window as a "
                           "pld.DistributedTensor parameter; offsets address the whole window)")
        return w

    def _region(self, w: Window, offsets, shape, what: str):
        from pto.language.typing import as_int
        offs = [as_int(o, f"an offset of {what}") for o in (offsets if isinstance(offsets, (list, tuple))
                                                            else [offsets])]
        dims = list(w.tensor.shape)
        shape = list(shape) + [1] * (len(dims) - len(shape)) if len(shape) < len(dims) else list(shape)
        if len(offs) != len(dims) or len(shape) != len(dims) or any(
                o < 0 or s < 0 or o + s > d for o, s, d in zip(offs, shape, dims)):
            raise DslError(f"{what}: region offsets {offs} shape {shape} outside window {w.name!r} {dims}")
        return offs, shape

    # ---- kernel-side operations ---------------------------------------------------------------
    def store(self, blk, target, peer: int, offsets, data: torch.Tensor, atomic: bool) -> None:
        """``remote_store`` / ``put`` of ``data`` into ``peer``'s window ``target``."""
        w = self.window_of(target, "pld.tile.remote_store")
        if data.dtype != w.tensor.dtype:
            raise DslError(f"pld.tile.remote_store: tile dtype {data.dtype} does not match window {w.name!r} "
                           f"{w.tensor.dtype} (cast first)")
        lead = [1] * (w.tensor.dim() - data.dim())
        offs, shape = self._region(w, offsets, lead + list(data.shape), "pld.tile.remote_store")
        data = data.reshape(shape).contiguous()
        task = blk.task
        if peer == self.rank:  # a local store: a write footprint, ordered by the task graph
            blk.fp.append((target.buf, w.box(offs, shape), 2 if atomic else 1))
            self._apply_put(self.rank, (w.id, offs, atomic, task.name, task.id, -1, self.epoch), data)
            return
        seq = self.sent_puts[peer]
        self.sent_puts[peer] += 1
        self.transport.send(peer, _PUT, (w.id, offs, atomic, task.name, task.id, seq, self.epoch), data)

    def notify(self, blk, target, peer: int, offsets, value: int, op) -> None:
        """``notify``: Set / AtomicAdd ``value`` into ``peer``'s signal element."""
        w = self.window_of(target, "pld.system.notify")
        if w.tensor.dtype.is_floating_point:
            raise DslError(f"pld.system.notify: signal window {w.name!r} must be an integer window")
        offs, _ = self._region(w, offsets, [1] * w.tensor.dim(), "pld.system.notify")
        meta = (w.id, tuple(offs), value, op is pld.NotifyOp.Set, self.sent_puts[peer] if peer != self.rank else 0)
        if peer == self.rank:
            self._apply_notify(self.rank, meta)
        else:
            self.transport.send(peer, _NOTIFY, meta, None)

    def wait(self, blk, signal, offsets, expected: int, cmp) -> None:
        """``wait``: block until ``signal[offsets]`` compares true (see the module docstring).

        Raises:
            DistributedError: timeout or a dead peer, naming rank, window, counter and value.
        """
        w = self.window_of(signal, "pld.system.wait")
        offs, _ = self._region(w, offsets, [1] * w.tensor.dim(), "pld.system.wait")
        el = tuple(offs)
        ge = cmp is pld.WaitCmp.Ge
        deadline = time.monotonic() + self.timeout_s
        with self.cv:
            while True:
                v = int(w.tensor[el])
                if (v >= expected) if ge else (v == expected):
                    break
                what = (f"rank {self.rank}: task {blk.task.name!r} waits on window {w.name!r} counter "
                        f"{list(el)} {'>=' if ge else '=='} {expected}, value {v}")
                if self.dead:
                    r, why = next(iter(self.dead.items()))
                    raise DistributedError(f"{what}: rank {r} died ({why})")
                if self.size == 1:
                    raise DistributedError(f"{what}: one rank, nothing else can notify it")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistributedError(f"{what}: not notified within {self.timeout_s:g} s "
                                           f"({TIMEOUT_ENV})")
                self.cv.wait(min(left, 1.0))
            acq = dict(self.notifies.get((w.id, el), {}))
        self.events.append(RemoteEvent(blk.task.id, blk.task.name, w.name, el, expected, acq))

    # ---- applying traffic (receiver threads, or the caller for this rank) ---------------------
    def _apply_put(self, src: int, meta, data: torch.Tensor) -> None:
        wid, offs, atomic, tname, tid, seq, epoch = meta
        w = self.windows[wid]
        region = tuple(slice(o, o + s) for o, s in zip(offs, data.shape))
        with self.cv:
            if data.is_meta:  # graph-only mode: a shape-only tile, nothing to copy (the write is recorded)
                pass
            elif atomic:
                w.tensor[region] += data
            else:
                w.tensor[region] = data
            self.writes.append((src, tname, tid, wid, w.box(offs, list(data.shape)), seq, epoch))
            self.cv.notify_all()

    def _apply_notify(self, src: int, meta) -> None:
        wid, el, value, is_set, puts_before = meta
        w = self.windows[wid]
        with self.cv:
            if is_set:
                w.tensor[el] = value
            else:
                w.tensor[el] += value
            self.notifies.setdefault((wid, el), {})[src] = puts_before
            self.cv.notify_all()

    def receive(self, src: int, kind: int, meta, data) -> None:
        """Apply one message from ``src`` (called by the transport's receiver thread).

        A peer may run ahead of this rank's host code (its first program's stores arrive while
        this rank is still allocating windows): a message for a window not registered yet, and
        every later one from the same source (FIFO order), waits in a per-source queue that
        :meth:`register_window` drains."""
        with self.cv:
            q = self._stash.setdefault(src, [])
            if q or (kind in (_PUT, _NOTIFY) and meta[0] >= len(self.windows)):
                q.append((kind, meta, data))
                return
        self._apply(src, kind, meta, data)

    def _drain(self) -> None:
        with self.cv:  # under the lock: a source's newer messages wait until its queue is empty
            for src, q in self._stash.items():
                while q and not (q[0][0] in (_PUT, _NOTIFY) and q[0][1][0] >= len(self.windows)):
                    self._apply(src, *q.pop(0))

    def _apply(self, src: int, kind: int, meta, data) -> None:
        if kind == _PUT:
            self._apply_put(src, meta, data)
        elif kind == _NOTIFY:
            self._apply_notify(src, meta)
        elif kind == _END:
            with self.cv:
                self.ends[src] = meta
                self.cv.notify_all()
        elif kind == _STATUS:
            with self.cv:
                self.statuses[src][meta[0]] = meta[1]
                self.cv.notify_all()

    def agree(self, error: str | None, what: str) -> dict[int, str]:
        """Every rank tells every other whether its step ``what`` (host code before any program,
        such as loading its weights) failed, and waits for theirs: ``error`` is this rank's
        failure (None: it succeeded). A peer that died counts as failed.

        Returns:
            ``{rank: error}`` of the ranks that failed (this one included), the same on every rank.

        Raises:
            DistributedError: a peer neither answered nor died within ``timeout_s``.
        """
        self._agreed += 1
        n = self._agreed
        failed = {self.rank: error} if error is not None else {}
        for p in range(self.size):
            if p != self.rank and p not in self.dead:
                try:
                    self.transport.send(p, _STATUS, (n, error), None)
                except DistributedError:
                    pass  # recorded in self.dead by the transport
        deadline = time.monotonic() + self.timeout_s
        with self.cv:
            while True:
                late = [p for p in range(self.size) if p != self.rank and n not in self.statuses[p]
                        and p not in self.dead]
                if not late:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistributedError(f"rank {self.rank}: {what}: ranks {late} did not report within "
                                           f"{self.timeout_s:g} s ({TIMEOUT_ENV})")
                self.cv.wait(min(left, 1.0))
            for p in range(self.size):
                if p == self.rank:
                    continue
                if n in self.statuses[p]:
                    if self.statuses[p][n] is not None:
                        failed[p] = self.statuses[p][n]
                else:
                    failed[p] = f"rank {p} died ({self.dead[p]})"
        return dict(sorted(failed.items()))

    def peer_failed(self, src: int, why: str) -> None:
        """The channel from ``src`` broke (the process died or closed early)."""
        with self.cv:
            self.dead.setdefault(src, why)
            self.cv.notify_all()

    # ---- program boundaries ------------------------------------------------------------------
    def end_program(self, prog) -> None:
        """After one program on every rank: count it; in check mode exchange end markers (all
        its traffic is then applied everywhere) and run the cross-rank race check; reset the
        per-program records. Outside check mode nothing waits here: a program that reuses a
        window orders the reuse by its own notify / wait chain, as on the device.

        Raises:
            DistributedError: a peer did not finish the program within ``timeout_s`` or died.
            RaceError: see the module docstring.
        """
        self.epoch += 1
        check = prog is not None and getattr(prog, "check", False)
        if self.size > 1 and check:
            for p in range(self.size):
                if p != self.rank:
                    self.transport.send(p, _END, self.epoch, None)
            deadline = time.monotonic() + self.timeout_s
            with self.cv:
                while any(self.ends[p] < self.epoch for p in range(self.size) if p != self.rank):
                    late = [p for p in range(self.size) if p != self.rank and self.ends[p] < self.epoch]
                    what = (f"rank {self.rank}: program {prog.name if prog else '?'!r} end: ranks {late} "
                            f"have not finished it")
                    if self.dead:
                        r, why = next(iter(self.dead.items()))
                        raise DistributedError(f"{what}; rank {r} died ({why})")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DistributedError(f"{what} within {self.timeout_s:g} s ({TIMEOUT_ENV})")
                    self.cv.wait(min(left, 1.0))
        try:
            if check:
                self._check_races(prog)
        finally:
            with self.cv:
                self.writes = [w for w in self.writes if w[6] >= self.epoch]
            self.events = []

    def _check_races(self, prog) -> None:
        cur = self.epoch - 1
        bufs = {}
        for buf in prog.buffers:
            w = self._by_key.get((buf.data.data_ptr(), tuple(buf.data.shape), buf.data.dtype)) \
                if buf.kind == "arg" else None
            if w is not None:
                bufs[buf.id] = w
        if not bufs:
            return
        g = prog.graph
        with self.cv:  # remote stores first: they are the cross-rank races this check exists for
            writes = sorted((w for w in self.writes if w[6] == cur), key=lambda w: w[0] == self.rank)
        for task in g.tasks:
            if task.kind == "dummy":
                continue
            for buf, kind, box in task.footprints:
                w = bufs.get(buf.id)
                if w is None or kind != 0:
                    continue
                for src, tname, tid, wid, wbox, seq, _ in writes:
                    if wid != w.id or not _overlap(box, wbox):
                        continue
                    if src == self.rank:
                        if tid <= task.id and g.reachable(tid, task.id):
                            continue
                    elif any(ev.acquired.get(src, 0) > seq and g.reachable(ev.task_id, task.id)
                             for ev in self.events):
                        continue
                    r0, r1 = max(box[0], wbox[0]), min(box[1], wbox[1])
                    c0, c1 = max(box[2], wbox[2]), min(box[3], wbox[3])
                    raise RaceError(
                        f"program {prog.name}: rank {self.rank} task {task.name!r} (id {task.id}) reads window "
                        f"{w.name!r}[{r0}:{r1}, {c0}:{c1}] that rank {src} task {tname!r} (id {tid}) wrote with "
                        f"remote_store/put, with no notify/wait ordering them (the reader must depend on a task "
                        f"whose pld.system.wait a notify from rank {src}, issued after the store, satisfied)")


_LOCAL = None
_WORLD: World | None = None


def local_world() -> World:
    """The one-rank world of a process without torch.distributed."""
    global _LOCAL
    if _LOCAL is None:
        _LOCAL = World(1, 0, timeout_s=1.0)
    return _LOCAL


class GlooTransport:
    """Point-to-point messages over a gloo process group: a header (kind, meta bytes, data
    bytes) int64, then one payload (pickled meta, raw data bytes), in one FIFO channel per
    pair of ranks."""

    def __init__(self, world: World):
        import torch.distributed as dist
        self.dist = dist
        self.world = world
        self.lock = threading.Lock()
        self.closed = set()
        self.threads = []
        for p in range(world.size):
            if p != world.rank:
                th = threading.Thread(target=self._recv_loop, args=(p,), daemon=True,
                                      name=f"pto-dist-recv-{p}")
                th.start()
                self.threads.append(th)

    def send(self, peer: int, kind: int, meta, data: torch.Tensor | None) -> None:
        """Send one message to ``peer`` (blocking until gloo has taken the bytes, at most the
        world's ``timeout_s`` per part: a live peer's receiver thread always drains its channel,
        so a send that makes no progress that long means the peer stopped, e.g. stuck or
        suspended, where gloo's own group timeout would wait for days).

        Raises:
            DistributedError: the channel to ``peer`` failed (the peer died) or took nothing
                for ``timeout_s`` (the peer stopped reading).
        """
        mb = pickle.dumps((meta, None if data is None else (data.dtype, tuple(data.shape))))
        payload = torch.frombuffer(bytearray(mb), dtype=torch.uint8)
        nd = 0
        if data is not None:
            db = data.contiguous().view(-1).view(torch.uint8)
            nd = db.numel()
            payload = torch.cat([payload, db])
        head = torch.tensor([kind, len(mb), nd], dtype=torch.int64)
        limit = datetime.timedelta(seconds=self.world.timeout_s)
        try:
            with self.lock:
                for part in (head, payload):  # two sends a message: sizes, then meta and data bytes
                    if self.dist.isend(part, peer).wait(limit) is False:
                        raise RuntimeError(f"Timed out waiting {self.world.timeout_s:g} s for the send")
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError subclasses
            first = _reason(e)
            self.world.peer_failed(peer, f"send failed: {first}")
            if "Timed out" in first:
                raise DistributedError(f"rank {self.world.rank}: sending to rank {peer} made no progress within "
                                       f"{self.world.timeout_s:g} s ({TIMEOUT_ENV}): rank {peer} stopped reading "
                                       "(stuck or suspended?)") from None
            raise DistributedError(f"rank {self.world.rank}: sending to rank {peer} failed (rank {peer} died?): "
                                   f"{first}") from None

    def _recv_loop(self, src: int) -> None:
        w = self.world
        try:
            while True:
                head = torch.empty(3, dtype=torch.int64)
                self.dist.recv(head, src)
                kind, nm, nd = (int(x) for x in head)
                payload = torch.empty(nm + nd, dtype=torch.uint8)
                self.dist.recv(payload, src)
                meta, spec = pickle.loads(payload[:nm].numpy().tobytes())
                data = None
                if spec is not None:
                    dtype, shape = spec
                    data = payload[nm:].clone().view(dtype).view(shape)
                if kind == _CLOSE:
                    self.closed.add(src)
                    return
                w.receive(src, kind, meta, data)
        except Exception as e:  # noqa: BLE001 - a dead peer surfaces as a gloo error here
            if src not in self.closed:
                w.peer_failed(src, f"connection lost: {_reason(e)}")

    def close(self) -> None:
        """Tell every peer this rank is done, wait (bounded) for theirs, destroy the group."""
        for p in range(self.world.size):
            if p != self.world.rank and p not in self.world.dead:
                try:
                    self.send(p, _CLOSE, None, None)
                except DistributedError:
                    pass
        for th in self.threads:
            th.join(timeout=min(self.world.timeout_s, 10.0))
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer already gone
            pass


class ThreadTransport:
    """Ranks as threads of one process: a send applies the message to the peer's world at once
    (a copy of the data), in send order. For tests and task counts; the semantics are those of
    :class:`GlooTransport` without the sockets."""

    def __init__(self, worlds: list):
        self.worlds = worlds

    def send(self, peer: int, kind: int, meta, data) -> None:
        """Deliver one message to ``peer``'s world."""
        self.worlds[peer].receive(self.src, kind, meta, None if data is None else data.clone())

    def close(self) -> None:
        """Nothing to close."""


def run_threads(fn, n: int, *, timeout_s: float | None = None) -> list:
    """Run ``fn(rank)`` as ``n`` ranks, one thread each, over :class:`ThreadTransport` (every
    ``pld`` call in a thread sees that thread's world; allocate windows inside ``fn``).

    Returns:
        ``fn``'s results in rank order.

    Raises:
        the first rank's exception (by rank) if any failed; DistributedError if a rank is
        still running ``timeout_s`` (default :func:`default_timeout_s`) after the others ended.
    """
    t = default_timeout_s() if timeout_s is None else float(timeout_s)
    worlds = [World(n, r, timeout_s=t) for r in range(n)]
    for r, w in enumerate(worlds):
        w.transport = ThreadTransport(worlds)
        w.transport.src = r
    results, errors = [None] * n, [None] * n

    def body(r):
        pld._thread.world = worlds[r]
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[r] = e
            for other in worlds:  # the peers' waits fail now, as for a dead process
                if other is not worlds[r]:
                    other.peer_failed(r, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        finally:
            pld._thread.world = None

    threads = [threading.Thread(target=body, args=(r,), name=f"pto-rank-{r}", daemon=True) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(t + 10.0)
    alive = [r for r, th in enumerate(threads) if th.is_alive()]
    for e in errors:
        if e is not None:
            raise e
    if alive:
        raise DistributedError(f"ranks {alive} still running {t:g} s after the others ended")
    return results


def init(timeout_s: float | None = None) -> World:
    """Join the run described by the torchrun environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``): a gloo process group, receiver threads, and the world
    that ``pld`` uses. Without ``WORLD_SIZE`` (or ``WORLD_SIZE=1``) the local one-rank world.

    Raises:
        ConfigError: a malformed environment.
        DistributedError: the group could not be formed within ``timeout_s``.
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE / RANK must be integers, got {os.environ.get('WORLD_SIZE')!r} / "
                          f"{os.environ.get('RANK')!r}") from None
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"RANK={rank} outside WORLD_SIZE={size}")
    t = default_timeout_s() if timeout_s is None else float(timeout_s)
    if size == 1:
        _WORLD = World(1, 0, timeout_s=t)
    else:
        import torch.distributed as dist
        from torch.distributed.rendezvous import rendezvous
        try:
            # the rendezvous (every rank joining) is bounded by the wait timeout; the group's own
            # timeout is not, since it bounds each blocking recv of the receiver threads, and a
            # peer may rightly send nothing for a long time (a dead peer closes the connection;
            # a stuck one is caught by the waits' own deadline)
            store, rank, size = next(rendezvous("env://", rank, size, timeout=datetime.timedelta(seconds=t)))
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(days=7))
        except Exception as e:  # noqa: BLE001 - rendezvous failures come in several classes
            raise DistributedError(f"rank {rank}: cannot join the gloo group of {size} ranks at "
                                   f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}: "
                                   f"{_reason(e)}") from None
        _WORLD = World(size, rank, timeout_s=t)
        _WORLD.transport = GlooTransport(_WORLD)
        atexit.register(shutdown)
    pld._world = _WORLD
    return _WORLD


def shutdown() -> None:
    """Leave the run (close the channels); the local one-rank world again afterwards."""
    global _WORLD
    w, _WORLD = _WORLD, None
    pld._world = None
    if w is not None and w.transport is not None:
        w.transport.close()


def run(entry, *args, config=None, **kwargs):
    """Run ``@pl.jit`` ``entry`` on this rank, then :meth:`World.end_program` (all ranks run
    the same program). Returns the Program.

    Raises:
        the program's errors; DistributedError / RaceError from the end of the program.
    """
    prog = entry.run(*args, config=config, **kwargs)
    pld.world().end_program(prog)
    return prog


def _reason(e: BaseException) -> str:
    """The first line of a gloo / rendezvous error without gloo's source location prefix
    (``[.../pair.cc:537] ``) and its generic advice sentence, at most 200 characters."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if text.startswith("[") and "] " in text:
        text = text[text.index("] ") + 2:]
    text = text.split(" This is typically caused by")[0]
    return text if len(text) <= 200 else text[:197] + "..."


def _signal_name(num: int) -> str:
    """``SIGKILL`` for 9; the number itself for one the platform does not name."""
    import signal
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], nprocs: int, *, timeout_s: float | None = None, grace_s: float = 10.0,
          quiet_ranks: bool = True, script: str | None = None) -> int:
    """Start ``nprocs`` ranks of ``python -m pto ARGV`` (``python SCRIPT ARGV`` with ``script``) on this machine (torchrun's environment:
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and wait.

    When a rank fails, the others get ``grace_s`` seconds to end on their own (they see the
    dead peer), then are killed; every child is reaped before returning, none is left behind.
    Ranks other than 0 have their stdout discarded when ``quiet_ranks`` (stderr is kept).

    Returns:
        0 if every rank exited 0, else the first failing rank's own exit code (1 when every
        failing rank was killed by a signal: each such rank is named on stderr; a signal's
        negative return code would leave the process as an exit status outside pto's codes).
    """
    port = _free_port()
    env = dict(os.environ, WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if timeout_s is not None:
        env[TIMEOUT_ENV] = str(timeout_s)
    env.pop("PTO_EP_SPAWNED", None)
    procs = []
    try:
        for r in range(nprocs):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r), PTO_EP_SPAWNED="1")
            out = subprocess.DEVNULL if (quiet_ranks and r) else None
            cmd = [sys.executable, script] if script else [sys.executable, "-m", "pto"]
            procs.append(subprocess.Popen([*cmd, *argv], env=e, stdout=out))
        code, failed_at = 0, None
        while True:
            states = [p.poll() for p in procs]
            bad = [c for c in states if c not in (None, 0)]
            if bad and failed_at is None:
                failed_at = time.monotonic()
            own = [c for c in bad if c > 0]
            if own and code <= 0:
                code = own[0]
            if all(c is not None for c in states):
                break
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                break
            time.sleep(0.05)
        for r, c in enumerate(states):
            if c is not None and c < 0:
                print(f"error: rank {r} was killed by signal {_signal_name(-c)}", file=sys.stderr)
        return code if code > 0 else (1 if failed_at is not None else 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
