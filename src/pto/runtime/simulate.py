"""Simulated accelerator: list-schedule a recorded task graph on a machine
model (DESIGN section 7).

Cost model, per block (one SPMD instance of one barrier phase):

* a block that issued a matmul runs on a cube core (AIC) for
  ``flops / cube_flops + bytes / aic_gm_bw``; a mixed cube + vector block
  occupies the AIC of one core group and all its flops are charged at the
  cube rate;
* any other block runs on a vector core (AIV) for
  ``flops / vec_flops + bytes / aiv_gm_bw``;
* every task pays ``dispatch_s`` between becoming ready and its first block
  starting; join nodes (``task_dummy``) cost nothing;
* the phases of a task split by ``syncall`` are barriers: phase k+1 of any
  block starts after phase k of every block ended (cores are released at the
  barrier);
* allocation-time initialisation is charged to the allocation, not to a
  task: a scratch buffer created with ``init_value`` is filled by the AICPU at
  ``memset_bw`` (one fill at a time, in allocation order), and every task that
  names the buffer (``task.buffers``) waits for the fill;
* ring-heap reuse: a scratch buffer whose heap bytes overlap an earlier,
  freed allocation is only available (and only filled) after every task that
  named the earlier allocation finished, as the device reclaims ring memory
  only when those tasks retire.

The scheduler is event driven: ready blocks wait in one queue per core type,
ordered by (ready time, task id, block index); a free core takes the head of
its queue; among free cores the lowest index wins. Everything is
deterministic. The critical path is the longest dependency chain with
unlimited cores (task weight = dispatch + sum over phases of the longest
block; fills are nodes of their own).

Figures are estimates, meant to be compared as ratios between variants of
one kernel; the machine constants below say where each number comes from.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pto.errors import ConfigError, PtoError

__all__ = ["Machine", "MACHINES", "SimResult", "BlockRun", "FillRun", "simulate", "get_machine"]


@dataclass(frozen=True)
class Machine:
    """A machine model (rates in SI units: FLOP/s, bytes/s, seconds).

    Attributes:
        name: model name (``a2a3``, ``a5`` or a test machine).
        n_aic, n_aiv: cube and vector core counts.
        cube_flops: peak of one AIC (FLOP/s; BF16/FP16 rate, also charged
            for INT8 matmuls).
        vec_flops: peak of one AIV (FLOP/s; FP32 elementwise rate).
        aic_gm_bw, aiv_gm_bw: GM (HBM) bytes/s available to one core.
        dispatch_s: per-task dispatch cost (seconds).
        memset_bw: AICPU fill bandwidth for ``init_value`` allocations (bytes/s).
        sources: where each constant comes from (for reports).
    """

    name: str
    n_aic: int
    n_aiv: int
    cube_flops: float
    vec_flops: float
    aic_gm_bw: float
    aiv_gm_bw: float
    dispatch_s: float
    memset_bw: float
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def block_us(self, flops: float, nbytes: float, cube: bool) -> float:
        """Duration in µs of one block with ``flops`` and ``nbytes`` of GM
        traffic on a cube core (``cube``) or a vector core."""
        if cube:
            return flops / (self.cube_flops / 1e6) + nbytes / (self.aic_gm_bw / 1e6)
        return flops / (self.vec_flops / 1e6) + nbytes / (self.aiv_gm_bw / 1e6)

    @property
    def dispatch_us(self) -> float:
        """Per-task dispatch cost in µs (an estimate; see the module constants)."""
        return self.dispatch_s * 1e6

    def fill_us(self, nbytes: int) -> float:
        """Duration in µs of an AICPU fill of ``nbytes``."""
        return nbytes / (self.memset_bw / 1e6)


# ---- machine constants ---------------------------------------------------------------
# a2a3: one Ascend 910B-class die (Atlas A2 / one die of an A3 910C package).
#   * 24 AIC + 48 AIV, core group = 1 AIC + 2 AIV: reference dsl-api.md section 1
#     ("Ascend 910B has 24 clusters") and the public PTO runtime's platform config
#     (PLATFORM_MAX_BLOCKDIM = 24, 1 AIC + 2 AIV per block).
#   * Cube peak 376 TFLOPS dense BF16/FP16 per die: "Serving Large Language Models on
#     Huawei CloudMatrix384" (Zuo et al., arXiv:2506.12708, 2025): 752 TFLOPS per
#     Ascend 910C package of two dies. Per AIC: 376e12 / 24.
#     Cross-check: a Da Vinci cube does 16x16x16 = 4096 FP16 MACs per cycle
#     (Huawei, Hot Chips 31, 2019), so 376 TFLOPS over 24 cubes implies ~1.91 GHz.
#   * Vector: a Da Vinci vector unit is 2048 bits wide (Hot Chips 31, 2019), i.e. 64
#     FP32 lanes per cycle; at the clock implied above: 64 * 1.91 GHz per AIV.
#   * HBM 1.6 TB/s per die (CloudMatrix384 paper: 3.2 TB/s per two-die 910C package;
#     public 910C reports give the same 3.2 TB/s). Per core: the fair share when every
#     core of its type streams at once (1.6 TB/s / 24 per AIC, / 48 per AIV); a lone
#     core is modelled no faster (estimate).
#   * Dispatch 2 µs per task and AICPU memset 50 GB/s: estimates (no public figure);
#     the 50 GB/s stands for a few AICPU Arm cores streaming stores.
_A2A3_CUBE = 376e12
_A2A3_CLOCK = _A2A3_CUBE / (24 * 4096 * 2)
_A2A3_HBM = 1.6e12

# a5: one Ascend 950-class chip (Ascend 950DT).
#   * 36 AIC + 72 AIV: public CANN runtime device properties of the 950-series chip
#     (hicann/runtime, src/runtime/feature/inc/base_david.hpp: RT_DAVID_AICORE_NUM = 36,
#     RT_DAVID_AIVECTOR_NUM = 72).
#   * Cube: Huawei Connect 2025 roadmap: 1 PFLOPS FP8 (2 PFLOPS FP4) per 950 chip; the
#     BF16/FP16 rate is taken as half the FP8 rate, 500 TFLOPS (estimate).
#   * HBM: 950DT with HiZQ 2.0, 144 GB at 4.0 TB/s (Huawei Connect 2025; the 950PR's
#     HiBL 1.0 gives 1.6 TB/s). Per core: fair share as for a2a3.
#   * Vector per AIV: no public figure; the a2a3 per-core rate is kept (estimate).
#   * Dispatch 1 µs (Huawei states the 950 generation halves task-scheduling latency;
#     estimate) and AICPU memset 50 GB/s (estimate).
_A5_CUBE = 500e12
_A5_HBM = 4.0e12

MACHINES: dict[str, Machine] = {
    "a2a3": Machine(
        name="a2a3", n_aic=24, n_aiv=48,
        cube_flops=_A2A3_CUBE / 24, vec_flops=64 * _A2A3_CLOCK,
        aic_gm_bw=_A2A3_HBM / 24, aiv_gm_bw=_A2A3_HBM / 48,
        dispatch_s=2e-6, memset_bw=50e9,
        sources={
            "cores": "24 AIC + 48 AIV: reference dsl-api.md 1; PTO runtime platform_config.h",
            "cube": "376 TFLOPS BF16 per die: CloudMatrix384 paper (arXiv:2506.12708)",
            "vector": "2048-bit vector unit (Hot Chips 31 Da Vinci) at the clock implied by the cube peak",
            "hbm": "1.6 TB/s per die: CloudMatrix384 paper (3.2 TB/s per 910C package)",
            "dispatch": "2 us per task: estimate",
            "memset": "50 GB/s AICPU fill: estimate",
        }),
    "a5": Machine(
        name="a5", n_aic=36, n_aiv=72,
        cube_flops=_A5_CUBE / 36, vec_flops=64 * _A2A3_CLOCK,
        aic_gm_bw=_A5_HBM / 36, aiv_gm_bw=_A5_HBM / 72,
        dispatch_s=1e-6, memset_bw=50e9,
        sources={
            "cores": "36 AIC + 72 AIV: CANN runtime base_david.hpp (950-series device properties)",
            "cube": "500 TFLOPS BF16 = half of the 1 PFLOPS FP8 of Huawei Connect 2025 (estimate)",
            "vector": "a2a3 per-core rate kept (estimate)",
            "hbm": "4.0 TB/s HiZQ 2.0 (Ascend 950DT, Huawei Connect 2025)",
            "dispatch": "1 us per task: estimate (950 halves scheduling latency per Huawei)",
            "memset": "50 GB/s AICPU fill: estimate",
        }),
}


def get_machine(machine) -> Machine:
    """The Machine named ``machine`` (or ``machine`` itself if it is one).

    Raises:
        ConfigError: an unknown machine name.
    """
    if isinstance(machine, Machine):
        return machine
    try:
        return MACHINES[machine]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown machine {machine!r}; known machines: {sorted(MACHINES)}") from None


@dataclass(frozen=True)
class BlockRun:
    """One scheduled block: task id and name, block index, phase, core type
    (``"aic"`` / ``"aiv"``), core index, start and end in µs, flops, bytes."""

    task: int
    name: str
    block: int
    phase: int
    core_type: str
    core: int
    start_us: float
    end_us: float
    flops: int
    bytes: int


@dataclass(frozen=True)
class FillRun:
    """One allocation-time fill on the AICPU: buffer id and name, bytes,
    start and end in µs."""

    buffer: int
    name: str
    nbytes: int
    start_us: float
    end_us: float


@dataclass
class SimResult:
    """Outcome of :func:`simulate` (times in µs).

    Attributes:
        machine: the Machine; makespan_us: end of the last block or fill.
        critical_path: node names along the longest dependency chain (fills
            appear as ``"fill <buffer>"``); critical_path_ids: task ids on it
            (fills excluded); critical_path_us: its length;
            critical_path_tasks: real tasks on it.
        utilisation: busy time / (cores * makespan) per core type
            (``"aic"``, ``"aiv"``); busy_us: busy time per core type.
        tasks, dummies, edges, blocks: graph counts (blocks after merging the
            records of one block and phase).
        fills, fill_bytes, fill_us: allocation-time fills.
        runs: every BlockRun; fill_runs: every FillRun;
        task_spans: {task id: (ready_us, start_us, end_us)}.
    """

    machine: Machine
    makespan_us: float = 0.0
    critical_path: list = field(default_factory=list)
    critical_path_ids: list = field(default_factory=list)
    critical_path_us: float = 0.0
    critical_path_tasks: int = 0
    utilisation: dict = field(default_factory=dict)
    busy_us: dict = field(default_factory=dict)
    tasks: int = 0
    dummies: int = 0
    edges: int = 0
    blocks: int = 0
    fills: int = 0
    fill_bytes: int = 0
    fill_us: float = 0.0
    runs: list = field(default_factory=list)
    fill_runs: list = field(default_factory=list)
    task_spans: dict = field(default_factory=dict)

    def as_row(self) -> dict:
        """The headline figures as a flat dict."""
        return {"machine": self.machine.name, "tasks": self.tasks, "edges": self.edges, "blocks": self.blocks,
                "fills": self.fills, "makespan_us": self.makespan_us, "critical_path_tasks": self.critical_path_tasks,
                "critical_path_us": self.critical_path_us, "aic_util": self.utilisation.get("aic", 0.0),
                "aiv_util": self.utilisation.get("aiv", 0.0)}

    def __str__(self) -> str:
        return (f"{self.machine.name}: makespan {self.makespan_us:.2f} us, {self.tasks} tasks, {self.edges} edges, "
                f"critical path {self.critical_path_tasks} tasks / {self.critical_path_us:.2f} us, "
                f"AIC {self.utilisation.get('aic', 0.0):.1%} AIV {self.utilisation.get('aiv', 0.0):.1%}")


# ---- graph preparation ---------------------------------------------------------------

def _phases(task) -> list:
    """Blocks of ``task`` merged per (phase, block index), grouped by phase:
    a list of phases, each a list of (idx, flops, bytes, cube)."""
    merged: dict = {}
    for b in task.blocks:
        key = (b.phase, b.idx)
        m = merged.get(key)
        if m is None:
            merged[key] = [b.flops, b.bytes, b.cube]
        else:
            m[0] += b.flops
            m[1] += b.bytes
            m[2] = m[2] or b.cube
    out: dict = {}
    for (ph, idx) in sorted(merged):
        f, nb, cube = merged[(ph, idx)]
        out.setdefault(ph, []).append((idx, f, nb, cube))
    return [out[ph] for ph in sorted(out)]


def _scratch_nodes(program, graph):
    """Per scratch buffer: (buffer, reuse predecessor task ids, fill flag).

    Reuse predecessors of buffer B are the tasks naming an earlier scratch
    buffer whose heap bytes overlap B's."""
    users: dict = {}
    for t in graph.tasks:
        for bid in t.buffers:
            users.setdefault(bid, []).append(t.id)
    scratch = [b for b in program.buffers if b.kind == "scratch" and b.offset is not None]
    nodes = {}
    for i, b in enumerate(scratch):
        lo, hi = b.offset, b.offset + max(b.nbytes, 1)
        preds = set()
        for e in scratch[:i]:
            if e.offset < hi and lo < e.offset + max(e.nbytes, 1):
                preds.update(users.get(e.id, ()))
        nodes[b.id] = (b, preds, b.init_value is not None)
    return nodes


# ---- simulation ----------------------------------------------------------------------

def simulate(program, machine="a2a3") -> SimResult:
    """List-schedule ``program.graph`` on ``machine`` (see the module docstring).

    Args:
        program: a finished :class:`pto.runtime.Program` (its graph, buffers
            and block counters).
        machine: ``"a2a3"``, ``"a5"`` or a :class:`Machine`.

    Returns:
        SimResult with makespan, critical path, utilisation and the schedule.

    Raises:
        ConfigError: an unknown machine name.
        PtoError: a graph whose dependencies cannot all be satisfied.
    """
    m = get_machine(machine)
    graph = program.graph
    tasks = graph.tasks
    n = len(tasks)
    res = SimResult(machine=m)
    res.tasks = sum(1 for t in tasks if t.kind != "dummy")
    res.dummies = n - res.tasks
    res.edges = sum(len(t.preds) for t in tasks)

    phases = [_phases(t) if t.kind != "dummy" else [] for t in tasks]
    res.blocks = sum(len(p) for ps in phases for p in ps)
    nodes = _scratch_nodes(program, graph)
    disp = m.dispatch_us
    dur = [[[m.block_us(f, nb, cube) for (_, f, nb, cube) in p] for p in ps] for ps in phases]

    # ---- dependency bookkeeping: tasks wait for preds and for their scratch buffers
    succs: list = [[] for _ in range(n)]
    waiting = [0] * n
    buf_waiters: dict = {bid: [] for bid in nodes}
    for t in tasks:
        for p in t.preds:
            succs[p].append(t.id)
        waiting[t.id] = len(t.preds)
        for bid in t.buffers:
            if bid in nodes:
                buf_waiters[bid].append(t.id)
                waiting[t.id] += 1
    reuse_left = {bid: len(preds) for bid, (_, preds, _) in nodes.items()}
    reuse_waiters: dict = {}
    for bid, (_, preds, _) in nodes.items():
        for p in preds:
            reuse_waiters.setdefault(p, []).append(bid)
    fill_order = sorted(bid for bid, (_, _, fill) in nodes.items() if fill)
    fill_ready = set()
    fill_state = {"next": 0, "busy_until": None}

    events: list = []  # (time, seq, kind, payload)
    seq = [0]

    def push(time, kind, payload):
        seq[0] += 1
        heapq.heappush(events, (time, seq[0], kind, payload))

    queues = {"aic": [], "aiv": []}
    free = {"aic": list(range(m.n_aic)), "aiv": list(range(m.n_aiv))}
    for q in free.values():
        heapq.heapify(q)
    busy = {"aic": 0.0, "aiv": 0.0}
    phase_left = [0] * n
    cur_phase = [0] * n
    spans: dict = {}
    finished = [False] * n
    buf_done: dict = {}

    def task_ready(tid, now):
        spans[tid] = [now, None, None]
        if tasks[tid].kind == "dummy":
            finish_task(tid, now)
        else:
            push(now + disp, "release", tid)

    def dec_task(tid, now):
        waiting[tid] -= 1
        if waiting[tid] == 0:
            task_ready(tid, now)

    def buffer_available(bid, now):
        buf_done[bid] = now
        for tid in buf_waiters[bid]:
            dec_task(tid, now)

    def start_phase(tid, now):
        ph = cur_phase[tid]
        blocks = phases[tid][ph]
        phase_left[tid] = len(blocks)
        for i, (idx, f, nb, cube) in enumerate(blocks):
            heapq.heappush(queues["aic" if cube else "aiv"], (now, tid, idx, ph, i))

    def finish_task(tid, now):
        finished[tid] = True
        sp = spans[tid]
        if sp[1] is None:
            sp[1] = now
        sp[2] = now
        for s in succs[tid]:
            dec_task(s, now)
        for bid in reuse_waiters.get(tid, ()):
            reuse_left[bid] -= 1
            if reuse_left[bid] == 0:
                alloc_ready(bid, now)

    def alloc_ready(bid, now):
        if nodes[bid][2]:
            fill_ready.add(bid)
            try_fill(now)
        else:
            buffer_available(bid, now)

    def try_fill(now):
        if fill_state["busy_until"] is not None:
            return
        k = fill_state["next"]
        if k < len(fill_order) and fill_order[k] in fill_ready:
            bid = fill_order[k]
            b = nodes[bid][0]
            end = now + m.fill_us(b.nbytes)
            res.fill_runs.append(FillRun(bid, b.name, b.nbytes, now, end))
            fill_state["busy_until"] = end
            push(end, "fill_end", bid)

    def dispatch_cores(now):
        for ct in ("aic", "aiv"):
            q, fr = queues[ct], free[ct]
            while q and fr:
                _, tid, idx, ph, i = heapq.heappop(q)
                core = heapq.heappop(fr)
                d = dur[tid][ph][i]
                _, f, nb, _ = phases[tid][ph][i]
                res.runs.append(BlockRun(tid, tasks[tid].name, idx, ph, ct, core, now, now + d, f, nb))
                if spans[tid][1] is None:
                    spans[tid][1] = now
                busy[ct] += d
                push(now + d, "block_end", (tid, ct, core))

    # ---- initial state
    for bid in sorted(nodes):
        if reuse_left[bid] == 0:
            alloc_ready(bid, 0.0)
    for t in tasks:
        if waiting[t.id] == 0 and t.id not in spans:
            task_ready(t.id, 0.0)
    now = 0.0
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "release":
                tid = payload
                if not phases[tid]:
                    finish_task(tid, now)
                else:
                    cur_phase[tid] = 0
                    start_phase(tid, now)
            elif kind == "block_end":
                tid, ct, core = payload
                heapq.heappush(free[ct], core)
                phase_left[tid] -= 1
                if phase_left[tid] == 0:
                    cur_phase[tid] += 1
                    if cur_phase[tid] < len(phases[tid]):
                        start_phase(tid, now)
                    else:
                        finish_task(tid, now)
            elif kind == "fill_end":
                fill_state["busy_until"] = None
                fill_state["next"] += 1
                buffer_available(payload, now)
                try_fill(now)
        dispatch_cores(now)
    if not all(finished):
        stuck = [tasks[i].name for i in range(n) if not finished[i]][:5]
        raise PtoError(f"simulate: {n - sum(finished)} tasks of {program.name} never became ready "
                       f"(e.g. {stuck}); the graph or its buffer records are inconsistent")

    ends = [r.end_us for r in res.runs] + [f.end_us for f in res.fill_runs] + [s[2] for s in spans.values()]
    res.makespan_us = max(ends, default=0.0)
    res.task_spans = {tid: tuple(s) for tid, s in sorted(spans.items())}
    res.busy_us = dict(busy)
    res.utilisation = {ct: (busy[ct] / (cnt * res.makespan_us) if res.makespan_us > 0 and cnt else 0.0)
                       for ct, cnt in (("aic", m.n_aic), ("aiv", m.n_aiv))}
    res.fills = len(res.fill_runs)
    res.fill_bytes = sum(f.nbytes for f in res.fill_runs)
    res.fill_us = sum(f.end_us - f.start_us for f in res.fill_runs)
    _critical_path(res, tasks, phases, dur, nodes, m)
    return res


def _critical_path(res: SimResult, tasks, phases, dur, nodes, m: Machine) -> None:
    """Longest dependency chain with unlimited cores (see the module docstring)."""
    disp = m.dispatch_us
    best: list = [0.0] * len(tasks)
    prev: list = [None] * len(tasks)  # ("task", id) or ("buf", id)
    buf_best: dict = {}
    buf_prev: dict = {}

    def buffer_end(bid):
        if bid not in buf_best:
            b, preds, fill = nodes[bid]
            start, arg = 0.0, None
            for p in sorted(preds):
                if best[p] > start or arg is None and best[p] >= start:
                    start, arg = best[p], p
            buf_best[bid] = start + (m.fill_us(b.nbytes) if fill else 0.0)
            buf_prev[bid] = arg
        return buf_best[bid]

    for t in tasks:
        start, arg = 0.0, None
        for p in sorted(t.preds):
            if best[p] > start or arg is None and best[p] >= start:
                start, arg = best[p], ("task", p)
        for bid in sorted(t.buffers):
            if bid in nodes:
                e = buffer_end(bid)
                if e > start or arg is None and e >= start and nodes[bid][2]:
                    start, arg = e, ("buf", bid)
        if t.kind == "dummy":
            w = 0.0
        else:
            w = disp + sum(max(d, default=0.0) for d in dur[t.id])
        best[t.id] = start + w
        prev[t.id] = arg
    if not tasks:
        return
    end = max(range(len(tasks)), key=lambda i: (best[i], -i))
    names, ids = [], []
    node = ("task", end)
    while node is not None:
        kind, i = node
        if kind == "task":
            if tasks[i].kind != "dummy":
                names.append(tasks[i].name)
                ids.append(i)
            node = prev[i]
        else:
            if nodes[i][2]:
                names.append(f"fill {nodes[i][0].name}")
            p = buf_prev.get(i)
            node = ("task", p) if p is not None else None
    res.critical_path = names[::-1]
    res.critical_path_ids = ids[::-1]
    res.critical_path_us = best[end]
    res.critical_path_tasks = len(ids)
