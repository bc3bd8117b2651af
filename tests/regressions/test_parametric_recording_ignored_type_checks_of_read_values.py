"""A parametric recording handed the kernel a Sym for every value read from data; a kernel that
checked the read value's type (``isinstance(v, int)``, ``isinstance(v, float)``,
``isinstance(v, numbers.Integral)``, ``type(v) is int``) took the other branch on the recording
call and on every replay, with no guard: outputs differed from a plain run.

Now a Sym answers ``isinstance`` / ``__class__`` as its number does (the recording still replays),
and a kernel whose Python calls ``type`` / ``id`` or compares by ``is`` makes the recording give up
(plain runs, exact keys). Every call is compared with a plain run (cache off) bit for bit.
"""

import numbers
import operator
import sys

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info, parametric_replay, set_program_cache
from pto.runtime.symbolic import Sym

pytestmark = pytest.mark.usefixtures("fresh_program_cache")


_THREE = 3


def _by_isinstance(v, f):
    a = 1.0 if isinstance(v, int) else 2.0
    b = 10.0 if isinstance(f, float) else 20.0
    c = 100.0 if isinstance(v, numbers.Integral) and not isinstance(f, numbers.Integral) else 200.0
    d = 1000.0 if v.__class__ == int else 2000.0
    return a + b + c + d


def _by_type(v, f):
    return 1.0 if type(v) is int else 2.0


def _by_identity(v, f):
    return 1.0 if v is _THREE else 2.0  # identity of a small int (one object in a plain run)


def _by_operator_is(v, f):
    return 1.0 if operator.is_(v, _THREE) else 2.0  # the same test in a C call


def _by_attributes(v, f):
    try:
        bits = v.bit_length()  # an int method a Sym does not define: the number's (a guard)
    except AttributeError:
        bits = -1
    return (1.0 if hasattr(v, "numerator") else 2.0) + 10.0 * bits


def _kernel(fill):
    """A kernel writing ``fill(v, f)`` of its two reads everywhere, 7.0 at column ``v``."""
    @pl.jit
    def by(sel: pl.Tensor[[1, 4], pl.INT32], w: pl.Tensor[[1, 4], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
            v = pl.read(sel, [0, 0])
            f = pl.read(w, [0, 0])
            y[0:1, 0:16] = pl.full([1, 16], pl.FP32, fill(v, f))
            y[0:1, v:v + 1] = pl.full([1, 1], pl.FP32, 7.0)  # the read value as an offset: replays
        return y
    return by


by_isinstance = _kernel(_by_isinstance)


def _call(kernel, s):
    y = torch.zeros(1, 16)
    kernel.run(torch.tensor([[s, 0, 0, 0]], dtype=torch.int32), torch.full((1, 4), 0.5), y)
    return y


@pytest.mark.parametrize("fill, replays", [(_by_isinstance, True), (_by_type, False), (_by_identity, False),
                                          (_by_operator_is, False), (_by_attributes, None)])
def test_type_checks_of_read_values_answer_as_in_a_plain_run(fill, replays):
    kernel = by_isinstance if fill is _by_isinstance else _kernel(fill)
    if replays is not False and sys.gettrace() is not None:
        pytest.skip("a trace function (coverage, a debugger) is on: parametric recordings give up")
    positions = [3, 3, 5, 0, 3, 9]  # a first call, the recording, then replays (or plain runs)
    set_program_cache(False)
    plain = [_call(kernel, s) for s in positions]
    set_program_cache(True)
    with parametric_replay():
        got = [_call(kernel, s) for s in positions]
    for s, p, g in zip(positions, plain, got):
        assert torch.equal(p, g), (fill.__name__, s, p, g)
    info = cache_info()
    if replays is None:  # exact guards: the recorded value replays, the others diverge
        assert (info["recorded"], info["replayed"], info["diverged"]) == (1, 0, 1)
    elif replays:
        assert (info["recorded"], info["replayed"], info["diverged"]) == (1, 4, 0)
    else:  # the recording gave up: no replay, the key went back to exact keys
        assert (info["recorded"], info["replayed"], info["uncacheable"]) == (0, 0, 1)


def test_a_sym_reports_its_number_class():
    import pto.runtime.replay as replay
    rec = replay._Recorder(True)
    i, f = Sym(3, ("R", 0), rec), Sym(0.5, ("R", 1), rec)
    assert isinstance(i, int) and not isinstance(i, float) and isinstance(i, numbers.Integral)
    assert isinstance(f, float) and isinstance(f, numbers.Real) and not isinstance(f, numbers.Integral)
    assert isinstance(i / 2, float) and isinstance(i // 2, int) and (i * f).__class__ is float


def test_a_recording_under_a_trace_function_gives_up():
    def tracer(frame, event, arg):  # a debugger or coverage would sit here
        return None

    set_program_cache(False)
    plain = [_call(by_isinstance, s) for s in (3, 3, 5)]
    set_program_cache(True)
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with parametric_replay():
            got = [_call(by_isinstance, s) for s in (3, 3, 5)]
    finally:
        sys.settrace(old)
    assert all(torch.equal(p, g) for p, g in zip(plain, got))
    info = cache_info()
    assert (info["recorded"], info["replayed"], info["uncacheable"]) == (0, 0, 1)
