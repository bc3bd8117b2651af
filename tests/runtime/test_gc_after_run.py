"""The cyclic GC's work around a plain run (runtime/program.py, ``_gc_resume``): the run pauses
the collector, so every object it allocated waits in the youngest generation at its end. That
collection must not run inside the call, while the Program is still referenced (it would move the
live graph to an older generation): it runs at the caller's next allocation. The task graph holds
no reference cycle, so after a plain call that dropped its Program (``kernel(...)``) the graph is
already freed by refcount and that collection finds next to nothing. Counted with
``gc.callbacks``, not timed."""

import gc

import pytest
import torch

import pto
import pto.language as pl

ROWS = 400  # tasks: their objects are far more than a young collection's threshold (700 allocations)


@pl.jit
def _rows(a: pl.Tensor[[ROWS, 16], pl.FP32], c: pl.Out[pl.Tensor[[ROWS, 16], pl.FP32]]):
    for i in range(ROWS):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
            c[i:i + 1, 0:16] = a[i:i + 1, 0:16] + a[i:i + 1, 0:16]
    return c


def _inputs():
    """A (ROWS, 16) FP32 input and a zero output of that shape, then a full collection, so that
    the collections counted afterwards are the run's."""
    a, c = torch.randn(ROWS, 16), torch.zeros(ROWS, 16)
    gc.collect()
    return a, c


@pytest.fixture
def collections():
    """The GC on, the program cache off; yields (phase, events): set ``phase[0]`` to label the
    collections (generation, objects collected) that start from then on."""
    was_on, was_cached = gc.isenabled(), pto.runtime.program_cache_enabled()
    gc.enable()
    pto.runtime.set_program_cache(False)
    phase = ["setup"]
    events = []

    def cb(ph, info):
        if ph == "stop":
            events.append((phase[0], info["generation"], info["collected"]))
    gc.callbacks.append(cb)
    yield phase, events
    gc.callbacks.remove(cb)
    pto.runtime.set_program_cache(was_cached)
    if not was_on:
        gc.disable()


def test_no_collection_inside_a_plain_call(collections):
    phase, events = collections
    a = torch.randn(ROWS, 16)
    c = torch.zeros(ROWS, 16)
    _rows(a, c)  # warm: first-call caches
    c.zero_()
    gc.collect()
    phase[0] = "inside"
    _rows(a, c)  # the Program is dropped when the call returns its result
    phase[0] = "after"
    junk = [[] for _ in range(4)]  # the caller's next allocations
    del junk
    assert torch.equal(c, a + a)
    assert [e for e in events if e[0] == "inside"] == []
    after = [e for e in events if e[0] == "after"]
    # the graph (a Task and a Block per task at least) was freed by refcount: nothing for a collection
    assert sum(e[2] for e in after) < ROWS


def test_a_kept_program_is_not_collected_inside_the_call(collections):
    phase, events = collections
    a, c = _inputs()
    phase[0] = "inside"
    prog = _rows.run(a, c)
    phase[0] = "after"
    assert [e for e in events if e[0] == "inside"] == []
    assert prog.stats.tasks == ROWS and len(prog.graph.tasks) == ROWS
    assert all(t.preds == set() for t in prog.graph.tasks)  # rows are independent


def test_a_kept_program_read_under_gc_paused_is_never_scanned(collections):
    phase, events = collections
    a, c = _inputs()
    phase[0] = "inside"
    with pto.runtime.program.gc_paused():
        prog = _rows.run(a, c)
        assert prog.stats.tasks == ROWS and prog.stats.edges == 0  # reads allocate: no collection meanwhile
        del prog
    phase[0] = "after"
    junk = [[] for _ in range(4)]
    del junk
    assert torch.equal(c, a + a)
    assert [e for e in events if e[0] == "inside"] == []
    assert sum(e[2] for e in events if e[0] == "after") < ROWS
