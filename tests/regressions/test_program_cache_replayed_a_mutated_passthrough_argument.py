"""The program cache keyed a pass-through (unannotated) argument by its identity, so a config
object or a list changed in place between calls replayed the first recording: stale outputs
(``cfg.scale`` 2.0 -> 5.0 gave ``x * 2``; rows [1, 2] -> [3, 4] copied rows 1 and 2).

Now a pass-through argument is keyed by value when it is immutable (numbers, strings, tuples,
frozen dataclasses, ...) and any other one (a list, a dict, a mutable object) runs plain.
"""

import dataclasses

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info


pytestmark = pytest.mark.usefixtures("fresh_program_cache")


class Cfg:
    scale = 2.0


@dataclasses.dataclass(frozen=True)
class FrozenCfg:
    scale: float
    rows: tuple


@pl.jit
def scaled(x: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]], cfg):
    for b in pl.spmd(1, name_hint="s"):
        y[0:16, 0:64] = x[0:16, 0:64] * cfg.scale


@pl.jit
def rows_of(x: pl.Tensor[[16, 64], pl.FP32], y: pl.Out[pl.Tensor[[16, 64], pl.FP32]], rows):
    for b in pl.spmd(1, name_hint="zero"):
        y[0:16, 0:64] = x[0:16, 0:64] * 0.0
    for i in rows:
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="row"):
            y[i:i + 1, 0:64] = x[i:i + 1, 0:64]


def test_a_mutated_config_object_is_not_replayed_stale():
    x = torch.randn(16, 64)
    cfg = Cfg()
    for s in (2.0, 2.0, 2.0, 5.0, 5.0):
        cfg.scale = s
        y = torch.empty(16, 64)
        prog = scaled.run(x, y, cfg)
        assert torch.equal(y, x * s), f"scale {s}"
        assert not prog.replayed
    assert cache_info()["unkeyable"] == 5 and cache_info()["entries"] == 0


def test_a_list_changed_in_place_is_not_replayed_stale():
    x = torch.randn(16, 64)
    rows = [1, 2]
    for r in ([1, 2], [1, 2], [1, 2], [3, 4], [3, 4]):
        rows[:] = r
        y = torch.empty(16, 64)
        rows_of.run(x, y, rows)
        want = torch.zeros(16, 64)
        want[r] = x[r]
        assert torch.equal(y, want), f"rows {r}"
    assert cache_info()["unkeyable"] == 5


def test_immutable_passthrough_values_are_keyed_by_value_and_replayed():
    x = torch.randn(16, 64)
    for s in (2.0, 2.0, 2.0, 5.0, 5.0, 5.0):
        y = torch.empty(16, 64)
        prog = scaled.run(x, y, FrozenCfg(s, (1, 2)))  # a new but equal object each call
        assert torch.equal(y, x * s)
    assert prog.replayed
    assert cache_info()["replayed"] == 2 and cache_info()["entries"] == 2 and cache_info()["unkeyable"] == 0
    for r in ((1, 2), (1, 2), (1, 2), (3, 4)):
        y = torch.empty(16, 64)
        rows_of.run(x, y, r)
        want = torch.zeros(16, 64)
        want[list(r)] = x[list(r)]
        assert torch.equal(y, want)
    assert cache_info()["replayed"] == 3


def test_a_frozen_dataclass_holding_a_list_runs_plain():
    x = torch.randn(16, 64)
    cfg = FrozenCfg(2.0, [1, 2])
    for _ in range(3):
        y = torch.empty(16, 64)
        assert not scaled.run(x, y, cfg).replayed
    assert cache_info()["unkeyable"] == 3
