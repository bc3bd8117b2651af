"""Block templates across tasks (runtime/blocks.py, ``_TaskEnv``): a task whose kernel state
matches an earlier task's of the same site runs from that task's templates with its own tensors
in place of the earlier ones (no recording), bit-identical to a plain run; a different Python
value, a heap offset or an unkeyable variable records anew."""

import dataclasses
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


# ---- values a key must tell apart (each: a warm-up program, then a call that must not reuse it
# wrongly; templates on vs off bit for bit) ----
@dataclasses.dataclass(frozen=True)
class _Cfg:
    s: object


class _Box:
    def __init__(self, v):
        self.v = v


@dataclasses.dataclass(frozen=True)
class _Holder:
    box: _Box


class _K:
    s = 2.0


SCALE = 2.0


@pl.jit
def k_slice(x: pl.Tensor[[128, 8], pl.FP32], y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    cols = slice(0, 8)  # slices do not hash on Python 3.11: keyed by their parts
    for b in pl.spmd(32, name_hint="k_slice"):
        y[b * 4:(b + 1) * 4, cols] = pl.add(x[b * 4:(b + 1) * 4, cols], 1.0)
    return y


@pl.jit
def k_attr(x: pl.Tensor[[128, 8], pl.FP32], obj, y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="k_attr"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.mul(x[b * 4:(b + 1) * 4, 0:8], obj.s)
    return y


@pl.jit
def k_box(x: pl.Tensor[[128, 8], pl.FP32], h, y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="k_box"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.mul(x[b * 4:(b + 1) * 4, 0:8], h.box.v)
    return y


@pl.jit
def k_fn(x: pl.Tensor[[128, 8], pl.FP32], f, y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="k_fn"):
        y[b * 4:(b + 1) * 4, 0:8] = f(x[b * 4:(b + 1) * 4, 0:8])
    return y


@pl.jit
def k_glob(x: pl.Tensor[[128, 8], pl.FP32], y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="k_glob"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.mul(x[b * 4:(b + 1) * 4, 0:8], SCALE)
    return y


@pl.jit
def k_rng(x: pl.Tensor[[128, 8], pl.FP32], r, y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="k_rng"):
        y[r.start + b * 4:r.start + (b + 1) * 4, 0:8] = pl.exp(x[r.start + b * 4:r.start + (b + 1) * 4, 0:8])
    return y


def _helpers():
    src = "def act(t):\n    return pl.mul(t, S)\n"
    ga, gb = {"pl": pl, "S": 2.0}, {"pl": pl, "S": 3.0}  # one helper's code in two modules
    exec(compile(src, "variant_a.py", "exec"), ga)  # noqa: S102 - the test's own source
    exec(compile(src, "variant_b.py", "exec"), gb)  # noqa: S102
    return ga["act"], gb["act"]


def _set(obj, name, value):
    return lambda: setattr(obj, name, value)


def _set_global(value):
    def f():
        global SCALE
        SCALE = value
    return f


_BOX = _Box(2.0)
_ACT_A, _ACT_B = _helpers()
CASES = {  # name: (kernel, warm-up extra args, call extra args, change before the call, reused)
    "slice variable": (k_slice, (), (), None, 1),
    "frozen dataclass 0.0 then -0.0": (k_attr, (_Cfg(0.0),), (_Cfg(-0.0),), None, 0),
    "frozen dataclass holding a mutable object": (k_box, (_Holder(_BOX),), (_Holder(_BOX),), _set(_BOX, "v", 3.0), 0),
    "class attribute": (k_attr, (_K,), (_K,), _set(_K, "s", 3.0), 0),
    "same code, other module globals": (k_fn, (_ACT_A,), (_ACT_B,), None, 0),
    "module global of the kernel": (k_glob, (), (), _set_global(3.0), 0),
    "empty ranges with other starts": (k_rng, (range(0, 0),), (range(64, 64),), None, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_value_the_body_can_tell_apart_keys_another_entry(name):
    fn, warm, call, change, reused = CASES[name]
    rt._blocks.reset_templates()
    torch.manual_seed(0)
    x0, x1 = torch.randn(128, 8), torch.randn(128, 8)
    try:
        C.run_args(fn, x0, *warm, torch.zeros(128, 8))
        if change is not None:
            change()
        y_on, y_off = torch.zeros(128, 8), torch.zeros(128, 8)
        p_on = C.run_args(fn, x1, *call, y_on)
        assert B.template_info()["reused"] == reused
        p_off = C.run_args(fn, x1, *call, y_off, templates=False)
        assert torch.equal(y_on.view(torch.int32), y_off.view(torch.int32))
        assert C.graph_view(p_on) == C.graph_view(p_off)
    finally:
        _K.s, _BOX.v = 2.0, 2.0
        _set_global(2.0)()
