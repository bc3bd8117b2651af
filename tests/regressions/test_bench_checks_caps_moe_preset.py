"""benchmarks/bench_checks.py built every kernel at the asked preset, ignoring a case's
``max_preset``: expert_routed at ``flash`` (256 experts) in check mode was OOM-killed at
24 GB RSS and the run never reached the later kernels. It now caps the preset as
bench_kernels does (the MoE kernels run at ``demo``)."""

import importlib.util
import pathlib

import pto.models.deepseek_v4  # noqa: F401 - fills the kernel registry
from pto.golden import all_cases

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_checks.py"


def test_bench_checks_runs_expert_routed_at_its_capped_preset():
    spec = importlib.util.spec_from_file_location("bench_checks", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    case = next(c for c in all_cases(group="model") if c.name == "expert_routed")
    assert case.max_preset == "demo"
    row = bench.bench_case(case, "flash", "prefill", repeat=1, min_seconds=0.0)
    assert row["preset"] == "demo" and row["runs"] == 1 and row["tasks"] == 6  # dispatch, 2 x (gate/up, down), combine
