"""A replay writes Out/InOut arguments in place (runtime/replay.py, ``_replay``), into the caller's
tensors, keeping a copy of their values: a replay that stops at a guard (or raises) after it wrote
them puts the values back before the call runs plain, and arguments that share storage get
private copies, as before."""

import pytest
import torch

import pto.language as pl
from pto.language.jit import bind_arguments
from pto.runtime import replay
from pto.runtime.replay import cache_info, clear_program_cache, set_program_cache


@pl.jit
def write_then_steer(flag: pl.Tensor[[pl.dynamic("F"), 65], pl.INT32], x: pl.Tensor[[8, 16], pl.FP32],
                     y: pl.Out[pl.Tensor[[8, 16], pl.FP32]], z: pl.InOut[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="first"):  # written before the guard below
        y[0:8, 0:16] = x[0:8, 0:16] + 1.0
        z[0:8, 0:16] = z[0:8, 0:16] + x[0:8, 0:16]
    f = pl.read(flag, [0, 0])
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="second"):
        if f == 0:
            y[0:1, 0:16] = x[0:1, 0:16] * 2.0
        else:
            y[1:2, 0:16] = x[1:2, 0:16] * 3.0
    return y


def _flag(v: int) -> torch.Tensor:
    t = torch.zeros(64, 65, dtype=torch.int32)  # too large for its values to be part of the key
    t[0, 0] = v
    return t


def _ref(flag: int, x, z):
    y = x + 1.0
    if flag == 0:
        y[0] = x[0] * 2.0
    else:
        y[1] = x[1] * 3.0
    return y, z + x


def _entry():
    (ent,) = [e for e in replay._CACHE.values() if e.trace is not None]
    return ent


def test_a_replay_that_stops_after_writing_puts_the_callers_tensors_back():
    set_program_cache(True)
    clear_program_cache()
    x = torch.randn(8, 16)
    for _ in range(3):
        z = torch.ones(8, 16)
        y = torch.zeros(8, 16)
        write_then_steer(_flag(0), x, y, z)
        ry, rz = _ref(0, x, torch.ones(8, 16))
        assert torch.equal(y, ry) and torch.equal(z, rz)
    assert cache_info()["replayed"] == 1
    y, z = torch.full((8, 16), 7.0), torch.full((8, 16), 5.0)
    params = bind_arguments(write_then_steer, (_flag(1), x, y, z), {}, gm=False)
    assert replay._replay(_entry().trace, write_then_steer, params, replay._DEFAULT_CONFIG) is None  # the guard
    assert torch.equal(y, torch.full((8, 16), 7.0)) and torch.equal(z, torch.full((8, 16), 5.0))
    write_then_steer(_flag(1), x, y, z)  # diverges, runs plain
    ry, rz = _ref(1, x, torch.full((8, 16), 5.0))
    assert torch.equal(y, ry) and torch.equal(z, rz)
    assert cache_info()["diverged"] == 1
    clear_program_cache()


def test_arguments_sharing_storage_replay_on_private_copies():
    set_program_cache(True)
    clear_program_cache()
    x = torch.randn(8, 16)
    for call in range(4):
        base = torch.zeros(2, 8, 16)
        base[1] = 1.0
        y, z = base[0], base[1]  # one storage: the replay writes private copies, copied back
        write_then_steer(_flag(0), x, y, z)
        ry, rz = _ref(0, x, torch.ones(8, 16))
        assert torch.equal(y, ry) and torch.equal(z, rz), call
    assert cache_info()["replayed"] == 2
    clear_program_cache()


def test_an_interrupted_replay_puts_the_callers_tensors_back(monkeypatch):
    set_program_cache(True)
    clear_program_cache()
    x = torch.randn(8, 16)
    for _ in range(2):  # plain, recorded
        write_then_steer(_flag(0), x, torch.zeros(8, 16), torch.ones(8, 16))
    trace = _entry().trace
    run = trace.run

    def interrupted(regs):  # the whole replay writes y and z, then the user presses Ctrl-C
        run(regs)
        raise KeyboardInterrupt

    monkeypatch.setattr(trace, "run", interrupted)
    y, z = torch.full((8, 16), 7.0), torch.full((8, 16), 5.0)
    try:
        write_then_steer(_flag(0), x, y, z)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the KeyboardInterrupt was swallowed")
    assert torch.equal(y, torch.full((8, 16), 7.0)) and torch.equal(z, torch.full((8, 16), 5.0))
    clear_program_cache()


def test_outputs_overlapping_through_two_storages_are_refused():
    """y and z are two torch storages over the same numpy memory (torch.from_numpy of overlapping
    views): storage identity does not see it, their bytes do. Two written arguments that share
    bytes would lose one's update to the other's copy back, so a plain run, a recording and a
    replay all refuse them before anything is written."""
    import numpy as np

    from pto.errors import BindError

    x = torch.arange(128, dtype=torch.float32).reshape(8, 16)
    for cache in (False, True):
        set_program_cache(cache)
        clear_program_cache()
        for _ in range(3):
            a = np.ones((12, 16), dtype=np.float32)
            y, z = torch.from_numpy(a[:8]), torch.from_numpy(a[4:12])  # y rows 4..7 are z rows 0..3
            with pytest.raises(BindError, match="written arguments 'y' and 'z' share memory"):
                write_then_steer(_flag(0), x, y, z)
            assert (a == 1.0).all()
        a = np.ones((16, 16), dtype=np.float32)  # the same memory, no shared bytes: runs
        write_then_steer(_flag(0), x, torch.from_numpy(a[:8]), torch.from_numpy(a[8:16]))
        assert np.array_equal(a[8:], (x + 1.0).numpy())
    set_program_cache(True)
    clear_program_cache()
