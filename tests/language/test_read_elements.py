"""pl.read_elements: element reads at a list of indices in one call, with the values, footprints,
load counts, orchestration reads and errors of one pl.read per index."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

KEEP = pto.RunConfig(keep_footprints=True)
CHECK = pto.RunConfig(check=True, keep_footprints=True)


def _kernel(idxs, bulk: bool, view: str):
    @pl.jit
    def k(t2: pl.Tensor[[6, 10], pl.INT32], t1: pl.Tensor[[12], pl.INT64], y: pl.Out[pl.Tensor[[1, 64], pl.INT64]]):
        src = {"2d": t2, "2d_view": t2[1:5, 2:9], "1d": t1, "1d_view": t1[3:11]}[view]
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="reads"):
            vals = pl.read_elements(src, idxs) if bulk else [pl.read(src, list(i)) for i in idxs]
            y[0:1, 0:64] = pl.write_values(pl.full([1, 64], pl.INT64, -7), [0, 0], [int(v) for v in vals])
        return y
    return k


CASES = {
    "2d": [(0, 0), (5, 9), (2, 3), (2, 3), (0, 9), (4, 1)],
    "2d_view": [(0, 0), (3, 6), (1, 2), (1, 2), (2, 0)],
    "1d": [(0,), (11,), (4,), (4,), (7,)],
    "1d_view": [(0,), (7,), (2,), (2,), [5]],
}


@pytest.mark.parametrize("view", sorted(CASES))
@pytest.mark.parametrize("config", [KEEP, CHECK], ids=["plain", "check"])
def test_read_elements_is_one_read_per_index(view, config):
    t2 = torch.arange(60, dtype=torch.int32).reshape(6, 10) * 3 - 50
    t1 = torch.arange(12, dtype=torch.int64) * -11 + 2 ** 40
    outs = []
    for bulk in (True, False):
        y = torch.zeros(1, 64, dtype=torch.int64)
        prog = _kernel(CASES[view], bulk, view).run(t2, t1, y, config=config)
        b = prog.graph.tasks[0].blocks[0]
        outs.append((y, (b.ops, b.ld, b.st, b.bytes, [(buf.name, box, kind) for buf, box, kind in b.fp])))
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1] == outs[1][1]  # the same records, in the same order


def test_orchestration_reads_and_values():
    @pl.jit
    def k(t: pl.Tensor[[4, 5], pl.FP32], y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        vals = pl.read_elements(t, [[0, 1], [3, 4], (0, 1), [2, 0]])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            y[0:1, 0:4] = pl.write_values(pl.full([1, 4], pl.FP32, 0.0), [0, 0], vals)
        return y

    t = torch.randn(4, 5)
    y = torch.zeros(1, 4)
    prog = k.run(t, y)
    assert y.tolist() == [[t[0, 1].item(), t[3, 4].item(), t[0, 1].item(), t[2, 0].item()]]
    assert prog.orch_reads == 4


def test_empty_and_tile_sources():
    @pl.jit
    def k(t: pl.Tensor[[2, 3], pl.INT32], y: pl.Out[pl.Tensor[[1, 3], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            assert pl.read_elements(t, []) == []
            tile = t[0:2, 0:3]
            y[0:1, 0:3] = pl.write_values(pl.full([1, 3], pl.INT32, 0), [0, 0],
                                          pl.read_elements(tile, [[1, 2], [0, 0], [1, 0]]))
        return y

    t = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    y = torch.zeros(1, 3, dtype=torch.int32)
    k.run(t, y)
    assert y.tolist() == [[6, 1, 4]]


@pytest.mark.parametrize("idxs,msg", [(5, "must be a list"), ([[0, 0], [2, 0]], "out of bounds|index"),
                                      ([[0, -1]], "out of bounds|index|negative"), ([[0]], "index|rank|indices")])
def test_errors_are_read_errors(idxs, msg):
    @pl.jit
    def k(t: pl.Tensor[[2, 3], pl.INT32], y: pl.Out[pl.Tensor[[1, 3], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            pl.read_elements(t, idxs)
            y[0:1, 0:3] = pl.full([1, 3], pl.INT32, 0)
        return y

    with pytest.raises(DslError, match=msg):
        k.run(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32))


@pl.jit
def _gather(table: pl.Tensor[[8], pl.INT32], pos: pl.Tensor[[4], pl.INT32], y: pl.Out[pl.Tensor[[1, 4], pl.INT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
        p = pl.read_values(pos, [0], 4)
        vals = pl.read_elements(table, [[q // 2] for q in p])  # data-dependent indices
        y[0:1, 0:4] = pl.write_values(pl.full([1, 4], pl.INT32, 0), [0, 0], vals)
    return y


@pytest.mark.parametrize("parametric", [False, True], ids=["cache", "parametric"])
def test_replays_match_plain_runs(parametric, replays_match):
    table = torch.tensor([70, 71, 72, 73, 74, 75, 76, 77], dtype=torch.int32)

    def one(p):
        y = torch.zeros(1, 4, dtype=torch.int32)
        _gather.run(table, torch.tensor(p, dtype=torch.int32), y)
        assert y.tolist() == [[70 + q // 2 for q in p]]
    replays_match(parametric, [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [15, 3, 3, 8], [0, 1, 2, 3], [9, 9, 9, 9]],
                  one)
