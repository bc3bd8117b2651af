"""The pto runtime: programs, the ring heap, the task graph, dependency
derivation, check mode, the simulator and trace export (docs/dsl.md)."""

from pto import errors as _errors
from pto.language import _ctx as _lang_ctx
from pto.runtime.graph import Block, Footprint, Task, TaskGraph
from pto.runtime.heap import Buffer, RingHeap
from pto.runtime.program import Program, ProgramStats, RunConfig, _record_block_error
from pto.runtime import replay as _replay
from pto.runtime.replay import (cache_info, clear_program_cache, parametric_replay, parametric_replay_enabled,
                                program_cache_enabled, set_parametric_replay, set_program_cache,
                                set_program_cache_size)
from pto.runtime.sanitizer import drop_init_values
from pto.runtime import blocks as _blocks
from pto.runtime.blocks import block_templates, block_templates_enabled, set_block_templates
from pto.runtime.simulate import Machine, SimResult, simulate  # pto.runtime.simulate is the function

__all__ = ["Program", "ProgramStats", "RunConfig", "Task", "Block", "Footprint", "TaskGraph", "RingHeap",
           "Buffer", "run", "simulate", "Machine", "SimResult", "drop_init_values", "set_program_cache",
           "program_cache_enabled", "clear_program_cache", "cache_info", "set_program_cache_size",
           "set_parametric_replay", "parametric_replay", "parametric_replay_enabled", "set_block_templates",
           "block_templates", "block_templates_enabled"]


def run(jf, *args, config: RunConfig | None = None, **kwargs) -> Program:
    """Run ``@pl.jit`` function ``jf`` with torch arguments; returns the Program (a repeated
    plain call may be a replay: runtime/replay.py)."""
    return _replay.run(jf, args, kwargs, config)


_factory = _replay.run  # a plain run, or a recorded run / replay of a repeated call (runtime/replay.py)


_lang_ctx.default_factory = _lang_ctx.state.program_factory = _factory
_errors._created_hook = _record_block_error
_lang_ctx.block_runner = _blocks.runner
_blocks.install()
