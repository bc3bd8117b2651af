"""GM tensor operations: loads with valid shapes and padding, stores of the valid
region, atomic adds, scalar reads/writes, views, and their errors
(hw-native-sys/pypto `docs/en/user/`; language/tensor_ops.py)."""

import math

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

R, C = 8, 16


def run(kernel, *args, **cfg):
    return kernel.run(*args, config=pto.RunConfig(keep_footprints=True, **cfg))


def fps(prog):
    return {t.name: [str(f) for f in prog.footprints(t)] for t in prog.graph}


def test_valid_shape_load_pads_and_records_only_the_valid_box():
    seen = {}

    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32]):
        with pl.at(name_hint="load"):
            seen["zero"] = pl.slice(x, [4, 16], [6, 0], valid_shape=[2, 10])
            seen["min"] = pl.slice(x, [4, 16], [6, 0], valid_shape=[2, 10], pad_value=pl.PadValue.min)
            seen["old"] = pl.load(x, [6, 0], [4, 16], valid_shapes=[2, 10])

    x = torch.arange(R * C, dtype=torch.float32).reshape(R, C)
    p = run(k, x)
    z = seen["zero"]
    assert z.shape == (4, 16) and z.valid == (2, 10)
    assert torch.equal(z.data[:2, :10], x[6:8, :10]) and (z.data[2:] == 0).all() and (z.data[:, 10:] == 0).all()
    m = seen["min"].data
    assert (m[2:] == torch.finfo(torch.float32).min).all() and torch.equal(m[:2, :10], x[6:8, :10])
    assert torch.equal(seen["old"].data, z.data)
    assert fps(p)["load"] == ["read x[6:8, 0:10]"]


def test_valid_shape_window_may_extend_past_the_tensor_but_not_the_valid_region():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32]):
        with pl.at(name_hint="load"):
            t = pl.slice(x, [16, 32], [0, 0], valid_shape=[R, C])
            assert t.shape == (16, 32)
            pl.slice(x, [4, 16], [6, 0], valid_shape=[3, 16])

    with pytest.raises(DslError, match=r"valid window \[6, 9\) out of bounds of dim 0"):
        run(k, torch.zeros(R, C))


def test_store_writes_only_the_valid_region():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(name_hint="store"):
            t = pl.set_validshape(pl.full([4, 16], pl.FP32, 7.0), 2, 5)
            pl.assemble(y, t, [6, 11])          # window [6:8, 11:16] fits; the tile would not
            y[0:2, 0:5] = t                      # subscript form: the valid region is the window
            pl.store(pl.full([1, 16], pl.FP32, 1.0), [3, 0], y)
        return y

    y = torch.zeros(R, C)
    p = run(k, torch.zeros(R, C), y)
    want = torch.zeros(R, C)
    want[6:8, 11:16] = 7
    want[0:2, 0:5] = 7
    want[3] = 1
    assert torch.equal(y, want)
    assert fps(p)["store"] == ["write y[0:2, 0:5]", "write y[3:4, 0:16]", "write y[6:8, 11:16]"]


def test_atomic_add_accumulates_and_is_recorded_as_atomic():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], acc: pl.InOut[pl.Tensor[[R, C], pl.FP32]]):
        for b in pl.spmd(3, name_hint="adds"):
            pl.assemble(acc, x[:, :], [0, 0], atomic=pl.AtomicType.Add)
            pl.store(x[0:2, :], [2, 0], acc, atomic=pl.AtomicType.Add)
        return acc

    x = torch.randn(R, C)
    acc = torch.ones(R, C)
    p = run(k, x, acc, check=True)
    want = 1 + 3 * x
    want[2:4] += 3 * x[0:2]
    assert torch.allclose(acc, want, atol=1e-6)
    assert fps(p)["adds"] == ["read x[0:8, 0:16]", "atomic_add acc[0:8, 0:16]"]


def test_atomic_add_errors():
    @pl.jit
    def bad_dtype(y: pl.Out[pl.Tensor[[4], pl.INT64]]):
        with pl.at(name_hint="a"):
            pl.assemble(y, pl.full([4], pl.INT64, 1), [0], atomic=pl.AtomicType.Add)

    with pytest.raises(DslError, match="atomic add on dtype pl.INT64"):
        run(bad_dtype, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(DslError, match="atomic add needs a GM target"):
        pl.assemble(pl.full([2], pl.FP32, 0.0), pl.full([2], pl.FP32, 1.0), [0], atomic=pl.AtomicType.Add)


def test_store_errors_dtype_bounds_rank():
    def prog(body):
        @pl.jit
        def k(y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
            with pl.at(name_hint="bad"):
                body(y)
        return k

    with pytest.raises(DslError, match="storing a pl.BF16 tile into a pl.FP32 tensor"):
        run(prog(lambda y: pl.assemble(y, pl.full([2, 2], pl.BF16, 0.0), [0, 0])), torch.zeros(R, C))
    with pytest.raises(DslError, match=r"store window \[7, 9\) out of bounds of dim 0"):
        run(prog(lambda y: pl.assemble(y, pl.full([2, 2], pl.FP32, 0.0), [7, 0])), torch.zeros(R, C))
    with pytest.raises(DslError, match="rank mismatch"):
        run(prog(lambda y: pl.assemble(y, pl.full([2], pl.FP32, 0.0), [0, 0])), torch.zeros(R, C))
    with pytest.raises(DslError, match=r"tile of shape \[2, 3\] assigned to window \[2, 2\]"):
        run(prog(lambda y: y.__setitem__((slice(0, 2), slice(0, 2)), pl.full([2, 3], pl.FP32, 0.0))),
            torch.zeros(R, C))


def test_subscripts_elements_mixed_and_out_of_bounds():
    seen = {}

    @pl.jit
    def k(x: pl.Tensor[[2, R, C], pl.FP32]):
        with pl.at(name_hint="reads"):
            seen["elem"] = x[1, 2, 3]
            seen["row"] = x[1, 2, 4:8]
            seen["plane"] = x[0]
            seen["read"] = pl.read(x, [0, 7, 15])
        seen["orch"] = pl.read(x, [1, 0, 0])

    x = torch.randn(2, R, C)
    run(k, x)
    assert seen["elem"] == x[1, 2, 3].item() and isinstance(seen["elem"], float)
    assert torch.equal(seen["row"].data, x[1, 2, 4:8]) and seen["row"].shape == (4,)
    assert seen["plane"].shape == (R, C)
    assert seen["read"] == x[0, 7, 15].item() and seen["orch"] == x[1, 0, 0].item()

    @pl.jit
    def oob(x: pl.Tensor[[2, R, C], pl.FP32]):
        with pl.at(name_hint="oob"):
            t = x[0, 0:9, :]

    with pytest.raises(DslError, match=r"window \[0, 9\) out of bounds of dim 1 .*task 'oob' block 0"):
        run(oob, x)

    @pl.jit
    def strided(x: pl.Tensor[[2, R, C], pl.FP32]):
        with pl.at(name_hint="s"):
            t = x[0, 0:8:2, :]

    with pytest.raises(DslError, match="strided"):
        run(strided, x)


def test_scalar_write_and_read_errors():
    @pl.jit
    def k(yi: pl.Out[pl.Tensor[[4], pl.INT32]], y: pl.Out[pl.Tensor[[4], pl.FP32]]):
        with pl.at(name_hint="w"):
            pl.write(yi, [1], 7)
            pl.write(yi, 2, 3.0)
            pl.write(y, [0], 0.25)
            y[3] = 1.5
        return yi

    yi, y = torch.zeros(4, dtype=torch.int32), torch.zeros(4)
    run(k, yi, y)
    assert yi.tolist() == [0, 7, 3, 0] and y.tolist() == [0.25, 0, 0, 1.5]

    @pl.jit
    def frac(yi: pl.Out[pl.Tensor[[4], pl.INT32]]):
        with pl.at(name_hint="w"):
            pl.write(yi, [1], 2.7)

    with pytest.raises(DslError, match="fractional value 2.7 into integer tensor yi"):
        run(frac, torch.zeros(4, dtype=torch.int32))

    @pl.jit
    def oob(yi: pl.Out[pl.Tensor[[4], pl.INT32]]):
        with pl.at(name_hint="w"):
            pl.write(yi, [4], 1)

    with pytest.raises(DslError, match="index 4 out of bounds"):
        run(oob, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(DslError, match="index 9 out of bounds"):
        @pl.jit
        def roob(x: pl.Tensor[[4], pl.INT32]):
            pl.read(x, [9])
        run(roob, torch.zeros(4, dtype=torch.int32))

    @pl.jit
    def ranks(x: pl.Tensor[[4, 3], pl.INT32], y: pl.Out[pl.Tensor[[4, 3], pl.INT32]], op: str):
        if op == "read":
            pl.read(x, [1])
        with pl.at(name_hint="w"):
            if op == "write":
                pl.write(y, [0], 1)
            else:
                pl.write(y, [0, 3], 1)

    a, b = torch.zeros(4, 3, dtype=torch.int32), torch.zeros(4, 3, dtype=torch.int32)
    with pytest.raises(DslError, match=r"^kernel ranks, at .*test_tensor_ops.py:\d+: pl.read: 1 indices for x of rank 2$"):
        run(ranks, a, b, "read")
    with pytest.raises(DslError, match=r"^kernel ranks, task 'w' \(#0\) block 0, at .*test_tensor_ops.py:\d+: "
                                       r"pl.write: 1 indices for y of rank 2$"):
        run(ranks, a, b, "write")
    with pytest.raises(DslError, match=r"^kernel ranks: pl.write: index 3 out of bounds of dim 1 of y \(extent 3\) "
                                       r"\(task 'w' block 0 at .*test_tensor_ops.py:\d+\)$"):
        run(ranks, a, b, "oob")


def test_orchestration_views_and_gm_writes_outside_tasks():
    seen = {}

    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        top = x[0:4, :]
        v = pl.slice(x, [2, 8], [4, 8])
        r = pl.reshape(x, [R * C])
        seen["types"] = (type(top).__name__, top.shape, v.shape, r.shape, pl.tensor.dim(x, 1))
        with pl.at(name_hint="copy"):
            y[0:2, 0:8] = v[:, :]
            y[2:4, :] = top[1:3, :]
        y[0:1, :] = pl.full([1, C], pl.FP32, 0.0)  # a GM write outside a task
        return y

    x = torch.randn(R, C)
    with pytest.raises(DslError, match="must run inside a task"):
        run(k, x, torch.zeros(R, C))
    assert seen["types"] == ("GMTensor", (4, C), (2, 8), (R * C,), C)


def test_gm_view_footprints_map_to_the_root():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        v = pl.slice(x, [2, 8], [4, 8])
        flat = pl.reshape(y, [R * C])
        with pl.at(name_hint="copy"):
            pl.assemble(flat, v[1, :], [C * 5])  # row 5, cols 0..7 of y
        return y

    x = torch.randn(R, C)
    y = torch.zeros(R, C)
    p = run(k, x, y)
    assert torch.equal(y[5, 0:8], x[5, 8:16])
    assert fps(p)["copy"] == ["read x[5:6, 8:16]", "write y[5:6, 0:8]"]


def test_reshape_errors_and_create_tensor_placement():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32]):
        pl.reshape(x, [3, 5])

    with pytest.raises(DslError, match="cannot reshape x"):
        run(k, torch.zeros(R, C))

    @pl.jit
    def noncontig(x: pl.Tensor[[R, C], pl.FP32]):
        pl.reshape(x[:, 0:4], [R * 4])

    with pytest.raises(DslError, match="not contiguous"):
        run(noncontig, torch.zeros(R, C))

    @pl.jit
    def in_task(x: pl.Tensor[[R, C], pl.FP32]):
        with pl.at(name_hint="t"):
            pl.create_tensor([4], pl.FP32)

    with pytest.raises(DslError, match="orchestration-only"):
        run(in_task, torch.zeros(R, C))

    @pl.jit
    def negative(x: pl.Tensor[[R, C], pl.FP32]):
        pl.create_tensor([4, -1], pl.FP32)

    with pytest.raises(DslError, match="negative dim 1"):
        run(negative, torch.zeros(R, C))
    with pytest.raises(DslError, match="outside a running"):
        pl.create_tensor([4], pl.FP32)


def test_scalar_min_max():
    assert pl.max(3, 16) == 16 and pl.min(3, 16) == 3 and pl.max(2.5, -1) == 2.5
    assert math.isclose(pl.min(0.1, 0.2), 0.1)
