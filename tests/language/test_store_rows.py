"""pl.store_rows: a tile's rows (or a list of one-row tiles) into rows of a GM tensor through an index
list, in one call, with the values, footprints, store counts, undo saves and errors of one
pl.assemble per row."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

KEEP = pto.RunConfig(keep_footprints=True)
CHECK = pto.RunConfig(check=True, keep_footprints=True)
R_DYN = pl.dynamic("R")


def _rows_of(prog):
    """Per task: its name, footprints and, per block, the counters and the footprint records as a multiset."""
    out = []
    for t in prog.graph.tasks:
        fps = sorted((buf.name, kind, box) for buf, kind, box in t.footprints)
        blks = [(b.ops, b.flops, b.bytes, b.ld, b.st, b.vk,
                 sorted((buf.name, box, kind) for buf, box, kind in b.fp)) for b in t.blocks]
        out.append((t.name, fps, blks, sorted(t.preds)))
    return out


def _kernel(mode: str, col: int, width: int):
    """``mode``: "bulk" (pl.store_rows of a tile through src_rows), "list" (pl.store_rows of one-row
    tiles) or "rows" (one pl.assemble per row, the composition)."""

    @pl.jit
    def k(src: pl.Tensor[[16, width], pl.FP32], idx: pl.Tensor[[16], pl.INT32],
          y: pl.InOut[pl.Tensor[[R_DYN, 24], pl.FP32]]):
        for b in pl.spmd(2, name_hint="scatter"):
            t = pl.slice(src, [8, width], [b * 8, 0], valid_shape=[8, width])
            dst = pl.read_values(idx, [b * 8], 8)
            keep = [i for i in range(8) if dst[i] >= 0]
            rows = [dst[i] for i in keep]
            if mode == "bulk":
                pl.store_rows(y, rows, t, col, src_rows=keep)
            elif mode == "list":
                pl.store_rows(y, rows, [t[i:i + 1, :] * 2.0 for i in keep], col)
            else:
                for i in keep:
                    r = t[i:i + 1, :] * 2.0 if mode == "rows2" else pl.slice(t, [1, width], [i, 0])
                    pl.assemble(y, r, [dst[i], col])
        return y
    return k


IDX = [[5, -1, 6, 7, 0, 1, 2, 12, 13, 14, 15, -1, 3, 20, 21, 9],  # runs, gaps, skips
       [19, 18, 17, 16, 4, 8, 10, 11, 22, 23, 24, 25, 26, 27, 28, 29]]  # descending, then ascending


@pytest.mark.parametrize("idx", IDX)
@pytest.mark.parametrize("col,width", [(0, 24), (4, 16), (23, 1)])
@pytest.mark.parametrize("config", [KEEP, CHECK], ids=["plain", "check"])
@pytest.mark.parametrize("bulk,rows", [("bulk", "rows"), ("list", "rows2")])
def test_store_rows_is_one_assemble_per_row(idx, col, width, config, bulk, rows):
    g = torch.Generator().manual_seed(col)
    src = torch.randn(16, width, generator=g)
    outs = []
    for mode in (bulk, rows):
        y = torch.full((32, 24), 7.0)
        prog = _kernel(mode, col, width).run(src, torch.tensor(idx, dtype=torch.int32), y, config=config)
        outs.append((y, _rows_of(prog)))
    (yb, gb), (yr, gr) = outs
    assert torch.equal(yb, yr)
    assert gb == gr
    scale = 2.0 if bulk == "list" else 1.0
    for k, r in enumerate(idx):
        if r >= 0:
            assert torch.equal(yb[r, col:col + width], src[k] * scale)


def test_store_rows_in_place_argument_is_restored_when_the_program_fails():
    """The rows are saved before they are overwritten (an argument written in place): a later
    failure restores the caller's tensor."""

    @pl.jit
    def k(src: pl.Tensor[[8, 4], pl.FP32], y: pl.InOut[pl.Tensor[[16, 4], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter"):
            pl.store_rows(y, [3, 4, 5, 9, 0, 1], pl.slice(src, [8, 4], [0, 0]), 0, src_rows=[0, 1, 2, 3, 4, 5])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="bad"):
            y[0:1, 0:4] = src[7:9, 0:4]  # out of bounds: the program raises
        return y

    y = torch.arange(64, dtype=torch.float32).reshape(16, 4)
    before = y.clone()
    with pytest.raises(DslError):
        k.run(torch.randn(8, 4), y)
    assert torch.equal(y, before)


def test_repeated_rows_keep_the_later_one():
    @pl.jit
    def k(src: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter"):
            y[0:4, 0:8] = pl.full([4, 8], pl.FP32, 0.0)
            pl.store_rows(y, [1, 2, 1, 1], src[0:4, 0:8])
        return y

    src = torch.randn(4, 8)
    y = torch.zeros(4, 8)
    prog = k.run(src, y, config=KEEP)
    assert torch.equal(y[1], src[3]) and torch.equal(y[2], src[1])
    b = prog.graph.tasks[0].blocks[0]
    assert b.st == 1 + 4 and b.ld == 1


def test_empty_rows_store_nothing():
    @pl.jit
    def k(src: pl.Tensor[[4, 8], pl.FP32], y: pl.InOut[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter"):
            pl.store_rows(y, [], src[0:4, 0:8])
            pl.store_rows(y, (), [])
        return y

    y = torch.ones(4, 8)
    prog = k.run(torch.randn(4, 8), y, config=KEEP)
    assert torch.equal(y, torch.ones(4, 8)) and prog.graph.tasks[0].blocks[0].st == 0


@pytest.mark.parametrize("call,msg", [
    (lambda y, t: pl.store_rows(y, 3, t), "rows must be a list"),
    (lambda y, t: pl.store_rows(y, [0, 1], t, src_rows=[0]), "src_rows must be a list or tuple of 2"),
    (lambda y, t: pl.store_rows(y, [0], [t[0:1, :]], src_rows=[0]), "src_rows goes with a tile source"),
    (lambda y, t: pl.store_rows(y, [0, 1], [t[0:1, :]]), "1 source tiles for 2 rows"),
    (lambda y, t: pl.store_rows(y, [0], 5.0), "src must be a tile"),
    (lambda y, t: pl.store_rows(y, [0, 4], t), "out of bounds"),
    (lambda y, t: pl.store_rows(y, [0], t, src_rows=[4]), "out of tile dim 0"),
    (lambda y, t: pl.store_rows(y, [0], t, col=1), "out of bounds"),
    (lambda y, t: pl.store_rows(y, [0], pl.cast(t, pl.BF16)), "cast first"),
])
def test_errors_name_the_problem(call, msg):
    @pl.jit
    def k(src: pl.Tensor[[4, 8], pl.FP32], y: pl.InOut[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scatter"):
            call(y, src[0:4, 0:8])
        return y

    with pytest.raises(DslError, match=msg):
        k.run(torch.randn(4, 8), torch.zeros(4, 8))


def test_outside_a_task_is_an_error():
    @pl.jit
    def k(y: pl.InOut[pl.Tensor[[4, 8], pl.FP32]]):
        pl.store_rows(y, [0], pl.full([1, 8], pl.FP32, 1.0))
        return y

    with pytest.raises(DslError, match="inside a task"):
        k.run(torch.zeros(4, 8))


@pl.jit
def _scatter(src: pl.Tensor[[8, 4], pl.FP32], idx: pl.Tensor[[8], pl.INT32], y: pl.InOut[pl.Tensor[[8, 4], pl.FP32]]):
    for b in pl.spmd(2, name_hint="scatter"):
        dst = pl.read_values(idx, [b * 4], 4)
        keep = [i for i in range(4) if dst[i] >= 0]
        t = src[b * 4:b * 4 + 4, 0:4]
        pl.store_rows(y, [dst[i] for i in keep], [t[i:i + 1, :] + 1.0 for i in keep])
    return y


SCATTERS = [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7], [7, 6, -1, 4, 3, 2, 1, 0],
            [0, 1, 2, 3, 4, 5, 6, 7], [5, -1, -1, 2, 0, 1, 3, 4]]


def _scatter_into_zeros(src, p):
    y = torch.zeros(8, 4)
    _scatter.run(src, torch.tensor(p, dtype=torch.int32), y)
    return y


@pytest.mark.parametrize("parametric", [False, True], ids=["cache", "parametric"])
def test_replays_match_plain_runs(parametric, plain_run, replays_match):
    src = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    want = {tuple(p): plain_run(lambda: _scatter_into_zeros(src, p)) for p in SCATTERS}
    replays_match(parametric, SCATTERS, lambda p: torch.testing.assert_close(_scatter_into_zeros(src, p),
                                                                            want[tuple(p)], rtol=0, atol=0))


@pl.jit
def _block_rows(src: pl.Tensor[[64, 4], pl.FP32], y: pl.InOut[pl.Tensor[[64, 4], pl.FP32]]):
    for b in pl.spmd(16, name_hint="rows"):
        t = src[b * 4:b * 4 + 4, 0:4]
        pl.store_rows(y, [63 - 4 * b - k for k in range(4)], t)  # every block its own rows
    return y


def test_templated_blocks_store_rows_of_their_own(templated_runs_match):
    src = torch.randn(64, 4, generator=torch.Generator().manual_seed(2))

    def run():
        y = torch.zeros(64, 4)
        _block_rows.run(src, y)
        return y
    templated_runs_match(run, src.flip(0))
