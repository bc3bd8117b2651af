"""Simulator: exact schedules on a toy machine (1 FLOP/µs, 1 byte/µs, 1 µs dispatch)."""

from types import SimpleNamespace

import pytest
import torch

import pto.language as pl
from pto.errors import ConfigError
from pto.runtime import RunConfig
from pto.runtime.graph import Block, Task, TaskGraph
from pto.runtime.heap import Buffer
from pto.runtime.simulate import MACHINES, Machine, get_machine, simulate

TOY = Machine(name="toy", n_aic=1, n_aiv=2, cube_flops=1e6, vec_flops=1e6, aic_gm_bw=1e6, aiv_gm_bw=1e6,
              dispatch_s=1e-6, memset_bw=1e6)


def _task(graph, name, blocks, preds=(), kind="spmd", buffers=()):
    """blocks: list of (flops, bytes, cube[, phase]) per block record."""
    t = Task(len(graph.tasks), name, kind, "test", len(blocks), [], False)
    for i, spec in enumerate(blocks):
        flops, nbytes, cube = spec[:3]
        b = Block(t, spec[4] if len(spec) > 4 else i, spec[3] if len(spec) > 3 else 0)
        b.flops, b.bytes, b.cube = flops, nbytes, cube
        t.blocks.append(b)
    t.preds = set(preds)
    t.buffers = set(buffers)
    graph.tasks.append(t)
    return t


def _program(graph, buffers=()):
    return SimpleNamespace(name="handmade", graph=graph, buffers=list(buffers))


def _scratch(bid, name, nbytes, offset, init_value):
    data = torch.zeros(nbytes // 4, dtype=torch.float32)
    return Buffer(bid, name, "test", "scratch", data, None, offset=offset, init_value=init_value)


def test_handmade_graph_schedule_is_exact():
    g = TaskGraph()
    _task(g, "load", [(3, 1, False), (1, 1, False)])           # AIV blocks of 4 and 2 us
    _task(g, "mm", [(4, 2, True)], preds=[0])                   # AIC block of 6 us
    _task(g, "side", [(2, 0, False)] * 3)                       # three 2 us AIV blocks
    _task(g, "task_dummy", [], preds=[1, 2], kind="dummy")
    _task(g, "out", [(1, 0, False)], preds=[3])
    r = simulate(_program(g), TOY)
    assert r.makespan_us == 14.0
    assert r.critical_path == ["load", "mm", "out"]
    assert r.critical_path_ids == [0, 1, 4]
    assert r.critical_path_us == 14.0
    assert (r.tasks, r.dummies, r.edges, r.blocks) == (4, 1, 4, 7)
    assert r.task_spans[0] == (0.0, 1.0, 5.0)
    assert r.task_spans[1] == (5.0, 6.0, 12.0)
    assert r.task_spans[3] == (12.0, 12.0, 12.0)   # join node: no dispatch, no cost
    assert r.task_spans[4] == (12.0, 13.0, 14.0)
    side = sorted((x.start_us, x.end_us, x.core) for x in r.runs if x.name == "side")
    # "load" blocks were queued first; "side" fills the vector cores as they free up
    assert side == [(3.0, 5.0, 1), (5.0, 7.0, 0), (5.0, 7.0, 1)]
    assert r.busy_us == {"aic": 6.0, "aiv": 13.0}
    assert r.utilisation == {"aic": 6.0 / 14.0, "aiv": 13.0 / 28.0}


def test_mixed_block_runs_on_the_cube_core():
    g = TaskGraph()
    _task(g, "mix", [(2, 0, True), (2, 0, True)])
    r = simulate(_program(g), TOY)
    assert [(x.core_type, x.start_us, x.end_us) for x in r.runs] == [("aic", 1.0, 3.0), ("aic", 3.0, 5.0)]
    assert r.makespan_us == 5.0


def test_syncall_phases_are_barriers():
    g = TaskGraph()
    # phase 0: block 0 takes 4 us, block 1 takes 1 us; phase 1: 1 us each
    _task(g, "phased", [(4, 0, False, 0, 0), (1, 0, False, 0, 1), (1, 0, False, 1, 0), (1, 0, False, 1, 1)])
    r = simulate(_program(g), TOY)
    phase1 = sorted((x.block, x.start_us) for x in r.runs if x.phase == 1)
    assert phase1 == [(0, 5.0), (1, 5.0)]
    assert r.makespan_us == 6.0
    assert r.critical_path_us == 6.0  # dispatch 1 + longest phase-0 block 4 + longest phase-1 block 1


def test_records_of_one_block_and_phase_are_merged():
    g = TaskGraph()
    _task(g, "t", [(0, 0, False, 0, 0), (2, 1, False, 0, 0), (1, 0, False, 0, 1)])
    r = simulate(_program(g), TOY)
    assert r.blocks == 2
    assert sorted((x.block, x.end_us - x.start_us) for x in r.runs) == [(0, 3.0), (1, 1.0)]


def test_init_fill_delays_the_first_consumer():
    g = TaskGraph()
    _task(g, "consumer", [(1, 0, False)], buffers=[1])
    _task(g, "other", [(1, 0, False)])
    filled = simulate(_program(g, [_scratch(1, "acc", 8, 0, 0)]), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in filled.fill_runs] == [("acc", 0.0, 8.0)]
    assert filled.task_spans[0] == (8.0, 9.0, 10.0)
    assert filled.task_spans[1] == (0.0, 1.0, 2.0)
    assert filled.makespan_us == 10.0
    assert filled.critical_path == ["fill acc", "consumer"]
    assert filled.critical_path_tasks == 1
    assert filled.critical_path_us == 10.0
    assert (filled.fills, filled.fill_bytes, filled.fill_us) == (1, 8, 8.0)
    plain = simulate(_program(g, [_scratch(1, "acc", 8, 0, None)]), TOY)
    assert plain.fills == 0
    assert plain.task_spans[0] == (0.0, 1.0, 2.0)
    assert plain.makespan_us == 2.0


def test_fills_run_one_at_a_time_in_allocation_order():
    g = TaskGraph()
    _task(g, "use_b", [(1, 0, False)], buffers=[2])
    r = simulate(_program(g, [_scratch(1, "a", 4, 0, 0), _scratch(2, "b", 4, 512, 0)]), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in r.fill_runs] == [("a", 0.0, 4.0), ("b", 4.0, 8.0)]
    assert r.task_spans[0] == (8.0, 9.0, 10.0)


def test_reused_heap_memory_waits_for_the_previous_users():
    g = TaskGraph()
    _task(g, "first", [(5, 0, False)], buffers=[1])
    _task(g, "second", [(1, 0, False)], buffers=[2])
    bufs = [_scratch(1, "old", 8, 0, None), _scratch(2, "new", 4, 0, 0)]  # same heap bytes
    r = simulate(_program(g, bufs), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in r.fill_runs] == [("new", 6.0, 10.0)]
    assert r.task_spans[1] == (10.0, 11.0, 12.0)
    assert r.critical_path == ["first", "fill new", "second"]


def test_empty_task_and_empty_graph():
    g = TaskGraph()
    _task(g, "empty", [])
    r = simulate(_program(g), TOY)
    assert r.task_spans[0] == (0.0, 1.0, 1.0)
    assert r.makespan_us == 1.0
    assert simulate(_program(TaskGraph()), TOY).makespan_us == 0.0


def test_machine_models():
    a2 = get_machine("a2a3")
    assert (a2.n_aic, a2.n_aiv) == (24, 48)
    assert a2.cube_flops * 24 == pytest.approx(376e12)
    assert a2.aic_gm_bw * 24 == pytest.approx(1.6e12)
    a5 = MACHINES["a5"]
    assert (a5.n_aic, a5.n_aiv) == (36, 72)
    assert set(a2.sources) == set(a5.sources) == {"cores", "cube", "vector", "hbm", "dispatch", "memset"}
    with pytest.raises(ConfigError, match="unknown machine 'b9'"):
        get_machine("b9")


# ---- recorded programs ------------------------------------------------------------------

def _make_kernel():
    @pl.jit
    def split_k(x: pl.Tensor[[32, 64], pl.BF16], w: pl.Tensor[[64, 64], pl.BF16],
                y: pl.Out[pl.Tensor[[32, 64], pl.FP32]], seed_scopes):
        acc = pl.create_tensor([32, 64], pl.FP32, init_value=None if seed_scopes else 0)
        if seed_scopes:
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="seed"):
                acc[0:32, 0:64] = pl.full([32, 64], pl.FP32, 0.0)
        for k in pl.spmd(2, name_hint="partial"):
            part = pl.matmul(x[0:32, k * 32:(k + 1) * 32], w[k * 32:(k + 1) * 32, 0:64])
            pl.assemble(acc, part, [0, 0], atomic=pl.AtomicType.Add)
        for b in pl.spmd(4, name_hint="epilogue"):
            y[b * 8:(b + 1) * 8, 0:64] = pl.exp(acc[b * 8:(b + 1) * 8, 0:64])
        return y
    return split_k


def _run(seed_scopes):
    k = _make_kernel()
    x = torch.randn(32, 64).bfloat16()
    w = torch.randn(64, 64).bfloat16()
    return k.run(x, w, torch.zeros(32, 64), seed_scopes)


def test_recorded_seed_and_init_variants():
    seeded, init = _run(True), _run(False)
    rs, ri = simulate(seeded, TOY), simulate(init, TOY)
    assert (rs.tasks, rs.edges, rs.fills) == (3, 3, 0)
    assert (ri.tasks, ri.edges, ri.fills) == (2, 1, 1)
    assert rs.critical_path == ["seed", "partial", "epilogue"]
    assert ri.critical_path == ["fill acc", "partial", "epilogue"]
    assert ri.critical_path_tasks == 2
    fill_end = ri.fill_runs[0].end_us
    assert fill_end == 32 * 64 * 4  # 8192 bytes at 1 byte/us
    assert ri.task_spans[0][0] == fill_end  # the first task naming acc waits for the fill
    assert all(x.core_type == "aic" for x in ri.runs if x.name == "partial")
    assert all(x.core_type == "aiv" for x in ri.runs if x.name == "epilogue")


def test_recorded_syncall_phases():
    @pl.jit
    def phased(x: pl.Tensor[[2, 64], pl.FP32], y: pl.Out[pl.Tensor[[2, 64], pl.FP32]]):
        @pl.spmd(2, name_hint="two_phase")
        def body(b):
            t = pl.exp(x[b:b + 1, 0:64])
            y[b:b + 1, 0:64] = t
            yield pl.system.syncall()
            y[1 - b:2 - b, 0:64] = pl.exp(y[1 - b:2 - b, 0:64])
        return y

    p = phased.run(torch.randn(2, 64), torch.zeros(2, 64), config=RunConfig(keep_footprints=True))
    r = simulate(p, TOY)
    assert r.blocks == 4
    ends0 = max(x.end_us for x in r.runs if x.phase == 0)
    assert sorted(x.start_us for x in r.runs if x.phase == 1) == [ends0, ends0]


def test_simulate_is_deterministic():
    p = _run(False)
    a, b = simulate(p, "a2a3"), simulate(p, "a2a3")
    assert a.runs == b.runs and a.makespan_us == b.makespan_us and a.critical_path == b.critical_path
    assert simulate(p, "a5").makespan_us < a.makespan_us
