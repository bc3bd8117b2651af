"""Kernel CPU wall time vs its torch golden's, side by side in one run.

For every registered model kernel at the given preset (default ``flash``; a case's
``max_preset`` caps it, e.g. the MoE kernels run at ``demo``) and
mode (default ``prefill``, falling back to the case's first mode), build the
inputs once, time the golden and the kernel (unchecked) over ``--repeat``
runs each after one untimed warm-up run of both, and print the median (``--stat min``: the
fastest) of each and their ratio (issue 17's target: ratio <= 1.5). Kernel calls are plain runs:
the program cache (runtime/replay.py) is off unless ``--cache`` is given (then the timed calls
after the warm-up are its recording and replays).

``--clock cpu`` times the process's CPU time (``time.process_time``) instead of the wall: on a
shared, loaded box the wall also counts the time other processes hold the cores.

    python benchmarks/bench_kernels.py [--preset flash] [--mode prefill] [--repeat 3] [--threads 1] [--cache]
                                       [--clock wall|cpu] [--stat median|min] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

import pto
from pto.golden import ScalarSpec, TensorSpec, all_cases
from pto.models.deepseek_v4.config import capped_preset


def _inputs(run):
    vals = {}
    for s in run.specs:
        vals[s.name] = s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor()
    return vals


def _time(fn, run, repeat: int, clock=time.perf_counter) -> list[float]:
    """``clock`` times (ms) of ``fn(vals)`` over ``repeat`` consecutive runs; the inputs are
    rebuilt from the same seed before each run, outside the timed region (so InOut state starts
    equal and sub-millisecond kernels are not measured as a difference of two noisy medians).
    Runs of the golden and of the kernel are not interleaved: a Program pauses the cyclic GC
    and leaves its garbage to whatever runs next, which would then pay for it."""
    times = []
    for _ in range(repeat):
        torch.manual_seed(0)
        vals = _inputs(run)
        t0 = clock()
        fn(vals)
        times.append((clock() - t0) * 1e3)
    return times


def bench_case(case, preset: str, mode: str, repeat: int, clock=time.perf_counter,
               stat=statistics.median) -> dict:
    """Kernel and golden ``clock`` time (ms, default the wall; ``stat`` of the ``repeat`` runs,
    default the median) of one case (inputs built outside the timing)."""
    preset = capped_preset(preset, case.max_preset)
    run = case.build(preset, mode)

    def golden(vals):
        run.golden(vals)

    def kernel(vals):
        run.fn.run(*[vals[s.name] for s in run.specs], config=pto.RunConfig(check=False))

    _time(golden, run, 1)  # warm-up: first-call costs (lazy imports, first use of a torch kernel) untimed
    _time(kernel, run, 1)
    g = max(stat(_time(golden, run, repeat, clock)), 1e-3)
    k = max(stat(_time(kernel, run, repeat, clock)), 1e-3)
    return {"name": case.name, "mode": mode, "preset": preset, "kernel_ms": k, "golden_ms": g, "ratio": k / g}


def _ms(v: float) -> str:
    """A time in ms with three significant digits (sub-millisecond kernels are not 0.0)."""
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--mode", default="prefill")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for both kernel and golden (default 1: stable on a shared box)")
    ap.add_argument("--cache", action="store_true",
                    help="let repeated kernel calls replay from the program cache (default: plain runs, cache off)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall (time.perf_counter, default) or this process's CPU time (time.process_time)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="median of the --repeat runs (default) or the fastest (robust on a loaded box)")
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    stat = min if args.stat == "min" else statistics.median
    torch.set_num_threads(max(1, args.threads))
    was_cached = pto.runtime.program_cache_enabled()
    pto.runtime.set_program_cache(args.cache)
    rows = []
    for case in all_cases(group="model"):
        if args.only and case.name not in args.only:
            continue
        mode = args.mode if args.mode in case.modes else case.modes[0]
        rows.append(bench_case(case, args.preset, mode, args.repeat, clock, stat))
    table = Table(title=f"kernel vs golden CPU {args.clock}, preset={args.preset} ({args.stat} of {args.repeat}, "
                        f"program cache {'on' if args.cache else 'off'})")
    for col in ("kernel", "mode", "kernel ms", "golden ms", "kernel/golden"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    for r in rows:
        mode = r["mode"] + (f" ({r['preset']})" if r["preset"] != args.preset else "")
        table.add_row(r["name"], mode, _ms(r["kernel_ms"]), _ms(r["golden_ms"]), f"{r['ratio']:.2f}")
    Console().print(table)
    pto.runtime.set_program_cache(was_cached)
    return 0


if __name__ == "__main__":
    sys.exit(main())
