"""Regression: leaving a task scope early (break / return inside ``for b in pl.spmd(n)``, an
exception raised inside ``pl.at`` / ``pl.spmd`` and caught by the kernel) recorded the task with
no dependency edges and no race check, so the program "succeeded" with a graph missing a
read-after-write edge, even in check mode (breaker finding H1).

Now the task is closed with the footprints of the blocks that ran (edges derived, race-checked)
and the program fails with a DslError naming the task, where it was left and how many blocks had
started, raised at the next task / allocation / join node / orchestration read or at program
end; an exception already leaving the program is kept as is.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, RaceError
from pto.language._ctx import rel_path
from pto.runtime import Program, RunConfig

R, C = 64, 128


def _execute(kernel, *args, check=False):
    """Run ``kernel`` and return (Program, raised exception or None); the Program survives the error."""
    prog = Program(kernel, RunConfig(check=check, keep_footprints=True))
    try:
        prog.execute(args, {})
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return prog, e
    return prog, None


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <{marker}>"):
                return n
    raise AssertionError(marker)


@pl.jit
def break_in_last_block(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    t = pl.create_tensor([R, C], pl.FP32)
    with pl.at(name_hint="fill"):
        t[:, :] = x[:, :]
    for b in pl.spmd(4, name_hint="producer"):
        y[16 * b:16 * b + 16, :] = t[16 * b:16 * b + 16, :]
        if b == 3:
            break  # <break>
    with pl.at(name_hint="consumer"):
        y[0:16, :] = t[0:16, :]


@pytest.mark.parametrize("check", [False, True])
def test_break_in_spmd_loop_derives_edges_and_fails_at_the_next_task(check):
    prog, err = _execute(break_in_last_block, torch.randn(R, C), torch.zeros(R, C), check=check)
    assert isinstance(err, DslError)
    msg = str(err)
    assert f"left task 'producer' (opened at {rel_path(__file__)}:" in msg
    assert f"early at {rel_path(__file__)}:{_line_of('break')} in block 3, after 4 of 4 blocks had started" in msg
    # the task that was left early still has its edge (it read t, written by 'fill')
    names = [t.name for t in prog.graph]
    assert names == ["fill", "producer"]  # 'consumer' was refused
    assert prog.graph[1].preds == {0}
    assert prog.stats.edges == 1


@pl.jit
def return_in_spmd_loop(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    for b in pl.spmd(4, name_hint="half"):
        y[16 * b:16 * b + 16, :] = x[16 * b:16 * b + 16, :]
        if b == 1:
            return y  # <return>
    return y


def test_return_inside_spmd_loop_fails_at_program_end_and_leaves_outputs_untouched():
    y = torch.zeros(R, C)
    prog, err = _execute(return_in_spmd_loop, torch.randn(R, C), y)
    assert isinstance(err, DslError)
    assert "left task 'half'" in str(err)
    assert f"early at {rel_path(__file__)}:{_line_of('return')} in block 1, after 2 of 4 blocks had started" in str(err)
    assert torch.count_nonzero(y) == 0  # the caller's Out tensor is untouched
    assert len(prog.graph[0].blocks) == 2 and prog.graph[0].footprints


def _caught_at_then(what: str):
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        t = pl.create_tensor([R, C], pl.FP32, init_value=0)
        try:
            with pl.at(name_hint="w"):
                t[:, :] = x[:, :]
                raise KeyError("boom")  # <raise>
        except KeyError:
            pass
        seen.append("caught")
        if what == "task":
            with pl.at(name_hint="consumer"):
                y[:, :] = t[:, :]
        elif what == "alloc":
            pl.create_tensor([4, 4], pl.FP32)
        elif what == "read":
            pl.read(t, [0, 0])
        elif what == "dummy":
            pl.system.task_dummy(deps=[0])
        seen.append("went on")
    seen = []
    return k, seen


@pytest.mark.parametrize("what", ["task", "alloc", "read", "dummy", "end"])
def test_caught_exception_in_pl_at_fails_at_the_next_interaction(what):
    k, seen = _caught_at_then(what)
    prog, err = _execute(k, torch.randn(R, C), torch.zeros(R, C))
    assert isinstance(err, DslError), err
    assert "left task 'w'" in str(err)
    assert "after 1 of 1 blocks had started" in str(err)
    assert f":{_line_of('raise')} in block 0" in str(err)
    assert seen == (["caught", "went on"] if what == "end" else ["caught"])
    assert [t.name for t in prog.graph] == ["w"]
    assert sorted(f.kind for f in prog.footprints(prog.graph[0])) == ["read", "write"]


@pl.jit
def raises_out_of_program(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    t = pl.create_tensor([R, C], pl.FP32, init_value=0)
    with pl.at(name_hint="w"):
        t[:, :] = x[:, :]
    with pl.at(name_hint="r"):
        y[:, :] = t[:, :]
        raise KeyError("the user's own error")


def test_an_exception_leaving_the_program_is_kept_and_the_edge_is_recorded():
    prog, err = _execute(raises_out_of_program, torch.randn(R, C), torch.zeros(R, C), check=True)
    assert type(err) is KeyError and err.args == ("the user's own error",)
    assert prog.graph[1].preds == {0}


@pl.jit
def decorator_body_raises(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    def body(b):
        y[b:b + 1, :] = x[b:b + 1, :]
        if b == 2:
            raise ValueError("deco")  # <deco>
    try:
        pl.spmd(4, name_hint="deco")(body)
    except ValueError:
        pass
    return y


def test_decorator_form_body_error_caught_by_the_kernel_fails_at_program_end():
    prog, err = _execute(decorator_body_raises, torch.randn(R, C), torch.zeros(R, C))
    assert isinstance(err, DslError)
    assert f"early at {rel_path(__file__)}:{_line_of('deco')} in block 2, after 3 of 4 blocks had started" in str(err)
    assert [blk.idx for blk in prog.graph[0].blocks] == [0, 1, 2]


@pl.jit
def racy_then_break(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    t = pl.create_tensor([R, C], pl.FP32, init_value=0, manual_dep=True)
    with pl.at(name_hint="w"):
        t[:, :] = x[:, :]
    for b in pl.spmd(2, name_hint="r"):  # no deps=[w]: races on t
        y[b:b + 1, :] = t[b:b + 1, :]
        break


def test_check_mode_race_checks_the_blocks_that_ran():
    prog, err = _execute(racy_then_break, torch.randn(R, C), torch.zeros(R, C), check=True)
    assert isinstance(err, DslError) and "left task 'r'" in str(err)
    assert "the blocks that ran also fail the check" in str(err)
    assert isinstance(err.__cause__, RaceError)
    assert "'t'" in str(err.__cause__)
