"""What allocation-time initialisation buys: seed task vs ``init_value``, side by side.

For every registered model kernel that keeps its seed variant
(``seed_variant=True``), at the given preset (default ``flash``) in decode and
prefill shape (the modes the case supports): run the kernel once with
``seed_scopes=True`` (an explicit zero-fill task) and once with
allocation-time initialisation, schedule both recorded graphs on the
simulated machine (default ``a2a3``), and print tasks, edges, critical path
(tasks and µs), simulated makespan and the scratch bytes each variant
allocates. Simulated figures are estimates: read them as ratios.

    python benchmarks/bench_seed.py [--preset flash] [--machine a2a3] [--only NAME ...]
                                    [--group model|example] [--markdown]

``--markdown`` writes the table as GitHub markdown to stdout (for the README).
"""

from __future__ import annotations

import argparse
import sys

import torch
from rich.console import Console
from rich.table import Table

import pto
import pto.models.deepseek_v4  # noqa: F401 - fills the kernel registry
from pto.golden import ScalarSpec, all_cases, load_examples
from pto.runtime.simulate import get_machine, simulate

MODES = ("decode", "prefill")


def run_variant(case, preset: str, mode: str, seed_scopes: bool):
    """Run one variant of ``case`` once (seeded inputs, no check mode); returns the Program."""
    cr = case.build(preset, mode, seed_scopes=seed_scopes)
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    return cr.fn.run(*vals, config=pto.RunConfig(check=False))


def compare(case, preset: str, mode: str, machine) -> dict:
    """Seed variant vs allocation-time initialisation of one case and mode.

    Returns:
        {"kernel", "mode", "seed": row, "init": row} where a row holds tasks,
        edges, fills, cp_tasks, cp_us, makespan_us, scratch_bytes,
        heap_peak_bytes and the critical path names.
    """
    out = {"kernel": case.name, "mode": mode}
    for key, seed in (("seed", True), ("init", False)):
        prog = run_variant(case, preset, mode, seed)
        sim = simulate(prog, machine)
        out[key] = {"tasks": sim.tasks, "edges": sim.edges, "fills": sim.fills, "cp_tasks": sim.critical_path_tasks,
                    "cp_us": sim.critical_path_us, "makespan_us": sim.makespan_us,
                    "scratch_bytes": prog.stats.scratch_bytes, "heap_peak_bytes": prog.stats.heap_peak_bytes,
                    "critical_path": sim.critical_path}
    return out


def _kib(n: int) -> str:
    """Bytes with a binary unit (KiB below 1 MiB, else MiB)."""
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def _cells(r: dict) -> list:
    s, i = r["seed"], r["init"]
    gain = (s["makespan_us"] - i["makespan_us"]) / s["makespan_us"] if s["makespan_us"] else 0.0
    return [r["kernel"], r["mode"],
            f"{s['tasks']} / {i['tasks']}", f"{s['edges']} / {i['edges']}",
            f"{s['cp_tasks']} / {i['cp_tasks']}", f"{s['cp_us']:.2f} / {i['cp_us']:.2f}",
            f"{s['makespan_us']:.2f} / {i['makespan_us']:.2f}", f"{gain:+.1%}",
            f"{_kib(s['scratch_bytes'])} / {_kib(i['scratch_bytes'])}",
            f"{_kib(s['heap_peak_bytes'])} / {_kib(i['heap_peak_bytes'])}"]


HEADERS = ["kernel", "mode", "tasks", "edges", "crit. path tasks", "crit. path µs", "makespan µs",
           "makespan saved", "scratch", "heap peak"]


def markdown(rows: list, preset: str, machine) -> str:
    """The comparison as a GitHub markdown table (cells read ``seed / init``)."""
    lines = [f"Seed task vs allocation-time init, preset `{preset}`, simulated `{machine.name}` "
             f"({machine.n_aic} AIC + {machine.n_aiv} AIV); each cell is `seed / init`.", "",
             "| " + " | ".join(HEADERS) + " |",
             "|" + "|".join("---" if h in ("kernel", "mode") else "---:" for h in HEADERS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cells(r)) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--machine", default="a2a3")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME")
    ap.add_argument("--group", default="model", choices=("model", "example"))
    ap.add_argument("--markdown", action="store_true", help="print a markdown table instead of the rich table")
    args = ap.parse_args(argv)
    machine = get_machine(args.machine)
    if args.group == "example":
        load_examples()
    cases = [c for c in all_cases(group=args.group) if c.seed_variant and (not args.only or c.name in args.only)]
    rows = []
    for case in sorted(cases, key=lambda c: c.name):
        modes = [m for m in MODES if m in case.modes] or list(case.modes[:1])
        for mode in modes:
            rows.append(compare(case, args.preset, mode, machine))
    if args.markdown:
        print(markdown(rows, args.preset, machine))
        return 0
    con = Console() if Console().is_terminal else Console(width=200)
    if not rows:
        con.print(f"no registered {args.group} kernel has a seed variant yet")
        return 0
    table = Table(title=f"seed task vs allocation-time init (seed / init), preset={args.preset}, "
                        f"simulated {machine.name}", title_justify="left")
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("kernel", "mode") else "right")
    for r in rows:
        table.add_row(*_cells(r))
    con.print(table)
    for r in rows:
        con.print(f"{r['kernel']} {r['mode']} critical path, seed: {' -> '.join(r['seed']['critical_path'])}",
                  highlight=False, markup=False)
        con.print(f"{r['kernel']} {r['mode']} critical path, init: {' -> '.join(r['init']['critical_path'])}",
                  highlight=False, markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
