"""The program cache keyed a float scalar by ``==``: ``-0.0`` and ``0.0`` shared a key, so
``x / a`` with ``a = 0.0`` replayed the ``a = -0.0`` recording (``-inf`` for ``+inf``); and
every NaN call was a new key (``nan != nan``), one entry per call.

The replay guard on a value read from data (``pl.read``) compared with ``==`` too: a read
``0.0`` passed the guard of a ``-0.0`` recording and replayed its division.

Now floats are keyed by their bit pattern (the two zeros are two keys, a NaN is one key) and a
guard on a recorded zero checks its sign.
"""

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info


pytestmark = pytest.mark.usefixtures("fresh_program_cache")


@pl.jit
def div_by(x: pl.Tensor[[16, 64], pl.FP32], a: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]]):
    for b in pl.spmd(1, name_hint="div"):
        y[0:16, 0:64] = x[0:16, 0:64] / a


def test_zero_and_negative_zero_are_two_keys():
    x = torch.rand(16, 64) + 0.5
    for a in (-0.0, -0.0, -0.0, 0.0, 0.0, 0.0):
        y = torch.empty(16, 64)
        div_by.run(x, a, y)
        want = torch.full((16, 64), float("inf") if str(a)[0] != "-" else float("-inf"))
        assert torch.equal(y, want), f"a = {a!r}"
    assert cache_info()["entries"] == 2 and cache_info()["replayed"] == 2


def test_nan_calls_share_one_key():
    x = torch.rand(16, 64)
    for _ in range(6):
        y = torch.empty(16, 64)
        div_by.run(x, float("nan"), y)
        assert y.isnan().all()
    assert cache_info()["entries"] == 1 and cache_info()["replayed"] == 4


@pl.jit
def div_by_read(x: pl.Tensor[[16, 64], pl.FP32], s: pl.Tensor[[1, 1], pl.FP32],
                y: pl.Out[pl.Tensor[[16, 64], pl.FP32]]):
    a = pl.read(s, [0, 0])
    for b in pl.spmd(1, name_hint="div"):
        y[0:16, 0:64] = x[0:16, 0:64] / a


def test_a_guard_on_a_read_zero_sees_its_sign():
    # the replay's guard on pl.read compared with ==: a read 0.0 passed the -0.0 recording's guard
    x = torch.rand(16, 64) + 0.5
    for a in (-0.0, -0.0, -0.0, 0.0):
        y = torch.empty(16, 64)
        prog = div_by_read.run(x, torch.tensor([[a]]), y)
    assert torch.equal(y, torch.full((16, 64), float("inf")))
    assert not prog.replayed and cache_info()["diverged"] == 1
