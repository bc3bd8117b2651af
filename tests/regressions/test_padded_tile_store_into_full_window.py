"""A padded tile (valid_shape smaller than its shape) assigned to a window of
its full shape stores only its valid region. The subscript-store fast path
once passed the window to the store, which then copied the valid region into
the whole window and failed with a torch size error."""

import torch

import pto.language as pl


@pl.jit
def _store_padded(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="store_padded"):
        t = pl.slice(x, [8, 16], [0, 0], valid_shape=[4, 16])
        y[0:8, 0:16] = t
    return y


def test_padded_tile_into_full_window_stores_the_valid_rows():
    x = torch.randn(8, 16)
    y = torch.full((8, 16), 7.0)
    _store_padded(x, y)
    assert torch.equal(y[:4], x[:4])
    assert torch.equal(y[4:], torch.full((4, 16), 7.0))
