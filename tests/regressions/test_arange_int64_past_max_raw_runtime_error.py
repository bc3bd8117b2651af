"""Regression: ``pl.arange`` wraps numbers past its dtype's range (two's complement, as integer
add does and as tests/language/test_arange_runs.py holds for INT8 / INT16 / INT32 / UINT8), but
an INT64 run past INT64's max (or a start past it) failed with torch's bare RuntimeError ("value
cannot be converted to type int64_t without overflow"). It now wraps like the other dtypes;
pl.arange_runs' general path, which builds its runs with pl.arange, too."""

import pytest
import torch

import pto.language as pl

M = 1 << 63


def _wrap(x):
    return (x + M) % (1 << 64) - M


def _run(make):
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 6], pl.INT64]]):
        for _ in pl.spmd(1, name_hint="k"):
            y[0:1, 0:6] = make()
    y = torch.zeros(1, 6, dtype=torch.int64)
    k(y)
    return y[0].tolist()


@pytest.mark.parametrize("start,desc", [(M - 3, False), (M + 5, False), (-M + 2, True), (-M - 10, True)])
def test_int64_arange_wraps(start, desc):
    got = _run(lambda: pl.arange(start, [1, 6], pl.INT64, descending=desc))
    step = -1 if desc else 1
    assert got == [_wrap(start + step * i) for i in range(6)]


def test_int64_arange_runs_past_max_wraps():
    got = _run(lambda: pl.arange_runs([1, 6], pl.INT64, -1, [(1, M - 2, 4)]))
    assert got == [-1, M - 2, M - 1, -M, -M + 1, -1]


def test_int32_start_past_int64_wraps_to_its_low_bits():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 4], pl.INT32]]):
        for _ in pl.spmd(1, name_hint="k"):
            y[0:1, 0:4] = pl.arange((1 << 64) + 7, [1, 4], pl.INT32)
    y = torch.zeros(1, 4, dtype=torch.int32)
    k(y)
    assert y[0].tolist() == [7, 8, 9, 10]
