"""pl.gather_rows: the values, footprints and derived graph of one-row loads, in one op."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, PtoError


@pl.jit
def _gathered(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[4, 6], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather"):
        y[0:4, 0:6] = pl.gather_rows(x, [5, 1, 5, 7], col_offset=3, cols=6)
    return y


@pl.jit
def _per_row(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[4, 6], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather"):
        out = pl.full([4, 6], pl.FP32, 0.0)
        for i, r in enumerate((5, 1, 5, 7)):
            out = pl.assemble(out, x[r:r + 1, 3:9], [i, 0])
        y[0:4, 0:6] = out
    return y


def _gather_after_writes(rows):
    """A kernel writing rows 2 and 6 of a scratch tensor (one task each), then gathering ``rows``."""
    @pl.jit
    def kernel(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[2, 16], pl.FP32]]):
        s = pl.create_tensor([8, 16], pl.FP32, name="s")
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w_row2"):
            s[2:3, 0:16] = x[2:3, 0:16]
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w_row6"):
            s[6:7, 0:16] = x[6:7, 0:16]
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather"):
            y[0:2, 0:16] = pl.gather_rows(s, rows)
        return y
    return kernel


def test_values_and_footprints_equal_per_row_loads():
    x = torch.randn(8, 16)
    ya, yb = torch.empty(4, 6), torch.empty(4, 6)
    pa = _gathered.run(x, ya, config=pto.RunConfig(check=True))
    pb = _per_row.run(x, yb, config=pto.RunConfig(check=True))
    assert torch.equal(ya, x[[5, 1, 5, 7], 3:9]) and torch.equal(ya, yb)
    fa = sorted(str(f) for f in pa.footprints(pa.graph.real_tasks[-1]))
    fb = sorted(str(f) for f in pb.footprints(pb.graph.real_tasks[-1]))
    assert fa == fb


def test_edges_follow_the_gathered_rows():
    x = torch.randn(8, 16)
    y = torch.empty(2, 16)
    prog = _gather_after_writes([6, 2]).run(x, y, config=pto.RunConfig(check=True))
    assert torch.equal(y, x[[6, 2]])
    assert prog.graph.named_edges() == {("w_row2", "gather"), ("w_row6", "gather")}


def test_check_mode_sees_an_unwritten_row():
    with pytest.raises(PtoError, match="undefined|never written|uninitiali"):
        _gather_after_writes([2, 3]).run(torch.randn(8, 16), torch.empty(2, 16), config=pto.RunConfig(check=True))


@pl.jit
def _bad_row(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="gather"):
        y[0:1, 0:16] = pl.gather_rows(x, [8])
    return y


def test_out_of_bounds_row():
    with pytest.raises(DslError, match="entry 0 is row 8"):
        _bad_row.run(torch.randn(8, 16), torch.empty(1, 16), config=pto.RunConfig(check=False))
