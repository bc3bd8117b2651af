"""The program cache (runtime/replay.py) and lazy derivation (deps.LazyDerivation).

* a repeated plain call replays: bit-identical outputs, the graph and statistics of a plain run;
* a replay whose control path or data-dependent footprint would differ is detected (a guard)
  and the call runs plain; scalars that steer control flow are part of the key;
* check mode, other RunConfigs, the switch and the reset;
* every registered kernel at ``tiny``: the third call (a replay, or a plain run after a
  divergence) gives the plain run's outputs bit for bit and its graph; the lazily derived graph of
  a plain run equals check mode's eagerly derived one.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.golden import TensorSpec, all_cases, get_case
from pto.golden.harness import resolve_outputs
from pto.runtime import (RunConfig, cache_info, clear_program_cache, parametric_replay, parametric_replay_enabled,
                         set_program_cache)

N = pl.dynamic("N")


pytestmark = pytest.mark.usefixtures("fresh_program_cache")


@pl.jit
def row_add(a: pl.Tensor[[N, 16], pl.FP32], b: pl.Tensor[[N, 16], pl.FP32], c: pl.Out[pl.Tensor[[N, 16], pl.FP32]]):
    for i in range(a.shape[0]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row_add"):
            c[i:i + 1, 0:16] = a[i:i + 1, 0:16] + b[i:i + 1, 0:16]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="again"):
        c[0:1, 0:16] = c[0:1, 0:16] + c[1:2, 0:16]
    return c


@pl.jit
def steered(flag: pl.Tensor[[pl.dynamic("F"), 65], pl.INT32], x: pl.Tensor[[8, 16], pl.FP32],
            y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    # the orchestration reads a value and picks a control path and a footprint by it
    f = pl.read(flag, [0, 0])
    if f == 0:
        for b in pl.spmd(2, name_hint="copy"):
            y[b * 4:b * 4 + 4, 0:16] = x[b * 4:b * 4 + 4, 0:16]
    else:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="double"):
            y[0:8, 0:16] = x[0:8, 0:16] + x[0:8, 0:16]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
        r = pl.read(flag, [0, 0]) % 8  # a data-dependent footprint
        y[r:r + 1, 0:16] = x[r:r + 1, 0:16] * 3.0
    return y


@pl.jit
def scaled(x: pl.Tensor[[4, 16], pl.FP32], y: pl.Out[pl.Tensor[[4, 16], pl.FP32]], n: pl.Scalar[pl.INT32]):
    for i in range(n):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
            y[i:i + 1, 0:16] = x[i:i + 1, 0:16] + x[i:i + 1, 0:16]
    return y


def graph_record(prog):
    """Everything the graph and statistics say, as plain values (buffers by name and id)."""
    tasks = []
    for t in prog.graph.tasks:
        fps = sorted((buf.name, buf.id, kind, box) for buf, kind, box in t.footprints)
        blocks = [tuple(getattr(b, a) for a in type(b).__slots__ if a not in ("task", "fp")) for b in t.blocks]
        tasks.append((t.id, t.name, t.kind, t.site, t.n_blocks, sorted(t.preds), list(t.explicit), t.manual,
                      fps, sorted(t.buffers), blocks))
    bufs = [(b.id, b.name, b.kind, b.shape, b.dtype, b.nbytes, b.offset, b.init_value) for b in prog.buffers]
    row = {k: v for k, v in prog.stats.as_row().items() if k != "wall_us"}
    return tasks, bufs, row, sorted(prog.graph.edge_kinds().items())


def test_repeated_call_replays_bit_identical_with_the_plain_graph():
    a, b = torch.randn(64, 16), torch.randn(64, 16)
    set_program_cache(False)
    ref = torch.zeros(64, 16)
    fresh = row_add.run(a, b, ref)
    set_program_cache(True)
    progs = []
    for _ in range(4):
        c = torch.zeros(64, 16)
        progs.append(row_add.run(a, b, c))
        assert torch.equal(c, ref)
    assert [p.replayed for p in progs] == [False, False, True, True]
    assert cache_info()["recorded"] == 1 and cache_info()["replayed"] == 2
    assert progs[2].stats.tasks == 65 and progs[2].stats.edges == 2
    assert graph_record(progs[2]) == graph_record(fresh) == graph_record(progs[1])
    assert progs[3].result is not None and progs[3].graph.tasks[64].preds == {0, 1}


def test_other_arguments_replay_with_their_own_values():
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    for _ in range(3):
        row_add.run(a, b, torch.zeros(8, 16))
    a2, b2 = torch.randn(8, 16), torch.randn(8, 16)
    out = torch.zeros(8, 16)
    prog = row_add.run(a2, b2, out)
    assert prog.replayed
    ref = a2 + b2
    ref[0] += ref[1]
    assert torch.equal(out, ref)
    assert prog.result is out  # the Out argument comes back as the caller's tensor
    # another shape is another key: a first call again
    assert not row_add.run(torch.randn(9, 16), torch.randn(9, 16), torch.zeros(9, 16)).replayed


def _flag(v: int, rows: int = 64) -> torch.Tensor:
    """The steering value in element [0, 0] of an INT32 tensor; 64 x 65 elements is larger than
    the index tensors whose values are part of the key, so only a guard sees it."""
    t = torch.zeros(rows, 65, dtype=torch.int32)
    t[0, 0] = v
    return t


def test_small_index_tensors_are_part_of_the_key():
    assert not parametric_replay_enabled()  # the default
    x = torch.randn(8, 16)
    for flag in (0, 0, 0, 1):
        y = torch.zeros(8, 16)
        prog = steered.run(_flag(flag, rows=1), x, y)
        assert torch.equal(y, _steered_ref(flag, x))
    assert not prog.replayed and cache_info()["diverged"] == 0  # another key: a first call, no replay tried
    assert steered.run(_flag(0, rows=1), x, torch.zeros(8, 16)).replayed


def test_values_read_from_data_replay_parametrically_with_a_fresh_graph():
    # recorded at flag 3 (path "double", row 3): 5, 11 and 2 take the same path with another row
    # (a footprint computed from the value read): they replay, with the graph of a plain run
    x = torch.randn(8, 16)
    flags = (5, 11, 2, 0, 6)
    set_program_cache(False)
    plain = {f: graph_record(steered.run(_flag(f, rows=1), x, torch.zeros(8, 16))) for f in flags}
    set_program_cache(True)
    with parametric_replay():
        for _ in range(2):
            steered.run(_flag(3, rows=1), x, torch.zeros(8, 16))
        assert cache_info()["recorded"] == 1
        for flag in flags:
            y = torch.zeros(8, 16)
            prog = steered.run(_flag(flag, rows=1), x, y)
            assert torch.equal(y, _steered_ref(flag, x)), flag
            assert prog.replayed == (flag != 0), flag  # 0 takes the other branch: a guard on ``f == 0`` diverges
            assert graph_record(prog) == plain[flag], flag
    assert cache_info()["replayed"] == 4 and cache_info()["diverged"] == 1 and cache_info()["recorded"] == 1
    assert not parametric_replay_enabled()


def _steered_ref(flag: int, x: torch.Tensor) -> torch.Tensor:
    y = x.clone() if flag == 0 else x + x
    r = flag % 8
    y[r] = x[r] * 3.0
    return y


def test_a_different_control_path_or_footprint_diverges_and_runs_plain():
    x = torch.randn(8, 16)
    flags = (1, 8, 3)  # 1 and 3: another path; 8: the same path, another row
    set_program_cache(False)
    plain = {f: graph_record(steered.run(_flag(f), x, torch.zeros(8, 16)))
             for f in flags}
    set_program_cache(True)
    for _ in range(3):
        y = torch.zeros(8, 16)
        prog = steered.run(_flag(0), x, y)
        assert torch.equal(y, _steered_ref(0, x))
    assert prog.replayed
    for flag in flags:
        y = torch.zeros(8, 16)
        prog = steered.run(_flag(flag), x, y)
        assert torch.equal(y, _steered_ref(flag, x)), flag
        assert not prog.replayed
        assert graph_record(prog) == plain[flag]
    assert cache_info()["diverged"] == 3
    # three divergences in a row: the key runs plain for good
    prog = steered.run(_flag(0), x, torch.zeros(8, 16))
    assert not prog.replayed


def test_scalars_that_steer_control_flow_are_part_of_the_key():
    x = torch.randn(4, 16)
    for n in (2, 2, 2, 3):
        y = torch.zeros(4, 16)
        prog = scaled.run(x, y, n)
        ref = torch.zeros(4, 16)
        ref[:n] = x[:n] + x[:n]
        assert torch.equal(y, ref)
    assert not prog.replayed and prog.stats.tasks == 3
    assert scaled.run(x, torch.zeros(4, 16), 2).replayed


def test_check_mode_other_configs_the_switch_and_the_reset_run_plain():
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    for cfg in (RunConfig(check=True), RunConfig(keep_footprints=True), RunConfig(block_order="reverse")):
        assert not any(row_add.run(a, b, torch.zeros(8, 16), config=cfg).replayed for _ in range(3))
    for _ in range(3):
        prog = row_add.run(a, b, torch.zeros(8, 16), config=RunConfig(heap_bytes=1 << 20))
    assert prog.replayed
    clear_program_cache()
    assert not row_add.run(a, b, torch.zeros(8, 16), config=RunConfig(heap_bytes=1 << 20)).replayed
    set_program_cache(False)
    assert not any(row_add.run(a, b, torch.zeros(8, 16)).replayed for _ in range(3))
    assert not pto.runtime.program_cache_enabled()


def test_a_replay_leaves_the_caller_untouched_when_it_diverges():
    x = torch.randn(8, 16)
    for _ in range(3):
        steered.run(_flag(0), x, torch.zeros(8, 16))
    y = torch.full((8, 16), 7.0)
    steered.run(_flag(1), x, y)
    assert torch.equal(y, _steered_ref(1, x))


def _case_runs():
    out = []
    for c in all_cases("model"):
        for m in c.modes:
            out.append((c.name, m))
    return out


def _values(cr):
    torch.manual_seed(0)
    specs = resolve_outputs(cr.fn, cr.specs)
    vals = [s.create_tensor() if isinstance(s, TensorSpec) else s.to_python() for s in specs]
    outs = [i for i, s in enumerate(specs) if isinstance(s, TensorSpec) and s.is_output]
    return vals, outs


def _clone(vals):
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in vals]


@pytest.mark.parametrize("name,mode", _case_runs())
def test_every_registered_kernel_replays_bit_identical_with_the_plain_graph(name, mode):
    cr = get_case(name).build("tiny", mode)
    vals, outs = _values(cr)
    set_program_cache(False)
    ref_args = _clone(vals)
    fresh = cr.fn.run(*ref_args)
    eager = cr.fn.run(*_clone(vals), config=RunConfig(check=True))
    assert {(p, t.id) for t in fresh.graph.tasks for p in t.preds} == eager.graph.edges()  # lazy == eager
    set_program_cache(True)
    for call in range(3):
        args = _clone(vals)
        prog = cr.fn.run(*args)
        for i in outs:
            assert torch.equal(args[i], ref_args[i]) or (args[i].dtype.is_floating_point and torch.equal(
                args[i].isnan(), ref_args[i].isnan()) and torch.equal(args[i].nan_to_num(), ref_args[i].nan_to_num())), \
                f"{name} {mode} call {call}: output {i} differs"
    assert prog.replayed and cache_info()["errors"] == 0, \
        f"{name} {mode}: the third call with the same inputs was not replayed ({cache_info()})"
    assert graph_record(prog) == graph_record(fresh)
