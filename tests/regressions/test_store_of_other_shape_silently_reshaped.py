"""Regression: ``y[0:16, 0:64] = x[0:8, :]`` (an [8, 128] tile into a [16, 64] window, same
element count) was silently reshaped (breaker finding M4). A subscript store now accepts a tile
whose shape differs from the window only in unit dims (``y[i, :] = row``); anything else is a
DslError naming both shapes.
"""

import re

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def _kernel(how: str):
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
        with pl.at(name_hint="t"):
            if how == "same_count":
                y[0:16, 0:64] = x[0:8, :]
            elif how == "transposed":
                y[0:2, 0:64] = pl.reshape(x[0:1, :], [64, 2])
            elif how == "row_int":
                y[3, :] = x[5:6, :]  # window [1, 128] (dim 0 dropped), tile [1, 128]
            elif how == "row_vector":
                y[3:4, :] = pl.reshape(x[5:6, :], [128])  # tile [128] into window [1, 128]
            elif how == "column":
                y[0:16, 7:8] = pl.reshape(x[0:1, 0:16], [16])  # tile [16] into window [16, 1]
        return y
    return k


@pytest.mark.parametrize("how,tile,window", [("same_count", "[8, 128]", "[16, 64]"),
                                             ("transposed", "[64, 2]", "[2, 64]")])
def test_store_of_a_tile_whose_shape_differs_beyond_unit_dims_is_rejected(how, tile, window):
    with pytest.raises(DslError, match=re.escape(f"y: tile of shape {tile} assigned to window {window}: the shapes "
                                                 "differ beyond unit dims") + ".*task 't' block 0"):
        _kernel(how)(torch.randn(64, 128), torch.zeros(64, 128))


@pytest.mark.parametrize("how", ["row_int", "row_vector", "column"])
def test_store_differing_only_in_unit_dims_is_allowed(how):
    x = torch.randn(64, 128)
    y = torch.zeros(64, 128)
    _kernel(how)(x, y)
    want = torch.zeros(64, 128)
    if how == "column":
        want[0:16, 7] = x[0, 0:16]
    else:
        want[3] = x[5]
    assert torch.equal(y, want)
