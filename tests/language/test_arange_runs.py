"""pl.arange_runs: a [1, N] tile of runs of consecutive integers, the same tile and tile-op count
as pl.full followed by one pl.arange + pl.assemble per run."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto.language as pl
from pto.errors import DslError

INT_DTYPES = [pl.INT32, pl.INT16, pl.INT8, pl.INT64, pl.UINT8]


def _composed(shape, dt, fill, runs):
    t = pl.full(shape, dt, fill)
    lead = [0] * (len(shape) - 1)
    for col, start, n in runs:
        t = pl.assemble(t, pl.arange(start, [1] * len(lead) + [n], dtype=dt), [*lead, col])
    return t


def _both(shape, dt, fill, runs):
    """[tile, ops, tile, ops]: pl.arange_runs and the composition, each in one task."""
    got = []
    for bulk in (True, False):
        @pl.jit
        def k(y: pl.Out[pl.Tensor[[1, 1], pl.INT32]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
                got.append((pl.arange_runs(shape, dt, fill, runs) if bulk else _composed(shape, dt, fill, runs)).data)
                y[0:1, 0:1] = pl.full([1, 1], pl.INT32, 0)
            return y
        prog = k.run(torch.zeros(1, 1, dtype=torch.int32))
        got.append(prog.graph.tasks[0].blocks[0].ops - 1)  # less the [1, 1] fill of the store
    return got


def _error(fn):
    try:
        fn()
    except DslError as e:
        return str(e)
    return None


@settings(max_examples=120, deadline=None)
@given(dt=st.sampled_from(INT_DTYPES), width=st.integers(0, 40), rank1=st.booleans(), data=st.data())
def test_matches_full_arange_assemble(dt, width, rank1, data):
    lo, hi = dt.min, dt.max
    fill = data.draw(st.integers(lo, hi))
    runs = []
    for _ in range(data.draw(st.integers(0, 5))):
        col = data.draw(st.integers(0, width))
        n = data.draw(st.integers(0, width - col))
        start = data.draw(st.integers(max(lo, -(1 << 40)), min(hi, 1 << 40)))
        runs.append((col, start, n))
    shape = [width] if rank1 else [1, width]
    if _error(lambda: _composed(shape, dt, fill, runs)) is not None:  # (a run past the dtype's range wraps)
        assert _error(lambda: pl.arange_runs(shape, dt, fill, runs)) == _error(lambda: _composed(shape, dt, fill, runs))
        return
    tv, ov, ts, os_ = _both(shape, dt, fill, runs)
    assert tv.dtype == ts.dtype and list(tv.shape) == list(ts.shape) and torch.equal(tv, ts)
    assert ov == os_ == 1 + len(runs)


def test_window_row_of_page_segments():
    tile, ops, _, ops_ref = _both([1, 12], pl.INT32, -1, [(0, 37, 3), (3, 80, 4), (7, 16, 2)])
    assert tile.tolist() == [[37, 38, 39, 80, 81, 82, 83, 16, 17, -1, -1, -1]]
    assert ops == ops_ref == 4


@pytest.mark.parametrize("dt,runs", [(pl.INT16, [(0, 32766, 4)]), (pl.UINT8, [(1, 254, 3)]), (pl.INT8, [(0, -129, 2)])])
def test_runs_past_the_dtype_range_wrap_as_arange_does(dt, runs):
    tv, ov, ts, os_ = _both([1, 6], dt, 0, runs)
    assert torch.equal(tv, ts) and ov == os_


@pytest.mark.parametrize("shape,dt,fill,runs", [
    ([1, 8], pl.INT32, -1, [(6, 0, 3)]),  # a run past the last column
    ([1, 8], pl.INT32, -1, [(-1, 0, 2)]),  # a negative column
    ([1, 8], pl.INT32, -1, [(0, 0, -1)]),  # a negative length
    ([1, 8], pl.INT8, 300, []),  # a fill outside the dtype
    ([1, 8], pl.INT8, 2.5, []),  # a fractional fill
    ([1, 8], pl.FP32, -1, [(0, 0, 2)]),  # not an integer dtype
])
def test_errors_match_the_composition(shape, dt, fill, runs):
    msg = _error(lambda: _composed(shape, dt, fill, runs))
    assert msg is not None and _error(lambda: pl.arange_runs(shape, dt, fill, runs)) == msg


def test_other_shapes_are_the_composition():
    tv, ov, ts, os_ = _both([2, 8], pl.INT32, -1, [(0, 5, 2)])  # a leading dim other than 1: row 0
    assert torch.equal(tv, ts) and tv[0, :3].tolist() == [5, 6, -1] and ov == os_ == 2


def test_malformed_runs():
    with pytest.raises(DslError, match=r"runs must be a list of \(col, start, n\) triples"):
        pl.arange_runs([1, 8], pl.INT32, -1, [(0, 1)])
    with pytest.raises(DslError, match=r"runs must be a list of \(col, start, n\) triples"):
        pl.arange_runs([1, 8], pl.INT32, -1, 5)
