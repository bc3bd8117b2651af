"""Exact edge sets of small hand-written programs (docs/dsl.md; runtime/deps.py)."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

R, C = 32, 16


def edges(prog):
    return prog.graph.named_edges()


def run(kernel, *args, check=False):
    return kernel.run(*args, config=pto.RunConfig(check=check))


def x_in():
    return torch.randn(R, C)


def test_raw_reader_waits_for_writer_only_where_boxes_overlap():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32)
        with pl.at(name_hint="write_top"):
            s[0:16, :] = x[0:16, :]
        with pl.at(name_hint="write_bottom"):
            s[16:32, :] = x[16:32, :]
        with pl.at(name_hint="read_top"):
            y[0:16, :] = s[0:16, :]
        with pl.at(name_hint="read_all"):
            y[16:32, :] = s[8:24, :]
        return y

    p = run(k, x_in(), torch.zeros(R, C), check=True)
    # read_top and read_all write disjoint rows of y: no WAW edge between them
    assert edges(p) == {("write_top", "read_top"), ("write_top", "read_all"), ("write_bottom", "read_all")}


def test_waw_chain_and_no_war_edge():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32, init_value=0)
        with pl.at(name_hint="w1"):
            s[:, :] = x[:, :]
        with pl.at(name_hint="reader"):
            y[:, :] = s[:, :]
        with pl.at(name_hint="w2"):  # overwrites what reader read: WAR is not derived
            s[:, :] = x[:, :] * 2.0
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == {("w1", "reader"), ("w1", "w2")}
    assert ("reader", "w2") not in edges(p)


def test_waw_covered_producer_is_replaced():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32)
        with pl.at(name_hint="w1"):
            s[:, :] = x[:, :]
        with pl.at(name_hint="w2"):
            s[:, :] = x[:, :]
        with pl.at(name_hint="reader"):
            y[:, :] = s[:, :]
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    # w2 fully covers w1's box, so the reader waits for w2 only
    assert edges(p) == {("w1", "w2"), ("w2", "reader")}


def test_two_atomic_adders_have_no_edge_between_them_and_both_feed_the_reader():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        acc = pl.create_tensor([R, C], pl.FP32, init_value=0)
        for b in pl.spmd(2, name_hint="add1"):
            pl.assemble(acc, x[:, :], [0, 0], atomic=pl.AtomicType.Add)
        for b in pl.spmd(2, name_hint="add2"):
            pl.assemble(acc, x[:, :], [0, 0], atomic=pl.AtomicType.Add)
        with pl.at(name_hint="reader"):
            y[:, :] = acc[:, :]
        return y

    x = x_in()
    y = torch.zeros(R, C)
    p = run(k, x, y, check=True)
    assert edges(p) == {("add1", "reader"), ("add2", "reader")}
    assert torch.allclose(y, 4 * x)
    assert p.stats.tasks == 3  # init_value=0 is part of the allocation: no seed task


def test_atomic_adder_waits_for_a_plain_writer_and_a_writer_waits_for_adders():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        acc = pl.create_tensor([R, C], pl.FP32)
        with pl.at(name_hint="seed"):
            acc[:, :] = pl.full([R, C], pl.FP32, 0.0)
        with pl.at(name_hint="add"):
            pl.assemble(acc, x[:, :], [0, 0], atomic=pl.AtomicType.Add)
        with pl.at(name_hint="overwrite"):
            acc[:, :] = x[:, :]
        with pl.at(name_hint="reader"):
            y[:, :] = acc[:, :]
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == {("seed", "add"), ("seed", "overwrite"), ("add", "overwrite"), ("overwrite", "reader")}


def test_explicit_deps_and_invalid_ids():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(name_hint="a") as a:
            y[0:16, :] = x[0:16, :]
        with pl.at(name_hint="b", deps=[a, -1, None]):
            y[16:32, :] = x[16:32, :]
        s = pl.spmd(1, name_hint="c", deps=[a])
        for _ in s:
            pass
        with pl.at(name_hint="d", deps=[s]):
            pass
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == {("a", "b"), ("a", "c"), ("c", "d")}
    assert p.graph[1].explicit == [0]


def test_deps_on_a_future_task_is_a_dsl_error():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32]):
        with pl.at(name_hint="a", deps=[5]):
            pass

    with pytest.raises(DslError, match="unknown task id 5"):
        run(k, x_in())


def test_task_dummy_joins_and_returns_minus_one_without_deps():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(name_hint="a") as a:
            y[0:16, :] = x[0:16, :]
        with pl.at(name_hint="b") as b:
            y[16:32, :] = x[16:32, :]
        join = pl.system.task_dummy(deps=[a, b])
        none = pl.system.task_dummy(deps=[])
        invalid = pl.system.task_dummy(deps=[-1])
        with pl.at(name_hint="after", deps=[join, none, invalid]):
            pass
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == {("a", "task_dummy"), ("b", "task_dummy"), ("task_dummy", "after")}
    assert p.stats.tasks == 3 and p.stats.dummies == 1 and p.stats.edges == 3
    assert [t.kind for t in p.graph] == ["at", "at", "dummy", "at"]


def test_manual_scope_derives_nothing_but_keeps_explicit_deps():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32)
        with pl.manual_scope():
            with pl.at(name_hint="w") as w:
                s[:, :] = x[:, :]
            with pl.at(name_hint="r_no_dep"):
                y[0:16, :] = s[0:16, :]
            with pl.at(name_hint="r_dep", deps=[w]):
                y[16:32, :] = s[16:32, :]
        with pl.at(name_hint="auto_reader"):  # outside the manual scope: derivation is back on,
            y[:, :] = s[:, :]                  # but manual tasks registered no producers
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == {("w", "r_dep")}
    assert [t.manual for t in p.graph] == [True, True, True, False]


def test_manual_scope_cannot_nest_or_run_inside_a_task():
    @pl.jit
    def nested(x: pl.Tensor[[R, C], pl.FP32]):
        with pl.manual_scope():
            with pl.manual_scope():
                pass

    with pytest.raises(DslError, match="cannot nest"):
        run(nested, x_in())


def test_manual_dep_tensor_is_excluded_from_derivation():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32, manual_dep=True)
        with pl.at(name_hint="w"):
            s[:, :] = x[:, :]
        with pl.at(name_hint="r"):
            y[:, :] = s[:, :]
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == set()


def test_creator_retention_records_buffers_and_init_value_adds_no_task():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        z = pl.create_tensor([R, C], pl.FP32, init_value=0)
        m = pl.create_tensor([R, C], pl.INT32, init_value=-1)
        with pl.at(name_hint="use"):
            y[:, :] = z[:, :] + x[:, :]
            t = m[0:1, :]
        return y

    x = x_in()
    y = torch.zeros(R, C)
    p = run(k, x, y, check=True)
    assert p.stats.tasks == 1 and p.stats.edges == 0 and len(p.graph) == 1
    ids = {b.name: b.id for b in p.buffers}
    assert p.graph[0].buffers == {ids["x"], ids["y"], ids["z"], ids["m"]}
    assert torch.equal(y, x)
    assert p.stats.init_bytes == R * C * 4 * 2


def test_statement_order_is_not_ordering_disjoint_tasks_have_no_edges():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        for b in pl.spmd(2, name_hint="half"):
            y[b * 16:(b + 1) * 16, :] = x[b * 16:(b + 1) * 16, :]
        with pl.at(name_hint="other"):
            t = x[:, :]
        return y

    p = run(k, x_in(), torch.zeros(R, C))
    assert edges(p) == set()


def test_inout_argument_orders_writer_after_earlier_writer_via_the_argument():
    @pl.jit
    def k(state: pl.InOut[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(name_hint="inc1"):
            state[:, :] = state[:, :] + 1.0
        with pl.at(name_hint="inc2"):
            state[:, :] = state[:, :] + 1.0
        return state

    st = torch.zeros(R, C)
    p = run(k, st, check=True)
    assert edges(p) == {("inc1", "inc2")}
    assert (st == 2).all()


def test_footprints_of_views_map_to_root_coordinates():
    @pl.jit
    def k(x: pl.Tensor[[4, 8, C], pl.FP32], y: pl.Out[pl.Tensor[[4, 8, C], pl.FP32]]):
        with pl.at(name_hint="copy_plane2"):
            y[2, :, :] = x[2, :, :]
        with pl.at(name_hint="read_row"):
            t = y[2, 3:5, 4:8]
        with pl.at(name_hint="read_other_plane"):
            t = y[1, :, :]
        return y

    p = k.run(torch.randn(4, 8, C), torch.zeros(4, 8, C), config=pto.RunConfig(keep_footprints=True))
    fps = {t.name: [str(f) for f in p.footprints(t)] for t in p.graph}
    assert fps["copy_plane2"] == ["read x[16:24, 0:16]", "write y[16:24, 0:16]"]
    assert fps["read_row"] == ["read y[19:21, 4:8]"]
    assert edges(p) == {("copy_plane2", "read_row")}


# ---- footprint coalescing --------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pto.runtime.deps import coalesce  # noqa: E402

box = st.tuples(st.integers(0, 6), st.integers(1, 4), st.integers(0, 6), st.integers(1, 4)).map(
    lambda t: (t[0], t[0] + t[1], t[2], t[2] + t[3]))


def cells(boxes):
    return {(r, c) for r0, r1, c0, c1 in boxes for r in range(r0, r1) for c in range(c0, c1)}


@settings(max_examples=300, deadline=None)
@given(st.lists(box, max_size=8))
def test_coalesce_keeps_exactly_the_union_and_never_grows(boxes):
    out = coalesce(boxes)
    assert cells(out) == cells(boxes)
    assert len(out) <= len(set(boxes))


def test_coalesce_merges_the_blocks_of_a_row_split_task():
    rows = [(16 * b, 16 * b + 16, 0, 64) for b in range(8)]
    assert coalesce(rows) == [(0, 128, 0, 64)]
    cols = [(0, 4, 32 * b, 32 * b + 32) for b in range(4)]
    assert coalesce(cols) == [(0, 4, 0, 128)]
