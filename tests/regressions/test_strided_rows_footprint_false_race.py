"""Regression: a window whose root rows are strided (one stream of a
[T, N, D] tensor over several tokens) was recorded as one bounding box, so
blocks writing different streams were reported as a race and got false edges.
Footprints are now exact: one box per run of contiguous root rows."""

import torch

import pto
import pto.language as pl
from pto.language.tensor_ops import GMTensor

T = pl.dynamic("T")


@pl.jit
def _per_stream(y: pl.Out[pl.Tensor[[T, 4, 16], pl.FP32]]):
    for j in pl.spmd(4, name_hint="stream_fill"):
        y[:, j, :] = pl.full([8, 16], pl.FP32, float(j))


@pl.jit
def _per_stream_then_read(y: pl.Out[pl.Tensor[[T, 4, 16], pl.FP32]], z: pl.Out[pl.Tensor[[T, 16], pl.FP32]]):
    for j in pl.spmd(4, name_hint="stream_fill"):
        y[:, j, :] = pl.full([8, 16], pl.FP32, float(j))
    with pl.at(name_hint="read_stream_2"):
        z[:, :] = y[:, 2, :]


def test_blocks_writing_different_streams_do_not_race():
    y = torch.zeros(8, 4, 16)
    pto.run(_per_stream, y, config=pto.RunConfig(check=True))
    assert torch.equal(y[:, :, 0], torch.arange(4.0).expand(8, 4))


def test_stream_box_is_one_row_per_token():
    class _Buf:
        base_off = 0
        C = 16
    t = GMTensor(torch.zeros(8, 4, 16), _Buf(), "t")
    assert t.box([0, 1, 0], [3, 2, 16]) == [(1, 2, 0, 16), (5, 6, 0, 16), (9, 10, 0, 16)]
    assert t.box([0, 0, 0], [3, 4, 16]) == (0, 12, 0, 16)
    view = GMTensor(t.data[:, 2, :], t.buf, "v")
    assert view.box([2, 0], [4, 16]) == [(10, 11, 0, 16), (14, 15, 0, 16)]
    assert view.box([2, 0], [3, 8]) == (10, 11, 0, 8)


def test_reader_of_one_stream_depends_on_the_writer():
    y, z = torch.zeros(8, 4, 16), torch.zeros(8, 16)
    prog = pto.run(_per_stream_then_read, y, z, config=pto.RunConfig(check=True))
    assert prog.graph.named_edges() == {("stream_fill", "read_stream_2")}
    assert torch.equal(z, torch.full((8, 16), 2.0))
