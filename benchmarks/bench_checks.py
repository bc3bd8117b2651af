"""Check-mode slowdown: checked wall / unchecked wall per model kernel, same run.

For every registered model kernel (``pto.golden.all_cases(group="model")``)
at the given preset (default ``flash``; a case's ``max_preset`` caps it, e.g. the MoE kernels run
at ``demo``, as in bench_kernels) and mode (default ``prefill``; cases
without it are skipped), build the inputs once, then run the kernel
unchecked and in check mode (definedness sanitizer + race checker, docs/dsl.md
"Check mode") alternately on fresh copies of the inputs, at least
``--repeat`` times each and until each variant has run ``--min-seconds``,
and print the best walls (the machine is shared; the minimum is the least
disturbed run), their ratio (target <= 2x, issue 17) and where the checked run's
extra time goes (medians):

* ``race ms``: time inside the race checker (``RaceChecker.check_task``);
* ``output ms``: the end-of-program output check;
* ``rest``: shadow-mask propagation in loads, stores and tile ops, and the orchestration
  itself: from its third call an unchecked run replays the program cache's recording
  (runtime/replay.py) while check mode always runs the kernel's Python, so ``rest`` holds what
  the cache saves (at flash prefill, 1 thread: about 0.7 ms of lookup_embedding's 2 ms, 35 ms of
  mtp_layer's 125 ms).

Seed kernels (cases with a ``seed_scopes`` variant) are marked. No kernel
golden runs; this times the kernel only.

Torch runs 1 intra-op thread by default, as ``pto check`` does (``PTO_THREADS``) and as the other
benchmarks do: on this 2-core machine a reduction of more than 32k elements with 2 threads waits
for the second thread, milliseconds when another process holds that core (a bool ``any`` of a
[128, 512] window took 0.08 ms with 1 thread and up to 8 ms with 2), which made both sides of
the ratio erratic. ``--threads 0`` keeps torch's own setting.

    python benchmarks/bench_checks.py [--preset flash] [--mode prefill] [--repeat 3] [--only NAME ...]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

import pto.models.deepseek_v4  # noqa: F401 - fills the kernel registry
from pto.errors import PtoError
from pto.golden import ScalarSpec, all_cases
from pto.models.deepseek_v4.config import capped_preset
from pto.language.typing import INOUT, OUT
from pto.runtime import RunConfig
from pto.runtime import races as _races
from pto.runtime import sanitizer as _sanitizer


class _Timers:
    """Wraps the race checker and the output check with wall-clock counters."""

    def __init__(self):
        self.race_s = 0.0
        self.output_s = 0.0
        self._orig = (_races.RaceChecker.check_task, _sanitizer.check_outputs)

    def __enter__(self):
        orig_task, orig_out = self._orig
        timers = self

        def check_task(checker, task):
            t0 = time.perf_counter()
            try:
                return orig_task(checker, task)
            finally:
                timers.race_s += time.perf_counter() - t0

        def check_outputs(program):
            t0 = time.perf_counter()
            try:
                return orig_out(program)
            finally:
                timers.output_s += time.perf_counter() - t0

        _races.RaceChecker.check_task = check_task
        _sanitizer.check_outputs = check_outputs
        return self

    def __exit__(self, *exc):
        _races.RaceChecker.check_task, _sanitizer.check_outputs = self._orig
        return False


def _inputs(run) -> list:
    torch.manual_seed(0)
    return [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in run.specs]


def bench_case(case, preset: str, mode: str, repeat: int, min_seconds: float = 1.0) -> dict:
    """Best unchecked and checked kernel walls (ms) of one case, plus the
    checked run's race-checker and output-check time (ms, median)."""
    preset = capped_preset(preset, case.max_preset)  # the MoE kernels run at demo (as in bench_kernels)
    run = case.build(preset, mode)
    base = _inputs(run)

    _, anns = run.fn.signature()
    written = {k for k, a in anns.items() if getattr(a, "direction", None) in (OUT, INOUT)}

    def once(check: bool):
        # fresh copies of what the kernel writes; In tensors are never written (a write is a DslError)
        args = [a.clone() if isinstance(a, torch.Tensor) and s.name in written else a for s, a in zip(run.specs, base)]
        t0 = time.perf_counter()
        prog = run.fn.run(*args, config=RunConfig(check=check))
        return (time.perf_counter() - t0) * 1e3, prog

    once(False)  # warm-up (imports, heap storage)
    plain, checked, race, out = [], [], [], []
    tasks = 0
    while len(plain) < repeat or min(sum(plain), sum(checked)) < min_seconds * 1e3:
        ms, prog = once(False)
        plain.append(ms)
        tasks = prog.stats.tasks
        del prog
        gc.collect()  # untimed: a finished program's cycles hold its argument copies (1 GB for lookup_embedding)
        with _Timers() as tm:
            ms, _ = once(True)
        gc.collect()
        checked.append(ms)
        race.append(tm.race_s * 1e3)
        out.append(tm.output_s * 1e3)
    p, c = min(plain), min(checked)
    return {"name": case.name, "mode": mode, "preset": preset, "label": run.label, "seed": case.seed_variant, "tasks": tasks,
            "runs": len(plain),
            "plain_ms": p, "check_ms": c, "ratio": c / p, "race_ms": statistics.median(race),
            "output_ms": statistics.median(out)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--mode", default="prefill")
    ap.add_argument("--repeat", type=int, default=3, help="minimum runs per variant")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="minimum total wall per variant")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: what pto's CLI runs with, PTO_THREADS; 0: torch's own)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, failed = [], []
    for case in all_cases(group="model"):
        if (args.only and case.name not in args.only) or args.mode not in case.modes:
            continue
        try:
            rows.append(bench_case(case, args.preset, args.mode, args.repeat, args.min_seconds))
        except PtoError as e:  # a kernel that fails its check is reported, the others still run
            failed.append(case.name)
            print(f"{case.name}: fails check mode: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        r = rows[-1]
        print(f"{r['name']}: {r['plain_ms']:.1f} ms -> {r['check_ms']:.1f} ms ({r['ratio']:.2f}x)", flush=True)
    table = Table(title=f"check-mode slowdown, preset={args.preset} mode={args.mode} "
                        f"(best of >= {args.repeat} runs each, torch threads {torch.get_num_threads()})")
    for col in ("kernel", "seed", "tasks", "runs", "unchecked ms", "checked ms", "checked/unchecked", "race ms",
                "output ms", "rest ms"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for r in rows:
        rest = max(0.0, r["check_ms"] - r["plain_ms"] - r["race_ms"] - r["output_ms"])
        name = r["name"] + (f" ({r['preset']})" if r["preset"] != args.preset else "")
        table.add_row(name, "yes" if r["seed"] else "", str(r["tasks"]), str(r["runs"]), f"{r['plain_ms']:.1f}",
                      f"{r['check_ms']:.1f}", f"{r['ratio']:.2f}x", f"{r['race_ms']:.1f}", f"{r['output_ms']:.1f}",
                      f"{rest:.1f}")
    Console(width=140).print(table)
    worst = max((r["ratio"] for r in rows), default=0.0)
    print(f"worst slowdown {worst:.2f}x (target <= 2x)"
          + (f"; failing check mode, not timed: {', '.join(failed)}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
