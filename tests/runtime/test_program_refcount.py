"""A finished plain run has no Program <-> Buffer reference cycle (runtime/program.py): the
buffers' ``program`` is the ended-program sentinel (``_EndedProgram``), so the Program is freed
by refcount as soon as the caller drops it, with the cyclic GC off; edges read from its graph
after the program is dropped are those of an eager derivation."""

import gc
import weakref

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError
from pto.runtime.program import _ENDED


@pl.jit
def _k(a: pl.Tensor[[8, 64], pl.FP32], c: pl.Out[pl.Tensor[[8, 64], pl.FP32]]):
    s = pl.create_tensor([8, 64], pl.FP32, init_value=0)
    for b in pl.spmd(2, name_hint="add"):
        t = a[b * 4:b * 4 + 4, 0:64] + s[b * 4:b * 4 + 4, 0:64]
        c[b * 4:b * 4 + 4, 0:64] = t
    return c


@pytest.fixture
def no_gc():
    """The cyclic GC off for the test (what is freed is freed by refcount)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.mark.parametrize("fail", [False, True])
def test_plain_program_is_freed_by_refcount(fail, no_gc):
    a, c = torch.randn(8, 64), torch.zeros(8, 64)
    if fail:
        with pytest.raises(pto.BindError):
            _k.run(a, torch.zeros(8, 63))
    prog = _k.run(a, c)
    assert torch.equal(c, a) and prog.stats.tasks == 1 and prog.stats.edges == 0
    assert all(b.program is _ENDED for b in prog.buffers)
    ref = weakref.ref(prog)
    del prog
    assert ref() is None


def test_ended_program_sentinel_names_the_misuse():
    with pytest.raises(DslError, match="program that has ended"):
        _ENDED.orchestration_read(None, None)
    assert _ENDED.cur_block is None and _ENDED.sanitizer is None


@pl.jit
def _chain(a: pl.Tensor[[8, 64], pl.FP32], c: pl.Out[pl.Tensor[[8, 64], pl.FP32]]):
    s = pl.create_tensor([8, 64], pl.FP32)
    with pl.at(name_hint="first"):
        s[0:8, 0:64] = a[0:8, 0:64]
    with pl.at(name_hint="other"):
        c[0:8, 0:64] = a[0:8, 0:64]
    with pl.at(name_hint="second"):
        c[0:4, 0:64] = s[0:4, 0:64]  # RAW on s (task 0), WAW on c (task 1)
    return c


def test_edges_of_a_held_task_after_its_program_is_dropped(no_gc):
    a, c = torch.randn(8, 64), torch.zeros(8, 64)
    prog = _chain.run(a, c)
    last = prog.graph.tasks[2]
    blk = last.blocks[0]
    del prog
    assert last.preds == {0, 1}  # derived now
    assert blk.task is last
    eager = _chain.run(a, c, config=pto.RunConfig(check=True))
    assert [t.preds for t in eager.graph.tasks] == [set(), set(), {0, 1}]


@pl.jit
def _held_scopes(a: pl.Tensor[[8, 64], pl.FP32], c: pl.Out[pl.Tensor[[8, 64], pl.FP32]]):
    s = pl.create_tensor([8, 64], pl.FP32)
    first = pl.spmd(2, name_hint="copy")  # a task scope held in a local of the kernel's frame
    for b in first:
        s[b * 4:b * 4 + 4, 0:64] = a[b * 4:b * 4 + 4, 0:64]
    one = pl.at(name_hint="last")
    with one:
        c[0:8, 0:64] = s[0:8, 0:64] + a[0:8, 0:64]
    return c


def _alive(cls) -> int:
    return sum(type(o) is cls for o in gc.get_objects())


@pytest.mark.parametrize("read_edges", [False, True])
def test_task_graph_is_freed_by_refcount(read_edges, no_gc):
    from pto.runtime.graph import Block
    from pto.runtime.heap import Buffer
    was = pto.runtime.program_cache_enabled()
    pto.runtime.set_program_cache(False)  # a plain run (a recording would keep its own graph)
    a, c = torch.randn(8, 64), torch.zeros(8, 64)
    before = (_alive(Block), _alive(Buffer))
    try:
        prog = _held_scopes.run(a, c)
    finally:
        pto.runtime.set_program_cache(was)
    assert torch.equal(c, a + a)
    graph, stats = prog.graph, prog.stats
    refs = [weakref.ref(graph), weakref.ref(graph.tasks[1]), weakref.ref(prog.buffers[-1].data)]
    assert graph.tasks[0].blocks[1].task is graph.tasks[0] and _alive(Block) == before[0] + 3
    if read_edges:
        assert stats.edges == 1 and graph.tasks[1].preds == {0}
    del prog, graph, stats
    assert [r() for r in refs] == [None] * len(refs)  # no cycle: freed with the GC off
    assert (_alive(Block), _alive(Buffer)) == before


def test_malloc_tuning_is_set_on_glibc_and_can_be_turned_off(monkeypatch):
    import sys

    from pto.runtime.program import tune_malloc
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL("libc.so.6").mallopt
        except (OSError, AttributeError):
            pytest.skip("not glibc")
        assert tune_malloc() is True
    monkeypatch.setenv("PTO_MALLOC_TUNING", "0")
    assert tune_malloc() is False
    monkeypatch.setenv("PTO_MALLOC_TUNING", "1")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert tune_malloc() is False  # the environment's own setting wins
