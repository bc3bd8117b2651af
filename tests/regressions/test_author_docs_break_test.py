"""Defects two break tests found (a kernel author writing new kernels; a user checking the docs):

* a window of a reshaped or flat view that crosses root rows recorded whole root rows: two blocks
  writing disjoint runs of a flat view raced, and a later task got a RAW edge it does not need;
* ``deps=t0`` (a bare task id) was dropped when ``t0 == 0`` and a TypeError otherwise; a
  ``pl.spmd`` object that had not run yet was silently no dependency;
* one tensor passed as an In and an Out argument passed check mode although the device, in
  place, reads the kernel's own stores (pto reads a copy of the values from before the run);
* ``pl.full`` / ``pl.select`` with a float past the tile dtype's range raised torch's
  RuntimeError, where a store or a tile op rounds it to inf;
* ``pl.range(0, 4, 0)`` and a reduction over an empty dim raised raw Python / torch errors;
* writing an In parameter named its line by absolute path;
* ``--scalar a=inf`` / ``nan`` were refused; ``--preset`` on an example was silently ignored, and
  ``--opt T=true`` on a builder whose ``T`` defaults to None reached torch;
  ``pto sim`` printed a 3000-task critical path in full;
* an allclose failure whose elements are NaN in the golden too did not say so;
* ``DistributedError`` was not importable from ``pto``.
"""

import math

import pytest
import torch

import pto
import pto.language as pl
from pto.cli import main as cli_main
from pto.cli import parse_options
from pto.errors import BindError, DslError, RaceError
from pto.golden import TensorSpec, run_jit


@pl.jit
def _flat_disjoint(x: pl.Tensor[[16, 32], pl.FP32], y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    s = pl.create_tensor([16, 32], pl.FP32)
    f = pl.reshape(s, [512])
    xf = pl.reshape(x, [512])
    for b in pl.spmd(2, name_hint="w"):
        if b == 0:
            f[0:100] = xf[0:100]
        else:
            f[100:512] = xf[100:512]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="r"):
        y[0:16, :] = s[0:16, :]


@pl.jit
def _reshape_overlap(x: pl.Tensor[[32, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    s = pl.create_tensor([16, 32], pl.FP32)
    r = pl.reshape(s, [32, 16])
    for b in pl.spmd(2, name_hint="w"):
        if b == 0:
            r[0:17, :] = x[0:17, :]  # rows 0-7 of s and s[8, 0:16]
        else:
            r[16:32, :] = x[16:32, :]  # s[8, 0:16] again, then rows 9-15
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="r"):
        y[0:16, :] = s[0:16, :]


@pl.jit
def _flat_then_row(x: pl.Tensor[[16, 32], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]],
                   z: pl.Out[pl.Tensor[[100], pl.FP32]]):
    s = pl.create_tensor([16, 32], pl.FP32, init_value=0)
    f = pl.reshape(s, [512])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="a"):
        f[0:100] = pl.reshape(x[0:4, 0:25], [100])  # elements 0..99: rows 0-2 and s[3, 0:4]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="b"):
        y[0:1, :] = s[3:4, 16:32]  # elements 112..127: nothing task a wrote
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="c"):
        z[0:100] = f[0:100]


def test_disjoint_runs_of_a_flat_view_do_not_race():
    x, y = torch.randn(16, 32), torch.empty(16, 32)
    _flat_disjoint.run(x, y, config=pto.RunConfig(check=True))
    assert torch.equal(y, x)


def test_a_reshaped_view_overlap_names_the_elements_both_write():
    with pytest.raises(RaceError, match=r"rows \[8, 9\) cols \[0, 16\)"):
        _reshape_overlap.run(torch.randn(32, 16), torch.empty(16, 32), config=pto.RunConfig(check=True))


def test_a_flat_window_records_its_own_elements_and_no_false_edge():
    prog = _flat_then_row.run(torch.randn(16, 32), torch.empty(1, 16), torch.empty(100))
    a, b, c = prog.graph.tasks
    writes = sorted(box for buf, kind, box in a.footprints if buf.name == "s")
    assert writes == [(0, 3, 0, 32), (3, 4, 0, 4)]
    assert b.preds == set() and c.preds == {a.id}
    assert prog.graph.named_edges() == {("a", "c")} and prog.stats.edges == 1


@pl.jit
def _bare_dep(x: pl.Tensor[[16, 32], pl.FP32], y: pl.Out[pl.Tensor[[16, 32], pl.FP32]],
              z: pl.Out[pl.Tensor[[16, 32], pl.FP32]], w: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="a") as t0:
        y[0:16, :] = x[0:16, :]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="b", deps=t0) as t1:  # t0 == 0
        z[0:16, :] = x[0:16, :] * 2.0
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="c", deps=t1):  # t1 == 1
        w[0:16, :] = x[0:16, :] * 3.0


@pl.jit
def _dep_on_unrun_spmd(x: pl.Tensor[[16, 32], pl.FP32], z: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    sp = pl.spmd(2, name_hint="later")
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="b", deps=[sp]):
        z[0:16, :] = x[0:16, :]
    for b in sp:
        z[8 * b:8 * b + 8, :] = x[8 * b:8 * b + 8, :]


def test_a_bare_task_id_is_one_dependency_zero_included():
    prog = _bare_dep.run(torch.randn(16, 32), *(torch.empty(16, 32) for _ in range(3)))
    assert prog.graph.named_edges() == {("a", "b"), ("b", "c")} and prog.stats.edges == 2


def test_a_dependency_on_a_task_scope_that_has_not_run_is_refused():
    with pytest.raises(DslError, match=r"task 'later' \(pl.spmd\) has not run yet"):
        _dep_on_unrun_spmd.run(torch.randn(16, 32), torch.empty(16, 32))


@pl.jit
def _shift_up(x: pl.Tensor[[8, 32], pl.FP32], y: pl.PartialOut[pl.Tensor[[8, 32], pl.FP32]]):
    for b in pl.spmd(7, name_hint="shift"):
        y[b:b + 1, :] = x[b + 1:b + 2, :]


def test_an_in_argument_aliasing_an_out_is_refused_in_check_mode_only():
    buf = torch.arange(8.0).repeat(32, 1).t().contiguous()
    plain = buf.clone()
    _shift_up.run(plain, plain)  # a plain run: documented private-copy semantics
    assert plain[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 7]
    b = buf.clone()
    with pytest.raises(BindError, match="In argument 'x' shares memory with the written argument 'y'"):
        _shift_up.run(b, b, config=pto.RunConfig(check=True))
    assert torch.equal(b, buf)  # nothing written
    # separate tensors are fine in check mode
    out = buf.clone()
    _shift_up.run(buf.clone(), out, config=pto.RunConfig(check=True))
    assert out[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 7]


@pl.jit
def _big_scalars(x: pl.Tensor[[4, 8], pl.FP16], y: pl.Out[pl.Tensor[[4, 8], pl.FP16]],
                 z: pl.Out[pl.Tensor[[4, 8], pl.FP16]], w: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="m"):
        t = x[0:4, :]
        y[0:4, :] = pl.full([4, 8], pl.FP16, 1e5)
        z[0:4, :] = pl.select(t > 0.0, t, -1e5)
        w[0:4, :] = pl.full([4, 8], pl.FP32, 1e39)


def test_a_float_past_the_tile_range_rounds_to_inf_in_full_and_select():
    y, z, w = torch.zeros(4, 8, dtype=torch.float16), torch.zeros(4, 8, dtype=torch.float16), torch.zeros(4, 8)
    _big_scalars.run(-torch.ones(4, 8, dtype=torch.float16), y, z, w)
    assert bool((y == math.inf).all()) and bool((z == -math.inf).all()) and bool((w == math.inf).all())
    # the same rounding a tile op gives the scalar
    assert float(torch.tensor(1e5, dtype=torch.float64).to(torch.float16)) == math.inf


@pl.jit
def _step_zero(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    for i in pl.range(0, 4, 0):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="r"):
            y[i:i + 1, :] = x[i:i + 1, :]


@pl.jit
def _empty_row_max(x: pl.Tensor[[8, 32], pl.FP32], y: pl.Out[pl.Tensor[[8, 1], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="m"):
        t = x[0:8, 0:0]
        y[0:8, :] = pl.row_max(t)


def test_a_zero_loop_step_and_an_empty_reduction_are_dsl_errors():
    with pytest.raises(DslError, match="pl.range: step must not be zero"):
        _step_zero.run(torch.randn(4, 8), torch.empty(4, 8))
    with pytest.raises(DslError, match=r"pl.row_max: the tile \[8, 0\] has no elements along dim 1"):
        _empty_row_max.run(torch.randn(8, 32), torch.empty(8, 1))


@pl.jit
def _writes_in(x: pl.Tensor[[8, 32], pl.FP32], y: pl.Out[pl.Tensor[[8, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
        x[0:8, :] = x[0:8, :] * 2.0
        y[0:8, :] = x[0:8, :]


def test_writing_an_in_parameter_names_the_line_by_relative_path():
    with pytest.raises(DslError) as ei:
        _writes_in.run(torch.randn(8, 32), torch.empty(8, 32))
    msg = str(ei.value)
    assert "declared In (read-only)" in msg and "test_author_docs_break_test.py:" in msg
    assert __file__ not in msg  # the absolute path


def test_scalar_options_take_inf_and_nan():
    got = parse_options(["a=inf", "b=-inf", "c=nan", "d=Infinity", "e=1.5", "f=name"], "--scalar")
    assert got["a"] == math.inf and got["b"] == -math.inf and math.isnan(got["c"]) and got["d"] == math.inf
    assert got["e"] == 1.5 and got["f"] == "name"


def test_preset_on_an_example_is_refused(capsys):
    assert cli_main(["run", "example_add", "--preset", "tiny"]) == 2
    assert "--preset tiny does not apply to kernel 'example_add'" in capsys.readouterr().err
    assert cli_main(["run", "example_add"]) == 0


@pl.jit
def _many_tasks(x: pl.Tensor[[8, 32], pl.FP32], y: pl.Out[pl.Tensor[[8, 32], pl.FP32]]):
    acc = pl.create_tensor([8, 32], pl.FP32, init_value=0)
    for _ in range(40):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="inc"):
            acc[0:8, :] = acc[0:8, :] + x[0:8, :]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="out"):
        y[0:8, :] = acc[0:8, :]


def test_a_long_critical_path_prints_its_ends(capsys):
    target = f"{__file__}:_many_tasks"
    assert cli_main(["sim", target]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("critical path:")][0]
    steps = line[len("critical path: "):].split(" -> ")
    # fill acc, submit inc, the 40 inc tasks (each submitted while the one before runs), out: 43 steps
    assert len(steps) == 21 and steps[10] == "... (23 more steps) ..."
    assert steps[0] == "fill acc" and steps[-1] == "out"


@pl.jit
def _log(x: pl.Tensor[[8, 32], pl.FP32], y: pl.Out[pl.Tensor[[8, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="d"):
        y[0:8, :] = pl.log(x[0:8, :])


def test_an_allclose_failure_says_when_the_golden_has_the_nans_too():
    specs = [TensorSpec("x", [8, 32], torch.float32, init_value=lambda: -torch.ones(8, 32)),
             TensorSpec("y", [8, 32], torch.float32, is_output=True)]

    def golden(v):
        v["y"][:] = torch.log(v["x"])
    res = run_jit(_log, specs, golden)
    assert not res.passed
    assert "256 of them NaN in the golden too" in str(res)


def test_distributed_error_is_a_top_level_pto_error():
    assert issubclass(pto.DistributedError, pto.PtoError) and "DistributedError" in pto.__all__


def test_an_option_whose_default_is_none_is_checked_by_its_annotation(capsys):
    # rms_norm's builder: ``T: int | None = None``; True used to reach torch.randn
    assert cli_main(["run", "rms_norm", "--preset", "tiny", "--opt", "T=true"]) == 2
    assert "rms_norm: --opt T expects an integer, got True" in capsys.readouterr().err
    assert cli_main(["run", "rms_norm", "--preset", "tiny", "--opt", "T=8"]) == 0


@pl.jit
def _bool_fill(y: pl.Out[pl.Tensor[[2, 4], pl.BOOL]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="m"):
        y[0:2, :] = pl.full([2, 4], pl.BOOL, 1e6)


def test_a_big_float_fills_a_bool_tile_as_before():
    y = torch.zeros(2, 4, dtype=torch.bool)
    _bool_fill.run(y)  # a non-zero number is True; the float-range rounding is for float tiles only
    assert bool(y.all())


def test_none_is_still_an_option_value_where_it_is_the_default(capsys):
    assert cli_main(["run", "rms_norm", "--preset", "tiny", "--opt", "T=None"]) == 0


@pl.jit
def _big_ints(x: pl.Tensor[[2, 8], pl.FP16], y: pl.Out[pl.Tensor[[2, 8], pl.FP16]],
              z: pl.Out[pl.Tensor[[2, 8], pl.FP16]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="m"):
        t = x[0:2, :]
        y[0:2, :] = pl.full([2, 8], pl.FP16, 70000)
        z[0:2, :] = pl.select(t > 0.0, t, -(10 ** 400))


def test_an_int_past_the_float_tile_range_rounds_to_inf_too():
    y, z = torch.zeros(2, 8, dtype=torch.float16), torch.zeros(2, 8, dtype=torch.float16)
    _big_ints.run(-torch.ones(2, 8, dtype=torch.float16), y, z)
    assert bool((y == math.inf).all()) and bool((z == -math.inf).all())


def test_graph_only_refuses_an_empty_max_reduction_as_a_real_run_does():
    with pytest.raises(DslError, match=r"pl.row_max: the tile \[8, 0\] has no elements along dim 1"):
        _empty_row_max.run(torch.randn(8, 32), torch.empty(8, 1), config=pto.RunConfig(execute=False))
