"""Schedule sensitivity: does a kernel's result depend on which valid schedule the device picks?

The CPU runs blocks in index order and applies atomic adds as they are issued: one valid
schedule. ``RunConfig(block_order="reverse" | "shuffle")`` runs another one (blocks of
every SPMD task in another order; atomic-add contributions of tasks the graph leaves
unordered applied in another order). :func:`schedule_sensitivity` runs a kernel both ways
on the same inputs and compares every output bit for bit: a race-free kernel can differ
only through the rounding of its atomic adds (split-K accumulation), and the report says
which outputs differ, by how much (max abs, ulps) and through which atomic-add tasks; a
kernel that reduces its partials in a fixed order is bit-stable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from pto.language.typing import INOUT, OUT, TensorType
from pto.runtime import Program, RunConfig

__all__ = ["OutputSensitivity", "ScheduleReport", "schedule_sensitivity", "ulp_distance"]


@dataclass
class OutputSensitivity:
    """One output under the other schedule.

    Attributes:
        name: the Out/InOut parameter; identical: bit for bit equal to program order;
        differing / numel: elements whose bits differ / all elements;
        max_abs: largest absolute difference (float64; 0.0 when identical, nan when a NaN
            differs); max_ulps: largest distance in units in the last place of the output's
            dtype (integers: the absolute difference; 0 when identical);
        through: names of the atomic-add tasks whose contributions were applied in another
            order and that reach a task writing this output (``"name (#id)"``).
    """

    name: str
    identical: bool
    differing: int
    numel: int
    max_abs: float
    max_ulps: int
    through: list = field(default_factory=list)


@dataclass
class ScheduleReport:
    """Result of :func:`schedule_sensitivity`.

    Attributes:
        block_order, seed: the other schedule; outputs: one OutputSensitivity per Out/InOut
        parameter in order; reordered: the atomic-add tasks applied out of program order
        (``"name (#id)"``); program / reordered_program: the two runs.
    """

    block_order: str
    seed: int
    outputs: list
    reordered: list
    program: Program
    reordered_program: Program

    @property
    def stable(self) -> bool:
        """Every output is bit for bit the same under both schedules."""
        return all(o.identical for o in self.outputs)


_BITS = {torch.float32: (torch.int32, 0x7FFFFFFF), torch.bfloat16: (torch.int16, 0x7FFF),
         torch.float16: (torch.int16, 0x7FFF)}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance between ``a`` and ``b`` (same shape and dtype) in units in the
    last place: the number of representable values between them (FP32, BF16, FP16; +0 and
    -0 are 0 apart); for integer and bool tensors the absolute difference. INT64 result."""
    if a.dtype in _BITS:
        it, mask = _BITS[a.dtype]

        def ordered(x):
            i = x.contiguous().view(it).to(torch.int64)
            return torch.where(i < 0, -(i & mask), i)  # sign-magnitude bits -> a monotone integer line
        return (ordered(a) - ordered(b)).abs()
    return (a.to(torch.int64) - b.to(torch.int64)).abs()


def _outputs(fn) -> list:
    """(position, name) of the Out/InOut tensor parameters of ``fn``."""
    sig, anns = fn.signature()
    return [(i, n) for i, n in enumerate(sig.parameters)
            if isinstance(anns.get(n), TensorType) and anns[n].direction in (OUT, INOUT)]


def _compare(name: str, a: torch.Tensor, b: torch.Tensor) -> OutputSensitivity:
    if a.dtype in _BITS:  # the bits themselves (NaN payloads and the sign of zero count)
        it = _BITS[a.dtype][0]
        diff = a.contiguous().view(it) != b.contiguous().view(it)
    else:
        diff = a != b
    n = int(diff.sum())
    if n == 0:
        return OutputSensitivity(name, True, 0, a.numel(), 0.0, 0)
    d = (a[diff].double() - b[diff].double()).abs()
    max_abs = math.nan if bool(torch.isnan(d).any()) else float(d.max())
    return OutputSensitivity(name, False, n, a.numel(), max_abs, int(ulp_distance(a[diff], b[diff]).max()))


def _through(prog: Program, arg_name: str) -> list:
    """Atomic-add tasks applied out of program order that reach a task writing ``arg_name``."""
    buf = next(g.buf for p, _c, g in prog.args if p.name == arg_name)
    writers = [t.id for t in prog.graph if t.kind != "dummy" and any(b is buf and k != 0 for b, k, _ in t.footprints)]
    out = []
    for tid in sorted(prog.atomic_reordered):
        if any(tid == w or prog.graph.reachable(tid, w) for w in writers):
            out.append(f"{prog.graph[tid].name!r} (#{tid})")
    return out


def schedule_sensitivity(fn, args: list, block_order: str = "shuffle", seed: int = 0,
                         check: bool = True) -> ScheduleReport:
    """Run ``fn`` in program order and under ``block_order`` on the same arguments and compare
    every output bit for bit.

    Args:
        fn: a ``@pl.jit`` function; args: its arguments (torch tensors, scalars, pass-through
            values) in parameter order; each run gets its own clones of the tensors.
        block_order: ``"reverse"`` or ``"shuffle"`` (see ``RunConfig.block_order``);
        seed: ``RunConfig.block_order_seed``; check: run both in check mode.

    Returns:
        ScheduleReport (``stable`` True when every output is bit-identical).

    Raises:
        ConfigError: a bad ``block_order`` or ``seed`` (RunConfig validation);
        the kernel's PtoErrors (races, undefined outputs) from either run.
    """
    def clones():
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]

    base_args, other_args = clones(), clones()
    base = fn.run(*base_args, config=RunConfig(check=check))
    other = fn.run(*other_args, config=RunConfig(check=check, block_order=block_order, block_order_seed=seed))
    outputs = []
    for i, name in _outputs(fn):
        o = _compare(name, base_args[i], other_args[i])
        if not o.identical:
            o.through = _through(other, name)
        outputs.append(o)
    reordered = [f"{other.graph[t].name!r} (#{t})" for t in sorted(other.atomic_reordered)]
    return ScheduleReport(block_order, seed, outputs, reordered, base, other)
