"""Assertions shared by the DeepSeek-V4 kernel tests (imported as a plain module: pytest puts
this folder on ``sys.path`` for the test modules in it)."""

import pytest

import pto


def find_buffer(prog, name: str):
    """The first root buffer of ``prog`` named ``name`` (a ``pto.runtime.Buffer``)."""
    return next(b for b in prog.buffers if b.name == name)


def assert_capacity_error_before_any_task(cr, tensor: str) -> None:
    """Run case ``cr`` (a ``CaseRun``) in check mode and assert that it raises
    ``pto.CapacityError`` naming ``tensor`` before submitting any task."""
    vals = [s.create_tensor() for s in cr.specs]
    prog = pto.Program(cr.fn, pto.RunConfig(check=True))
    with pytest.raises(pto.CapacityError, match=tensor):
        prog.execute(vals, {})
    assert len(prog.graph.tasks) == 0
