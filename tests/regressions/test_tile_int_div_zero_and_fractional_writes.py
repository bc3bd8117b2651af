"""Regression: an INT32 tile divided by zero gave INT_MIN, a fractional value written
into an integer tile was truncated (the GM write already raised), and a rank-mismatched
``pl.slice`` of a tile silently returned the wrong shape. Each is now a DslError."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def test_integer_tile_division_by_zero_raises_and_nonzero_truncates():
    a = pl.Tile(torch.tensor([[7, -7]], dtype=torch.int32))
    with pytest.raises(DslError, match="division by zero"):
        pl.div(a, 0)
    with pytest.raises(DslError, match="division by zero"):
        pl.div(a, pl.Tile(torch.tensor([[1, 0]], dtype=torch.int32)))
    assert pl.div(a, 2).data.tolist() == [[3, -3]]
    f = pl.div(pl.Tile(torch.tensor([[1.0]])), 0.0)
    assert f.data.item() == float("inf")


def test_fractional_write_into_integer_tile_raises():
    t = pl.full([2, 2], pl.INT32, 0)
    with pytest.raises(DslError, match="fractional value 1.7"):
        pl.write(t, [0, 0], 1.7)
    with pytest.raises(DslError, match="fractional value 2.9"):
        t[1, 1] = 2.9
    pl.write(t, [0, 1], 3.0)
    t[1, 0] = 4
    assert t.data.tolist() == [[0, 3], [4, 0]]


def test_rank_mismatched_tile_slice_raises():
    t = pl.full([8, 128], pl.FP32, 1.0)
    with pytest.raises(DslError, match="rank 2"):
        pl.slice(t, [8], [0])
    assert pl.slice(t, [4, 64], [4, 64]).shape == (4, 64)
