"""Runtime overhead per task: the eager runtime vs the same tile ops in a plain loop.

A ``@pl.jit`` kernel submits ``--tasks`` (default 10,000) single-block
``pl.at`` tasks; each reads one row of two GM inputs, adds them (one tiny tile
op) and writes one row of a GM output (three GM arguments per task). The same
loads, add and store run as plain torch in a Python loop. Overhead per task =
(kernel time - plain time) / tasks. Times are process CPU time (robust on a
machine shared with other jobs; ``--wall`` for wall-clock time), in one process,
side by side: the kernel's first call (the process is fresh and the program cache
is reset: nothing ran the kernel or the runtime before it), the second call (a
plain run recorded by the program cache, runtime/replay.py), then the best of
``--repeat`` runs of the plain loop and of the kernel (repeated calls: replays), and the
best of ``--repeat`` first calls after a program-cache reset (plain runs in a warm process,
each after an untimed ``gc.collect()``: the fresh-process figure is one sample and swings by up
to 2x on a shared machine).
``--no-cache`` turns the program cache off (every call a plain run). Targets
(issue 17): overhead per task <= 0.8x the plain loop's time per task for the
first call, <= 0.3x for a repeated call.

    python benchmarks/bench_overhead.py [--tasks 10000] [--repeat 3] [--wall] [--check] [--no-cache] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

import pto
import pto.language as pl

COLS = 16


@pl.jit
def many_tasks(a: pl.Tensor[[pl.dynamic("N"), COLS], pl.FP32], b: pl.Tensor[[pl.dynamic("N"), COLS], pl.FP32],
               c: pl.Out[pl.Tensor[[pl.dynamic("N"), COLS], pl.FP32]]):
    n = a.shape[0]
    for i in range(n):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row_add"):
            c[i:i + 1, 0:COLS] = a[i:i + 1, 0:COLS] + b[i:i + 1, 0:COLS]
    return c


def plain_loop(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """The same per-row loads, add and store without the runtime."""
    for i in range(a.shape[0]):
        x = a[i:i + 1, 0:COLS].clone()
        y = b[i:i + 1, 0:COLS].clone()
        c[i:i + 1, 0:COLS].copy_(x + y)


def measure(n: int, repeat: int, check: bool = False, wall: bool = False) -> dict:
    """Best-of-``repeat`` times (s; CPU time, or wall time with ``wall``) of
    the kernel and the plain loop, and the overhead per task (µs).
    Raises AssertionError if the results differ."""
    clock = time.perf_counter if wall else time.process_time
    a, b = torch.randn(n, COLS), torch.randn(n, COLS)
    c_ref = torch.zeros(n, COLS)
    c_first = torch.zeros(n, COLS)
    pto.runtime.clear_program_cache()
    t0 = clock()
    many_tasks.run(a, b, c_first, config=pto.RunConfig(check=check))  # the first call of the process
    first = clock() - t0
    c_second = torch.zeros(n, COLS)
    t0 = clock()
    many_tasks.run(a, b, c_second, config=pto.RunConfig(check=check))  # recorded by the program cache
    second = clock() - t0
    plain = []
    for _ in range(repeat):
        t0 = clock()
        plain_loop(a, b, c_ref)
        plain.append(clock() - t0)
    kern = []
    prog = None
    for _ in range(repeat):
        c = torch.zeros(n, COLS)
        t0 = clock()
        prog = many_tasks.run(a, b, c, config=pto.RunConfig(check=check))
        kern.append(clock() - t0)
        assert torch.equal(c, c_ref), "kernel result differs from the plain loop"
    reset = []
    for _ in range(repeat):  # a first call after a cache reset: a plain run, in a warm process
        c = torch.zeros(n, COLS)
        pto.runtime.clear_program_cache()
        gc.collect()  # untimed: the earlier runs' and the dropped recordings' garbage
        t0 = clock()
        many_tasks.run(a, b, c, config=pto.RunConfig(check=check))
        reset.append(clock() - t0)
        assert torch.equal(c, c_ref), "kernel result after a cache reset differs from the plain loop"
    assert torch.equal(c_first, c_ref), "first kernel call's result differs from the plain loop"
    assert torch.equal(c_second, c_ref), "second kernel call's result differs from the plain loop"
    k, p = min(kern), min(plain)
    return {"tasks": prog.stats.tasks, "kernel_s": k, "plain_s": p, "overhead_us": (k - p) / n * 1e6,
            "kernel_us_per_task": k / n * 1e6, "plain_us_per_task": p / n * 1e6,
            "first_s": first, "first_overhead_us": (first - p) / n * 1e6, "second_s": second,
            "reset_s": min(reset), "reset_overhead_us": (min(reset) - p) / n * 1e6,
            "replayed": prog.replayed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="run the kernel in check mode")
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of process CPU time")
    ap.add_argument("--no-cache", action="store_true", help="program cache off: every call a plain run")
    ap.add_argument("--profile", action="store_true", help="cProfile one kernel run (top 25 by self time)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.no_cache:
        pto.runtime.set_program_cache(False)
    r = measure(args.tasks, args.repeat, args.check, args.wall)
    clock = "wall" if args.wall else "CPU"
    table = Table(title=f"runtime overhead, {r['tasks']} single-block tasks ({clock} time; repeated call: best of "
                        f"{args.repeat}{', check mode' if args.check else ''}"
                        f"{', replays' if r['replayed'] else ', plain runs'})", title_justify="left")
    for col in ("", f"{clock} ms", "µs per task", "overhead / plain", "target"):
        table.add_column(col, justify="left" if not col else "right")
    plain_us = r["plain_us_per_task"]
    table.add_row("plain torch loop", f"{r['plain_s'] * 1e3:.1f}", f"{plain_us:.2f}", "", "")
    table.add_row("pto kernel, first call", f"{r['first_s'] * 1e3:.1f}", f"{r['first_s'] / args.tasks * 1e6:.2f}",
                  "", "")
    table.add_row("pto kernel, second call (recorded)", f"{r['second_s'] * 1e3:.1f}",
                  f"{r['second_s'] / args.tasks * 1e6:.2f}", "", "")
    table.add_row("pto kernel, repeated call", f"{r['kernel_s'] * 1e3:.1f}", f"{r['kernel_us_per_task']:.2f}", "", "")
    table.add_row("runtime overhead, first call", f"{(r['first_s'] - r['plain_s']) * 1e3:.1f}",
                  f"{r['first_overhead_us']:.2f}", f"{r['first_overhead_us'] / plain_us:.2f}x", "<= 0.8x")
    table.add_row("runtime overhead, first call after a cache reset (best of "
                  f"{args.repeat})", f"{(r['reset_s'] - r['plain_s']) * 1e3:.1f}", f"{r['reset_overhead_us']:.2f}",
                  f"{r['reset_overhead_us'] / plain_us:.2f}x", "<= 0.8x")
    table.add_row("runtime overhead, repeated call", f"{(r['kernel_s'] - r['plain_s']) * 1e3:.1f}",
                  f"{r['overhead_us']:.2f}", f"{r['overhead_us'] / plain_us:.2f}x", "<= 0.3x")
    Console().print(table)
    if args.profile:
        import cProfile
        import pstats
        a, b = torch.randn(args.tasks, COLS), torch.randn(args.tasks, COLS)
        pr = cProfile.Profile()
        pr.enable()
        many_tasks.run(a, b, torch.zeros(args.tasks, COLS), config=pto.RunConfig(check=args.check))
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
