"""Regression: what a kernel author's break test found around check mode.

* ``pto check MODULE:F`` where ``F`` returns a Program it already ran printed ``PASS ... no
  undefined outputs, no races`` although no check ran (``--drop-init`` and ``--graph-only`` the
  same: the stored run was reported as mutated or graph-only);
* two Out/InOut arguments sharing bytes (``k(buf, buf)``) lost one's update to the other's copy
  back, in plain and check mode, with no error;
* the "first consumed undefined" line named the task's ``pl.at`` line, not the load's;
* ``pto sim --tasks`` gave tasks on the critical path positive slack when they were ordered by
  ring-heap reuse rather than by an edge;
* a 2-D subscript of a rank-1 GM tensor raised IndexError, an FP32 ``init_value`` past the
  dtype's range a torch RuntimeError, and a negative annotation dim was accepted until a run;
* an FP32 scalar argument past FP32's range became inf silently (int scalars are range-checked),
  and a BOOL ``init_value`` of ``True`` was refused while ``1`` was taken;
* an op torch has no CPU kernel for (UINT32 add, BOOL subtraction) left the program as torch's
  NotImplementedError / RuntimeError instead of a DslError;
* ``pto run DIR/k.py:k`` could not import ``k.py``'s sibling modules (``from helpers import X``);
* a ``pl.PartialOut`` read before it was written was called an "Out parameter".
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.cli import main
from pto.errors import BindError, DslError, UndefinedOutputError
from pto.runtime import simulate
from pto.views import sim_task_rows

KERNELS = '''
import torch
import pto.language as pl

@pl.jit
def race(x: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]]):
    for b in pl.spmd(2, name_hint="w"):
        y[0:16, :] = x[0:16, :] * float(b + 1)

def racy_prog():
    return race.run(torch.randn(16, 64), torch.empty(16, 64))
'''


def test_check_of_an_already_run_program_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "cr.py").write_text(KERNELS)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "cr.py:racy_prog"]) == 0  # running it is what it did
    capsys.readouterr()
    for extra in ([], ["--drop-init", "x"]):  # check mode is the first thing it cannot redo
        assert main(["check", "cr.py:racy_prog", *extra]) == 2
        err = capsys.readouterr().err
        assert "cr.py:racy_prog returned a Program that was already run; check mode needs a kernel it can run" in err
    assert main(["run", "cr.py:racy_prog", "--graph-only"]) == 2
    assert "graph-only mode needs a kernel" in capsys.readouterr().err
    assert main(["check", "cr.py:race"]) == 1  # the kernel itself: the race is caught
    assert "RaceError" in capsys.readouterr().out


@pl.jit
def inout2(a: pl.InOut[pl.Tensor[[16, 8], pl.FP32]], b: pl.InOut[pl.Tensor[[16, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
        a[0:16, :] = a[0:16, :] + 1.0
        b[0:16, :] = b[0:16, :] + 1.0


@pytest.mark.parametrize("check", [False, True])
def test_written_arguments_that_share_bytes_are_refused(check):
    buf = torch.zeros(24, 8)
    for a, b in ((buf[0:16], buf[0:16]), (buf[0:16], buf[8:24])):
        with pytest.raises(BindError, match="inout2: written arguments 'a' and 'b' share memory"):
            inout2.run(a, b, config=pto.RunConfig(check=check))
        assert bool((buf == 0).all())
    inout2.run(buf[0:16], torch.zeros(16, 8), config=pto.RunConfig(check=check))  # disjoint: fine
    assert bool((buf[0:16] == 1).all()) and bool((buf[16:] == 0).all())


@pl.jit
def use_scratch(x: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]]):
    s = pl.create_tensor([16, 64], pl.FP32)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="use"):
        y[0:16, :] = s[0:16, :] + x[0:16, :]  # THE LOAD


def test_first_consumer_names_the_loads_line():
    import inspect
    lines, start = inspect.getsourcelines(use_scratch.__wrapped__)
    line = start + next(i for i, ln in enumerate(lines) if "# THE LOAD" in ln)
    with pytest.raises(UndefinedOutputError) as ei:
        use_scratch.run(torch.randn(16, 64), torch.zeros(16, 64), config=pto.RunConfig(check=True))
    assert "first consumed undefined by task 'use' (#0) block 0 at " in str(ei.value)
    assert f"test_kernel_author_break_test.py:{line} (load)" in str(ei.value)


@pl.jit
def loop_scratch(x: pl.Tensor[[24, 64], pl.FP32], y: pl.Out[pl.Tensor[[24, 64], pl.FP32]]):
    for i in pl.range(3):
        s = pl.create_tensor([8, 64], pl.FP32)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            s[0:8, :] = x[8 * i:8 * i + 8, :] * 2.0
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="r"):
            y[8 * i:8 * i + 8, :] = s[0:8, :]


def test_critical_tasks_have_no_slack():
    prog = loop_scratch.run(torch.randn(24, 64), torch.zeros(24, 64), config=pto.RunConfig(keep_footprints=True))
    sim = simulate(prog, "a2a3")
    rows = sim_task_rows(sim, prog)
    assert [r["critical"] for r in rows] == [True] * 6  # w -> r -> (heap reuse) w -> r -> w -> r
    assert [r["slack_us"] for r in rows] == [0.0] * 6
    # the second s reuses the first's ring bytes: its tasks (2, 3) wait for both tasks naming the
    # first (0, 1); the third's (4, 5) for 2 and 3
    assert sim.reuse_succs == {0: [2, 3, 4, 5], 1: [2, 3, 4, 5], 2: [4, 5], 3: [4, 5]}


def test_bad_subscripts_fills_and_dims_are_dsl_errors():
    @pl.jit
    def rank1(x: pl.Tensor[[8], pl.FP32], y: pl.Out[pl.Tensor[[8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
            y[0:8] = x[0:8, :]

    with pytest.raises(DslError, match="x: 2 indices for a rank-1 tensor"):
        rank1.run(torch.zeros(8), torch.zeros(8))

    @pl.jit
    def big(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        s = pl.create_tensor([4, 8], pl.FP32, init_value=1e39)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
            y[0:4, :] = s[0:4, :] + x[0:4, :]

    with pytest.raises(BindError, match=r"init_value 1e\+39 out of range of pl.FP32"):
        big.run(torch.zeros(4, 8), torch.zeros(4, 8))
    with pytest.raises(DslError, match=r"tensor annotation dims must not be negative, got \[4, -8\]"):
        pl.Tensor[[4, -8], pl.FP32]


def test_float_scalars_in_range_and_bool_fills():
    @pl.jit
    def scale(x: pl.Tensor[[4], pl.FP32], a: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[4], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
            y[0:4] = x[0:4] * a

    y = torch.zeros(4)
    scale(torch.ones(4), float("inf"), y)  # an infinity is a float value of its own
    assert bool((y == float("inf")).all())
    with pytest.raises(BindError, match=r"scalar parameter 'a' value 1e\+39 out of range of pl.FP32"):
        scale(torch.ones(4), 1e39, torch.zeros(4))  # it would have become inf silently

    for iv, want in ((True, True), (False, False), (1, True)):
        @pl.jit
        def fill(y: pl.Out[pl.Tensor[[4], pl.BOOL]]):
            s = pl.create_tensor([4], pl.BOOL, init_value=iv)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
                y[0:4] = s[0:4]

        y = torch.zeros(4, dtype=torch.bool)
        fill(y)
        assert y.tolist() == [want] * 4
    with pytest.raises(BindError, match="init_value of a BOOL tensor must be True, False, 0 or 1, got 2"):
        iv = 2
        fill(torch.zeros(4, dtype=torch.bool))


@pl.jit
def uint_add(x: pl.Tensor[[4, 8], pl.UINT32], y: pl.Out[pl.Tensor[[4, 8], pl.UINT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
        y[0:4, :] = x[0:4, :] + 1  # UINT32 ADD


@pl.jit
def bool_sub(x: pl.Tensor[[4, 8], pl.BOOL], y: pl.Out[pl.Tensor[[4, 8], pl.BOOL]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
        t = x[0:4, :]
        y[0:4, :] = t - t


@pytest.mark.parametrize("check", [False, True])
def test_a_dtype_torch_cannot_compute_is_a_dsl_error(check):
    y = torch.full((4, 8), 7, dtype=torch.uint32)
    with pytest.raises(DslError) as ei:
        uint_add.run(torch.zeros(4, 8, dtype=torch.uint32), y, config=pto.RunConfig(check=check))
    msg = str(ei.value)
    assert msg.startswith("kernel uint_add, task 's' (#0) block 0, at ") and "test_kernel_author_break_test.py:" in msg
    assert "a tile operation on a dtype the CPU runtime cannot compute it for (torch: \"add_stub\" not " \
           "implemented for 'UInt32'); cast the tile to a dtype it supports first (pl.cast)" in msg
    assert bool((y == 7).all())  # nothing written
    with pytest.raises(DslError, match="with two bool tensors is not supported"):
        bool_sub.run(torch.zeros(4, 8, dtype=torch.bool), torch.zeros(4, 8, dtype=torch.bool),
                     config=pto.RunConfig(check=check))


def test_a_kernel_file_imports_its_sibling_modules(tmp_path, capsys, monkeypatch):
    (tmp_path / "kab_sibling_consts.py").write_text("SCALE = 3.0\n")
    (tmp_path / "k.py").write_text('''
import pto.language as pl
from kab_sibling_consts import SCALE

@pl.jit
def k(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
        y[0:4, :] = x[0:4, :] * SCALE
''')
    monkeypatch.chdir(tmp_path.parent)  # run from elsewhere, as "pto run DIR/k.py:k"
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert main(["run", f"{tmp_path.name}/k.py:k"]) == 0
    assert "cannot import" not in capsys.readouterr().err


@pl.jit
def read_partial(x: pl.Tensor[[4, 8], pl.FP32], y: pl.PartialOut[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="s"):
        y[0:4, :] = y[0:4, :] + x[0:4, :]


def test_a_partial_out_read_before_written_is_named_as_one():
    with pytest.raises(UndefinedOutputError, match=r"origin: PartialOut parameter 'y' \[4, 8\] pl.FP32 \(read before"):
        read_partial.run(torch.ones(4, 8), torch.zeros(4, 8), config=pto.RunConfig(check=True))
