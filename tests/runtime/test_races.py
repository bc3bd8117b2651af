"""Check mode, part 2: the race checker (docs/dsl.md, issue 6).

Every racy kernel here computes the right answer on the CPU (eager execution
in program order is one valid schedule); the checker must still report that
another valid schedule could differ, naming both tasks, both blocks, the
buffer and the overlapping box, and adding the missing edge must clear it.
"""

import re

import pytest
import torch

import pto.language as pl
from pto.errors import RaceError
from pto.runtime import RunConfig

CHECK = RunConfig(check=True)
ROWS, COLS = 8, 16


def _run(kernel, *args, check=True):
    return kernel.run(*args, config=RunConfig(check=check))


# ============================================================================
# Intra-task: blocks of one pl.spmd
# ============================================================================

def _rows_kernel(row_of_block, kind="write", n=2):
    @pl.jit
    def rows(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        z = pl.create_tensor([ROWS, COLS], pl.FP32, init_value=0)
        for b in pl.spmd(n, name_hint="row_writer"):
            r = row_of_block(b)
            if kind == "write":
                y[r:r + 1, :] = x[r:r + 1, :]
            elif kind == "atomic":
                pl.assemble(z, x[r:r + 1, :], [r, 0], atomic=pl.AtomicType.Add)
            elif kind == "read_vs_atomic":
                if b == 0:
                    pl.assemble(z, x[r:r + 1, :], [r, 0], atomic=pl.AtomicType.Add)
                else:
                    y[b:b + 1, :] = z[r:r + 1, :]
        with pl.at(name_hint="copy_back"):
            if kind != "write":
                y[0:ROWS, :] = z[0:ROWS, :]
    return rows


def test_two_blocks_writing_the_same_row_race():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    k = _rows_kernel(lambda b: 3)
    with pytest.raises(RaceError) as ei:
        _run(k, x, y)
    msg = str(ei.value)
    assert re.search(r"blocks 0 and 1 of task 'row_writer' \(#0, .*test_races\.py:\d+\) race on buffer "
                     r"'y' \[8, 16\]: block 0 write and block 1 write overlap in rows \[3, 4\) cols \[0, 16\)", msg)
    _run(k, x, y, check=False)  # unchecked: runs (and happens to be right on the CPU)
    assert torch.equal(y[3], x[3])


def test_blocks_writing_different_rows_do_not_race():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    _run(_rows_kernel(lambda b: b, n=ROWS), x, y)
    assert torch.equal(y, x)


def test_race_names_the_right_blocks_among_many():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    with pytest.raises(RaceError, match=r"blocks 2 and 5 of task 'row_writer'.*rows \[2, 3\)"):
        _run(_rows_kernel(lambda b: 2 if b == 5 else b, n=ROWS), x, y)


def test_atomic_adds_of_two_blocks_do_not_race():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    _run(_rows_kernel(lambda b: 1, kind="atomic", n=4), x, y)
    assert torch.allclose(y[1], 4 * x[1]) and bool((y[0] == 0).all())


def test_read_of_another_blocks_atomic_add_races():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    with pytest.raises(RaceError, match=r"block 0 atomic_add and block 1 read overlap in rows \[1, 2\)"):
        _run(_rows_kernel(lambda b: 1, kind="read_vs_atomic"), x, y)


def _phased_kernel(barrier: bool):
    @pl.jit
    def phased(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.PartialOut[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        s = pl.create_tensor([ROWS, COLS], pl.FP32)

        @pl.spmd(2, name_hint="exchange")
        def body(b):
            s[b:b + 1, :] = x[b:b + 1, :] * 2.0
            if barrier:
                yield pl.system.syncall()
            o = 1 - b
            y[b:b + 1, :] = s[o:o + 1, :]  # reads the row the other block wrote
            if not barrier:
                yield pl.system.syncall()
    return phased


def test_syncall_orders_the_blocks_of_one_task():
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    _run(_phased_kernel(barrier=True), x, y)
    assert torch.equal(y[0], 2 * x[1]) and torch.equal(y[1], 2 * x[0])
    with pytest.raises(RaceError, match=r"blocks 0 and 1 of task 'exchange'.*buffer 's'"):
        _run(_phased_kernel(barrier=False), x, y)


# ============================================================================
# Inter-task: write-after-read on a KV cache region (never derived)
# ============================================================================

PAGES, BLK, D = 4, 8, 16


def _kv_war_kernel(with_edge: bool):
    """``attend`` reads the cached rows [0, 8) of ``kv_cache``; ``cache_write``
    then overwrites the same rows with this step's kv. The runtime derives no
    write-after-read edge, so without ``deps=`` the device may run the write
    first."""
    @pl.jit
    def kv_war(kv_new: pl.Tensor[[BLK, D], pl.BF16], kv_cache: pl.InOut[pl.Tensor[[PAGES * BLK, D], pl.BF16]],
               attn: pl.Out[pl.Tensor[[BLK, D], pl.FP32]]):
        with pl.at(name_hint="attend") as attend_tid:
            attn[0:BLK, :] = pl.cast(kv_cache[0:BLK, :], pl.FP32) * 0.5
        for b in pl.spmd(2, name_hint="cache_write", deps=[attend_tid] if with_edge else None):
            r = b * (BLK // 2)
            kv_cache[r:r + BLK // 2, :] = kv_new[r:r + BLK // 2, :]
    return kv_war


def _kv_args():
    g = torch.Generator().manual_seed(5)
    return (torch.randn(BLK, D, generator=g).to(torch.bfloat16),
            torch.randn(PAGES * BLK, D, generator=g).to(torch.bfloat16), torch.zeros(BLK, D))


def test_write_after_read_on_kv_cache_without_edge_races():
    kv_new, cache, attn = _kv_args()
    before = cache.clone()
    with pytest.raises(RaceError) as ei:
        _run(_kv_war_kernel(with_edge=False), kv_new, cache, attn)
    msg = str(ei.value)
    assert re.search(r"task 'attend' \(#0, .*test_races\.py:\d+\) block 0 read and task 'cache_write' "
                     r"\(#1, .*test_races\.py:\d+\) block 0 write overlap on buffer 'kv_cache' \[32, 16\] in "
                     r"rows \[0, 4\) cols \[0, 16\) with no path between the two tasks", msg)
    assert "write-after-read" in msg
    assert torch.equal(cache, before)  # the failed program left the caller's InOut tensor alone


def test_write_after_read_with_edge_is_clean():
    kv_new, cache, attn = _kv_args()
    before = cache.clone()
    prog = _run(_kv_war_kernel(with_edge=True), kv_new, cache, attn)
    assert torch.equal(attn, before[:BLK].float() * 0.5) and torch.equal(cache[:BLK], kv_new)
    assert prog.graph.named_edges() == {("attend", "cache_write")}


# ============================================================================
# Inter-task: manual scope and manual_dep tensors without deps=
# ============================================================================

def _manual_kernel(with_deps: bool, form: str):
    @pl.jit
    def manual(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        s = pl.create_tensor([ROWS, COLS], pl.FP32, manual_dep=(form == "manual_dep"))
        if form == "manual_scope":
            with pl.manual_scope():
                with pl.at(name_hint="produce") as p:
                    s[0:ROWS, :] = x[0:ROWS, :] + 1.0
                for b in pl.spmd(2, name_hint="consume", deps=[p] if with_deps else None):
                    y[b * 4:b * 4 + 4, :] = s[b * 4:b * 4 + 4, :]
        else:
            with pl.at(name_hint="produce") as p:
                s[0:ROWS, :] = x[0:ROWS, :] + 1.0
            for b in pl.spmd(2, name_hint="consume", deps=[p] if with_deps else None):
                y[b * 4:b * 4 + 4, :] = s[b * 4:b * 4 + 4, :]
    return manual


@pytest.mark.parametrize("form", ["manual_scope", "manual_dep"])
def test_manual_scope_or_manual_dep_without_deps_races(form):
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    with pytest.raises(RaceError) as ei:
        _run(_manual_kernel(False, form), x, y)
    msg = str(ei.value)
    assert ("task 'produce' (#0, " in msg and "block 0 write and task 'consume' (#1, " in msg
            and "block 0 read overlap on buffer 's' [8, 16] in rows [0, 4) cols [0, 16)" in msg)
    assert "read-after-write" in msg


@pytest.mark.parametrize("form", ["manual_scope", "manual_dep"])
def test_manual_scope_or_manual_dep_with_deps_is_clean(form):
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    prog = _run(_manual_kernel(True, form), x, y)
    assert torch.equal(y, x + 1.0)
    assert prog.graph.named_edges() == {("produce", "consume")}


def test_race_names_the_blocks_of_both_tasks():
    @pl.jit
    def k(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        s = pl.create_tensor([ROWS, COLS], pl.FP32)
        with pl.manual_scope():
            for b in pl.spmd(4, name_hint="writers"):
                s[b:b + 1, :] = x[b:b + 1, :]
            for b in pl.spmd(4, name_hint="readers"):
                r = 2 if b == 3 else 7
                y[b:b + 1, :] = s[r:r + 1, :]

    with pytest.raises(RaceError, match=r"task 'writers' \(#0, [^)]*\) block 2 write and task 'readers' "
                                        r"\(#1, [^)]*\) block 3 read overlap on buffer 's' \[8, 16\] in rows \[2, 3\)"):
        _run(k, torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS))


# ============================================================================
# Paths: transitive edges and join nodes order tasks
# ============================================================================

def _path_kernel(link: str):
    @pl.jit
    def path(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        s = pl.create_tensor([ROWS, COLS], pl.FP32)
        t = pl.create_tensor([ROWS, COLS], pl.FP32)
        with pl.manual_scope():
            with pl.at(name_hint="a") as a:
                s[0:ROWS, :] = x[0:ROWS, :]
            with pl.at(name_hint="b", deps=[a]) as b:
                t[0:ROWS, :] = x[0:ROWS, :] * 2.0
            if link == "chain":
                deps = [b]
            elif link == "join":
                deps = [pl.system.task_dummy(deps=[a, b])]
            else:
                deps = []
            with pl.at(name_hint="c", deps=deps):
                y[0:ROWS, :] = s[0:ROWS, :] + t[0:ROWS, :]
    return path


@pytest.mark.parametrize("link", ["chain", "join"])
def test_transitive_path_and_join_node_order_tasks(link):
    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    _run(_path_kernel(link), x, y)
    assert torch.allclose(y, 3 * x)


def test_missing_path_is_reported_against_the_earliest_unordered_producer():
    with pytest.raises(RaceError, match=r"task 'a' \(#0.*task 'c' \(#2.*buffer 's'"):
        _run(_path_kernel("none"), torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS))


def test_history_pruning_still_reports_the_covering_writer():
    """'b' overwrites the region 'a' read (ordered after 'a'), so the checker
    drops a's entry; an unordered later writer 'c' must still be reported,
    now against 'b'."""
    @pl.jit
    def k(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        s = pl.create_tensor([ROWS, COLS], pl.FP32, init_value=0)
        with pl.manual_scope():
            with pl.at(name_hint="a") as a:
                y[0:ROWS, :] = s[0:ROWS, :]
            with pl.at(name_hint="b", deps=[a]):
                s[0:ROWS, :] = x[0:ROWS, :]
            with pl.at(name_hint="c", deps=[a]):
                s[0:2, :] = x[0:2, :]

    with pytest.raises(RaceError, match=r"task 'b' \(#1.*write and task 'c' \(#2.*write overlap on buffer 's' .* "
                                        r"rows \[0, 2\).*write-after-write"):
        _run(k, torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS))


def test_derived_edges_leave_a_pipeline_race_free():
    @pl.jit
    def k(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
        acc = pl.create_tensor([ROWS, COLS], pl.FP32, init_value=0)
        mid = pl.create_tensor([ROWS, COLS], pl.FP32)
        for b in pl.spmd(4, name_hint="split_k"):
            pl.assemble(acc, x[0:ROWS, :] * 0.25, [0, 0], atomic=pl.AtomicType.Add)
        for b in pl.spmd(2, name_hint="scale"):
            mid[b * 4:b * 4 + 4, :] = acc[b * 4:b * 4 + 4, :] * 2.0
        with pl.at(name_hint="out"):
            y[0:ROWS, :] = mid[0:ROWS, :]

    x, y = torch.randn(ROWS, COLS), torch.zeros(ROWS, COLS)
    prog = _run(k, x, y)
    assert torch.allclose(y, 2 * x)
    assert prog.graph.named_edges() == {("split_k", "scale"), ("scale", "out")}
