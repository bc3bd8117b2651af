"""pto: a Python tile-programming framework with a CPU task-graph runtime, and
DeepSeek-V4-Flash kernels written in it. See README.md and docs/ for the user's guide.

``import pto.language as pl`` is the DSL; ``pto.runtime`` runs it;
``pto.golden`` validates it against torch goldens.
"""

from pto.errors import (BindError, CapacityError, CheckpointError, ConfigError, DistributedError, DslError,
                        GoldenDataError, GoldenError, GraphOnlyError, HeapExhaustedError, PtoError, RaceError,
                        UndefinedOutputError, UndefinedValueError)
from pto.runtime import Program, RunConfig, run

__all__ = ["PtoError", "BindError", "CapacityError", "CheckpointError", "HeapExhaustedError", "ConfigError", "DslError",
           "UndefinedValueError", "UndefinedOutputError", "RaceError", "GoldenDataError", "GoldenError", "GraphOnlyError",
           "DistributedError", "Program",
           "RunConfig", "run"]
__version__ = "0.1.0"

from pto.runtime.program import freeze_imports as _freeze_imports  # noqa: E402

_freeze_imports()  # the imported modules leave the cyclic collector's scans (runtime/program.py)
