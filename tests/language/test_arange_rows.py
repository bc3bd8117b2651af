"""pl.arange_rows: many pl.arange_runs rows in one call, with the tiles, op counts and errors of one
pl.arange_runs per row; stored with pl.store_rows, under the program cache and block templates."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto
import pto.language as pl
from pto.errors import DslError

KEEP = pto.RunConfig(keep_footprints=True)


def _kernel(dt, width, rows, bulk: bool):
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[8, width], dt]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
            if bulk:
                tiles = pl.arange_rows([1, width], dt, -1 if dt is not pl.UINT8 else 7, rows)
            else:
                tiles = [pl.arange_runs([1, width], dt, -1 if dt is not pl.UINT8 else 7, r) for r in rows]
            for m, t in enumerate(tiles):
                y[m:m + 1, 0:width] = t
        return y
    return k


def _runs(draw, width, lo, hi):
    runs = []
    for _ in range(draw(st.integers(0, 3))):
        col = draw(st.integers(0, width))
        n = draw(st.integers(0, width - col))
        start = draw(st.integers(lo, hi - n + 1 if n else hi))
        runs.append((col, start, n))
    return runs


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from([pl.INT32, pl.INT8, pl.INT64, pl.UINT8, pl.INT16]), width=st.integers(1, 24),
       data=st.data())
def test_arange_rows_are_arange_runs_rows(dt, width, data):
    lo, hi = (dt.min, dt.max) if dt is not pl.INT64 else (-2 ** 40, 2 ** 40)
    rows = [_runs(data.draw, width, lo, hi) for _ in range(data.draw(st.integers(1, 8)))]
    outs = []
    for bulk in (True, False):
        y = torch.zeros(8, width, dtype=dt.torch)
        prog = _kernel(dt, width, rows, bulk).run(y, config=KEEP)
        b = prog.graph.tasks[0].blocks[0]
        outs.append((y, (b.ops, b.flops, b.vk, b.st, b.bytes, sorted(box for _, box, _ in b.fp))))
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1] == outs[1][1]


def test_a_start_past_the_dtype_is_the_composition():
    """A run whose numbers leave the dtype's range takes arange_runs' general path (pl.arange wraps)."""
    rows = [[(0, 2 ** 31 - 2, 4)], [(1, 5, 2)]]
    outs = []
    for bulk in (True, False):
        y = torch.zeros(8, 6, dtype=torch.int32)
        prog = _kernel(pl.INT32, 6, rows, bulk).run(y, config=KEEP)
        outs.append((y, prog.graph.tasks[0].blocks[0].ops))
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1] == 4


def test_tiles_are_rows_of_their_own():
    """A write into one tile is not seen by the next (disjoint rows), and the tiles have shape [1, N]."""

    @pl.jit
    def k(y: pl.Out[pl.Tensor[[3, 6], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
            a, b, c = pl.arange_rows([1, 6], pl.INT32, 0, [[(0, 10, 3)], [], [(2, 5, 4), (0, 1, 1)]])
            pl.write(a, [0, 5], 99)
            b = pl.write_values(b, [0, 0], [7, 7])
            pl.store_rows(y, [0, 1, 2], [a, b, c])
        return y

    y = torch.zeros(3, 6, dtype=torch.int32)
    k.run(y)
    assert y.tolist() == [[10, 11, 12, 0, 0, 99], [7, 7, 0, 0, 0, 0], [1, 0, 5, 6, 7, 8]]


def test_empty_rows_is_an_empty_list():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 4], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
            assert pl.arange_rows([1, 4], pl.INT32, 0, []) == []
            y[0:1, 0:4] = pl.full([1, 4], pl.INT32, 3)
        return y

    prog = k.run(torch.zeros(1, 4, dtype=torch.int32), config=KEEP)
    assert prog.graph.tasks[0].blocks[0].ops == 1


@pytest.mark.parametrize("rows,msg", [
    (3, "rows must be a list of run lists"),
    ([[(0, 0, 2)], [(3, 0, 2)]], "out of"),  # the second row's run reaches past the tile
    ([[(0, 0, -1)]], "negative|n >= 0|length"),
    ([[(0, 0)]], "triples"),
])
def test_errors_are_arange_runs_errors(rows, msg):
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[2, 4], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
            pl.store_rows(y, [0, 1], pl.arange_rows([1, 4], pl.INT32, 0, rows))
        return y

    with pytest.raises(DslError, match=msg):
        k.run(torch.zeros(2, 4, dtype=torch.int32))


@pl.jit
def _windows(pos: pl.Tensor[[8], pl.INT32], y: pl.Out[pl.Tensor[[8, 16], pl.INT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
        runs = [[(0, p * 4, 3), (5, 100 + t, 2)] if p >= 0 else []
                for t, p in enumerate(pl.read_values(pos, [0], 8))]  # data-dependent starts
        pl.store_rows(y, list(range(8)), pl.arange_rows([1, 16], pl.INT32, -1, runs))
    return y


POSITIONS = [[3, 1, -1, 7, 0, 2, 5, 4], [3, 1, -1, 7, 0, 2, 5, 4], [3, 1, -1, 7, 0, 2, 5, 4],
             [9, 8, 7, 6, -1, -1, 1, 0], [3, 1, -1, 7, 0, 2, 5, 4]]


@pytest.mark.parametrize("parametric", [False, True], ids=["cache", "parametric"])
def test_replays_match_plain_runs(parametric, replays_match):
    def one(p):
        want = torch.tensor([[4 * q, 4 * q + 1, 4 * q + 2, -1, -1, 100 + t, 101 + t] + [-1] * 9 if q >= 0
                             else [-1] * 16 for t, q in enumerate(p)], dtype=torch.int32)
        y = torch.zeros(8, 16, dtype=torch.int32)
        _windows.run(torch.tensor(p, dtype=torch.int32), y)
        assert torch.equal(y, want)
    replays_match(parametric, POSITIONS, one)


@pl.jit
def _block_rows(y: pl.Out[pl.Tensor[[64, 8], pl.INT32]]):
    for b in pl.spmd(16, name_hint="rows"):
        tiles = pl.arange_rows([1, 8], pl.INT32, -1, [[(0, 3, 4)], [(1, b, 2)], [], [(7, 4 * b, 1)]])
        pl.write(tiles[2], [0, 0], b)  # then written per block
        pl.store_rows(y, [4 * b + k for k in range(4)], tiles)
    return y


def test_templated_blocks_get_rows_of_their_own(templated_runs_match):
    want = []
    for b in range(16):
        want += [[-1, -1, -1, -1, -1, -1, -1, -1] for _ in range(4)]
        want[4 * b][0:4] = [3, 4, 5, 6]
        want[4 * b + 1][1:3] = [b, b + 1]
        want[4 * b + 2][0] = b
        want[4 * b + 3][7] = 4 * b

    def run():
        y = torch.zeros(64, 8, dtype=torch.int32)
        _block_rows.run(y)
        return y
    templated_runs_match(run, torch.tensor(want, dtype=torch.int32))
