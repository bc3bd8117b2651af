"""Regression: ``for row in tile`` ran off the end of the tile and raised an out-of-bounds
DslError (Python's legacy iteration protocol called ``__getitem__(3)`` on a 3-row tile), and
``len(tile)`` was a TypeError. A tile now iterates over its dim-0 sub-tiles and stops, as a
torch tensor does; a 0-dim tile raises a DslError for both."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


@pl.jit
def _rows_reversed(x: pl.Tensor[[3, 4], pl.FP32], y: pl.Out[pl.Tensor[[3, 4], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
        t = x[0:3, 0:4]
        n = len(t)
        for i, row in enumerate(t):  # row: [4], dim 0 dropped
            y[n - 1 - i:n - i, 0:4] = pl.reshape(row, [1, 4])
    return y


@pl.jit
def _iterate_scalar_tile(x: pl.Tensor[[3, 4], pl.FP32], y: pl.Out[pl.Tensor[[3, 4], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scalar"):
        e = x[0:3, 0:4][1, 2]  # a 0-dim tile
        for _ in e:
            pass
    return y


def test_for_row_in_tile_yields_each_row_then_stops():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = torch.zeros(3, 4)
    prog = _rows_reversed.run(x, y)
    assert torch.equal(y, x.flip(0))
    assert prog.stats.tasks == 1


def test_iterating_a_0dim_tile_is_a_dsl_error():
    with pytest.raises(DslError, match="0-dim tile"):
        _iterate_scalar_tile(torch.zeros(3, 4), torch.zeros(3, 4))
