"""Block templates across tasks (runtime/blocks.py, ``_TaskEnv``): a task whose kernel state
matches an earlier task's of the same site runs from that task's templates with its own tensors
in place of the earlier ones (no recording), bit-identical to a plain run; a different Python
value, a heap offset or an unkeyable variable records anew."""

import sys
import types
from pathlib import Path

import pytest
import torch

import pto.language as pl
import pto.runtime as rt
from pto.runtime import blocks as B

sys.path.insert(0, str(Path(__file__).parent))
import _blocks_compare as C  # noqa: E402
from _blocks_compare import small_tasks  # noqa: E402,F401 - the fixture, used by every test here

pytestmark = pytest.mark.usefixtures("small_tasks")


@pl.jit
def scaled(x: pl.Tensor[[128, 8], pl.FP32], s: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="load_w"):
        w = pl.load(x, [0, 0], [4, 8])  # a tile made before the task: a template constant, this program's values
    tmp = pl.create_tensor([128, 8], pl.FP32)
    for b in pl.spmd(32, name_hint="scaled"):
        tmp[b * 4:(b + 1) * 4, 0:8] = pl.mul(pl.add(pl.exp(x[b * 4:(b + 1) * 4, 0:8]), w), s)
    for b in pl.spmd(32, name_hint="copy"):
        y[b * 4:(b + 1) * 4, 0:8] = tmp[b * 4:(b + 1) * 4, 0:8]
    return y


def _expected(x, s):
    return ((torch.exp(x) + x[0:4].repeat(32, 1)) * torch.tensor(s, dtype=torch.float32)).float()


def _run(x, s, templates=True):
    y = torch.zeros(128, 8)
    prog = C.run_args(scaled, x, s, y, templates=templates)
    return prog, y


def test_a_later_program_reuses_the_templates_with_its_own_tensors():
    rt._blocks.reset_templates()
    torch.manual_seed(0)
    x0, x1 = torch.randn(128, 8), torch.randn(128, 8)
    _run(x0, 2.0)
    first = B.template_info()
    assert first["tasks"] == 2 and first["recorded"] == 2 and first["reused"] == 0  # load_w: one block, plain
    prog, y = _run(x1, 2.0)
    info = B.template_info()
    assert info["tasks"] == 4 and info["recorded"] == 2 and info["reused"] == 2  # nothing recorded again
    assert first["batched"] == 2 * 30 and info["batched"] == 60 + 2 * 31  # blocks 1..30, then 0..30
    assert torch.equal(y, _expected(x1, 2.0))  # x1's rows and x1's tile w, not x0's
    plain, y_plain = _run(x1, 2.0, templates=False)
    assert torch.equal(y, y_plain)
    assert C.graph_view(prog) == C.graph_view(plain) and C.stats_view(prog) == C.stats_view(plain)


def test_another_python_value_records_its_own_template():
    rt._blocks.reset_templates()
    x = torch.randn(128, 8)
    _run(x, 2.0)
    _, y = _run(x, 3.0)  # s is a number in the kernel's frame: part of the key (the template holds 2.0)
    info = B.template_info()
    # every variable of the kernel's frame is in the key: "copy" (which does not read s) records again too
    assert info["recorded"] == 4 and info["reused"] == 0
    assert torch.equal(y, _expected(x, 3.0))


def test_reuse_can_be_switched_off(monkeypatch):
    rt._blocks.reset_templates()
    monkeypatch.setattr(B, "_REUSE", [False])
    x = torch.randn(128, 8)
    _run(x, 2.0)
    _, y = _run(x, 2.0)
    info = B.template_info()
    assert info["recorded"] == 4 and info["reused"] == 0
    assert torch.equal(y, _expected(x, 2.0))


@pl.jit
def with_state(x: pl.Tensor[[128, 8], pl.FP32], y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    state = types.SimpleNamespace(scale=2.0)  # a mutable object in the frame: the task keys nothing
    for b in pl.spmd(32, name_hint="with_state"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.mul(x[b * 4:(b + 1) * 4, 0:8], state.scale)
    return y


def test_a_kernel_variable_that_cannot_be_keyed_records_every_task():
    rt._blocks.reset_templates()
    for _ in range(2):
        x, y = torch.randn(128, 8), torch.zeros(128, 8)
        C.run_args(with_state, x, y)
        assert torch.equal(y, x * 2.0)
    info = B.template_info()
    assert info["recorded"] == 2 and info["reused"] == 0


@pl.jit
def two_layers(x: pl.Tensor[[128, 8], pl.FP32], y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    keep = pl.create_tensor([128, 8], pl.FP32)
    _layer(x, keep)
    _layer(keep, y)  # the same task site; keep's scratch lives at another heap offset than layer 1's
    return y


@pl.jit.inline
def _layer(a: pl.Tensor[[128, 8], pl.FP32], out: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="layer"):
        out[b * 4:(b + 1) * 4, 0:8] = pl.add(a[b * 4:(b + 1) * 4, 0:8], 1.0)


def test_the_same_site_on_other_buffers_in_one_program():
    rt._blocks.reset_templates()
    x = torch.randn(128, 8)
    info = C.compare(two_layers, (x, torch.zeros(128, 8)))  # off and on: bit-identical, same graph and stats
    assert info["tasks"] == 2 and info["recorded"] + info["reused"] == 2
    prog, y = C.run_once(two_layers, (x, torch.zeros(128, 8)), True)
    assert torch.equal(y[1], (x + 1.0) + 1.0)
    again = B.template_info()
    assert again["recorded"] == info["recorded"] and again["reused"] == info["reused"] + 2  # every task reused
