"""Simulator: exact schedules on toy machines (1 FLOP/µs, 1 byte/µs, 1 µs dispatch, free or
1 µs submission, 1 byte/µs AICPU fill; TOY_LAT adds per-op latencies of 1 µs per vector op,
2 µs per matmul, 3 µs per GM load and 4 µs per GM store), the AICPU structure and the
calibrated constants."""

from types import SimpleNamespace

import pytest
import torch

import pto.language as pl
from pto.errors import ConfigError
from pto.runtime import RunConfig
from pto.runtime.graph import Block, Task, TaskGraph
from pto.runtime.heap import Buffer
from pto.runtime.simulate import (HCA_DECODE_FILL_CALIBRATION, MACHINES, Machine, fill_vs_seed, get_machine,
                                  simulate)

TOY = Machine(name="toy", n_aic=1, n_aiv=2, cube_flops=1e6, vec_flops=1e6, aic_gm_bw=1e6, aiv_gm_bw=1e6,
              submit_s=0.0, dispatch_s=1e-6, fill_bw=1e6)
TOY_SUBMIT = Machine(name="toy_submit", n_aic=1, n_aiv=2, cube_flops=1e6, vec_flops=1e6, aic_gm_bw=1e6,
                     aiv_gm_bw=1e6, submit_s=1e-6, dispatch_s=1e-6, fill_bw=1e6)
TOY_LAT = Machine(**{**TOY.__dict__, "name": "toy_lat", "vec_op_s": 1e-6, "cube_op_s": 2e-6, "load_s": 3e-6,
                     "store_s": 4e-6})


def _task(graph, name, blocks, preds=(), kind="spmd", buffers=(), counts=None):
    """blocks: list of (flops, bytes, cube[, phase[, idx]]) per block record; counts: one
    (ops, loads, stores, matmuls) per block record, or None for zeros."""
    t = Task(len(graph.tasks), name, kind, "test", len(blocks), [], False)
    for i, spec in enumerate(blocks):
        flops, nbytes, cube = spec[:3]
        b = Block(t, spec[4] if len(spec) > 4 else i, spec[3] if len(spec) > 3 else 0)
        b.flops, b.bytes, b.cube = flops, nbytes, cube
        if counts is not None:
            b.ops, b.ld, b.st, b.mm = counts[i]
        t.blocks.append(b)
    t.preds = set(preds)
    t.buffers = set(buffers)
    graph.tasks.append(t)
    return t


def _program(graph, buffers=()):
    return SimpleNamespace(name="handmade", graph=graph, buffers=list(buffers))


def _scratch(bid, name, nbytes, offset, init_value, tasks_before=0):
    data = torch.zeros(nbytes // 4, dtype=torch.float32)
    b = Buffer(bid, name, "test", "scratch", data, None, offset=offset, init_value=init_value)
    b.tasks_before = tasks_before
    return b


def test_handmade_graph_schedule_is_exact():
    g = TaskGraph()
    _task(g, "load", [(3, 1, False), (1, 1, False)])           # AIV blocks of 4 and 2 us
    _task(g, "mm", [(4, 2, True)], preds=[0])                   # AIC block of 6 us
    _task(g, "side", [(2, 0, False)] * 3)                       # three 2 us AIV blocks
    _task(g, "task_dummy", [], preds=[1, 2], kind="dummy")
    _task(g, "out", [(1, 0, False)], preds=[3])
    r = simulate(_program(g), TOY)
    assert (r.orch_us, r.sched_us, r.effective_us, r.makespan_us) == (0.0, 14.0, 14.0, 14.0)
    assert r.critical_path == ["load", "mm", "out"]
    assert r.critical_path_ids == [0, 1, 4]
    assert r.critical_path_us == 14.0
    assert (r.tasks, r.dummies, r.edges, r.blocks) == (4, 1, 4, 7)
    # one scheduler stream: "load" is dispatched over [0, 1], "side" over [1, 2]
    assert [(x.kind, x.name, x.start_us, x.end_us) for x in r.aicpu_runs if x.kind == "dispatch"] == [
        ("dispatch", "load", 0.0, 1.0), ("dispatch", "side", 1.0, 2.0), ("dispatch", "mm", 5.0, 6.0),
        ("dispatch", "out", 12.0, 13.0)]
    assert r.task_spans[0] == (0.0, 1.0, 5.0)
    assert r.task_spans[1] == (5.0, 6.0, 12.0)
    assert r.task_spans[2] == (0.0, 4.0, 9.0)
    assert r.task_spans[3] == (12.0, 12.0, 12.0)   # join node: no dispatch, no cost
    assert r.task_spans[4] == (12.0, 13.0, 14.0)
    side = sorted((x.start_us, x.end_us, x.core) for x in r.runs if x.name == "side")
    # "load" blocks were queued first; "side" takes the vector cores as they free up, each block
    # paying the 1 us pickup on its core because it did not start when its task was dispatched
    assert side == [(4.0, 6.0, 1), (6.0, 8.0, 0), (7.0, 9.0, 1)]
    assert r.busy_us == {"aic": 6.0, "aiv": 13.0}
    assert r.utilisation == {"aic": 6.0 / 14.0, "aiv": 13.0 / 28.0}


def test_mixed_block_runs_on_the_cube_core():
    g = TaskGraph()
    _task(g, "mix", [(2, 0, True), (2, 0, True)])
    r = simulate(_program(g), TOY)
    # one AIC: the second block waits for it and then pays its own 1 us pickup
    assert [(x.core_type, x.start_us, x.end_us) for x in r.runs] == [("aic", 1.0, 3.0), ("aic", 4.0, 6.0)]
    assert r.makespan_us == r.effective_us == 6.0


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


def test_orchestration_window_is_tasks_times_submit_cost_without_fill_cost():
    g = TaskGraph()
    _task(g, "a", [(1, 0, False)], buffers=[1])
    _task(g, "b", [(1, 0, False)], preds=[0])
    _task(g, "task_dummy", [], preds=[1], kind="dummy")
    _task(g, "c", [(1, 0, False)], preds=[2])
    free_fill = Machine(name="free_fill", n_aic=1, n_aiv=2, cube_flops=1e6, vec_flops=1e6, aic_gm_bw=1e6,
                        aiv_gm_bw=1e6, submit_s=0.874e-6, dispatch_s=0.8e-6, fill_bw=float("inf"))
    r = simulate(_program(g, [_scratch(1, "acc", 64, 0, 0)]), free_fill)
    assert r.orch_us == pytest.approx(4 * 0.874)  # three tasks and one join node, each submitted once
    assert [x.name for x in r.aicpu_runs if x.kind == "submit"] == ["a", "b", "task_dummy", "c"]
    assert r.fill_runs[0].end_us - r.fill_runs[0].start_us == 0.0
    assert r.effective_us == max(r.orch_us, r.sched_us)


def test_a_fill_delays_every_task_submitted_after_it():
    g = TaskGraph()
    _task(g, "before", [(1, 0, False)])
    _task(g, "user", [(1, 0, False)], buffers=[1])
    _task(g, "after", [(1, 0, False)])
    bufs = [_scratch(1, "acc", 4, 0, 0, tasks_before=1)]  # allocated after "before" was submitted
    r = simulate(_program(g, bufs), TOY_SUBMIT)
    # orchestration: submit before [0, 1], fill acc [1, 5], submit user [5, 6], submit after [6, 7]
    assert [(f.name, f.start_us, f.end_us) for f in r.fill_runs] == [("acc", 1.0, 5.0)]
    assert [(x.name, x.start_us, x.end_us) for x in r.aicpu_runs if x.kind == "submit"] == [
        ("before", 0.0, 1.0), ("user", 5.0, 6.0), ("after", 6.0, 7.0)]
    assert r.orch_us == 7.0
    assert r.task_spans[1][0] == 6.0 and r.task_spans[2][0] == 7.0   # ready only once submitted
    # "before" was ready at 1, but the fill holds the AICPU: its dispatch waits for the fill's end
    assert r.task_spans[0] == (1.0, 6.0, 7.0)
    assert [(x.name, x.start_us) for x in r.aicpu_runs if x.kind == "dispatch"] == [
        ("before", 5.0), ("user", 6.0), ("after", 7.0)]
    assert r.sched_us == r.effective_us == 9.0
    plain = simulate(_program(g, [_scratch(1, "acc", 4, 0, None, tasks_before=1)]), TOY_SUBMIT)
    assert plain.orch_us == 3.0 and plain.fills == 0
    assert plain.effective_us == 5.0  # three 1 us submissions, dispatches and blocks in a pipeline


def test_init_fill_delays_the_first_consumer():
    g = TaskGraph()
    _task(g, "consumer", [(1, 0, False)], buffers=[1])
    _task(g, "other", [(1, 0, False)])
    filled = simulate(_program(g, [_scratch(1, "acc", 8, 0, 0)]), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in filled.fill_runs] == [("acc", 0.0, 8.0)]
    assert filled.task_spans[0] == (8.0, 9.0, 10.0)
    assert filled.task_spans[1] == (8.0, 10.0, 11.0)  # submitted after the fill too
    assert (filled.orch_us, filled.effective_us, filled.makespan_us) == (8.0, 11.0, 11.0)
    assert filled.critical_path == ["fill acc", "submit consumer", "consumer"]
    assert filled.critical_path_tasks == 1
    assert filled.critical_path_us == 10.0
    assert (filled.fills, filled.fill_bytes, filled.fill_us) == (1, 8, 8.0)
    plain = simulate(_program(g, [_scratch(1, "acc", 8, 0, None)]), TOY)
    assert plain.fills == 0
    assert plain.task_spans[0] == (0.0, 1.0, 2.0)
    assert plain.effective_us == 3.0


def test_fills_run_one_at_a_time_in_allocation_order():
    g = TaskGraph()
    _task(g, "use_b", [(1, 0, False)], buffers=[2])
    r = simulate(_program(g, [_scratch(1, "a", 4, 0, 0), _scratch(2, "b", 4, 512, 0)]), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in r.fill_runs] == [("a", 0.0, 4.0), ("b", 4.0, 8.0)]
    assert r.task_spans[0] == (8.0, 9.0, 10.0)
    assert r.critical_path == ["fill a", "fill b", "submit use_b", "use_b"]


def test_reused_heap_memory_waits_for_the_previous_users():
    g = TaskGraph()
    _task(g, "first", [(5, 0, False)], buffers=[1])
    _task(g, "second", [(1, 0, False)], buffers=[2])
    bufs = [_scratch(1, "old", 8, 0, None), _scratch(2, "new", 4, 0, 0, tasks_before=1)]  # same heap bytes
    r = simulate(_program(g, bufs), TOY)
    assert [(f.name, f.start_us, f.end_us) for f in r.fill_runs] == [("new", 6.0, 10.0)]
    assert r.orch_us == 10.0  # the orchestrator waited for "first" to retire before filling
    assert r.task_spans[1] == (10.0, 11.0, 12.0)
    assert r.critical_path == ["first", "fill new", "submit second", "second"]
    assert r.critical_path_us == 12.0


def test_empty_task_and_empty_graph():
    g = TaskGraph()
    _task(g, "empty", [])
    r = simulate(_program(g), TOY)
    assert r.task_spans[0] == (0.0, 1.0, 1.0)
    assert (r.effective_us, r.makespan_us) == (1.0, 0.0)  # dispatched, no block on a core
    e = simulate(_program(TaskGraph()), TOY)
    assert (e.orch_us, e.sched_us, e.effective_us, e.makespan_us) == (0.0, 0.0, 0.0, 0.0)


def test_free_task_and_free_fill_counterfactuals():
    g = TaskGraph()
    _task(g, "seed", [(3, 0, False)], buffers=[1])
    _task(g, "use", [(1, 0, False)], preds=[0], buffers=[1])
    p = _program(g, [_scratch(1, "acc", 4, 0, 0)])
    base = simulate(p, TOY_SUBMIT)
    assert (base.orch_us, base.effective_us) == (6.0, 11.0)
    no_fill = simulate(p, TOY_SUBMIT, free_fills={1})
    assert (no_fill.fills, no_fill.orch_us, no_fill.effective_us) == (0, 2.0, 7.0)
    no_seed = simulate(p, TOY_SUBMIT, free_tasks={0})
    assert no_seed.orch_us == 5.0 and no_seed.task_spans[0] == (4.0, 4.0, 4.0)
    assert [x.name for x in no_seed.aicpu_runs] == ["use", "use"]  # one submission, one dispatch


def test_machine_models():
    a2 = get_machine("a2a3")
    assert (a2.n_aic, a2.n_aiv) == (24, 48)
    assert a2.cube_flops * 24 == pytest.approx(376e12)
    assert a2.aic_gm_bw * 24 == pytest.approx(1.6e12)
    assert (a2.submit_us, a2.dispatch_us) == pytest.approx((0.874, 0.8))
    a5 = MACHINES["a5"]
    assert (a5.n_aic, a5.n_aiv) == (36, 72)
    keys = {"cores", "cube", "vector", "hbm", "vector op", "matmul op", "GM load", "GM store", "submit", "dispatch",
            "fill"}
    assert set(a2.sources) == set(a5.sources) == keys
    # per-op latencies: fixed terms of the CANN PyPTO cost model's A2A3 table, GM latencies in
    # cycles at 2000 cycles per us
    assert a2.vec_op_s == pytest.approx(0.0188e-6)
    assert a2.cube_op_s == pytest.approx((0.015 + 0.012 + 0.0107) * 1e-6)
    assert a2.load_s == pytest.approx(1400 / 2000e6 + 0.00240884e-6)
    assert a2.store_s == pytest.approx(300 / 2000e6 + 0.00195e-6)
    assert a5.vec_op_s == pytest.approx(0.02101e-6)
    assert (a5.cube_op_s, a5.load_s, a5.store_s) == (a2.cube_op_s, a2.load_s, a2.store_s)
    with pytest.raises(ConfigError, match="unknown machine 'b9'"):
        get_machine("b9")


def test_fill_rate_reproduces_the_calibration_delta_exactly():
    cal = HCA_DECODE_FILL_CALIBRATION
    a2 = get_machine("a2a3")
    fill = sum(a2.fill_us(n) for n in cal["fill_bytes"].values())
    assert fill - cal["seed_tasks"] * a2.submit_us == pytest.approx(cal["orch_init_us"] - cal["orch_seed_us"])
    assert sum(cal["fill_bytes"].values()) == 100352
    assert a2.fill_bw == pytest.approx(100352 / 61.922e-6)


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
    assert ri.critical_path == ["fill acc", "submit partial", "partial", "epilogue"]
    assert ri.critical_path_tasks == 2
    fill_end = ri.fill_runs[0].end_us
    assert fill_end == ri.orch_us == 32 * 64 * 4  # 8192 bytes at 1 byte/us, before any submission
    assert ri.task_spans[0][0] == fill_end
    assert all(x.core_type == "aic" for x in ri.runs if x.name == "partial")
    assert all(x.core_type == "aiv" for x in ri.runs if x.name == "epilogue")
    # on TOY the seed task's 8192 GM bytes at 1 byte/us cost as much as the fill plus its dispatch
    rows = fill_vs_seed(seeded, init, TOY)
    assert [(r.buffer, r.nbytes, r.seed_task, r.cheaper) for r in rows] == [("acc", 8192, "seed", "init_value")]
    assert rows[0].fill_us == rows[0].fill_cost_us == 8192.0
    assert rows[0].seed_cost_us == rs.effective_us - simulate(seeded, TOY, free_tasks={0}).effective_us
    assert rows[0].seed_cost_us > rows[0].fill_cost_us
    slow_fill = Machine(**{**TOY.__dict__, "name": "slow_fill", "fill_bw": 1e5})
    rows = fill_vs_seed(seeded, init, slow_fill)
    assert rows[0].cheaper == "seed task" and rows[0].fill_cost_us == rows[0].fill_us == 81920.0


def test_flash_decode_fill_bytes_match_the_calibration():
    from pto.golden import ScalarSpec, get_case
    import pto.models.deepseek_v4  # noqa: F401 - fills the registry
    got = {}
    for name in ("qkv_proj_rope", "hc_pre"):
        cr = get_case(name).build("flash", "decode")
        torch.manual_seed(0)
        vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
        p = cr.fn.run(*vals, config=RunConfig())
        got.update({b.name: b.nbytes for b in p.buffers if b.kind == "scratch" and b.init_value is not None})
        free_fill = Machine(**{**MACHINES["a2a3"].__dict__, "name": "free_fill", "fill_bw": float("inf")})
        assert simulate(p, free_fill).orch_us == pytest.approx(p.stats.tasks * 0.874)
    assert got == HCA_DECODE_FILL_CALIBRATION["fill_bytes"]


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


def test_cli_diff_seed_scopes(capsys):
    from pto.cli import main
    assert main(["diff", "qkv_proj_rope", "--preset", "tiny", "--mode", "decode", "--opt", "seed_scopes=True"]) == 0
    out = capsys.readouterr().out
    for name in ("q", "kv", "qr", "qr_scale"):
        assert f"output {name}" in out
    assert "DIFFERS" not in out and out.count("bit-identical") == 4
    assert "qr_proj_seed" in out and "kv_proj_seed" in out
    assert main(["diff", "qkv_proj_rope", "--preset", "tiny", "--mode", "decode"]) == 2  # one variant twice


def test_fill_vs_seed_when_both_variants_fill():
    g = TaskGraph()
    _task(g, "use", [(1, 0, False)], buffers=[1])
    both = _program(g, [_scratch(1, "acc", 4, 0, 0)])
    rows = fill_vs_seed(both, both, TOY)
    assert [(r.buffer, r.seed_task, r.seed_cost_us, r.cheaper) for r in rows] == [
        ("acc", None, 0.0, "init_value in both")]
    assert rows[0].fill_cost_us == 4.0


# ---- per-op latency on the cores ---------------------------------------------------------

def test_per_op_latency_hand_computed():
    g = TaskGraph()
    # vector block: 2 flops + 1 byte + 3 vector ops x 1 + 2 loads x 3 + 1 store x 4 = 16 us
    _task(g, "vec", [(2, 1, False)], counts=[(3, 2, 1, 0)])
    # cube block: 4 flops + 2 bytes + 2 matmuls x 2 + 2 loads x 3 + 1 store x 4 = 20 us
    # mixed block on the AIC: 4 + 2 + 1 matmul x 2 + 4 vector ops x 1 + 1 load x 3 + 1 store x 4 = 19 us
    _task(g, "mm", [(4, 2, True), (4, 2, True)], preds=[0], counts=[(2, 2, 1, 2), (5, 1, 1, 1)])
    r = simulate(_program(g), TOY_LAT)
    assert sorted((x.name, x.block, x.start_us, x.end_us) for x in r.runs) == [
        ("mm", 0, 18.0, 38.0), ("mm", 1, 39.0, 58.0), ("vec", 0, 1.0, 17.0)]  # block 1 waits for the AIC: pickup 1
    assert r.task_spans[1] == (17.0, 18.0, 58.0)
    assert r.effective_us == 58.0
    assert r.critical_path_us == 1 + 16 + 1 + 20  # unlimited cores: the longer AIC block
    # without latency terms the same graph is the throughput model alone
    plain = simulate(_program(g), TOY)
    assert sorted((x.name, x.end_us - x.start_us) for x in plain.runs) == [("mm", 6.0), ("mm", 6.0), ("vec", 3.0)]


def test_block_us_splits_vector_ops_from_matmuls():
    assert TOY_LAT.block_us(0, 0, True, ops=3, matmuls=3) == 6.0
    assert TOY_LAT.block_us(0, 0, False, ops=3) == 3.0
    assert TOY_LAT.block_us(10, 5, False, loads=1, stores=1) == 22.0
    assert TOY.block_us(10, 5, False, ops=9, loads=9, stores=9, matmuls=1) == 15.0


def test_recorded_block_counters_and_a2a3_block_time():
    @pl.jit
    def chain(x: pl.Tensor[[16, 64], pl.BF16], w: pl.Tensor[[64, 32], pl.BF16], s: pl.Tensor[[4], pl.FP32],
              y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="mm_scale"):
            c = pl.matmul(x[0:16, 0:64], w[0:64, 0:32])     # 2 loads, 1 matmul
            k = pl.read(s, [1])                               # 1 scalar load
            y[0:16, 0:32] = pl.exp(c * k)                     # 2 vector ops (MULS, EXP), 1 store
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="vec"):
            pl.write(y, [0, 0], 1.0)                          # 1 scalar store
        return y

    p = chain.run(torch.randn(16, 64).bfloat16(), torch.randn(64, 32).bfloat16(), torch.ones(4), torch.zeros(16, 32))
    b0, b1 = p.graph.tasks[0].blocks[0], p.graph.tasks[1].blocks[0]
    assert (b0.ops, b0.ld, b0.st, b0.mm, b0.cube) == (3, 3, 1, 1, True)
    assert (b1.ops, b1.ld, b1.st, b1.mm, b1.cube) == (0, 0, 1, 0, False)
    assert (b0.vk, b1.vk) == ({"mul_s": 1, "exp": 1}, None)
    a2 = get_machine("a2a3")
    r = simulate(p, a2)
    run0 = next(x for x in r.runs if x.name == "mm_scale")
    nbytes = 16 * 64 * 2 + 64 * 32 * 2 + 4 + 16 * 32 * 4
    flops = 2 * 16 * 32 * 64 + 2 * 16 * 32
    expect = (flops / (a2.cube_flops / 1e6) + nbytes / (a2.aic_gm_bw / 1e6)
              + (0.015 + 0.02597 + 1 * 0.0377 + 3 * (0.7 + 0.00240884) + 1 * (0.15 + 0.00195)))  # MULS + EXP
    assert run0.end_us - run0.start_us == pytest.approx(expect, rel=1e-12)
    run1 = next(x for x in r.runs if x.name == "vec")
    assert run1.end_us - run1.start_us == pytest.approx(4 / (a2.aiv_gm_bw / 1e6) + 0.15 + 0.00195, rel=1e-12)


def test_records_of_one_block_merge_their_op_counts():
    g = TaskGraph()
    # two records of block 0, phase 0: 2 + 1 vector ops, 1 + 1 loads, 0 + 1 stores -> 3 + 6 + 4 = 13 us
    _task(g, "split", [(0, 0, False, 0, 0), (0, 0, False, 0, 0)], counts=[(2, 1, 0, 0), (1, 1, 1, 0)])
    r = simulate(_program(g), TOY_LAT)
    assert r.blocks == 1
    assert [(x.start_us, x.end_us) for x in r.runs] == [(1.0, pytest.approx(14.0, rel=1e-12))]


def _bench_sim_device():
    """benchmarks/bench_sim_device.py as a module (it is a script, not a package)."""
    import importlib.util
    import pathlib
    import sys

    name = "bench_sim_device"
    if name not in sys.modules:
        path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sim_device.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses resolve the module's annotations through sys.modules
        spec.loader.exec_module(mod)
    return sys.modules[name]


def test_bench_status_leaves_different_programs_out_of_the_check():
    bench = _bench_sim_device()
    fig = bench.Figure("x", 2.0, "src")
    assert bench.figure_status(fig, 1.0) == "ok"            # 1.0 / 2.0 = 0.5x: the bound is inside
    assert bench.figure_status(fig, 4.0) == "ok"            # 2.0x
    assert bench.figure_status(fig, 0.98) == "DISAGREES"    # 0.49x
    assert bench.figure_status(fig, None) == "pending"
    assert bench.figure_status(bench.Figure("d", 51.0, "src", measure="delta:effective"), 25.0) == "ok"
    assert bench.figure_status(bench.Figure("d", 51.0, "src", measure="delta:effective"), 24.9) == "DISAGREES"
    other = bench.Figure("y", 2.0, "src", differs="historical: different program: ...")
    assert bench.figure_status(other, 0.2) == "different program"  # 0.1x, but not a comparison
    table = [{"what": "a", "status": "ok"}, {"what": "b", "status": "DISAGREES"},
             {"what": "c", "status": "different program"}, {"what": "d", "status": "derived"}]
    assert bench.summary(table) == ("1 of 2 compared figures disagree: b. Not compared (1, the device measured a "
                                    "different program, reason on each row): c")
    # every row left out of the check says why, and the MoE row compares one rank with one rank
    for f in bench.FIGURES:
        assert not f.differs or f.differs.startswith(("historical: different program:", "different program:"))
    moe = next(f for f in bench.FIGURES if f.kernels == ("moe_ep",))
    assert (moe.ep, moe.experts_per_rank, moe.device_us, moe.differs) == (2, 32, 514.5, "")


def test_ep_moe_program_is_one_rank_of_the_world():
    bench = _bench_sim_device()
    from pto.models.deepseek_v4.config import get_config

    cfg = get_config("tiny")  # D 128, F 64, K 4
    D, F, K = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    prog = bench.ep_moe_program("tiny", ep=2, experts_per_rank=4)
    tasks = {t.name: t for t in prog.graph.tasks}
    # 21 tasks / 27 edges before expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block
    assert len(prog.graph.tasks) == 24 and sum(len(t.preds) for t in prog.graph.tasks) == 33
    ffn = [b for t in prog.graph.tasks if t.name in ("expert_gate_up", "expert_down") for b in t.blocks]
    assert len(ffn) == 4 * 2                           # per local expert a gate/up and a down block
    assert sum(b.mm for b in ffn) == 4 * 3             # gate, up and w2 of each
    assert sum(b.bytes for b in ffn) >= 4 * 3 * F * D  # the 4 experts' INT8 weights: 98,304 B
    # balanced routes: rank 0 receives its own T*K = 32 routes' rows, D INT8 bytes each, from the window
    gather = tasks["moe_ep_gather"].blocks[0]
    assert gather.bytes >= 8 * K * D
    r = simulate(prog, "a2a3")
    assert r.tasks == 24 and r.effective_us >= r.critical_path_us - 1e-9 > 0  # a schedule is no shorter


def test_vector_ops_take_their_kind_latency():
    # toy table: EXP 5 us, ROWSUMLINE 7 us; other vector ops 1 us (TOY_LAT's vec_op_s)
    m = Machine(**{**TOY_LAT.__dict__, "name": "toy_kinds", "vec_kind_s": (("EXP", 5e-6), ("ROWSUMLINE", 7e-6))})
    # 6 vector ops: 2 exp x 5 + 1 row_sum x 7 + 1 col_sum x 7 + (6 - 4) unnamed or unlisted x 1 = 26 us
    assert m.vec_latency_s(6, {"exp": 2, "row_sum": 1, "col_sum": 1, "add": 1}) * 1e6 == pytest.approx(26.0)
    assert m.block_us(0, 0, False, ops=6, kinds={"exp": 2, "row_sum": 1, "col_sum": 1}) == pytest.approx(26.0)
    assert TOY_LAT.block_us(0, 0, False, ops=6, kinds={"exp": 2}) == 6.0  # no table: every op at vec_op_s
    a2 = get_machine("a2a3")  # the A2A3 fixed terms: ROWSUMLINE 0.07288, ROWMAX_SINGLE 0.00888, EXPAND 0.014 us
    assert a2.vec_latency_s(4, {"row_sum": 1, "row_max": 1, "row_expand": 1}) * 1e6 == pytest.approx(
        0.07288 + 0.00888 + 0.014 + 0.0188)
    # records of one block merge their kinds; a replayed program keeps them
    g = TaskGraph()
    t = _task(g, "v", [(0, 0, False, 0, 0), (0, 0, False, 0, 0)], counts=[(2, 0, 0, 0), (1, 0, 0, 0)])
    t.blocks[0].vk, t.blocks[1].vk = {"exp": 2}, {"exp": 1}
    r = simulate(_program(g), m)
    assert [(x.start_us, x.end_us) for x in r.runs] == [(1.0, pytest.approx(16.0))]  # 3 exp x 5 us
