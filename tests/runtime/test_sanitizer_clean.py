"""Check mode's all-defined fast path (``Sanitizer.clean``, runtime/sanitizer.py).

A buffer whose shadow is known all zero is in ``Sanitizer.clean``: its loads, scalar
reads, stores of defined tiles and the output check skip the shadow. Each kernel here
runs twice in check mode, with the fast path and with it switched off (a ``clean`` set
that never takes an id: every shadow checked as before the fast path), and the two runs
must end the same: same error type and message (or none), same output values, and the
expected ids must have become clean. The kernels move undefined elements into buffers
that were clean (init_value, written in full and re-checked) through tile stores, atomic
adds, scalar writes and reshaped views, and leave part of a ``pl.Out`` unwritten.
"""

import sys
from pathlib import Path

import pytest
import torch

import pto.language as pl
from pto.errors import UndefinedOutputError

sys.path.insert(0, str(Path(__file__).parent))
from _sanitizer_compare import CHECK, run_checked  # noqa: E402


class _NeverClean(set):
    """A ``clean`` set that never holds an id: the general (pre fast path) behaviour."""

    def add(self, item):
        pass


def _never_clean(san) -> None:
    san.clean = _NeverClean()


def _run(kernel, make_args, general: bool):
    """(error type or None, message, outputs, clean ids) of one check-mode run."""
    err, msg, outs, san = run_checked(kernel, make_args, _never_clean if general else None, UndefinedOutputError)
    return err, msg, outs, set(san.clean)


def _same(kernel, make_args):
    fast = _run(kernel, make_args, general=False)
    slow = _run(kernel, make_args, general=True)
    assert fast[0] is slow[0] and fast[1] == slow[1]
    for a, b in zip(fast[2], slow[2]):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
    assert slow[3] == set()
    return fast


def _args():
    return [torch.arange(128, dtype=torch.float32).reshape(8, 16), torch.zeros(8, 16)]


@pl.jit
def _undef_into_init_zero(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="first"):
        acc[0:8, :] = x[0:8, :]  # defined into a clean buffer: stays clean
    with pl.at(name_hint="poison"):
        acc[2:4, 0:8] = junk[2:4, 0:8]
    with pl.at(name_hint="copy"):
        y[0:8, :] = acc[0:8, :]


def test_undefined_tile_store_into_init_value_buffer():
    err, msg, _outs, clean = _same(_undef_into_init_zero, _args)
    assert err is UndefinedOutputError
    assert "output 'y' [8, 16] has 16 undefined written element(s) in box [2:4, 0:8]" in msg and "'junk'" in msg
    assert clean == set()  # acc left the set at the poisoning store; y is never re-checked


@pl.jit
def _undef_after_recheck(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="fill"):
        s[0:8, :] = x[0:8, :]
    rd = pl.spmd(8, name_hint="read")
    for r in rd:  # eight one-row windows: the whole shadow re-checked
        y[r:r + 1, :] = s[r:r + 1, :] * 2.0
    with pl.at(name_hint="poison", deps=[rd.tid]):
        s[5:6, 3:4] = junk[0:1, 0:1]
    with pl.at(name_hint="again"):
        y[0:8, :] = s[0:8, :]


def test_undefined_store_after_buffer_became_clean():
    err, msg, _outs, clean = _same(_undef_after_recheck, _args)
    assert err is UndefinedOutputError
    assert "1 undefined written element(s) in box [5:6, 3:4]" in msg and "'junk'" in msg


@pl.jit
def _recheck_then_clean(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="fill"):
        s[0:8, :] = x[0:8, :]
    for r in pl.spmd(8, name_hint="read"):
        y[r:r + 1, :] = s[r:r + 1, :] + 1.0
    with pl.at(name_hint="again"):
        y[0:8, :] = s[0:8, :] + y[0:8, :]


def test_buffer_written_in_full_becomes_clean_same_values():
    err, _msg, outs, clean = _same(_recheck_then_clean, _args)
    assert err is None
    x = _args()[0]
    assert torch.equal(outs[1], x + x + 1.0)
    assert len(clean) == 2  # s after its eight row windows, y after the full window of 'again'


@pl.jit
def _atomic_undef(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="add"):
        pl.assemble(acc, x[0:8, :], [0, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="add_junk"):
        pl.assemble(acc, junk[6:8, :], [6, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="copy"):
        y[0:8, :] = acc[0:8, :]


@pl.jit
def _scalar_write_undef(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="w"):
        v = pl.read(junk, [1, 1])
        pl.write(acc, [3, 7], v)
        y[0:8, :] = x[0:8, :]
    with pl.at(name_hint="r"):
        e = pl.read(acc, [3, 7])
        pl.write(y, [0, 0], e)


@pl.jit
def _view_undef(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)
    junk = pl.create_tensor([4, 32], pl.FP32)
    flat = pl.reshape(acc, [4, 32])
    with pl.at(name_hint="w"):
        flat[1:2, 16:32] = junk[0:1, 0:16]  # row 3 of acc through the view
    with pl.at(name_hint="r"):
        y[0:8, :] = acc[0:8, :]


@pytest.mark.parametrize("kernel, text", [
    (_atomic_undef, "32 undefined written element(s) in box [6:8, 0:16]"),  # atomic add of undefined
    (_scalar_write_undef, "1 undefined written element(s) in box [0:1, 0:1]"),  # pl.write, then pl.read
    (_view_undef, "16 undefined written element(s) in box [3:4, 0:16]"),  # a store through a reshaped view
])
def test_undefined_into_a_clean_buffer(kernel, text):
    err, msg, _outs, _clean = _same(kernel, _args)
    assert err is UndefinedOutputError and text in msg and "'junk'" in msg


@pl.jit
def _partial_out(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(name_hint="w"):
        y[0:8, 0:8] = x[0:8, 0:8]
    for r in pl.spmd(8, name_hint="read"):  # re-checks y's shadow: still has unwritten elements
        y[r:r + 1, 0:8] = y[r:r + 1, 0:8] + 1.0


def test_unwritten_out_elements_with_rechecked_shadow():
    err, msg, _outs, clean = _same(_partial_out, _args)
    assert err is UndefinedOutputError and "64 element(s) the program never wrote, in box [0:8, 8:16]" in msg
    assert clean == set()


@pytest.mark.parametrize("kernel", [_undef_into_init_zero, _undef_after_recheck, _atomic_undef, _view_undef])
def test_plain_run_unchanged(kernel):
    a = _args()
    kernel.run(*a)  # plain mode has no sanitizer: the fast path is never reached
    assert a[1].shape == (8, 16)


def test_released_shadows_are_refilled_for_the_next_run():
    """Shadows go back to a pool at the end of a run (runtime/sanitizer.py ``new_shadow``);
    the next run of the same shapes must see them refilled: the undefined tags left in
    ``junk``/``acc`` by a failing run do not leak into a clean run, and the failing run
    fails again with the same message."""
    first = _run(_undef_into_init_zero, _args, general=False)
    clean = _run(_recheck_then_clean, _args, general=False)
    again = _run(_undef_into_init_zero, _args, general=False)
    assert clean[0] is None and first[0] is UndefinedOutputError and again[1] == first[1]
    x = _args()[0]
    assert torch.equal(clean[2][1], x + x + 1.0)
    a = _args()
    prog = _recheck_then_clean.run(*a, config=CHECK)
    assert all(b.shadow is None for b in prog.buffers)  # handed to the pool
