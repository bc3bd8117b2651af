"""Simulated accelerator: list-schedule a recorded task graph on a machine
model (docs/performance.md).

The machine is what the device runs a program on: cube cores (AIC), vector
cores (AIV) and the AICPU, which orchestrates and schedules.

AICPU (the reference runtime, simpler: an orchestrator thread and scheduler
threads released together; its ``orch`` and ``sched`` windows overlap and the
bench reports their union as the effective time):

* orchestration is one serial stream in program order: every task and join
  node is submitted at ``submit_us``; an ``init_value`` allocation is filled
  inline at its place in the program (``Buffer.tasks_before``) at ``fill_bw``,
  and delays every submission after it. A fill into ring-heap bytes that an
  earlier allocation used waits until the tasks naming that allocation
  finished (the ring is reclaimed only when they retire);
* the scheduler loop is one serial stream that dispatches a task once it is
  submitted, its predecessors finished and its scratch buffers are available,
  at ``dispatch_us`` per task, in (ready time, task id) order; a fill holds the
  AICPU, so no dispatch starts while one runs (the fill serialises on the
  orchestration and the scheduling path, pypto-lib PR #829); join nodes
  complete when ready, without a dispatch;
* a task's blocks are queued for cores when its dispatch ends; a block that
  finds no free core then pays the dispatch-to-start pickup again on the
  core it gets later (the ``[dispatch, start]`` gap of every block on the
  device's swimlane, about ``dispatch_us``).

Cores, per block (one SPMD instance of one barrier phase):

* a block that issued a matmul runs on a cube core for
  ``flops / cube_flops + bytes / aic_gm_bw``; a mixed cube + vector block
  occupies the AIC of one core group and all its flops are charged at the
  cube rate; any other block runs on a vector core for
  ``flops / vec_flops + bytes / aiv_gm_bw``;
* plus, as an in-order chain with no overlap, a fixed latency per operation
  the block issued (``Block.ops``, ``vk``, ``ld``, ``st``, ``mm``): per vector
  tile op its kind's fixed latency (``vec_kind_s``, via :data:`VEC_OP_OPCODES`;
  ``vec_op_s`` for a kind without an entry), ``cube_op_s`` per matmul,
  ``load_s`` per GM load and ``store_s`` per GM store (issue, pipeline drain
  and the GM round trip);
* the phases of a task split by ``syncall`` are barriers: phase k+1 of any
  block starts after phase k of every block ended;
* a scratch buffer (with or without ``init_value``) whose heap bytes overlap
  an earlier allocation is available only after every task naming the
  earlier one finished.

Ready blocks wait in one queue per core type, ordered by (ready time, task
id, block index); a free core takes the head of its queue; among free cores
the lowest index wins. Everything is deterministic.

Reported windows, as the device's bench reports them: ``orch_us`` (end of the
last submission or fill), ``sched_us`` (the last task finished), ``effective_us``
(their union; both open at 0), ``makespan_us`` (the last block ended). The
critical path is the longest chain with unlimited cores and an idle
scheduler: a task starts after its predecessors, its buffers and its own
submission (the orchestration stream is serial, so a submission can be the
binding constraint: it shows as ``submit <task>``, after the fills before it).

Figures are estimates; ``benchmarks/bench_sim_device.py`` holds them against
published device measurements. Each machine constant below names its source.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pto.errors import ConfigError, PtoError

__all__ = ["Machine", "MACHINES", "VEC_OP_OPCODES", "SimResult", "BlockRun", "FillRun", "AicpuRun", "FillVsSeed", "simulate",
           "get_machine", "fill_vs_seed", "HCA_DECODE_FILL_CALIBRATION"]


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
        submit_s: AICPU orchestration cost of submitting one task (seconds).
        dispatch_s: AICPU scheduler cost of dispatching one task (seconds).
        fill_bw: AICPU fill rate of ``init_value`` allocations (bytes/s).
        vec_op_s: fixed latency of one vector tile op on its core (seconds):
            issue plus the pipeline drain before a dependent op may start.
        cube_op_s: fixed latency of one matmul on the cube core (seconds):
            operand moves L1 -> L0A / L0B and the mmad issue.
        load_s: fixed latency of one GM load (tile load or scalar read) on
            the MTE2 pipe (seconds): GM read latency plus the copy's issue.
        store_s: fixed latency of one GM store (tile store, atomic assemble
            or scalar write) on the MTE3 pipe (seconds).
        vec_kind_s: per-kind vector latencies, ``((cost-model opcode, seconds), ...)``; a
            vector op whose kind (``Block.vk``, mapped by :data:`VEC_OP_OPCODES`) has an
            entry takes it, any other vector op ``vec_op_s``.
        sources: where each constant comes from (for reports).

    The latency terms default to 0 and no per-kind table (a machine without per-op latency).
    """

    name: str
    n_aic: int
    n_aiv: int
    cube_flops: float
    vec_flops: float
    aic_gm_bw: float
    aiv_gm_bw: float
    submit_s: float
    dispatch_s: float
    fill_bw: float
    vec_op_s: float = 0.0
    cube_op_s: float = 0.0
    load_s: float = 0.0
    store_s: float = 0.0
    vec_kind_s: tuple = ()
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def vec_latency_s(self, ops: int, kinds: dict | None = None) -> float:
        """Fixed latency (seconds) of ``ops`` vector ops of which ``kinds`` (``{op name:
        count}``, ``Block.vk``) are named: each named kind with a ``vec_kind_s`` entry at that
        entry, every other op at ``vec_op_s``."""
        if not kinds or not self.vec_kind_s:
            return ops * self.vec_op_s
        table = dict(self.vec_kind_s)
        lat, rest = 0.0, ops
        for kind, n in kinds.items():
            sec = table.get(VEC_OP_OPCODES.get(kind))
            if sec is not None:
                lat += n * sec
                rest -= n
        return lat + rest * self.vec_op_s

    def block_us(self, flops: float, nbytes: float, cube: bool, ops: int = 0, loads: int = 0, stores: int = 0,
                 matmuls: int = 0, kinds: dict | None = None) -> float:
        """Duration in µs of one block on a cube core (``cube``) or a vector core.

        Args:
            flops, nbytes: floating/integer operations and GM bytes moved.
            cube: the block issued a matmul (a cube core, all flops at the cube rate).
            ops: tile ops issued, matmuls included; loads, stores: GM accesses;
                matmuls: matmuls issued (``ops - matmuls`` are vector ops).
            kinds: the named vector ops by kind (``Block.vk``), a subset of the vector ops.

        The block is an in-order chain: throughput terms ``flops / peak + bytes
        / bandwidth`` plus one fixed latency per op (:meth:`vec_latency_s` for the vector
        ops, ``cube_op_s``, ``load_s``, ``store_s``), none overlapping the next."""
        lat = (self.vec_latency_s(ops - matmuls, kinds) + matmuls * self.cube_op_s + loads * self.load_s
               + stores * self.store_s) * 1e6
        if cube:
            return flops / (self.cube_flops / 1e6) + nbytes / (self.aic_gm_bw / 1e6) + lat
        return flops / (self.vec_flops / 1e6) + nbytes / (self.aiv_gm_bw / 1e6) + lat

    @property
    def submit_us(self) -> float:
        """AICPU cost of submitting one task, µs."""
        return self.submit_s * 1e6

    @property
    def dispatch_us(self) -> float:
        """AICPU cost of dispatching one task, µs."""
        return self.dispatch_s * 1e6

    def fill_us(self, nbytes: int) -> float:
        """Duration in µs of an AICPU fill of ``nbytes`` (0 for an infinite rate)."""
        return 0.0 if self.fill_bw == float("inf") else nbytes / (self.fill_bw / 1e6)


# ---- machine constants ---------------------------------------------------------------
# a2a3: one Ascend 910B-class die (Atlas A2 / one die of an A3 910C package).
#   * 24 AIC + 48 AIV, core group = 1 AIC + 2 AIV: hw-native-sys/pypto `docs/en/user/`
#     ("Ascend 910B has 24 clusters") and the public PTO runtime's platform config
#     (PLATFORM_MAX_BLOCKDIM = 24, 1 AIC + 2 AIV per block).
#   * Cube peak 376 TFLOPS dense BF16/FP16 per die: "Serving Large Language Models on
#     Huawei CloudMatrix384" (Zuo et al., arXiv:2506.12708, 2025): 752 TFLOPS per
#     Ascend 910C package of two dies. Per AIC: 376e12 / 24.
#     Cross-check: a Da Vinci cube does 16x16x16 = 4096 FP16 MACs per cycle
#     (Huawei, Hot Chips 31, 2019), so 376 TFLOPS over 24 cubes implies ~1.91 GHz.
#   * Vector: a Da Vinci vector unit is 2048 bits wide (Hot Chips 31, 2019), i.e. 64
#     FP32 lanes per cycle; at the clock implied above: 64 * 1.91 GHz per AIV.
#   * HBM 1.6 TB/s per die (CloudMatrix384 paper: 3.2 TB/s per two-die 910C package).
#     Per core: the fair share when every core of its type streams at once (1.6 TB/s /
#     24 per AIC, / 48 per AIV); a lone core is modelled no faster (estimate).
#   * AICPU submit 0.874 us per task: the reference runtime's C++ orchestrator, measured
#     per submitted task (hw-native-sys/simpler, device-log profiling guide).
#   * AICPU dispatch 0.8 us per task: the "pickup latency", the [dispatch, start] gap of a
#     block on its core, "~0.8 us per switch" (hw-native-sys/pypto,
#     docs/en/user/performance/01-task-granularity.md); charged to the scheduler stream per
#     task and again to a block that starts on a core only after its task's dispatch.
#     Cross-check, not fit: submit + dispatch = 1.67 us, against "about 1.7 us per dispatch"
#     on a standalone hc_pre (hw-native-sys/pypto-lib PR #545).
#   * AICPU fill rate: the one calibrated constant, see HCA_DECODE_FILL_CALIBRATION.
#   * Per-op latencies on the cores: the A2A3 tables of the CANN PyPTO cost model
#     (hicann/pypto, framework/src/cost_model/simulation/arch/A2A3/PostSimulatorA2A3.h, per op
#     a [us per MB, fixed us] pair, and arch/PipeSimulatorFast.cpp, which turns them into cycles
#     at 2000 cycles per us and adds 1400 cycles of GM read latency to every COPY_IN and 300
#     cycles of GM write latency to every COPY_OUT; each pipe runs one tile op at a time).
#     Only the fixed terms are taken (the byte and flop terms stay the rates above):
#       vector ops: each kind its own fixed term (_A2A3_VEC_KINDS below: ADD 0.0188, MUL 0.01419,
#         EXP 0.02597, ROWSUMLINE 0.07288, ROWMAX_SINGLE 0.00888, ...); a kind the table does not
#         have (abs, rsqrt, gather, select, ...) 0.0188 us, the median fixed term of its 18 vector
#         ops (ADD and the WHERE family);
#       matmul 0.0377 us: L1_TO_L0A 0.015 + L1_TO_L0B 0.012 + A_MUL_B 0.0107;
#       GM load 0.7024 us: 1400 cycles / 2000 per us + COPY_IN 0.00241;
#       GM store 0.15195 us: 300 cycles / 2000 per us + COPY_OUT 0.00195.
# DSL tile ops -> CANN PyPTO cost-model opcodes (the op names of PostSimulatorA2A3.h / A5.h); a
# tile-number form ("add_s") maps to the scalar opcode (ADDS, MULS, ...); the expand-and-combine
# ops to their combining op; col_expand_expdif (exp(x - col)) to EXP. Ops not here (abs, rsqrt,
# gather, select, cmp, fillpad, full, arange, sorts, ...) take the median.
VEC_OP_OPCODES = {
    "add": "ADD", "sub": "SUB", "mul": "MUL", "div": "DIV", "add_s": "ADDS", "sub_s": "SUBS", "mul_s": "MULS",
    "div_s": "DIVS", "maximum": "MAXIMUM", "minimum": "MAXIMUM", "maximum_s": "MAXIMUM", "minimum_s": "MAXIMUM",
    "neg": "NEG", "exp": "EXP", "log": "LN", "sqrt": "SQRT", "recip": "RECIPROCAL",
    "row_sum": "ROWSUMLINE", "col_sum": "ROWSUMLINE", "row_max": "ROWMAX_SINGLE", "row_min": "ROWMIN_SINGLE",
    "col_max": "ROWMAX_SINGLE", "row_expand": "EXPAND", "col_expand": "EXPAND",
    "row_expand_mul": "MUL", "col_expand_mul": "MUL", "row_expand_div": "DIV", "col_expand_div": "DIV",
    "row_expand_sub": "SUB", "col_expand_sub": "SUB", "row_expand_add": "ADD", "col_expand_add": "ADD",
    "col_expand_expdif": "EXP", "cast": "CAST", "transpose": "TRANSPOSE_MOVEOUT",
}
# Fixed terms (us) of the vector opcodes of the A2A3 table (PostSimulatorA2A3.h) and the A5 table
# (PostSimulatorA5.h, six vector ops).
_A2A3_VEC_KINDS = (("ADD", 0.0188), ("SUB", 0.02152), ("MUL", 0.01419), ("DIV", 0.02462), ("ADDS", 0.0221),
                   ("SUBS", 0.0221), ("MULS", 0.015), ("DIVS", 0.015), ("SQRT", 0.02197), ("EXP", 0.02597),
                   ("NEG", 0.015), ("LN", 0.02597), ("RECIPROCAL", 0.00989), ("ROWSUMLINE", 0.07288),
                   ("ROWMAX_SINGLE", 0.00888), ("ROWMIN_SINGLE", 0.00888), ("EXPAND", 0.014), ("CAST", 0.015687),
                   ("TRANSPOSE_MOVEOUT", 0.0335), ("MAXIMUM", 0.0))
_A5_VEC_KINDS = (("ADD", 0.01992), ("SUB", 0.0312), ("DIV", 0.02462), ("ADDS", 0.0221), ("EXPAND", 0.014),
                 ("CAST", 0.015687))

_A2A3_CUBE = 376e12
_A2A3_CLOCK = _A2A3_CUBE / (24 * 4096 * 2)
_A2A3_HBM = 1.6e12
_A2A3_SUBMIT = 0.874e-6
_A2A3_DISPATCH = 0.8e-6
_COST_MODEL_FREQ = 2000e6  # cycles per second in the cost model's cycle conversion
_A2A3_VEC_OP = 0.0188e-6
_CUBE_OP = (0.015 + 0.012 + 0.0107) * 1e-6
_GM_LOAD = 1400 / _COST_MODEL_FREQ + 0.00240884e-6
_GM_STORE = 300 / _COST_MODEL_FREQ + 0.00195e-6

# The fill rate, calibrated on one published figure only (hw-native-sys/pypto-lib PR #829,
# a2a3, HCA decode, PYPTO_BENCH=1, median of 100 rounds): the orchestration window went
# 48.6 -> 107.9 us when the split-K zero-seeds of qr_fp32, kv_fp32 (qkv_proj_rope) and
# mixes_raw (hc_pre) moved from three on-core seed tasks to create_tensor(init_value=0).
# In this model the orchestration window is sum(submits) + sum(fills), so
#   delta_orch = fill_bytes / fill_bw - seed_tasks * submit
# with fill_bytes the FLASH decode (T = 8, t_pad = 16 rows) sizes of the three buffers:
# qr_fp32 16 x 1024 FP32 (65536 B) + kv_fp32 16 x 512 FP32 (32768 B) + mixes_raw 16 x 32
# FP32 (2048 B) = 100352 B (tests/runtime/test_simulate.py checks these against the
# registered kernels). Every other published figure is a check, not a fit.
HCA_DECODE_FILL_CALIBRATION = {
    "source": "hw-native-sys/pypto-lib PR #829 (a2a3, HCA decode, median of 100 rounds)",
    "orch_seed_us": 48.6, "orch_init_us": 107.9, "seed_tasks": 3,
    "fill_bytes": {"qr_fp32": 65536, "kv_fp32": 32768, "mixes_raw": 2048},
}


def _calibrated_fill_bw(cal: dict, submit_s: float) -> float:
    """Fill rate (bytes/s) that reproduces the calibration's orchestration-window delta."""
    fill_s = (cal["orch_init_us"] - cal["orch_seed_us"]) * 1e-6 + cal["seed_tasks"] * submit_s
    return sum(cal["fill_bytes"].values()) / fill_s


_A2A3_FILL = _calibrated_fill_bw(HCA_DECODE_FILL_CALIBRATION, _A2A3_SUBMIT)

# a5: one Ascend 950-class chip (Ascend 950DT).
#   * 36 AIC + 72 AIV: public CANN runtime device properties of the 950-series chip
#     (hicann/runtime, src/runtime/feature/inc/base_david.hpp: RT_DAVID_AICORE_NUM = 36,
#     RT_DAVID_AIVECTOR_NUM = 72).
#   * Cube: Huawei Connect 2025 roadmap: 1 PFLOPS FP8 (2 PFLOPS FP4) per 950 chip; the
#     BF16/FP16 rate is taken as half the FP8 rate, 500 TFLOPS (estimate).
#   * HBM: 950DT with HiZQ 2.0, 144 GB at 4.0 TB/s (Huawei Connect 2025; the 950PR's
#     HiBL 1.0 gives 1.6 TB/s). Per core: fair share as for a2a3.
#   * Vector per AIV: no public figure; the a2a3 per-core rate is kept (estimate).
#   * AICPU submit, dispatch and fill: no published a5 figures; the a2a3 values are kept
#     (estimate: the same runtime code on an AICPU of the same class).
#   * Per-op latencies: the A5 table of the same cost model (arch/A5/PostSimulatorA5.h):
#     vector op 0.02101 us, the median fixed term of its six vector ops (ADD 0.01992, SUB
#     0.0312, DIV 0.02462, ADDS 0.0221, EXPAND 0.014, CAST 0.015687); matmul, GM load and
#     store as a2a3 (the same L1_TO_L0A/B, A_MUL_B, COPY_IN/OUT entries and GM latencies).
_A5_CUBE = 500e12
_A5_HBM = 4.0e12
_A5_VEC_OP = (0.01992 + 0.0221) / 2 * 1e-6

_COST_MODEL = "CANN PyPTO cost model (hicann/pypto, cost_model/simulation/arch/{}, PipeSimulatorFast.cpp)"
_LATENCY_SOURCES = {
    "vector op": ("per kind, the fixed term of its opcode (VEC_OP_OPCODES); 0.0188 us, the median of the 18 "
                  "vector ops, for a kind without one: " + _COST_MODEL.format("A2A3/PostSimulatorA2A3.h")),
    "matmul op": "0.0377 us per matmul: L1_TO_L0A + L1_TO_L0B + A_MUL_B fixed terms, " + _COST_MODEL.format(
        "A2A3/PostSimulatorA2A3.h"),
    "GM load": "0.7024 us per load: 1400 cycles GM read latency at 2000 cycles/us + COPY_IN, " + _COST_MODEL.format(
        "A2A3/PostSimulatorA2A3.h"),
    "GM store": "0.152 us per store: 300 cycles GM write latency at 2000 cycles/us + COPY_OUT, " + _COST_MODEL.format(
        "A2A3/PostSimulatorA2A3.h"),
}

_AICPU_SOURCES = {
    "submit": "0.874 us per submitted task: simpler device-log profiling guide (C++ orchestrator, a2a3)",
    "dispatch": ("0.8 us per dispatch-to-start switch: pypto docs/en/user/performance/01-task-granularity.md "
                 "(per task on the scheduler, again per later-wave block)"),
    "fill": (f"{_A2A3_FILL / 1e9:.3f} GB/s AICPU fill: calibrated on the orchestration-window delta "
             f"48.6 -> 107.9 us of pypto-lib PR #829 (HCA decode, a2a3)"),
}

MACHINES: dict[str, Machine] = {
    "a2a3": Machine(
        name="a2a3", n_aic=24, n_aiv=48,
        cube_flops=_A2A3_CUBE / 24, vec_flops=64 * _A2A3_CLOCK,
        aic_gm_bw=_A2A3_HBM / 24, aiv_gm_bw=_A2A3_HBM / 48,
        submit_s=_A2A3_SUBMIT, dispatch_s=_A2A3_DISPATCH, fill_bw=_A2A3_FILL,
        vec_op_s=_A2A3_VEC_OP, cube_op_s=_CUBE_OP, load_s=_GM_LOAD, store_s=_GM_STORE,
        vec_kind_s=tuple((k, v * 1e-6) for k, v in _A2A3_VEC_KINDS),
        sources={
            "cores": "24 AIC + 48 AIV: hw-native-sys/pypto `docs/en/user/`; PTO runtime platform_config.h",
            "cube": "376 TFLOPS BF16 per die: CloudMatrix384 paper (arXiv:2506.12708)",
            "vector": "2048-bit vector unit (Hot Chips 31 Da Vinci) at the clock implied by the cube peak",
            "hbm": "1.6 TB/s per die: CloudMatrix384 paper (3.2 TB/s per 910C package)",
            **_LATENCY_SOURCES,
            **_AICPU_SOURCES,
        }),
    "a5": Machine(
        name="a5", n_aic=36, n_aiv=72,
        cube_flops=_A5_CUBE / 36, vec_flops=64 * _A2A3_CLOCK,
        aic_gm_bw=_A5_HBM / 36, aiv_gm_bw=_A5_HBM / 72,
        submit_s=_A2A3_SUBMIT, dispatch_s=_A2A3_DISPATCH, fill_bw=_A2A3_FILL,
        vec_op_s=_A5_VEC_OP, cube_op_s=_CUBE_OP, load_s=_GM_LOAD, store_s=_GM_STORE,
        vec_kind_s=tuple((k, v * 1e-6) for k, v in _A5_VEC_KINDS),
        sources={
            "cores": "36 AIC + 72 AIV: CANN runtime base_david.hpp (950-series device properties)",
            "cube": "500 TFLOPS BF16 = half of the 1 PFLOPS FP8 of Huawei Connect 2025 (estimate)",
            "vector": "a2a3 per-core rate kept (estimate)",
            "hbm": "4.0 TB/s HiZQ 2.0 (Ascend 950DT, Huawei Connect 2025)",
            "vector op": ("per kind, the fixed term of its opcode among the 6 vector ops; 0.02101 us, their "
                          "median, for any other kind: " + _COST_MODEL.format("A5/PostSimulatorA5.h")),
            **{k: v.replace("A2A3/PostSimulatorA2A3.h", "A5/PostSimulatorA5.h")
               for k, v in _LATENCY_SOURCES.items() if k != "vector op"},
            **{k: f"a2a3 value kept (estimate; no a5 figure): {v}" for k, v in _AICPU_SOURCES.items()},
        }),
}


def _check_machine(m: Machine) -> None:
    """ConfigError naming a constant of ``m`` a schedule cannot use: core counts must be
    positive integers, rates positive (``inf``: that work is free), costs and latencies finite
    and non-negative."""
    import math
    import numbers
    for f in ("n_aic", "n_aiv"):
        v = getattr(m, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ConfigError(f"machine {m.name!r}: {f} must be a positive integer core count, got {v!r}")
    for f in ("cube_flops", "vec_flops", "aic_gm_bw", "aiv_gm_bw", "fill_bw"):
        v = getattr(m, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or v <= 0:
            raise ConfigError(f"machine {m.name!r}: {f} must be a positive rate (inf: free), got {v!r}")
    for f in ("submit_s", "dispatch_s", "vec_op_s", "cube_op_s", "load_s", "store_s"):
        v = getattr(m, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"machine {m.name!r}: {f} must be a finite non-negative time in seconds, got {v!r}")
    for kind, v in m.vec_kind_s:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"machine {m.name!r}: vec_kind_s {kind!r} must be a finite non-negative time, got {v!r}")


def get_machine(machine) -> Machine:
    """The Machine named ``machine`` (or ``machine`` itself if it is one, checked).

    Raises:
        ConfigError: an unknown machine name; a Machine with a constant a schedule cannot use
            (a core count below 1, a rate that is not positive, a negative or non-finite cost).
    """
    if isinstance(machine, Machine):
        _check_machine(machine)
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


@dataclass(frozen=True)
class AicpuRun:
    """One AICPU step: ``kind`` ``"submit"`` (orchestration) or
    ``"dispatch"`` (scheduler), task id and name, start and end in µs."""

    kind: str
    task: int
    name: str
    start_us: float
    end_us: float


@dataclass
class SimResult:
    """Outcome of :func:`simulate` (times in µs).

    Attributes:
        machine: the Machine.
        orch_us: orchestration window (end of the last submission or fill);
            sched_us: scheduler window (the last task finished);
            effective_us: their union (both open at 0); makespan_us: end of
            the last block on a core.
        critical_path: node names along the longest dependency chain (fills
            appear as ``"fill <buffer>"``, a binding submission as
            ``"submit <task>"``); critical_path_ids: task ids on it;
            critical_path_us: its length; critical_path_tasks: real tasks on it.
        utilisation: busy time / (cores * effective time) per core type
            (``"aic"``, ``"aiv"``); busy_us: busy time per core type.
        tasks, dummies, edges, blocks: graph counts (blocks after merging the
            records of one block and phase).
        fills, fill_bytes, fill_us: allocation-time fills.
        runs: every BlockRun; fill_runs: every FillRun; aicpu_runs: every
            submission and dispatch (AicpuRun);
        task_spans: {task id: (ready_us, start_us, end_us)}: ready = submitted,
            predecessors done and buffers available; start = first block (or
            completion for a join node or an empty task).
        reuse_succs: {task id: ids of the tasks that waited for ring-heap bytes it was among the
            last to use} (a dependency through memory reuse, beside the graph's edges).
    """

    machine: Machine
    orch_us: float = 0.0
    sched_us: float = 0.0
    effective_us: float = 0.0
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
    aicpu_runs: list = field(default_factory=list)
    task_spans: dict = field(default_factory=dict)
    reuse_succs: dict = field(default_factory=dict)

    def as_row(self) -> dict:
        """The headline figures as a flat dict."""
        return {"machine": self.machine.name, "tasks": self.tasks, "edges": self.edges, "blocks": self.blocks,
                "fills": self.fills, "orch_us": self.orch_us, "sched_us": self.sched_us,
                "effective_us": self.effective_us, "makespan_us": self.makespan_us,
                "critical_path_tasks": self.critical_path_tasks, "critical_path_us": self.critical_path_us,
                "aic_util": self.utilisation.get("aic", 0.0), "aiv_util": self.utilisation.get("aiv", 0.0)}

    def __str__(self) -> str:
        return (f"{self.machine.name}: effective {self.effective_us:.2f} us (orch {self.orch_us:.2f}, sched "
                f"{self.sched_us:.2f}), {self.tasks} tasks, {self.edges} edges, critical path "
                f"{self.critical_path_tasks} tasks / {self.critical_path_us:.2f} us, "
                f"AIC {self.utilisation.get('aic', 0.0):.1%} AIV {self.utilisation.get('aiv', 0.0):.1%}")


# ---- graph preparation ---------------------------------------------------------------

def _phases(task) -> list:
    """Blocks of ``task`` merged per (phase, block index), grouped by phase:
    a list of phases, each a list of (idx, flops, bytes, cube, ops, loads,
    stores, matmuls, vector ops by kind or None)."""
    merged: dict = {}
    for b in task.blocks:
        key = (b.phase, b.idx)
        m = merged.get(key)
        vk = getattr(b, "vk", None)
        if m is None:
            merged[key] = [b.flops, b.bytes, b.cube, b.ops, b.ld, b.st, b.mm, dict(vk) if vk else None]
        else:
            m[0] += b.flops
            m[1] += b.bytes
            m[2] = m[2] or b.cube
            m[3] += b.ops
            m[4] += b.ld
            m[5] += b.st
            m[6] += b.mm
            if vk:
                if m[7] is None:
                    m[7] = {}
                for k, n in vk.items():
                    m[7][k] = m[7].get(k, 0) + n
    out: dict = {}
    for (ph, idx) in sorted(merged):
        out.setdefault(ph, []).append((idx, *merged[(ph, idx)]))
    return [out[ph] for ph in sorted(out)]


def _block_us(m: Machine, rec: tuple) -> float:
    """Duration in µs of one merged block record of :func:`_phases` on ``m``."""
    _, f, nb, cube, ops, ld, st, mm, vk = rec
    return m.block_us(f, nb, cube, ops, ld, st, mm, vk)


def _scratch_nodes(program, graph, free_fills):
    """Per scratch buffer: (buffer, reuse predecessor task ids, fill flag).

    Reuse predecessors of buffer B are the tasks naming an earlier scratch
    buffer whose heap bytes overlap B's. ``free_fills``: buffer ids whose
    fill is not charged (counterfactuals of :func:`fill_vs_seed`)."""
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
        nodes[b.id] = (b, preds, b.init_value is not None and b.id not in free_fills)
    return nodes


def _orchestration(tasks, nodes) -> list:
    """The orchestration stream in program order: ``("fill", buffer id)`` for
    each init_value allocation at its place, ``("submit", task id)`` for each
    task and join node."""
    fills_at: dict = {}
    for bid in sorted(nodes):
        b, _, fill = nodes[bid]
        if fill:
            fills_at.setdefault(min(getattr(b, "tasks_before", 0), len(tasks)), []).append(bid)
    seq = []
    for k in range(len(tasks) + 1):
        seq.extend(("fill", bid) for bid in fills_at.get(k, ()))
        if k < len(tasks):
            seq.append(("submit", k))
    return seq


# ---- simulation ----------------------------------------------------------------------

def simulate(program, machine="a2a3", *, free_tasks=frozenset(), free_fills=frozenset()) -> SimResult:
    """List-schedule ``program.graph`` on ``machine`` (see the module docstring).

    Args:
        program: a finished :class:`pto.runtime.Program` (its graph, buffers
            and block counters).
        machine: ``"a2a3"``, ``"a5"`` or a :class:`Machine`.
        free_tasks: task ids that cost nothing (no submission, no dispatch,
            no blocks; they complete when ready, like join nodes), for
            counterfactuals (:func:`fill_vs_seed`).
        free_fills: buffer ids whose ``init_value`` fill costs nothing.

    Returns:
        SimResult with the AICPU windows, makespan, critical path, utilisation
        and the schedule.

    Raises:
        ConfigError: an unknown machine name, or a Machine with an unusable constant
            (:func:`get_machine`).
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

    free = [t.kind == "dummy" or t.id in free_tasks for t in tasks]
    phases = [_phases(t) if not free[t.id] else [] for t in tasks]
    res.blocks = sum(len(p) for ps in phases for p in ps)
    nodes = _scratch_nodes(program, graph, free_fills)
    seq = _orchestration(tasks, nodes)
    sub_us, disp_us = m.submit_us, m.dispatch_us
    dur = [[[_block_us(m, rec) for rec in p] for p in ps] for ps in phases]

    # ---- dependency bookkeeping: a task waits for its submission, its preds and its scratch buffers
    succs: list = [[] for _ in range(n)]
    waiting = [1] * n
    buf_waiters: dict = {bid: [] for bid in nodes}
    for t in tasks:
        for p in t.preds:
            succs[p].append(t.id)
        waiting[t.id] += len(t.preds)
        for bid in t.buffers:
            if bid in nodes:
                buf_waiters[bid].append(t.id)
                waiting[t.id] += 1
    reuse_left = {bid: len(preds) for bid, (_, preds, _) in nodes.items()}
    reuse_waiters: dict = {}
    for bid, (_, preds, _) in nodes.items():
        for p in preds:
            reuse_waiters.setdefault(p, []).append(bid)
    res.reuse_succs = {p: sorted({w for bid in bids for w in buf_waiters[bid]}) for p, bids in reuse_waiters.items()}

    events: list = []  # (time, seq, kind, payload)
    counter = [0]

    def push(time, kind, payload):
        counter[0] += 1
        heapq.heappush(events, (time, counter[0], kind, payload))

    queues = {"aic": [], "aiv": []}
    free_cores = {"aic": list(range(m.n_aic)), "aiv": list(range(m.n_aiv))}
    busy = {"aic": 0.0, "aiv": 0.0}
    phase_left = [0] * n
    cur_phase = [0] * n
    spans: dict = {}
    finished = [False] * n
    aicpu = {"orch_idx": 0, "orch_free": 0.0, "orch_end": 0.0, "orch_blocked": None, "fill_until": 0.0,
             "sched_free": 0.0}
    dispatch_q: list = []  # (ready time, task id)
    last_done = [0.0]

    def task_ready(tid, now):
        spans[tid] = [now, None, None]
        if free[tid]:
            finish_task(tid, now)
        else:
            heapq.heappush(dispatch_q, (now, tid))

    def dec_task(tid, now):
        waiting[tid] -= 1
        if waiting[tid] == 0:
            task_ready(tid, now)

    def buffer_available(bid, now):
        for tid in buf_waiters[bid]:
            dec_task(tid, now)

    def start_phase(tid, now):
        ph = cur_phase[tid]
        blocks = phases[tid][ph]
        phase_left[tid] = len(blocks)
        for i, (idx, _, _, cube, *_) in enumerate(blocks):
            heapq.heappush(queues["aic" if cube else "aiv"], (now, tid, idx, ph, i))

    def finish_task(tid, now):
        finished[tid] = True
        last_done[0] = max(last_done[0], now)
        sp = spans[tid]
        if sp[1] is None:
            sp[1] = now
        sp[2] = now
        for s in succs[tid]:
            dec_task(s, now)
        for bid in reuse_waiters.get(tid, ()):
            reuse_left[bid] -= 1
            if reuse_left[bid] == 0 and not nodes[bid][2]:
                buffer_available(bid, now)

    def advance_orchestration(now):
        while aicpu["orch_idx"] < len(seq) and aicpu["orch_free"] <= now:
            kind, x = seq[aicpu["orch_idx"]]
            if kind == "submit":
                aicpu["orch_idx"] += 1
                if free[x] and x in free_tasks:  # a counterfactual free task: no submission cost
                    dec_task(x, now)
                    continue
                end = now + sub_us
                res.aicpu_runs.append(AicpuRun("submit", x, tasks[x].name, now, end))
                aicpu["orch_free"] = aicpu["orch_end"] = end
                push(end, "submitted", x)
                return
            if reuse_left[x] > 0:  # the fill needs ring bytes whose earlier users still run
                return
            b = nodes[x][0]
            end = now + m.fill_us(b.nbytes)
            res.fill_runs.append(FillRun(x, b.name, b.nbytes, now, end))
            aicpu["orch_idx"] += 1
            aicpu["orch_free"] = aicpu["orch_end"] = aicpu["fill_until"] = end
            push(end, "fill_end", x)
            return

    def advance_scheduler(now):
        if dispatch_q and aicpu["sched_free"] <= now and aicpu["fill_until"] <= now:
            _, tid = heapq.heappop(dispatch_q)
            end = now + disp_us
            res.aicpu_runs.append(AicpuRun("dispatch", tid, tasks[tid].name, now, end))
            aicpu["sched_free"] = end
            push(end, "dispatched", tid)

    def dispatch_cores(now):
        for ct in ("aic", "aiv"):
            q, fr = queues[ct], free_cores[ct]
            while q and fr:
                ready, tid, idx, ph, i = heapq.heappop(q)
                core = heapq.heappop(fr)
                d = dur[tid][ph][i]
                _, f, nb, *_ = phases[tid][ph][i]
                start = now if now <= ready else now + disp_us  # a later wave pays its own pickup on the core
                res.runs.append(BlockRun(tid, tasks[tid].name, idx, ph, ct, core, start, start + d, f, nb))
                if spans[tid][1] is None:
                    spans[tid][1] = start
                busy[ct] += d
                push(start + d, "block_end", (tid, ct, core))

    # ---- initial state: unfilled buffers without reuse predecessors are available at once
    for bid in sorted(nodes):
        if reuse_left[bid] == 0 and not nodes[bid][2]:
            buffer_available(bid, 0.0)
    now = 0.0
    advance_orchestration(now)
    advance_scheduler(now)
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "submitted":
                dec_task(payload, now)
            elif kind == "fill_end":
                buffer_available(payload, now)
            elif kind == "dispatched":
                tid = payload
                if not phases[tid]:
                    finish_task(tid, now)
                else:
                    cur_phase[tid] = 0
                    start_phase(tid, now)
            elif kind == "block_end":
                tid, ct, core = payload
                heapq.heappush(free_cores[ct], core)
                phase_left[tid] -= 1
                if phase_left[tid] == 0:
                    cur_phase[tid] += 1
                    if cur_phase[tid] < len(phases[tid]):
                        start_phase(tid, now)
                    else:
                        finish_task(tid, now)
            advance_orchestration(now)
        advance_orchestration(now)
        advance_scheduler(now)
        dispatch_cores(now)
    if not all(finished) or aicpu["orch_idx"] < len(seq):
        stuck = [tasks[i].name for i in range(n) if not finished[i]][:5]
        raise PtoError(f"simulate: {n - sum(finished)} tasks of {program.name} never became ready "
                       f"(e.g. {stuck}); the graph or its buffer records are inconsistent")

    res.orch_us = aicpu["orch_end"]
    res.sched_us = last_done[0]
    res.effective_us = max(res.orch_us, res.sched_us)
    res.makespan_us = max((r.end_us for r in res.runs), default=0.0)
    res.task_spans = {tid: tuple(s) for tid, s in sorted(spans.items())}
    res.busy_us = dict(busy)
    res.utilisation = {ct: (busy[ct] / (cnt * res.effective_us) if res.effective_us > 0 and cnt else 0.0)
                       for ct, cnt in (("aic", m.n_aic), ("aiv", m.n_aiv))}
    res.fills = len(res.fill_runs)
    res.fill_bytes = sum(f.nbytes for f in res.fill_runs)
    res.fill_us = sum(f.end_us - f.start_us for f in res.fill_runs)
    _critical_path(res, tasks, free, free_tasks, dur, nodes, seq, m)
    return res


def _critical_path(res: SimResult, tasks, free, free_tasks, dur, nodes, seq, m: Machine) -> None:
    """Longest chain with unlimited cores and an idle scheduler (see the module docstring).

    Orchestration items are nodes too: a submission follows the item before
    it in the stream, a fill follows the later of that item and the last task
    naming ring bytes it reuses."""
    n = len(tasks)
    best: list = [0.0] * n
    prev: list = [None] * n  # ("task", id) | ("buf", id) | ("orch", stream index)
    buf_best: dict = {}
    buf_prev: dict = {}
    orch_nodes: list = []  # (kind, id, prev): prev ("orch", j) | ("task", id) | None
    submit_at: dict = {}  # task id -> (stream index, end time)
    done = [0]

    def reuse_end(bid):
        start, arg = 0.0, None
        for p in sorted(nodes[bid][1]):
            if best[p] > start or arg is None and best[p] >= start:
                start, arg = best[p], p
        return start, arg

    def buf_end(bid):
        if bid not in buf_best:
            buf_best[bid], buf_prev[bid] = reuse_end(bid)
        return buf_best[bid]

    def settle(upto):
        # tasks are topological in id order; a task's submission and buffers precede it in the stream
        for t in tasks[done[0]:upto]:
            j, start = submit_at[t.id]
            arg = ("orch", j) if start > 0 else None
            for p in sorted(t.preds):
                if best[p] > start or arg is None and best[p] >= start:
                    start, arg = best[p], ("task", p)
            for bid in sorted(t.buffers):
                if bid in nodes and buf_end(bid) > start:
                    start, arg = buf_end(bid), ("buf", bid)
            best[t.id] = start + (0.0 if free[t.id] else m.dispatch_us + sum(max(d, default=0.0) for d in dur[t.id]))
            prev[t.id] = arg
        done[0] = max(done[0], upto)

    orch_t = 0.0
    for kind, x in seq:
        last = ("orch", len(orch_nodes) - 1) if orch_nodes and orch_t > 0 else None
        if kind == "fill":
            b = nodes[x][0]
            settle(min(getattr(b, "tasks_before", 0), n))
            start, p = reuse_end(x)
            if p is not None and start > orch_t:
                orch_t, last = start, ("task", p)
            orch_t += m.fill_us(b.nbytes)
            buf_best[x], buf_prev[x] = orch_t, len(orch_nodes)
            orch_nodes.append(("fill", x, last))
        else:
            if not (x in free_tasks and free[x]):
                orch_t += m.submit_us
            submit_at[x] = (len(orch_nodes), orch_t)
            orch_nodes.append(("submit", x, last))
    settle(n)
    if not tasks:
        return
    end = max(range(n), key=lambda i: (best[i], -i))
    names, ids = [], []
    node = ("task", end)
    while node is not None:
        kind, i = node
        if kind == "task":
            if not free[i]:
                names.append(tasks[i].name)
                ids.append(i)
            node = prev[i]
        elif kind == "buf":
            j = buf_prev[i]
            node = ("orch", j) if isinstance(j, int) and nodes[i][2] else (("task", j) if j is not None else None)
        else:  # walk the orchestration stream back: name the binding submission and every fill
            first = True
            while node is not None and node[0] == "orch":
                okind, x, oprev = orch_nodes[node[1]]
                if okind == "fill":
                    names.append(f"fill {nodes[x][0].name}")
                elif first:
                    names.append(f"submit {tasks[x].name}")
                first = False
                node = oprev
    res.critical_path = names[::-1]
    res.critical_path_ids = ids[::-1]
    res.critical_path_us = best[end]
    res.critical_path_tasks = len(ids)


# ---- seed task vs allocation-time fill -----------------------------------------------------

@dataclass(frozen=True)
class FillVsSeed:
    """One ``init_value`` allocation against the seed task that replaces it.

    Attributes:
        buffer: allocation name; nbytes: bytes filled by the AICPU.
        fill_us: the fill's AICPU time; fill_cost_us: what it adds to the
            effective time of the init_value variant (effective time minus
            that of the same run with this one fill free; 0 when the run with
            the fill free comes out slower, a list-scheduling anomaly).
        seed_task: name of the seed task in the seed variant (None if the seed
            variant fills the allocation too, or no task writes it before any
            other access); seed_block_us: its longest block; seed_cost_us: what
            it adds to the seed variant's effective time (minus the same run
            with the task free: no submission, dispatch or blocks; 0 likewise).
        cheaper: ``"seed task"``, ``"init_value"``, ``"equal"``, ``"init_value in
            both"`` (nothing to compare) or ``"no seed task"``.
    """

    buffer: str
    nbytes: int
    fill_us: float
    fill_cost_us: float
    seed_task: str | None
    seed_block_us: float
    seed_cost_us: float
    cheaper: str


def _seed_task(program, name: str):
    """The first task of ``program`` that touches scratch buffer ``name``, if
    it only writes it (the seed task), else None."""
    bids = {b.id for b in program.buffers if b.kind == "scratch" and b.name == name}
    for t in program.graph.tasks:
        kinds = {k for buf, k, _ in t.footprints if buf.id in bids}
        if kinds:
            return t if kinds == {1} else None
    return None


def fill_vs_seed(seed_program, init_program, machine="a2a3") -> list:
    """For every ``init_value`` allocation of ``init_program``, its fill cost
    against the seed task of ``seed_program`` writing the allocation of the
    same name (two variants of one kernel, e.g. ``seed_scopes=True`` and the
    default). Costs are marginal effective times from counterfactual runs of
    :func:`simulate` (the fill or the seed task made free).

    Returns:
        A list of :class:`FillVsSeed`, in allocation order.

    Raises:
        ConfigError: an unknown machine name.
    """
    m = get_machine(machine)
    base_init = simulate(init_program, m).effective_us
    base_seed = simulate(seed_program, m).effective_us
    rows = []
    for b in init_program.buffers:
        if b.kind != "scratch" or b.init_value is None:
            continue
        # a counterfactual can come out slower (a list-scheduling anomaly: the freed AICPU time
        # reorders dispatches); what the fill or the task adds is then nothing, not a saving
        fill_cost = max(0.0, base_init - simulate(init_program, m, free_fills={b.id}).effective_us)
        both = any(s.kind == "scratch" and s.name == b.name and s.init_value is not None
                   for s in seed_program.buffers)
        t = None if both else _seed_task(seed_program, b.name)
        if t is None:
            seed_cost, block = 0.0, 0.0
        else:
            seed_cost = max(0.0, base_seed - simulate(seed_program, m, free_tasks={t.id}).effective_us)
            block = max((_block_us(m, rec) for p in _phases(t) for rec in p), default=0.0)
        if t is None:
            cheaper = "init_value in both" if both else "no seed task"
        elif abs(fill_cost - seed_cost) < 1e-9:
            cheaper = "equal"
        else:
            cheaper = "seed task" if seed_cost < fill_cost else "init_value"
        rows.append(FillVsSeed(b.name, b.nbytes, m.fill_us(b.nbytes), fill_cost, t.name if t else None, block,
                               seed_cost, cheaper))
    return rows
