"""pl.write of a negative int into a UINT8 tile was stored wrapped (-1 -> 255) by the write fast
path, which relied on torch raising for an out-of-range number (torch wraps negative ints into
uint8); the general path, and the docs, make it a DslError naming the range."""

import pytest
import torch

import pto
import pto.language as pl
from pto.language.tile_ops import Tile


@pytest.mark.parametrize("value", [-1, -128, -255])
def test_negative_int_into_uint8_tile_is_a_dsl_error(value):
    t = Tile(torch.zeros(1, 4, dtype=torch.uint8))
    with pytest.raises(pto.DslError, match=r"out of range of pl.UINT8 \[0, 255\]"):
        pl.write(t, [0, 1], value)
    assert t.data.tolist() == [[0, 0, 0, 0]]  # nothing written
    pl.write(t, [0, 1], 255)
    assert t.data.tolist() == [[0, 255, 0, 0]]
