"""Regression: loads of In parameters became views of the caller's tensor (no copy), and a
write into such a tile copied it first, so a sub-tile or reshape taken before the write kept
pointing at the input and no longer saw writes through the other views (tile views alias,
as UB views do). A view of a no-copy tile now takes the private copy first.
"""

import torch

import pto.language as pl


@pl.jit
def _views(x: pl.Tensor[[16, 8], pl.FP32], y: pl.Out[pl.Tensor[[48, 8], pl.FP32]]):
    with pl.at(name_hint="t"):
        a = x[0:16, :]
        whole = a[...]
        flat = pl.reshape(a, [8, 16])
        pl.write(a, [0, 0], 7.0)
        whole[1, 1] = 5.0
        y[0:16, :] = whole
        y[16:32, :] = pl.reshape(flat, [16, 8])
        y[32:48, :] = a
    return y


def test_writes_through_one_view_are_seen_by_all_and_never_by_the_input():
    x = torch.randn(16, 8)
    before = x.clone()
    y = torch.zeros(48, 8)
    _views(x, y)
    want = before.clone()
    want[0, 0] = 7.0
    want[1, 1] = 5.0
    for r in (0, 16, 32):
        assert torch.equal(y[r:r + 16], want), r
    assert torch.equal(x, before)
