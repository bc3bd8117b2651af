"""Task scopes, loops and system constructs (hw-native-sys/pypto `docs/en/user/`; language/control.py, system.py)."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

N = 4


def run(kernel, *args):
    return kernel.run(*args, config=pto.RunConfig(keep_footprints=True))


def test_spmd_forms_give_one_task_of_n_blocks_and_task_ids():
    seen = {}

    @pl.jit
    def k(x: pl.Tensor[[N, 8], pl.FP32], y: pl.Out[pl.Tensor[[N, 8], pl.FP32]]):
        s = pl.spmd(N, name_hint="loop_form")
        for b in s:
            assert pl.tile.get_block_idx() == b
            y[b:b + 1, :] = x[b:b + 1, :]
        seen["loop"] = s.tid

        @pl.spmd(2, name_hint="decorator_form", deps=[s])
        def deco(b):
            seen.setdefault("deco_blocks", []).append(pl.tile.get_block_idx())
        seen["deco"] = deco

        with pl.spmd(1, name_hint="with_form") as tid:
            seen["with"] = tid
            seen["with_idx"] = pl.tile.get_block_idx()
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="at_form") as tid:
            seen["at"] = tid
        empty = pl.spmd(0, name_hint="empty")
        for _ in empty:
            raise AssertionError("no blocks")
        return y

    x = torch.randn(N, 8)
    y = torch.zeros(N, 8)
    p = run(k, x, y)
    assert torch.equal(x, y)
    assert (seen["loop"], seen["deco"], seen["with"], seen["at"]) == (0, 1, 2, 3)
    assert seen["deco_blocks"] == [0, 1] and seen["with_idx"] == 0
    assert [(t.name, t.kind, len(t.blocks)) for t in p.graph] == [
        ("loop_form", "spmd", N), ("decorator_form", "spmd", 2), ("with_form", "at", 1), ("at_form", "at", 1),
        ("empty", "spmd", 0)]
    assert p.stats.tasks == 5 and p.stats.blocks == N + 4
    assert p.graph[1].preds == {0}


def test_task_scopes_cannot_nest_and_with_spmd_needs_one_block():
    @pl.jit
    def nested(x: pl.Tensor[[N], pl.FP32]):
        with pl.at(name_hint="outer"):
            with pl.at(name_hint="inner"):
                pass

    with pytest.raises(DslError, match="cannot nest"):
        run(nested, torch.zeros(N))

    @pl.jit
    def with_many(x: pl.Tensor[[N], pl.FP32]):
        with pl.spmd(2):
            pass

    with pytest.raises(DslError, match=r"`with pl.spmd\(2\)`"):
        run(with_many, torch.zeros(N))

    with pytest.raises(DslError, match="negative block count"):
        pl.spmd(-1)


def test_block_index_and_task_ops_outside_tasks_are_errors():
    with pytest.raises(DslError, match="outside a task block"):
        pl.tile.get_block_idx()

    @pl.jit
    def k(x: pl.Tensor[[N], pl.FP32]):
        pl.system.syncall()

    with pytest.raises(DslError, match="inside an spmd block"):
        run(k, torch.zeros(N))

    @pl.jit
    def dummy_in_task(x: pl.Tensor[[N], pl.FP32]):
        with pl.at(name_hint="t"):
            pl.system.task_dummy(deps=[0])

    with pytest.raises(DslError, match="orchestration-only"):
        run(dummy_in_task, torch.zeros(N))


def test_syncall_phases_run_every_block_before_the_next_phase():
    order = []

    @pl.jit
    def k(x: pl.Tensor[[N], pl.FP32]):
        @pl.spmd(3, name_hint="phased")
        def body(b):
            order.append(("p0", b))
            yield pl.system.syncall()
            order.append(("p1", b))
            yield pl.system.syncall()
            order.append(("p2", b))

    p = run(k, torch.zeros(N))
    assert order == [("p0", 0), ("p0", 1), ("p0", 2), ("p1", 0), ("p1", 1), ("p1", 2),
                     ("p2", 0), ("p2", 1), ("p2", 2)]
    assert p.stats.tasks == 1 and sorted({blk.phase for blk in p.graph[0].blocks}) == [0, 1, 2]


def test_syncall_blocks_must_agree_on_the_barrier_count():
    @pl.jit
    def k(x: pl.Tensor[[N], pl.FP32]):
        @pl.spmd(2, name_hint="uneven")
        def body(b):
            if b == 0:
                yield pl.system.syncall()

    with pytest.raises(DslError, match="different number of syncall barriers"):
        run(k, torch.zeros(N))


def test_loops_inside_a_task_are_plain_loops_and_in_orchestration_are_scopes():
    seen = []

    @pl.jit
    def k(x: pl.Tensor[[N], pl.FP32]):
        for i in pl.range(3):
            s = pl.create_tensor([16], pl.FP32)
            seen.append(s.buf.offset)
        for i in pl.pipeline(1, 3, stage=2):
            pass
        for i in pl.parallel(2):
            pass
        with pl.at(name_hint="inner_loops"):
            total = 0
            for i in pl.range(0, 10, 3):
                total += i
            for i in pl.unroll(2):
                total += 100
            seen.append(total)

    p = run(k, torch.zeros(N))
    assert seen == [0, 0, 0, 218] and p.stats.heap_peak_bytes == 512


def test_range_bounds_may_be_runtime_scalars():
    got = []

    @pl.jit
    def k(x: pl.Tensor[[N], pl.INT32], n: pl.Scalar[pl.INT32]):
        m = pl.read(x, [0])
        for i in pl.range(m, n):
            got.append(i)

    run(k, torch.tensor([2, 0, 0, 0], dtype=torch.int32), 5)
    assert got == [2, 3, 4]


def test_program_return_values_map_back_to_caller_tensors():
    @pl.jit
    def k(x: pl.Tensor[[N], pl.FP32], y: pl.Out[pl.Tensor[[N], pl.FP32]], z: pl.InOut[pl.Tensor[[N], pl.FP32]]):
        with pl.at(name_hint="t"):
            y[0:N] = x[0:N]
            z[0:N] = z[0:N] + x[0:N]
        return y, [z, 3]

    x, y, z = torch.ones(N), torch.zeros(N), torch.ones(N)
    ry, (rz, three) = k(x, y, z)
    assert ry is y and rz is z and three == 3
    assert (y == 1).all() and (z == 2).all()
