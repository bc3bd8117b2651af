"""The golden harness: specs, run_jit, compare functions, save/replay, the kernel registry."""

from pto.golden.compare import (allclose, default_compare, error_stats, exact, ratio_allclose, ratio_reldiff,
                                valid_ratio_reldiff)
from pto.golden.harness import OutputReport, RunResult, load_golden_data, run_jit, save_golden_data
from pto.golden.registry import REGISTRY, CaseRun, KernelCase, all_cases, get_case, load_examples, register
from pto.golden.spec import ScalarSpec, TensorSpec

__all__ = ["TensorSpec", "ScalarSpec", "run_jit", "RunResult", "OutputReport", "allclose", "ratio_allclose",
           "ratio_reldiff", "exact", "valid_ratio_reldiff", "error_stats", "default_compare", "save_golden_data",
           "load_golden_data", "KernelCase", "CaseRun", "register", "get_case", "all_cases", "load_examples",
           "REGISTRY"]
