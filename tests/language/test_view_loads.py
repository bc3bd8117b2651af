"""Loads of In parameters are not copied; a tile write copies such a tile first, so the
caller's input never changes (and sub-tiles / reshapes of the tile are covered too)."""

import torch

import pto
import pto.language as pl


@pl.jit
def _write_into_loaded(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
        t = x[0:4, 0:8]
        t[0:1, 0:8] = pl.full([1, 8], pl.FP32, 7.0)  # tile subscript assign
        r = pl.reshape(x[0:4, 0:8], [8, 4])
        pl.write(r, [1, 1], 9.0)  # scalar write into a reshape of a loaded tile
        s = x[0:4, 0:8][2:3, 0:8]
        s[0:1, 0:2] = pl.full([1, 2], pl.FP32, -1.0)  # a sub-tile of a loaded tile
        y[0:4, 0:8] = t + pl.reshape(r, [4, 8])
    return y


def test_tile_writes_leave_the_input_alone():
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    x0 = x.clone()
    y = torch.empty(4, 8)
    _write_into_loaded.run(x, y, config=pto.RunConfig(check=False))
    assert torch.equal(x, x0)
    t = x0.clone()
    t[0] = 7.0
    r = x0.clone().reshape(8, 4)
    r[1, 1] = 9.0
    assert torch.equal(y, t + r.reshape(4, 8))
