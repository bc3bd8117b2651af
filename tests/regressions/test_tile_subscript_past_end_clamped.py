"""Regression: a tile subscript past the tile's end was silently clamped by torch
(``a[0:32, :]`` on a 16-row tile gave 16 rows), and negative tile indices counted from the end,
while GM subscripts reject both (breaker findings M4, M8, M9). Tile subscripts, and
``pl.read`` / ``pl.write`` on tiles, now raise DslError for any bound outside the tile.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError


def _kernel(how: str):
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
        with pl.at(name_hint="t"):
            a = x[0:16, :]
            if how == "past_end":
                y[16:32, :] = a[0:32, :]
            elif how == "negative_start":
                y[0:1, :] = a[-1:, :]
            elif how == "negative_index":
                y[0, :] = a[-1, :]
            elif how == "index_past_end":
                y[0, :] = a[16, :]
            elif how == "col_past_end":
                y[0:16, 0:64] = a[:, 100:164]
            elif how == "strided":
                y[0:8, :] = a[0:16:2, :]
            elif how == "too_many":
                y[0:1, :] = a[0:1, :, 0]
            elif how == "float":
                y[0:1, :] = a[0.0:1, :]
            elif how == "assign_past_end":
                a[10:20, :] = pl.full([10, 128], pl.FP32, 1.0)
            elif how == "read_past_end":
                pl.read(a, [20, 0])
            elif how == "read_negative":
                pl.read(a, [-1, 0])
            elif how == "write_past_end":
                pl.write(a, [99, 0], 1.0)
            elif how == "read_rank":
                pl.read(a, [0])
            elif how == "ok":
                b = a[4:8, 0:64]
                c = a[...]
                e = a[..., 0:1]
                pl.write(a, [15, 127], 3.0)
                y[0:4, 0:64] = b
                y[4:20, :] = c
                y[20:36, 0:1] = e
                y[36, 0] = pl.read(a, [15, 127])
        return y
    return k


@pytest.mark.parametrize("how,msg", [
    ("past_end", r"tile subscript: window \[0, 32\) out of bounds of dim 0 \(extent 16\) of tile \[16, 128\]"),
    ("negative_start", r"tile subscript: window \[-1, 16\) out of bounds of dim 0"),
    ("negative_index", r"tile subscript: index -1 out of bounds of dim 0 \(extent 16\)"),
    ("index_past_end", r"tile subscript: index 16 out of bounds of dim 0 \(extent 16\)"),
    ("col_past_end", r"tile subscript: window \[100, 164\) out of bounds of dim 1 \(extent 128\)"),
    ("strided", r"tile subscript: strided slices are not supported"),
    ("too_many", r"tile subscript: 3 indices for a rank-2 tile \[16, 128\]"),
    ("float", r"tile subscript: a slice start of dim 0 must be an int, got 0.0"),
    ("assign_past_end", r"tile subscript assign: window \[10, 20\) out of bounds of dim 0 \(extent 16\)"),
    ("read_past_end", r"pl.read: index 20 out of bounds of dim 0 \(extent 16\) of tile \[16, 128\]"),
    ("read_negative", r"pl.read: index -1 out of bounds of dim 0"),
    ("write_past_end", r"pl.write: index 99 out of bounds of dim 0"),
    ("read_rank", r"pl.read: 1 indices for a tile of rank 2 \[16, 128\]"),
])
def test_tile_subscript_outside_the_tile_is_a_dsl_error(how, msg):
    with pytest.raises(DslError, match=msg):
        _kernel(how)(torch.randn(64, 128), torch.zeros(64, 128))


def test_tile_subscripts_inside_the_tile_still_work():
    x = torch.randn(64, 128)
    y = torch.zeros(64, 128)
    _kernel("ok")(x, y)
    a = x[0:16].clone()
    a[15, 127] = 3.0
    assert torch.equal(y[0:4, 0:64], a[4:8, 0:64])
    assert torch.equal(y[4:20], a)
    assert torch.equal(y[20:36, 0:1], a[:, 0:1])
    assert y[36, 0].item() == 3.0
