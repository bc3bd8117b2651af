"""The DSL constructs pypto-lib kernels use (pto.language.compat_ops), the `with pl.spmd`
rewrite and the reference harness conventions; each checked against torch or by hand."""

import warnings

import pytest
import torch

import pto
import pto.language as pl
from pto.compat import golden as G
from pto.compat.transform import compile_pypto
from pto.errors import DslError
from pto.language import compat_ops
from pto.language.tile_ops import Tile

CHECK = pto.RunConfig(check=True)


@pytest.fixture
def pypto_mode():
    compat_ops.mode.pypto = True
    yield
    compat_ops.mode.pypto = False


def _exec(src: str, name: str):
    """Define a kernel from pypto source through the rewrite; returns the named object."""
    ns = {"pl": pl}
    exec(compile_pypto(src, "<pypto-test>"), ns)  # noqa: S102
    return ns[name]


SPMD_SRC = '''
@pl.jit
def k(x: pl.Tensor[[12, 4], pl.FP32], y: pl.Out[pl.Tensor[[12, 4], pl.FP32]], seen: list):
    with pl.spmd(3, name_hint="rows") as tid:
        b = pl.tile.get_block_idx()
        y[b * 4:(b + 1) * 4, :] = pl.mul(x[b * 4:(b + 1) * 4, :], float(b + 1))
    seen.append(tid)
    with pl.spmd(2, name_hint="after", deps=[tid]):
        for i in pl.range(2):
            if i == 1:
                break
    return y
'''


def test_with_spmd_body_runs_once_per_block_and_binds_the_task_id():
    k = _exec(SPMD_SRC, "k")
    x, y, seen = torch.randn(12, 4), torch.zeros(12, 4), []
    prog = k.run(x, y, seen, config=CHECK)
    scale = torch.tensor([1.0] * 4 + [2.0] * 4 + [3.0] * 4).reshape(12, 1)
    assert torch.equal(y, x * scale)
    assert prog.stats.tasks == 2 and prog.stats.blocks == 5
    assert seen == [prog.graph.tasks[0].id]
    assert prog.graph.tasks[1].preds == {prog.graph.tasks[0].id} or prog.stats.edges == 1


def test_with_spmd_rewrite_keeps_line_numbers_for_errors():
    src = "\n".join(["@pl.jit", "def k(x: pl.Tensor[[4, 4], pl.FP32]):", "    with pl.spmd(2):",
                     "        pl.tile.get_block_idx()", "        x[0:8, :]", ""])
    k = _exec(src, "k")
    with pytest.raises(DslError, match="<pypto-test>:5"):
        k.run(torch.zeros(4, 4), config=CHECK)


def test_break_directly_in_a_with_spmd_body_is_rejected_with_its_line():
    src = "for i in range(2):\n    with pl.spmd(2):\n        break\n"
    with pytest.raises(DslError, match="<pypto-test>:3: `break` directly inside"):
        compile_pypto(src, "<pypto-test>")


def test_create_tensor_in_a_task_is_a_poisoned_tile_only_under_pypto(pypto_mode):
    @pl.jit
    def k(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(name_hint="t"):
            acc = pl.create_tensor([4, 8], dtype=pl.FP32)
            assert isinstance(acc, Tile) and bool(torch.isnan(acc.data).all())
            acc = pl.assemble(acc, x[:, 0:4], [0, 0])
            acc = pl.assemble(acc, x[:, 4:8], [0, 4])
            y[:, :] = acc
        return y

    x, y = torch.randn(4, 8), torch.zeros(4, 8)
    k.run(x, y, config=CHECK)
    assert torch.equal(y, x)
    compat_ops.mode.pypto = False
    with pytest.raises(DslError, match="orchestration-only"):
        k.run(x, y, config=CHECK)


def test_written_in_is_an_error_in_pto_and_a_warning_under_pypto(pypto_mode):
    @pl.jit
    def k(x: pl.Tensor[[4, 4], pl.FP32]):
        with pl.at(name_hint="t"):
            x[:, :] = pl.full([4, 4], pl.FP32, 2.0)

    x = torch.zeros(4, 4)
    with pytest.warns(UserWarning, match="declared In but written"):
        k.run(x, config=CHECK)
    assert torch.equal(x, torch.full((4, 4), 2.0))
    compat_ops.mode.pypto = False
    with pytest.raises(DslError, match="declared In"):
        k.run(x, config=CHECK)


def test_store_of_a_tile_with_fewer_valid_rows_than_the_window_writes_the_valid_rows():
    @pl.jit
    def k(x: pl.Tensor[[16, 4], pl.FP32], y: pl.InOut[pl.Tensor[[8, 4], pl.FP32]]):
        with pl.at(name_hint="t"):
            t = pl.slice(x, [16, 4], [0, 0], valid_shape=[6, 4])
            y[0:8, :] = t  # 6 valid rows into an 8-row window
        return y

    x, y = torch.randn(16, 4), torch.full((8, 4), -7.0)
    k.run(x, y, config=CHECK)
    assert torch.equal(y[:6], x[:6]) and torch.equal(y[6:], torch.full((2, 4), -7.0))


def test_gather_row_concat_transpose_view_and_tiles():
    @pl.jit
    def k(src: pl.Tensor[[6, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 12], pl.FP32]]):
        with pl.at(name_hint="t"):
            l1 = pl.create_l1([4, 6], pl.FP32, transpose=True)
            for r in pl.range(6):  # GM row r lands as column r
                l1 = pl.gather_row(l1, src, [0, r], [r, 0], [1, 4], transpose=True)
            tv = pl.tile.transpose_view(l1)  # [6, 4] = src
            y[:, :] = pl.concat(l1, pl.move(pl.transpose(tv, 0, 1), target_memory=pl.MemorySpace.Vec))
        return y

    src, y = torch.randn(6, 4), torch.zeros(4, 12)
    k.run(src, y, config=CHECK)
    assert torch.equal(y, torch.cat([src.t(), src.t()], dim=1))


def test_gather_row_valid_shape_bounds_the_written_region():
    @pl.jit
    def k(src: pl.Tensor[[5, 4], pl.FP32], y: pl.Out[pl.Tensor[[8, 4], pl.FP32]]):
        with pl.at(name_hint="t"):
            t = pl.full([8, 4], pl.FP32, 0.0)
            t = pl.gather_row(t, src, [2, 0], [2, 0], [8, 4], valid_shape=[3, 4])  # rows 2..4 of src
            y[:, :] = t
        return y

    src, y = torch.randn(5, 4), torch.zeros(8, 4)
    k.run(src, y, config=CHECK)
    want = torch.zeros(8, 4)
    want[2:5] = src[2:5]
    assert torch.equal(y, want)


def test_array_split_aiv_prefetch_and_scalar_casts():
    arr = pl.array.create(3, pl.TASK_ID)
    assert arr == [-1, -1, -1] and pl.array.create(2, pl.INT32) == [0, 0]
    with pytest.raises(DslError, match="out of range"):
        arr[3] = 1
    assert repr(pl.Array[4, pl.TASK_ID]) == "pl.Array[4, TASK_ID]" or "Array" in repr(pl.Array[4, pl.TASK_ID])
    assert pl.cast(3.9, pl.INDEX) == 3 and pl.cast(-3.9, pl.INT32) == -3 and pl.const(1, pl.INT32) == 1
    assert pl.cast(1.0000001, pl.BF16) == 1.0 and pl.cast(7, pl.FP32) == 7.0
    with pytest.raises(DslError, match="out of range"):
        pl.cast(300, pl.INT8)

    @pl.jit
    def k(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]]):
        tids = pl.array.create(2, pl.TASK_ID)
        for i in pl.range(2):
            with pl.at(name_hint="half") as t:
                pl.prefetch(x, [0, 0], [4, 4])
                for lane in pl.split_aiv(2, mode=pl.SplitMode.NONE):
                    r = i * 2 + lane
                    y[r:r + 1, :] = pl.add(x[r:r + 1, :], float(lane))
            tids[i] = t
        pl.system.task_dummy(deps=[tids])
        return y

    x, y = torch.randn(4, 4), torch.zeros(4, 4)
    prog = k.run(x, y, config=CHECK)
    assert torch.equal(y, x + torch.tensor([0.0, 1.0, 0.0, 1.0]).reshape(4, 1))
    assert prog.stats.tasks == 2


def test_bind_dynamic_checks_the_dim():
    T = pl.dynamic("T")

    @pl.jit
    def k(x: pl.Tensor[[T, 4], pl.FP32], d: int):
        x.bind_dynamic(d, T)

    k.run(torch.zeros(3, 4), 0)
    with pytest.raises(DslError, match="bind_dynamic: dim 2 outside rank 2"):
        k.run(torch.zeros(3, 4), 2)


# ---- the reference harness conventions ---------------------------------------------------------

def test_comparators_take_the_reference_keywords():
    a, e = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.5])
    cmp = G.ratio_allclose(max_error_ratio=0.0)  # tolerances from the run
    assert cmp(a, e, actual_outputs={}, expected_outputs={}, inputs={}, rtol=0.0, atol=0.6)[0]
    assert not cmp(a, e, rtol=0.0, atol=0.4)[0]
    assert G.ratio_reldiff(diff_thd=0.2, pct_thd=0.0)(a, e, rtol=1, atol=1)[0]
    with pytest.raises(ValueError):
        G.ratio_allclose(max_error_ratio=2.0)


def test_topk_pair_compare_tolerates_ties_only():
    vals = torch.tensor([[5.0, 5.0, 1.0]])
    cmp = G.topk_pair_compare("v")
    ok, _ = cmp(torch.tensor([[1, 0, 2]]), torch.tensor([[0, 1, 2]]), actual_outputs={"v": vals})
    assert ok
    bad_vals = torch.tensor([[4.0, 5.0, 1.0]])  # not sorted where the indices differ
    ok, detail = cmp(torch.tensor([[1, 0, 2]]), torch.tensor([[0, 1, 2]]), actual_outputs={"v": bad_vals})
    assert not ok and "2 index positions" in detail
    assert not cmp(torch.tensor([[0]]), torch.tensor([[0]]), actual_outputs={})[0]


def test_validate_golden_checks_all_then_raises_one_assertion(capsys):
    out = {"a": torch.zeros(3), "b": torch.ones(3)}
    gold = {"a": torch.ones(3), "b": torch.ones(3)}
    with pytest.raises(AssertionError, match=r"Output\(s\) does not match golden: \['a'\]"):
        G.validate_golden(out, gold)
    text = capsys.readouterr().out
    assert "'a' FAIL" in text and "'b' PASS" in text


def test_tensor_spec_resident_is_validated_like_the_reference():
    assert G.TensorSpec("x", [2], torch.float32, resident="stacked").is_resident
    assert not G.TensorSpec("x", [2], torch.float32, resident=False).is_resident
    for bad in (True, -1, "cards"):
        with pytest.raises(ValueError):
            G.TensorSpec("x", [2], torch.float32, resident=bad)


def test_run_jit_without_golden_reports_validation_skipped(capsys):
    @pl.jit
    def k(x: pl.Tensor[[2], pl.FP32], y: pl.Out[pl.Tensor[[2], pl.FP32]]):
        with pl.at(name_hint="t"):
            y[0:2] = x[0:2]
        return y

    with warnings.catch_warnings():
        r = G.run_jit(k, [G.TensorSpec("x", [2], torch.float32), G.TensorSpec("y", [2], torch.float32, is_output=True)])
    assert r.passed and "validation skipped" in capsys.readouterr().out
    assert G.run_jit(k, [], compile_only=True, runtime_dir="d").error == "runtime_dir is incompatible with compile_only"


def test_matmul_acc_init_cond_store_window_and_unit_batch_matmul():
    @pl.jit
    def k(x: pl.Tensor[[16, 32], pl.BF16], w: pl.Tensor[[2, 8, 32], pl.BF16],
          y: pl.Out[pl.Tensor[[16, 16], pl.FP32]], first: pl.Out[pl.Tensor[[2, 1], pl.FP32]]):
        for g in pl.spmd(2, name_hint="proj"):
            acc = pl.create_tile([1, 16, 8], pl.FP32)  # NaN in check mode: init_cond must not read it
            for kb in pl.range(2):
                acc = pl.matmul_acc(acc, x[:, kb * 16:(kb + 1) * 16], w[g:g + 1, :, kb * 16:(kb + 1) * 16],
                                    b_trans=True, init_cond=(kb == 0))
            pl.assemble(y, acc, [0, g * 8])  # the unit batch dim is dropped
            pl.store(pl.reshape(acc, [16, 8]), [g, 0], first, shapes=[1, 1])  # the [0, 0] element only
        return y

    x, w = torch.randn(16, 32).bfloat16(), torch.randn(2, 8, 32).bfloat16()
    y, first = torch.zeros(16, 16), torch.zeros(2, 1)
    k.run(x, w, y, first, config=CHECK)
    want = torch.cat([x.float() @ w[0].float().T, x.float() @ w[1].float().T], dim=1)
    assert torch.allclose(y, want, atol=1e-4, rtol=1e-5)
    assert torch.equal(first[:, 0], torch.stack([y[0, 0], y[0, 8]]))


SYNCALL_SRC = '''
@pl.jit
def k(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]], last: list):
    scratch = pl.create_tensor([4, 8], dtype=pl.FP32)
    with pl.spmd(4, name_hint="two_phase", sync_start=True) as tid:
        b = pl.tile.get_block_idx()
        scratch[b:b + 1, :] = pl.mul(x[b:b + 1, :], 2.0)
        pl.system.syncall()
        nb = (b + 1) % 4
        y[b:b + 1, :] = scratch[nb:nb + 1, :]
        seen = b
    for c in pl.spmd(2, name_hint="for_form"):
        pl.system.syncall()
    last.append((tid, seen))
    return y
'''


def test_syncall_in_a_with_spmd_body_is_a_barrier_across_blocks():
    k = _exec(SYNCALL_SRC, "k")
    x, y, last = torch.randn(4, 8), torch.zeros(4, 8), []
    prog = k.run(x, y, last, config=CHECK)
    assert torch.equal(y, torch.roll(x * 2, -1, 0))  # each block read the row its neighbour wrote
    assert last == [(prog.graph.tasks[0].id, 3)]  # a body-assigned name read after the task (nonlocal)
    assert prog.stats.tasks == 2


def test_get_block_num_kernel_type_and_sync_mode():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[3], pl.INT32]]):
        for b in pl.spmd(3, name_hint="n"):
            pl.write(y, [b], pl.tile.get_block_num() * 10 + b)
        return y

    y = torch.zeros(3, dtype=torch.int32)
    k.run(y, config=CHECK)
    assert y.tolist() == [30, 31, 32]
    assert (pl.KernelType.MIX, pl.SyncAllMode.SOFT) == ("mix", "soft")
    with pytest.raises(DslError, match="outside a task block"):
        pl.tile.get_block_num()
