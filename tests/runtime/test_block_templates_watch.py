"""Block templates (runtime/blocks.py): the identity watch runs as a profile hook, or as a trace
hook while a profiler holds the profile hook; either way code that could tell the block index
from a number stops the recording (the program reruns plainly), and the hooks are as before."""

import sys
from pathlib import Path

import pytest
import torch

import pto.language as pl
from pto.runtime import blocks as B

sys.path.insert(0, str(Path(__file__).parent))
import _blocks_compare as C  # noqa: E402
from _blocks_compare import small_tasks  # noqa: E402,F401 - the fixture, used by every test here

pytestmark = pytest.mark.usefixtures("small_tasks")


def _kind_a(v):
    return 1 if type(v) is int else 2  # tells a symbol from an int


def _kind_b(v):
    return 1 if type(v) is int else 2  # the same, another code object (each is examined once)


@pl.jit
def typed_a(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="typed_a"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.add(x[b * 4:(b + 1) * 4, 0:8], float(_kind_a(b)))
    return y


@pl.jit
def typed_b(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="typed_b"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.add(x[b * 4:(b + 1) * 4, 0:8], float(_kind_b(b)))
    return y


@pl.jit
def plain_rows(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="plain_rows"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[b * 4:(b + 1) * 4, 0:8])
    return y


def test_watch_without_a_profiler_stops_the_recording_and_leaves_no_hook():
    assert sys.getprofile() is None and sys.gettrace() is None
    info, _ = C.both(typed_a, lambda: (torch.randn(64, 8), torch.zeros(64, 8)))
    assert info["restarts"] == 1
    assert sys.getprofile() is None and sys.gettrace() is None
    x, y = torch.randn(64, 8), torch.zeros(64, 8)
    C.run_args(typed_a, x, y)
    assert torch.equal(y, x + 1.0)


def test_watch_beside_a_profiler_uses_the_trace_hook_and_keeps_the_profiler():
    calls = []

    def profiler(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        info, _ = C.both(typed_b, lambda: (torch.randn(64, 8), torch.zeros(64, 8)))
        ok_info, _ = C.both(plain_rows, lambda: (torch.randn(64, 8), torch.zeros(64, 8)))
        assert sys.getprofile() is profiler and sys.gettrace() is None
    finally:
        sys.setprofile(None)
    assert info["restarts"] == 1
    assert ok_info["restarts"] == 0 and ok_info["batched"] == 14
    assert "_kind_b" in calls  # the profiler saw the kernel's calls throughout
