"""Every tile op against a torch reference (hw-native-sys/pypto `docs/en/user/`; tile_ops.py).

Tile ops run outside a program too (on plain ``Tile`` values), which is how
they are tested here; counting and footprints are covered in tests/runtime.
"""

import math

import pytest
import torch

import pto.language as pl
from pto.errors import DslError
from pto.language.tile_ops import Tile, tile_assemble, tile_reshape, tile_slice

torch.manual_seed(0)
FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def T(x):
    return Tile(x.clone())


def rand(shape, dtype=torch.float32, positive=False):
    x = torch.randn(shape)
    if positive:
        x = x.abs() + 0.1
    return x.to(dtype)


# ---- elementwise -----------------------------------------------------------------------------

BINARY = [
    ("add", pl.add, torch.add), ("sub", pl.sub, torch.sub), ("mul", pl.mul, torch.mul),
    ("div", pl.div, torch.div), ("maximum", pl.maximum, torch.maximum), ("minimum", pl.minimum, torch.minimum),
]


@pytest.mark.parametrize("name, op, ref", BINARY)
@pytest.mark.parametrize("dtype", FLOATS)
def test_binary_tile_tile(name, op, ref, dtype):
    a, b = rand((4, 8), dtype), rand((4, 8), dtype, positive=name == "div")
    out = op(T(a), T(b))
    assert out.data.dtype == dtype
    assert torch.equal(out.data, ref(a, b))


@pytest.mark.parametrize("name, op, ref", BINARY)
def test_binary_tile_scalar(name, op, ref):
    a = rand((3, 5))
    want = ref(a, torch.tensor(0.75)) if name in ("maximum", "minimum") else ref(a, 0.75)
    assert torch.equal(op(T(a), 0.75).data, want)


def test_scalar_on_the_left():
    a = rand((64, 64), positive=True)
    assert torch.equal(pl.sub(2.0, T(a)).data, 2.0 - a)
    exact = (3.0 / a.double()).float()  # correctly rounded quotient
    assert torch.equal(pl.div(3.0, T(a)).data, exact)  # one IEEE division, not 3 * (1 / a)
    assert not torch.equal(exact, 3.0 * torch.reciprocal(a))  # (the two differ on some of these values)
    assert torch.equal(pl.add(2.0, T(a)).data, 2.0 + a)
    assert torch.equal(pl.mul(2.0, T(a)).data, 2.0 * a)


def test_python_operators_map_to_ops():
    a, b = rand((32, 32)), rand((32, 32), positive=True)
    ta, tb = T(a), T(b)
    assert torch.equal((ta + tb).data, a + b)
    assert torch.equal((ta - tb).data, a - b)
    assert torch.equal((ta * tb).data, a * b)
    assert torch.equal((ta / tb).data, a / b)
    assert torch.equal((-ta).data, -a)
    assert torch.equal((1.5 - ta).data, 1.5 - a)
    assert torch.equal((3.0 / tb).data, (3.0 / b.double()).float())
    assert torch.equal((2 * ta + 1).data, 2 * a + 1)


def test_integer_elementwise_stays_integer():
    a = torch.tensor([[-7, 7, 3, 0]], dtype=torch.int32)
    b = torch.tensor([[2, -2, 5, 1]], dtype=torch.int32)
    assert pl.add(T(a), T(b)).data.tolist() == [[-5, 5, 8, 1]]
    assert pl.mul(T(a), 3).data.tolist() == [[-21, 21, 9, 0]]
    assert pl.div(T(a), T(b)).data.tolist() == [[-3, -3, 0, 0]]  # truncating integer division
    assert pl.maximum(T(a), 0).data.tolist() == [[0, 7, 3, 0]]
    assert pl.abs(T(a)).data.tolist() == [[7, 7, 3, 0]]
    assert pl.neg(T(a)).data.dtype == torch.int32


def test_integer_tile_rejects_a_fractional_scalar():
    a = Tile(torch.tensor([[1, 2]], dtype=torch.int32))
    with pytest.raises(DslError, match="INT32"):
        pl.mul(a, 0.5)
    with pytest.raises(DslError, match="INT32"):
        pl.maximum(a, 2.5)
    assert pl.mul(a, 2.0).data.tolist() == [[2, 4]]  # an integral float is fine


def test_binary_rejects_promotion_and_broadcast():
    with pytest.raises(DslError, match="dtype mismatch"):
        pl.add(T(rand((2, 2))), T(rand((2, 2), torch.bfloat16)))
    with pytest.raises(DslError, match="shape mismatch"):
        pl.add(T(rand((2, 2))), T(rand((2, 1))))
    with pytest.raises(DslError, match="expected a tile"):
        pl.add(1.0, 2.0)


UNARY = [("exp", pl.exp, torch.exp, False), ("log", pl.log, torch.log, True), ("sqrt", pl.sqrt, torch.sqrt, True),
         ("rsqrt", pl.rsqrt, torch.rsqrt, True), ("recip", pl.recip, torch.reciprocal, True),
         ("neg", pl.neg, torch.neg, False), ("abs", pl.abs, torch.abs, False)]


@pytest.mark.parametrize("name, op, ref, positive", UNARY)
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary(name, op, ref, positive, dtype):
    a = rand((4, 6), dtype, positive=positive)
    out = op(T(a))
    assert out.data.dtype == dtype and torch.equal(out.data, ref(a))


def test_unary_edge_values():
    a = torch.tensor([[0.0, -1.0, math.inf]])
    assert pl.log(T(a)).data[0, 0] == -math.inf and math.isnan(pl.log(T(a)).data[0, 1])
    assert pl.recip(T(a)).data[0, 0] == math.inf and pl.recip(T(a)).data[0, 2] == 0
    assert torch.allclose(pl.rsqrt(T(a), high_precision=True).data, torch.rsqrt(a), equal_nan=True)


@pytest.mark.parametrize("op", [pl.exp, pl.log, pl.sqrt, pl.rsqrt, pl.recip])
def test_float_only_unary_rejects_integers(op):
    with pytest.raises(DslError, match="float"):
        op(Tile(torch.ones(2, 2, dtype=torch.int32)))


# ---- reductions and expands -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_row_and_col_reductions(dtype):
    a = rand((5, 7), dtype)
    assert torch.equal(pl.row_sum(T(a)).data, a.float().sum(1, keepdim=True).to(dtype))
    assert torch.equal(pl.col_sum(T(a)).data, a.float().sum(0, keepdim=True).to(dtype))
    assert torch.equal(pl.row_max(T(a)).data, a.amax(1, keepdim=True))
    assert torch.equal(pl.col_max(T(a)).data, a.amax(0, keepdim=True))
    assert torch.equal(pl.row_min(T(a)).data, a.amin(1, keepdim=True))
    assert pl.row_sum(T(a)).shape == (5, 1) and pl.col_sum(T(a)).shape == (1, 7)


def test_bf16_row_sum_accumulates_in_fp32():
    a = torch.full((1, 256), 1.0, dtype=torch.bfloat16)
    a[0, 0] = 256.0  # sequential BF16 summation would stall at 256 + 1 = 256
    assert pl.row_sum(T(a)).data.item() == 512.0


def test_integer_reductions():
    a = torch.tensor([[1, -5, 3], [4, 4, -9]], dtype=torch.int32)
    assert pl.row_sum(T(a)).data.tolist() == [[-1], [-1]]
    assert pl.row_max(T(a)).data.tolist() == [[3], [4]]
    assert pl.col_max(T(a)).data.tolist() == [[4, 4, 3]]


def test_reductions_need_rank2():
    with pytest.raises(DslError, match="rank-2"):
        pl.row_sum(Tile(torch.ones(2, 2, 2)))


def test_reductions_include_padding():
    t = pl.set_validshape(Tile(torch.tensor([[1.0, 2.0, 5.0]])), 1, 2)
    assert pl.row_sum(t).data.item() == 8.0
    assert pl.row_sum(pl.fillpad(t, pl.PadValue.zero)).data.item() == 3.0


EXPANDS = [
    ("row_expand_mul", pl.row_expand_mul, torch.mul, "row"), ("row_expand_div", pl.row_expand_div, torch.div, "row"),
    ("row_expand_sub", pl.row_expand_sub, torch.sub, "row"), ("row_expand_add", pl.row_expand_add, torch.add, "row"),
    ("col_expand_mul", pl.col_expand_mul, torch.mul, "col"), ("col_expand_add", pl.col_expand_add, torch.add, "col"),
    ("col_expand_sub", pl.col_expand_sub, torch.sub, "col"), ("col_expand_div", pl.col_expand_div, torch.div, "col"),
    ("col_expand_expdif", pl.col_expand_expdif, lambda a, b: torch.exp(a - b), "col"),
    ("row_expand", pl.row_expand, lambda a, b: b.expand_as(a), "row"),
    ("col_expand", pl.col_expand, lambda a, b: b.expand_as(a), "col"),
]


@pytest.mark.parametrize("name, op, ref, axis", EXPANDS)
def test_expand_ops(name, op, ref, axis):
    lhs = rand((4, 6))
    rhs = rand((4, 1) if axis == "row" else (1, 6), positive=True)
    out = op(T(lhs), T(rhs))
    assert out.shape == (4, 6) and torch.equal(out.data, ref(lhs, rhs))


@pytest.mark.parametrize("name, op, ref, axis", EXPANDS)
def test_expand_ops_check_the_rhs_shape_and_dtype(name, op, ref, axis):
    bad = (1, 6) if axis == "row" else (4, 1)
    with pytest.raises(DslError, match="rhs must be"):
        op(T(rand((4, 6))), T(rand(bad)))
    good = (4, 1) if axis == "row" else (1, 6)
    with pytest.raises(DslError, match="dtype mismatch"):
        op(T(rand((4, 6))), T(rand(good, torch.bfloat16)))


# ---- constants ------------------------------------------------------------------------------------

def test_full_and_arange():
    assert torch.equal(pl.full([2, 3], pl.BF16, 1.5).data, torch.full((2, 3), 1.5, dtype=torch.bfloat16))
    assert pl.full([2, 2], pl.INT32, -1).data.tolist() == [[-1, -1], [-1, -1]]
    assert pl.full([2, 2], pl.INT32, 3.0).data.dtype == torch.int32
    with pytest.raises(DslError, match="float value"):
        pl.full([2], pl.INT32, 3.5)
    assert pl.arange(3, [1, 4]).data.tolist() == [[3, 4, 5, 6]]
    assert pl.arange(3, [1, 4], descending=True).data.tolist() == [[3, 2, 1, 0]]
    assert pl.arange(0, [1, 3], dtype=pl.UINT32).data.dtype == torch.uint32
    with pytest.raises(DslError, match="leading dims"):
        pl.arange(0, [2, 4])
    with pytest.raises(DslError, match="integer dtype"):
        pl.arange(0, [1, 4], dtype=pl.FP32)


# ---- gather / transpose / reshape / slice / assemble ------------------------------------------------

def test_gather_index_form_per_row_and_broadcast():
    x = rand((3, 5))
    idx = torch.tensor([[4, 0, 0, 2], [1, 1, 3, 3], [0, 1, 2, 3]], dtype=torch.int32)
    assert torch.equal(pl.gather(T(x), dim=-1, index=T(idx)).data, torch.gather(x, 1, idx.long()))
    row = torch.tensor([[1, 0, 3, 2]], dtype=torch.int32)
    out = pl.gather(T(x), dim=-1, index=T(row))
    assert torch.equal(out.data, x[:, [1, 0, 3, 2]])


def test_gather_errors():
    x = T(rand((2, 4)))
    with pytest.raises(DslError, match="out of range"):
        pl.gather(x, dim=-1, index=Tile(torch.tensor([[4]], dtype=torch.int32)))
    with pytest.raises(DslError, match="out of range"):
        pl.gather(x, dim=-1, index=Tile(torch.tensor([[-1]], dtype=torch.int32)))
    with pytest.raises(DslError, match="dim=-1"):
        pl.gather(x, dim=0, index=Tile(torch.tensor([[0]], dtype=torch.int32)))
    with pytest.raises(DslError, match="index rows"):
        pl.gather(x, dim=-1, index=Tile(torch.zeros(3, 1, dtype=torch.int32)))
    with pytest.raises(DslError, match="integer"):
        pl.gather(x, dim=-1, index=Tile(torch.zeros(2, 1)))
    with pytest.raises(DslError, match="index= is required"):
        pl.gather(x)  # neither index= nor mask_pattern= (mask patterns: test_sort_select_ops.py)


def test_transpose_swaps_data_and_valid_shape():
    a = torch.arange(6.0).reshape(2, 3)
    t = pl.transpose(pl.set_validshape(T(a), 1, 2))
    assert torch.equal(t.data, a.t()) and t.data.is_contiguous() and t.valid == (2, 1)


def test_tile_reshape_slice_assemble():
    a = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(tile_reshape(T(a), [2, 6]).data, a.reshape(2, 6))
    with pytest.raises(DslError, match="cannot reshape"):
        tile_reshape(T(a), [5, 2])
    s = tile_slice(T(a), [2, 2], [1, 1])
    assert torch.equal(s.data, a[1:3, 1:3])
    s.data[0, 0] = -1  # a copy
    assert a[1, 1] == 5
    with pytest.raises(DslError, match="out of tile"):
        tile_slice(T(a), [2, 2], [2, 3])
    dst = T(torch.zeros(3, 4))
    out = tile_assemble(dst, T(torch.ones(2, 2)), [1, 2])
    want = torch.zeros(3, 4)
    want[1:3, 2:4] = 1
    assert torch.equal(out.data, want) and dst.data.sum() == 0
    assert torch.equal(pl.slice(T(a), [1, 4], [2, 0]).data, a[2:3])
    assert torch.equal(pl.reshape(T(a), [12]).data, a.reshape(12))


def test_tile_subscript_read_and_write():
    t = T(torch.zeros(2, 3))
    t[0, 1:3] = 2.0
    t[1] = Tile(torch.ones(3))
    assert t.data.tolist() == [[0, 2, 2], [1, 1, 1]]
    assert torch.equal(t[1:2, :].data, torch.ones(1, 3))
    with pytest.raises(DslError, match="dtype"):
        t[0] = Tile(torch.ones(3, dtype=torch.int32))
    i = Tile(torch.zeros(1, 2, dtype=torch.int32))
    pl.write(i, [0, 1], 7)
    assert pl.read(i, [0, 1]) == 7


# ---- matmul ------------------------------------------------------------------------------------------

def test_bf16_matmul_accumulates_in_fp32():
    a, b = rand((8, 64), torch.bfloat16), rand((64, 16), torch.bfloat16)
    out = pl.matmul(T(a), T(b), out_dtype=pl.FP32)
    assert out.data.dtype == torch.float32
    assert torch.allclose(out.data, (a.double() @ b.double()).float(), rtol=1e-6, atol=1e-5)
    assert torch.equal(out.data, a.float() @ b.float())


def test_matmul_transposed_operands_and_batches():
    a, b = rand((4, 8), torch.bfloat16), rand((6, 8), torch.bfloat16)
    assert torch.equal(pl.matmul(T(a), T(b), b_trans=True).data, a.float() @ b.float().t())
    at = rand((8, 4), torch.bfloat16)
    assert torch.equal(pl.matmul(T(at), T(b), a_trans=True, b_trans=True).data, at.float().t() @ b.float().t())
    x, y = rand((2, 3, 4)), rand((2, 4, 5))
    assert torch.equal(pl.matmul(T(x), T(y)).data, x @ y)


def test_int8_matmul_is_exact_int32():
    a = torch.full((2, 512), 127, dtype=torch.int8)
    b = torch.full((512, 3), -128, dtype=torch.int8)
    out = pl.matmul(T(a), T(b), out_dtype=pl.INT32)
    assert out.data.dtype == torch.int32 and (out.data == 127 * -128 * 512).all()
    ar = torch.randint(-128, 128, (5, 37), dtype=torch.int8)
    br = torch.randint(-128, 128, (37, 7), dtype=torch.int8)
    assert torch.equal(pl.matmul(T(ar), T(br)).data, (ar.long() @ br.long()).int())


def test_matmul_errors():
    with pytest.raises(DslError, match="K mismatch"):
        pl.matmul(T(rand((2, 3))), T(rand((4, 2))))
    with pytest.raises(DslError, match="operand dtypes differ"):
        pl.matmul(T(rand((2, 3))), T(rand((3, 2), torch.bfloat16)))
    with pytest.raises(DslError, match="out_dtype"):
        pl.matmul(T(rand((2, 3), torch.bfloat16)), T(rand((3, 2), torch.bfloat16)), out_dtype=pl.BF16)
    with pytest.raises(DslError, match="unsupported operand"):
        pl.matmul(Tile(torch.ones(2, 2, dtype=torch.int32)), Tile(torch.ones(2, 2, dtype=torch.int32)))


def test_matmul_acc():
    a1, b1, a2, b2 = (rand(s, torch.bfloat16) for s in ((4, 8), (8, 5), (4, 8), (8, 5)))
    acc = pl.matmul(T(a1), T(b1))
    acc = pl.matmul_acc(acc, T(a2), T(b2))
    assert torch.equal(acc.data, a1.float() @ b1.float() + a2.float() @ b2.float())
    with pytest.raises(DslError, match="accumulator"):
        pl.matmul_acc(Tile(torch.zeros(4, 5, dtype=torch.bfloat16)), T(a2), T(b2))


# ---- valid shape and padding ---------------------------------------------------------------------------

def test_set_validshape_is_metadata_only():
    a = torch.arange(6.0).reshape(2, 3)
    t = pl.set_validshape(T(a), 1, 2)
    assert t.valid == (1, 2) and torch.equal(t.data, a)
    with pytest.raises(DslError, match="outside tile"):
        pl.set_validshape(T(a), 3, 1)


@pytest.mark.parametrize("pad, fill", [(pl.PadValue.zero, 0.0), (pl.PadValue.min, torch.finfo(torch.float32).min),
                                       (pl.PadValue.max, torch.finfo(torch.float32).max), (0, 0.0),
                                       (-math.inf, torch.finfo(torch.float32).min),
                                       (math.inf, torch.finfo(torch.float32).max)])
def test_fillpad_float(pad, fill):
    t = pl.set_validshape(T(torch.ones(3, 4)), 2, 3)
    out = pl.fillpad(t, pad)
    want = torch.full((3, 4), fill)
    want[:2, :3] = 1
    assert torch.equal(out.data, want) and out.valid is None


def test_fillpad_integer_and_bf16():
    t = pl.set_validshape(Tile(torch.ones(2, 2, dtype=torch.int32)), 1, 1)
    assert pl.fillpad(t, pl.PadValue.min).data.tolist() == [[1, -2 ** 31], [-2 ** 31, -2 ** 31]]
    b = pl.fillpad(pl.set_validshape(Tile(torch.ones(1, 2, dtype=torch.bfloat16)), 1, 1), pl.PadValue.min)
    assert b.data[0, 1].item() == torch.finfo(torch.bfloat16).min
    with pytest.raises(DslError, match="pad value"):
        pl.fillpad(t, 5)


def test_fillpad_then_softmax_ignores_padding():
    x = torch.randn(2, 5)
    t = pl.fillpad(pl.set_validshape(T(torch.cat([x, torch.zeros(2, 3)], 1)), 2, 5), pl.PadValue.min)
    e = pl.exp(pl.row_expand_sub(t, pl.row_max(t)))
    p = pl.row_expand_div(e, pl.row_sum(e))
    assert torch.allclose(p.data[:, :5], torch.softmax(x, -1), atol=1e-7) and (p.data[:, 5:] == 0).all()


def test_ops_keep_the_valid_shape_of_their_first_operand():
    t = pl.set_validshape(T(torch.ones(2, 4)), 1, 3)
    assert (t * 2.0).valid == (1, 3) and pl.exp(t).valid == (1, 3) and pl.cast(t, pl.BF16).valid == (1, 3)
    assert pl.row_expand_mul(t, T(torch.ones(2, 1))).valid == (1, 3)
    assert pl.row_sum(t).valid is None
