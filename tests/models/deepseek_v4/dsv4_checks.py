"""Assertions shared by the DeepSeek-V4 kernel tests (imported as a plain module: pytest puts
this folder on ``sys.path`` for the test modules in it)."""

import sys

import pytest

import pto


def build_past_capacity_check(monkeypatch, build, *args, **kwargs):
    """``build(*args, **kwargs)`` with its module's builder-level ``check_token_capacity``
    switched off, so that an oversized case reaches the kernel's own capacity check."""
    monkeypatch.setattr(sys.modules[build.__module__], "check_token_capacity", lambda *a: None)
    return build(*args, **kwargs)


def assert_graph(graph, tasks: list, named_edges: set, n_edges: int) -> None:
    """``graph`` (a ``TaskGraph``) has exactly the task names ``tasks`` in submission order,
    the ``(producer, consumer)`` name pairs ``named_edges`` and ``n_edges`` edges in all."""
    assert [t.name for t in graph.tasks] == tasks
    assert graph.named_edges() == named_edges
    assert len(graph.edges()) == n_edges


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


# per-token inputs of the ratio-128 compressor (make_compressor_inputs); the rest are shared state
COMPRESSOR_PER_TOKEN = ("x", "position_ids", "cmp_slot_mapping", "state_slot_mapping")


def compressor_chunk(d: dict, lo: int, hi: int, cmp_kv=None, state=None) -> dict:
    """Tokens ``lo .. hi-1`` of compressor fixture ``d`` as one call (all active), optionally
    on the caches ``cmp_kv`` / ``state`` of an earlier call."""
    out = {k: (v[lo:hi] if k in COMPRESSOR_PER_TOKEN else v) for k, v in d.items()}
    out["num_tokens"] = hi - lo
    if cmp_kv is not None:
        out["cmp_kv"], out["compress_state"] = cmp_kv, state
    return out
