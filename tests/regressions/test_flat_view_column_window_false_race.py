"""A column window of a flattened ``[T, N, D]`` tensor (``pl.reshape(y, [T, N * D])``) whose
columns lie inside one stream (``h * D + n0 .. h * D + n0 + w``) was recorded as whole root
rows: disjoint column blocks of one task raced (mtp_projection at flash raised a RaceError in
check mode). The footprint now lands on the stream's root rows and the window's columns."""

import torch

import pto
import pto.language as pl


def _kernel():
    @pl.jit
    def stream_cols(x: pl.Tensor[[8, 4, 64], pl.FP32], y: pl.Out[pl.Tensor[[8, 4, 64], pl.FP32]]):
        xf, yf = pl.reshape(x, [8, 256]), pl.reshape(y, [8, 256])
        for b in pl.spmd(8, name_hint="stream_cols"):
            c0 = (b // 2) * 64 + (b % 2) * 32  # stream b // 2, column half b % 2
            yf[0:8, c0:c0 + 32] = xf[0:8, c0:c0 + 32] * 2.0
    return stream_cols


def test_column_blocks_of_one_stream_do_not_race_and_boxes_are_exact():
    x, y = torch.randn(8, 4, 64), torch.empty(8, 4, 64)
    prog = _kernel().run(x, y, config=pto.RunConfig(check=True))
    assert torch.equal(y, x * 2.0)
    # the window rows 0..7, cols 64+32..64+64 of the [8, 256] view is stream 1 of each token:
    # root rows 1, 5, 9, ... (8 one-row boxes), root cols 32..64
    view = _flat_view(y)
    boxes = view.box((0, 96), (8, 128))
    assert sorted(boxes) == [(4 * t + 1, 4 * t + 2, 32, 64) for t in range(8)]
    assert prog.stats.tasks == 1


def _flat_view(y):
    """The ``[8, 256]`` GM view of ``y`` as a kernel builds it."""
    captured = {}

    @pl.jit
    def grab(t: pl.PartialOut[pl.Tensor[[8, 4, 64], pl.FP32]]):
        captured["view"] = pl.reshape(t, [8, 256])
    grab.run(y)
    return captured["view"]
