"""pl.write_values / pl.arange_runs under the program cache, parametric replay and block templates:
their host-made source tensors are constants of a recording, so replays with other data (and
templated blocks writing into their rows) must give what plain runs give."""

import pytest
import torch

import pto.language as pl


@pl.jit
def rows(pos: pl.Tensor[[8], pl.INT32], y: pl.Out[pl.Tensor[[8, 16], pl.INT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
        for t, p in enumerate(pl.read_values(pos, [0], 8)):
            runs = [(0, p * 4, 3), (5, 100 + t, 2)] if p >= 0 else []  # data-dependent starts
            r = pl.arange_runs([1, 16], pl.INT32, -1, runs)
            r = pl.write_values(r, [0, 8], [t, 2 * t, 7])  # constants into a row of its own
            r = pl.write_values(r, [0, 12], [p, p + 1])  # values read from data
            y[t:t + 1, 0:16] = r
    return y


def _rows_into_zeros(p):
    y = torch.zeros(8, 16, dtype=torch.int32)
    rows.run(torch.tensor(p, dtype=torch.int32), y)
    return y


POSITIONS = [[3, 1, -1, 7, 0, 2, 5, 4], [3, 1, -1, 7, 0, 2, 5, 4], [3, 1, -1, 7, 0, 2, 5, 4],
             [9, 8, 7, 6, -1, -1, 1, 0], [3, 1, -1, 7, 0, 2, 5, 4], [2, 2, 2, 2, 2, 2, 2, 2]]


@pytest.mark.parametrize("parametric", [False, True], ids=["cache", "parametric"])
def test_replays_match_plain_runs(parametric, plain_run, replays_match):
    want = {tuple(p): plain_run(lambda: _rows_into_zeros(p)) for p in POSITIONS}
    replays_match(parametric, POSITIONS, lambda p: torch.testing.assert_close(_rows_into_zeros(p), want[tuple(p)],
                                                                             rtol=0, atol=0))


@pl.jit
def blocks(y: pl.Out[pl.Tensor[[32, 8], pl.INT32]]):
    for b in pl.spmd(32, name_hint="rows"):
        r = pl.arange_runs([1, 8], pl.INT32, -1, [(0, 3, 4)])  # the same row in every block
        pl.write(r, [0, 5], b)  # then written per block
        r = pl.write_values(r, [0, 6], [b, 9])
        y[b:b + 1, 0:8] = r
    return y


def test_templated_blocks_get_rows_of_their_own(templated_runs_match):
    def run():
        y = torch.zeros(32, 8, dtype=torch.int32)
        blocks.run(y)
        return y
    templated_runs_match(run, torch.tensor([[3, 4, 5, 6, -1, b, b, 9] for b in range(32)], dtype=torch.int32))
