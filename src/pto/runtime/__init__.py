"""The pto runtime: programs, the ring heap, the task graph, dependency
derivation, check mode, the simulator and trace export (docs/dsl.md)."""

from pto import errors as _errors
from pto.language import _ctx as _lang_ctx
from pto.runtime.graph import Block, Footprint, Task, TaskGraph
from pto.runtime.heap import Buffer, RingHeap
from pto.runtime.program import Program, ProgramStats, RunConfig, _record_block_error
from pto.runtime.sanitizer import drop_init_values
from pto.runtime.simulate import Machine, SimResult, simulate  # pto.runtime.simulate is the function

__all__ = ["Program", "ProgramStats", "RunConfig", "Task", "Block", "Footprint", "TaskGraph", "RingHeap",
           "Buffer", "run", "simulate", "Machine", "SimResult", "drop_init_values"]


def run(jf, *args, config: RunConfig | None = None, **kwargs) -> Program:
    """Run ``@pl.jit`` function ``jf`` with torch arguments; returns the Program."""
    return Program(jf, config).execute(args, kwargs)


def _factory(jf, args, kwargs, config):
    return Program(jf, config).execute(args, kwargs)


_lang_ctx.default_factory = _lang_ctx.state.program_factory = _factory
_errors._created_hook = _record_block_error
