"""Block templates (runtime/blocks.py): what runs batched, bit-identical to plain blocks (outputs,
graph, statistics)."""

import sys
from pathlib import Path

import pytest
import torch

import pto.language as pl
from pto.runtime import blocks as B

sys.path.insert(0, str(Path(__file__).parent))
import _blocks_compare as C  # noqa: E402
from _blocks_compare import small_tasks  # noqa: E402,F401 - the fixture, used by every test here

pytestmark = pytest.mark.usefixtures("small_tasks")


@pl.jit
def whole_rows(x: pl.Tensor[[128, 16], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="whole_rows"):
        t = x[b * 4:(b + 1) * 4, 0:16]  # whole rows of a contiguous tensor: narrow_copy
        u = pl.slice(t, [2, 16], [1, 0])  # whole rows of the tile: narrow_copy of a block tile
        y[b * 2:(b + 1) * 2, 0:8] = pl.exp(pl.slice(u, [2, 8], [0, 8]))
    return y


def test_whole_row_loads_and_slices_run_batched():
    info = C.both(whole_rows, lambda: (torch.randn(128, 16), torch.zeros(64, 8)))[0]
    assert info["batched"] == 30 and info["restarts"] == 0


@pl.jit
def data_offsets(x: pl.Tensor[[256, 8], pl.FP32], rows: pl.Tensor[[32, 1], pl.INT32],
                 y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="data_offsets"):
        r = pl.read(rows, [b, 0])  # a load at an offset read from data: no batched form
        y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[r:r + 4, 0:8])
    return y


def _data_offsets_args():
    return (torch.randn(256, 8), torch.randint(0, 252, (32, 1), dtype=torch.int32), torch.zeros(128, 8))


def test_unbatched_site_runs_plainly_in_later_programs_below_min_unbatched(monkeypatch):
    info = C.both(data_offsets, _data_offsets_args)[0]
    assert info["tasks"] == 1 and info["templated"] == 30 and info["batched"] == 0
    C.run_args(data_offsets, *_data_offsets_args())  # the same site again: 32 < MIN_UNBATCHED blocks
    assert B.template_info()["tasks"] == 1
    monkeypatch.setattr(B, "MIN_UNBATCHED", 32)
    a = _data_offsets_args()
    C.run_args(data_offsets, *a)
    assert B.template_info()["tasks"] == 2 and torch.equal(a[2], torch.exp(a[0][a[1][:, 0].long()[:, None]
                                                                               + torch.arange(4)]).reshape(128, 8))


@pl.jit
def flagged(x: pl.Tensor[[128, 8], pl.FP32], flags: pl.Tensor[[32, 1], pl.INT32],
            y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="flagged"):
        if pl.read(flags, [b, 0]) > 0:
            y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[b * 4:(b + 1) * 4, 0:8])
        else:
            y[b * 4:(b + 1) * 4, 0:8] = pl.neg(x[b * 4:(b + 1) * 4, 0:8])
    return y


def test_a_batch_whose_every_block_took_another_path_does_not_stop_later_batches():
    first = torch.zeros(32, 1, dtype=torch.int32)
    first[0] = 1  # block 0 alone takes the exp path: the batch of blocks 1.. fails for every block
    info = C.both(flagged, lambda: (torch.randn(128, 8), first.clone(), torch.zeros(128, 8)))[0]
    # block 1 records the neg path; blocks 2 .. 29 run batched from that variant
    assert info["batched"] == 28 and info["restarts"] == 0 and info["recorded"] == 2
    x, y = torch.randn(128, 8), torch.zeros(128, 8)
    C.run_args(flagged, x, torch.ones(32, 1, dtype=torch.int32), y)  # a later program of the site: batched
    assert B.template_info()["batched"] == 28 + 30 and torch.equal(y, torch.exp(x))


@pl.jit
def early_path(x: pl.Tensor[[256, 8], pl.FP32], rows: pl.Tensor[[256, 1], pl.INT32],
               y: pl.Out[pl.Tensor[[256, 8], pl.FP32]], n: pl.Scalar[pl.INT32]):
    for b in pl.spmd(n, name_hint="early_path"):
        if b < 3:  # the first blocks: a long chain of integer steps on a read (a register: no batched form)
            c = pl.read(rows, [b, 0])
            for _ in range(40):
                c = (c * 3 + 1) // 2 % 1000
            y[b * 4:(b + 1) * 4, 0:8] = pl.add(pl.exp(x[b * 4:(b + 1) * 4, 0:8]), c)
        else:  # the others: a variant recorded at block 3, batched
            y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[b * 4:(b + 1) * 4, 0:8])
    return y


def _early_path_args(n: int):
    return (torch.randn(256, 8), torch.randint(0, 1000, (256, 1), dtype=torch.int32), torch.zeros(256, 8), n)


def _early_path_expected(a) -> torch.Tensor:
    x, rows, _, n = a
    want = torch.zeros(256, 8)
    want[:4 * n] = torch.exp(x[:4 * n])
    for b in range(3):
        c = int(rows[b, 0])
        for _ in range(40):
            c = (c * 3 + 1) // 2 % 1000
        want[b * 4:(b + 1) * 4] = torch.exp(x[b * 4:(b + 1) * 4]) + c
    return want


def test_block_zero_without_batched_form_does_not_stop_later_programs_when_variants_batched(monkeypatch):
    # block 0's path (blocks 0-2) has no batched form, the variant of blocks 3.. batches: the site
    # stays templated in later programs (it used to run plainly there below MIN_UNBATCHED blocks)
    # when the batches pay for the recordings (a recording at 1 block, 27 batched blocks)
    monkeypatch.setattr(B, "RECORD_BLOCKS", 1)
    info = C.both(early_path, lambda: _early_path_args(32))[0]
    assert info["tasks"] == 1 and info["recorded"] >= 2 and info["batched"] == 27 and info["restarts"] == 0
    a = _early_path_args(32)
    C.run_args(early_path, *a)
    after = B.template_info()
    # the second program takes the first one's templates (reused): blocks 0-2, whose paths follow
    # this program's data, record their own; block 3 (the variant's recording before) batches too
    assert after["tasks"] == 2 and after["reused"] == 1 and after["recorded"] == info["recorded"] + 3
    assert after["batched"] == 27 + 28
    assert torch.equal(a[2], _early_path_expected(a))


def test_recordings_that_cost_more_than_the_batches_saved_stop_later_tasks(monkeypatch):
    # recordings (block 0, the diverging blocks 1-2, block 3) at RECORD_BLOCKS (50, the default) against 27 batched blocks:
    # later 32-block tasks of the site run plainly (below MIN_UNBATCHED), with the same results
    monkeypatch.setattr(B, "RECORD_BLOCKS", 50)
    info = C.both(early_path, lambda: _early_path_args(32))[0]
    assert info["tasks"] == 1 and info["recorded"] >= 2 and info["batched"] == 27
    a = _early_path_args(32)
    C.run_args(early_path, *a)
    assert B.template_info()["tasks"] == 1 and torch.equal(a[2], _early_path_expected(a))


def test_unbatched_memory_is_per_block_count(monkeypatch):
    # a task of 5 blocks batches nothing (only blocks 3 and 4 take the batched path, fewer than 8):
    # later 5-block tasks of the site run plainly, a 32-block task there still uses templates
    monkeypatch.setattr(B, "RECORD_BLOCKS", 1)
    info = C.both(early_path, lambda: _early_path_args(5))[0]
    assert info["tasks"] == 1 and info["batched"] == 0
    a = _early_path_args(5)
    C.run_args(early_path, *a)
    assert B.template_info()["tasks"] == 1 and torch.equal(a[2], _early_path_expected(a))
    a = _early_path_args(32)
    C.run_args(early_path, *a)
    assert B.template_info()["tasks"] == 2 and B.template_info()["batched"] == 27
    assert torch.equal(a[2], _early_path_expected(a))


def test_cross_overlap_of_batched_blocks():
    """The overlap test a batch runs before it runs blocks at once: a box one block writes that
    meets a box of another block (read or written) is an overlap; reads alone, disjoint row ranges
    (the quick path) and disjoint columns of shared rows (the sweep) are not."""
    a, b = object(), object()

    def blocks(*fps):
        return [B._FpBlock(i, fp) for i, fp in enumerate(fps)]

    W, R = 1, 0
    assert not B._cross_overlap(blocks([(a, (0, 4, 0, 8), W)], [(a, (4, 8, 0, 8), W)], [(a, (8, 12, 0, 8), W)]))
    assert not B._cross_overlap(blocks([(a, (0, 8, 0, 4), W)], [(a, (0, 8, 4, 8), W)]))  # same rows, other columns
    assert not B._cross_overlap(blocks([(b, (0, 8, 0, 8), R)], [(b, (0, 8, 0, 8), R)]))  # reads only
    assert B._cross_overlap(blocks([(a, (0, 4, 0, 8), W)], [(a, (3, 5, 0, 8), R)]))  # a read of a written row
    assert B._cross_overlap(blocks([(a, (0, 8, 0, 5), W)], [(a, (0, 8, 4, 8), W)]))  # shared rows and a column
    # one block's own boxes may overlap: only other blocks count
    assert not B._cross_overlap(blocks([(a, (0, 4, 0, 8), W), (a, (2, 6, 0, 8), R)], [(a, (6, 8, 0, 8), W)]))
