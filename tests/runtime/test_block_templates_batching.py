"""Block templates (runtime/blocks.py): what runs batched, bit-identical to plain blocks (outputs,
graph, statistics)."""

import sys
from pathlib import Path

import pytest
import torch

import pto.language as pl
import pto.runtime as rt
from pto.runtime import Program, RunConfig
from pto.runtime import blocks as B

sys.path.insert(0, str(Path(__file__).parent))
import _blocks_compare as C  # noqa: E402


def _run(fn, *args, templates=True):
    with rt.block_templates(templates):
        return Program(fn, RunConfig(keep_footprints=True)).execute(args, {})


@pytest.fixture(autouse=True)
def small_tasks(monkeypatch):
    """Templates for the small tasks below too (by default only tasks of >= 24 blocks)."""
    monkeypatch.setattr(B, "MIN_BLOCKS", 4)
    yield
    B.reset_templates()


def _both(fn, make_args):
    """Run plain and with templates on copies of the same arguments; assert the same tensors,
    graph and stats; returns template_info()."""
    B.reset_templates()
    torch.manual_seed(0)
    a0 = make_args()
    a1 = [v.clone() if isinstance(v, torch.Tensor) else v for v in a0]
    p0, p1 = _run(fn, *a0, templates=False), _run(fn, *a1, templates=True)
    for x, y in zip(a0, a1):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
    assert C.graph_view(p0) == C.graph_view(p1)
    assert C.stats_view(p0) == C.stats_view(p1)
    return B.template_info()


@pl.jit
def whole_rows(x: pl.Tensor[[128, 16], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="whole_rows"):
        t = x[b * 4:(b + 1) * 4, 0:16]  # whole rows of a contiguous tensor: narrow_copy
        u = pl.slice(t, [2, 16], [1, 0])  # whole rows of the tile: narrow_copy of a block tile
        y[b * 2:(b + 1) * 2, 0:8] = pl.exp(pl.slice(u, [2, 8], [0, 8]))
    return y


def test_whole_row_loads_and_slices_run_batched():
    info = _both(whole_rows, lambda: (torch.randn(128, 16), torch.zeros(64, 8)))
    assert info["batched"] == 30 and info["restarts"] == 0
