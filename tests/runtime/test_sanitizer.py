"""Check mode, part 1: the definedness sanitizer (docs/dsl.md, issue 6).

* every tile op propagates definedness masks by its rule, checked against an
  independent element-by-element reference (and a coverage test that fails
  when a new tile op is added without a rule test);
* loads/stores, valid-shape padding, fillpad, atomic adds, poisoning;
* undefined scalars used as index / loop bound / branch raise at once;
* the UndefinedOutputError message;
* the ``init_value`` mutation hook, and mutation tests on small kernels with
  the seed-kernel patterns (split-K accumulator, -1 sentinel index list with
  a block table, 8-row pad, INT8 padding rows read by a matmul).

Masks hold undefinedness tags (0 = defined); the tests build tiles with raw
tags directly (any value below ``TAINT_BASE`` names an allocation id).
"""

import itertools
import re

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, UndefinedOutputError, UndefinedValueError
from pto.language import tile_ops
from pto.language._ctx import rel_path
from pto.language.tile_ops import Tile
from pto.language.typing import ScalarValue
from pto.runtime import RunConfig, drop_init_values

CHECK = RunConfig(check=True)
THIS_FILE = __file__


def _site_of(fn, needle: str) -> str:
    """``file:line`` of the first source line of ``fn`` containing ``needle``."""
    import inspect
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if needle in line:
            return f"{rel_path(inspect.getsourcefile(fn))}:{start + i}"  # messages name paths relative to cwd
    raise AssertionError(f"{needle!r} not in {fn}")


# ============================================================================
# 1. Tile-op propagation rules, op by op
# ============================================================================

M, K, N = 4, 5, 6
TAG_A, TAG_B = 3, 7  # two different origins; AND of definedness keeps the larger tag


def _mask(shape, cells, tag):
    m = torch.zeros(shape, dtype=torch.int32)
    for c in cells:
        m[c] = tag
    return m


def _tile(shape, cells=(), tag=TAG_A, dtype=torch.float32, lo=0.5, hi=2.0):
    g = torch.Generator().manual_seed(hash((tuple(shape), tag)) % 1000)
    if dtype.is_floating_point:
        data = (torch.rand(shape, generator=g) * (hi - lo) + lo).to(dtype)
    else:
        data = torch.randint(0, 5, shape, generator=g).to(dtype)
    return Tile(data, _mask(shape, cells, tag) if cells else None)


def _m(t: Tile, shape=None) -> list:
    """The tile's mask as nested lists (zeros when the tile has none)."""
    if t.mask is None:
        return torch.zeros(shape or t.shape, dtype=torch.int32).tolist()
    return t.mask.tolist()


def _ref_elementwise(ma, mb):
    return [[max(x, y) for x, y in zip(ra, rb)] for ra, rb in zip(ma, mb)]


A_CELLS = [(0, 1), (2, 3), (3, 0)]
B_CELLS = [(0, 1), (1, 5), (3, 2)]

BINARY = {
    "add": tile_ops.add, "sub": tile_ops.sub, "mul": tile_ops.mul, "div": tile_ops.div,
    "maximum": tile_ops.maximum, "minimum": tile_ops.minimum,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_elementwise_is_and(name):
    a, b = _tile((M, N), A_CELLS, TAG_A), _tile((M, N), B_CELLS, TAG_B)
    out = BINARY[name](a, b)
    assert _m(out) == _ref_elementwise(_m(a), _m(b))
    # defined on one side only: the other side's mask survives unchanged
    assert _m(BINARY[name](a, _tile((M, N)))) == _m(a)
    assert BINARY[name](_tile((M, N)), _tile((M, N), tag=1)).mask is None


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_scalar(name):
    a = _tile((M, N), A_CELLS, TAG_A)
    assert _m(BINARY[name](a, 1.5)) == _m(a)
    undef = ScalarValue(2.0, False, "test", TAG_B)
    assert _m(BINARY[name](a, undef)) == [[TAG_B] * N for _ in range(M)]
    assert _m(BINARY[name](a, ScalarValue(2.0, True))) == _m(a)


def test_python_operators_follow_the_ops():
    a, b = _tile((M, N), A_CELLS, TAG_A), _tile((M, N), B_CELLS, TAG_B)
    ref = _ref_elementwise(_m(a), _m(b))
    for out in (a + b, a - b, a * b, a / b):
        assert _m(out) == ref
    for out in (2.0 - a, 2.0 / a, 3.0 * a, -a):
        assert _m(out) == _m(a)
    undef = ScalarValue(2.0, False, "test", TAG_B)
    for out in (undef - a, undef * a, a + undef, undef / a):
        assert _m(out) == [[TAG_B] * N for _ in range(M)]


UNARY = {"neg": tile_ops.neg, "abs": tile_ops.abs, "exp": tile_ops.exp, "log": tile_ops.log,
         "sqrt": tile_ops.sqrt, "rsqrt": tile_ops.rsqrt, "recip": tile_ops.recip}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_keeps_mask(name):
    a = _tile((M, N), A_CELLS, TAG_A)
    out = UNARY[name](a)
    assert _m(out) == _m(a)
    assert UNARY[name](_tile((M, N))).mask is None


@pytest.mark.parametrize("dst,mode", [(pl.BF16, "round"), (pl.INT32, "rint"), (pl.INT8, "trunc"),
                                      (pl.FP32, "none"), (pl.FP16, "floor")])
def test_cast_keeps_mask(dst, mode):
    a = _tile((M, N), A_CELLS, TAG_A)
    assert _m(tile_ops.cast(a, dst, mode=mode)) == _m(a)


REDUCE = {"row_sum": (tile_ops.row_sum, 1), "row_max": (tile_ops.row_max, 1), "row_min": (tile_ops.row_min, 1),
          "col_sum": (tile_ops.col_sum, 0), "col_max": (tile_ops.col_max, 0)}


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduction_is_all_along_the_axis(name):
    fn, axis = REDUCE[name]
    a = _tile((M, N), A_CELLS, TAG_A)
    ma = _m(a)
    out = fn(a)
    if axis == 1:
        ref = [[max(row)] for row in ma]
    else:
        ref = [[max(ma[i][j] for i in range(M)) for j in range(N)]]
    assert _m(out) == ref
    # exactly the rows/cols that hold an undefined element are undefined
    assert sum(v != 0 for r in _m(out) for v in r) == len({c[1 - axis] for c in A_CELLS})


EXPAND_ROW = {"row_expand": tile_ops.row_expand, "row_expand_mul": tile_ops.row_expand_mul,
              "row_expand_div": tile_ops.row_expand_div, "row_expand_sub": tile_ops.row_expand_sub,
              "row_expand_add": tile_ops.row_expand_add}
EXPAND_COL = {"col_expand": tile_ops.col_expand, "col_expand_mul": tile_ops.col_expand_mul,
              "col_expand_add": tile_ops.col_expand_add, "col_expand_sub": tile_ops.col_expand_sub,
              "col_expand_div": tile_ops.col_expand_div, "col_expand_expdif": tile_ops.col_expand_expdif}


@pytest.mark.parametrize("name", sorted(EXPAND_ROW) + sorted(EXPAND_COL))
@pytest.mark.parametrize("lhs_masked", [True, False])
def test_expand_ops_and_with_broadcast(name, lhs_masked):
    row = name in EXPAND_ROW
    fn = EXPAND_ROW.get(name) or EXPAND_COL[name]
    lhs = _tile((M, N), A_CELLS if lhs_masked else (), TAG_A)
    rhs = _tile((M, 1), [(2, 0)], TAG_B) if row else _tile((1, N), [(0, 4)], TAG_B)
    out = fn(lhs, rhs)
    ml, mr = _m(lhs), _m(rhs)
    ref = [[max(ml[i][j], mr[i][0] if row else mr[0][j]) for j in range(N)] for i in range(M)]
    assert _m(out) == ref
    # the result's mask is a private tensor (not a broadcast view): in-place updates stay local
    out[0:1, 0:1] = tile_ops.full([1, 1], pl.FP32, 0.0)
    assert _m(rhs) == mr and _m(lhs) == ml


@pytest.mark.parametrize("a_trans,b_trans", list(itertools.product([False, True], repeat=2)))
def test_matmul_by_row_of_a_and_column_of_b(a_trans, b_trans):
    a_cells, b_cells = [(1, 2)], [(3, 4), (0, 0)]
    a = _tile((M, K), a_cells, TAG_A, dtype=torch.bfloat16)
    b = _tile((K, N), b_cells, TAG_B, dtype=torch.bfloat16)
    if a_trans:
        a = Tile(a.data.T.contiguous(), a.mask.T.contiguous())
    if b_trans:
        b = Tile(b.data.T.contiguous(), b.mask.T.contiguous())
    out = tile_ops.matmul(a, b, a_trans=a_trans, b_trans=b_trans)
    ref = [[max([TAG_A if (i, k) in a_cells else 0 for k in range(K)] +
                [TAG_B if (k, j) in b_cells else 0 for k in range(K)]) for j in range(N)] for i in range(M)]
    assert _m(out) == ref
    # one undefined element of A poisons one output row, of B one output column
    assert sum(v != 0 for r in _m(tile_ops.matmul(_tile((M, K), [(1, 2)], dtype=torch.bfloat16),
                                                _tile((K, N), dtype=torch.bfloat16))) for v in r) == N


def test_matmul_int8_and_batched():
    a = _tile((2, M, K), [(1, 0, 3)], TAG_A, dtype=torch.int8)
    b = _tile((2, K, N), [(0, 2, 5)], TAG_B, dtype=torch.int8)
    out = tile_ops.matmul(a, b)
    assert out.data.dtype == torch.int32
    ref = torch.zeros(2, M, N, dtype=torch.int32)
    ref[1, 0, :] = TAG_A
    ref[0, :, 5] = TAG_B
    assert torch.equal(out.mask, ref)


def test_matmul_acc_ands_accumulator_and_product():
    acc = _tile((M, N), [(3, 3)], TAG_B)
    a = _tile((M, K), [(0, 1)], TAG_A, dtype=torch.bfloat16)
    b = _tile((K, N), dtype=torch.bfloat16)
    out = tile_ops.matmul_acc(acc, a, b)
    ref = [[TAG_A if i == 0 else (TAG_B if (i, j) == (3, 3) else 0) for j in range(N)] for i in range(M)]
    assert _m(out) == ref


def test_gather_moves_masks_with_the_data():
    x = _tile((M, N), [(0, 4), (2, 1)], TAG_A)
    idx = Tile(torch.tensor([[4, 0, 4], [1, 1, 2], [1, 5, 0], [3, 3, 3]], dtype=torch.int32))
    out = tile_ops.gather(x, index=idx)
    assert _m(out) == [[TAG_A, 0, TAG_A], [0, 0, 0], [TAG_A, 0, 0], [0, 0, 0]]
    # an undefined index yields an undefined element, even if its garbage value is out of range
    bad = Tile(torch.tensor([[0, -85, 2]], dtype=torch.int32), _mask((1, 3), [(0, 1)], TAG_B))
    out = tile_ops.gather(_tile((M, N)), index=bad)  # one index row broadcast to every row
    assert _m(out) == [[0, TAG_B, 0]] * M


def test_transpose_reshape_slice_assemble_move_masks():
    a = _tile((M, N), A_CELLS, TAG_A)
    assert _m(tile_ops.transpose(a)) == [list(r) for r in zip(*_m(a))]
    assert torch.equal(tile_ops.tile_reshape(a, [2, M * N // 2]).mask, a.mask.reshape(2, -1))
    s = tile_ops.tile_slice(a, [2, 4], [2, 0])
    assert _m(s) == [r[0:4] for r in _m(a)[2:4]]
    dst = _tile((M, N))
    out = tile_ops.tile_assemble(dst, _tile((2, 2), [(1, 1)], TAG_B), [1, 2])
    assert _m(out) == [[TAG_B if (i, j) == (2, 3) else 0 for j in range(N)] for i in range(M)]
    assert dst.mask is None  # the source tile is unchanged


def test_set_validshape_and_fillpad():
    a = _tile((M, N), [(0, 0), (3, 5), (1, 4)], TAG_A)
    v = tile_ops.set_validshape(a, 2, 5)
    assert _m(v) == _m(a) and v.valid == (2, 5)
    for pad in (tile_ops.PadValue.zero, tile_ops.PadValue.min, tile_ops.PadValue.max):
        f = tile_ops.fillpad(v, pad)
        # padding is defined (it is the pad value); the valid region keeps its mask
        assert _m(f) == [[TAG_A if (i, j) in [(0, 0), (1, 4)] else 0 for j in range(N)] for i in range(M)]
    assert _m(tile_ops.fillpad(a)) == _m(a)


def test_full_and_arange():
    assert tile_ops.full([2, 3], pl.FP32, 1.0).mask is None
    assert tile_ops.arange(0, [1, 8]).mask is None
    u = tile_ops.full([2, 3], pl.FP32, ScalarValue(1.0, False, "t", TAG_B))
    assert _m(u) == [[TAG_B] * 3] * 2  # an undefined value fills an undefined tile, no error yet


def test_tile_element_updates_do_not_leak_into_shared_masks():
    a = _tile((M, N), A_CELLS, TAG_A)
    b = tile_ops.exp(a)  # shares a's mask tensor
    b[0:1, 1:2] = tile_ops.full([1, 1], pl.FP32, 1.0)
    pl.write(b, [2, 3], 5.0)
    assert _m(a)[0][1] == TAG_A and _m(a)[2][3] == TAG_A
    assert _m(b)[0][1] == 0 and _m(b)[2][3] == 0
    c = tile_ops.exp(_tile((M, N)))
    c[1, 1] = ScalarValue(1.0, False, "t", TAG_B)
    pl.write(c, [0, 0], ScalarValue(1.0, False, "t", TAG_A))
    assert _m(c)[1][1] == TAG_B and _m(c)[0][0] == TAG_A
    assert isinstance(pl.read(c, [1, 1]), ScalarValue) and pl.read(c, [2, 2]) == c.data[2, 2].item()


RULE_TESTED = (set(BINARY) | set(UNARY) | set(REDUCE) | set(EXPAND_ROW) | set(EXPAND_COL) |
               {"cast", "matmul", "matmul_acc", "gather", "transpose", "tile_reshape", "tile_slice",
                "tile_assemble", "set_validshape", "fillpad", "full", "arange"} |
               # mask rules of the sort / select family: tests/language/test_sort_select_ops.py
               {"sort32", "mrgsort", "cmp", "select", "MaskPattern", "CMP_MODES"})


def test_every_tile_op_has_a_rule_test():
    ops = set(tile_ops.__all__) - {"Tile", "PadValue", "CAST_MODES"}
    assert ops - RULE_TESTED == set(), "tile ops without a mask-propagation test"


# ============================================================================
# 2. GM <-> tile: loads, stores, padding, atomics, poison
# ============================================================================

def _probe_kernel(capture: dict):
    @pl.jit
    def probe(x: pl.Tensor[[16, 16], pl.FP32], y: pl.PartialOut[pl.Tensor[[16, 16], pl.FP32]]):
        s = pl.create_tensor([16, 16], pl.FP32)  # undefined
        with pl.at(name_hint="half_fill"):
            s[0:8, :] = x[0:8, :]  # rows 8..15 stay undefined
        with pl.at(name_hint="probe"):
            capture["full"] = s[0:16, :]
            capture["valid"] = pl.slice(s, [8, 16], [4, 0], valid_shape=[4, 16])  # rows 4..7 only
            capture["valid_pad"] = pl.slice(s, [8, 16], [4, 0], valid_shape=[4, 16], pad_value=pl.PadValue.max)
            capture["straddle"] = pl.slice(s, [8, 16], [4, 0])  # rows 4..11
            capture["elem_def"] = pl.read(s, [7, 3])
            capture["elem_undef"] = pl.read(s, [8, 3])
            y[0:8, :] = s[0:8, :]
        capture["shadow"] = s.buf.shadow.clone()
        capture["data"] = s.data.clone()
    return probe


def test_loads_copy_the_shadow_and_padding_is_defined():
    cap = {}
    x = torch.randn(16, 16)
    y = torch.zeros(16, 16)
    _probe_kernel(cap).run(x, y, config=CHECK)
    undef_rows = lambda t: [i for i in range(t.shape[0]) if t.mask is not None and bool(t.mask[i].any())]  # noqa
    assert undef_rows(cap["full"]) == list(range(8, 16))
    assert bool((cap["full"].mask[8:] != 0).all())
    assert cap["valid"].mask is None and cap["valid_pad"].mask is None  # valid region defined, padding defined
    assert undef_rows(cap["straddle"]) == [4, 5, 6, 7]
    assert cap["elem_def"] == x[7, 3].item() and not isinstance(cap["elem_def"], ScalarValue)
    assert isinstance(cap["elem_undef"], ScalarValue) and not cap["elem_undef"].defined
    # poison: undefined FP32 storage holds NaN in check mode; written rows hold data
    assert bool(torch.isnan(cap["data"][8:]).all()) and torch.equal(cap["data"][:8], x[:8])
    assert bool((cap["shadow"][:8] == 0).all()) and bool((cap["shadow"][8:] != 0).all())
    assert torch.equal(y[:8], x[:8]) and bool((y[8:] == 0).all())  # unwritten Out rows keep caller values


def test_tags_name_the_first_consumer_and_stores_carry_them():
    @pl.jit
    def relay(y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
        a = pl.create_tensor([8, 8], pl.FP32)
        b = pl.create_tensor([8, 8], pl.FP32)
        with pl.at(name_hint="move"):
            b[0:8, :] = a[0:8, :] * 2.0
        with pl.at(name_hint="out"):
            y[0:8, :] = b[0:8, :]

    prog = None
    with pytest.raises(UndefinedOutputError) as ei:
        prog = relay.run(torch.zeros(8, 8), config=CHECK)
    assert prog is None
    msg = str(ei.value)
    assert "allocation 'a' [8, 8]" in msg and "task 'move' (#0) block 0" in msg and "(load)" in msg
    assert "written to 'y' by task(s) 'out' (#1)" in msg


def test_integer_poison_pattern_and_out_parameters():
    cap = {}

    @pl.jit
    def k(y: pl.Out[pl.Tensor[[4, 8], pl.INT32]], z: pl.Out[pl.Tensor[[4, 8], pl.BF16]]):
        s = pl.create_tensor([4, 8], pl.INT32)
        with pl.at(name_hint="look"):
            cap["s"] = s[0:4, :].data.clone()
            cap["y"] = y[0:4, :]
            cap["z"] = z[0:4, :].data.clone()

    with pytest.raises(UndefinedOutputError, match="output 'y' .* never wrote"):  # y and z are never written
        k.run(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.bfloat16), config=CHECK)
    assert bool((cap["s"].view(torch.uint8) == 0xAB).all())  # fixed garbage pattern
    assert bool((cap["y"].data.view(torch.uint8) == 0xAB).all())  # Out args: undefined until written
    assert bool((cap["y"].mask != 0).all())
    assert bool(torch.isnan(cap["z"]).all())


def _atomic_kernel(capture):
    @pl.jit
    def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
        z = pl.create_tensor([8, 8], pl.FP32, init_value=0)
        u = pl.create_tensor([8, 8], pl.FP32)
        for b in pl.spmd(2, name_hint="adds"):
            pl.assemble(z, x[0:8, :], [0, 0], atomic=pl.AtomicType.Add)
            pl.assemble(u, x[0:8, :], [0, 0], atomic=pl.AtomicType.Add)  # onto undefined
        with pl.at(name_hint="read"):
            capture["z"] = z[0:8, :]
            capture["u"] = u[0:8, :]
            y[0:8, :] = z[0:8, :]
    return k


def test_atomic_add_onto_undefined_stays_undefined():
    cap = {}
    x = torch.randn(8, 8)
    y = torch.zeros(8, 8)
    prog = _atomic_kernel(cap).run(x, y, config=CHECK)
    assert cap["z"].mask is None and torch.allclose(y, 2 * x)
    assert cap["u"].mask is not None and bool((cap["u"].mask != 0).all())
    assert bool(torch.isnan(cap["u"].data).all())
    buf, cons = prog.sanitizer.origin(int(cap["u"].mask[0, 0]))
    assert buf.name == "u" and cons.task == "adds" and cons.how == "atomic add onto undefined"


def test_unchecked_run_has_no_shadows_and_no_poison():
    cap = {}
    x = torch.randn(8, 8)
    y = torch.zeros(8, 8)
    prog = _atomic_kernel(cap).run(x, y, config=RunConfig(check=False))
    assert prog.sanitizer is None and prog.races is None
    assert cap["u"].mask is None and cap["z"].mask is None


# ============================================================================
# 3. Undefined scalars: index, loop bound, branch -> UndefinedValueError at once
# ============================================================================

def _scalar_kernel(use: str, trace: list):
    @pl.jit
    def k(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
        cnt = pl.create_tensor([1, 8], pl.INT32)  # never written
        with pl.at(name_hint="use"):
            n = pl.read(cnt, [0, 2])
            trace.append("read")
            if use == "index":
                y[0:1, :] = pl.slice(x, [1, 8], [n, 0])
            elif use == "subscript":
                y[0:1, :] = x[n:n + 1, :]
            elif use == "bound":
                for _ in pl.range(n):
                    pass
            elif use == "python_range":
                for _ in range(n):
                    pass
            elif use == "branch":
                if n >= 0:
                    pass
            elif use == "arith_then_branch":
                m = (n * 2 + 1) // 3
                if m:
                    pass
            elif use == "valid_shape":
                y[0:8, :] = pl.slice(x, [8, 8], [0, 0], valid_shape=[n, 8])
            trace.append("after")
    return k


@pytest.mark.parametrize("use,word", [("index", "a slice offset"), ("subscript", "a slice start"),
                                      ("bound", "pl.range bound"), ("python_range", "an index or loop bound"),
                                      ("branch", "a branch condition"), ("arith_then_branch", "a branch condition"),
                                      ("valid_shape", "a valid extent")])
def test_undefined_scalar_use_raises_at_once(use, word):
    trace = []
    k = _scalar_kernel(use, trace)
    with pytest.raises(UndefinedValueError) as ei:
        k.run(torch.randn(8, 8), torch.zeros(8, 8), config=CHECK)
    assert trace == ["read"]  # raised at the use, before the next statement
    msg = str(ei.value)
    assert word in msg
    assert "cnt[0, 2]" in msg and "allocation 'cnt' [1, 8] pl.INT32 at " in msg
    assert "task 'use' (#0) block 0" in msg


def test_undefined_scalar_in_orchestration_bound():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[4], pl.INT32]]):
        meta = pl.create_tensor([4], pl.INT32)
        for _ in pl.range(pl.read(meta, [1])):
            pass

    with pytest.raises(UndefinedValueError, match=r"pl.range bound.*meta\[1\].*allocation 'meta'.*orchestration"):
        k.run(torch.zeros(4, dtype=torch.int32), config=CHECK)


def test_undefined_scalar_as_a_value_propagates_without_error():
    @pl.jit
    def k(x: pl.Tensor[[1, 8], pl.FP32], y: pl.Out[pl.Tensor[[1, 8], pl.FP32]],
          z: pl.Out[pl.Tensor[[1, 8], pl.FP32]]):
        junk = pl.create_tensor([1, 8], pl.FP32)
        with pl.at(name_hint="scale"):
            s = pl.read(junk, [0, 0])
            t = x[0:1, :] * s  # a value, not an index: propagates
            f = pl.full([1, 8], pl.FP32, s + 1.0)
            pl.write(z, [0, 0], s)  # scalar write of an undefined value
            z[0:1, 1:8] = x[0:1, 1:8]
            y[0:1, :] = t + f

    with pytest.raises(UndefinedOutputError, match=r"(?s)output 'y' \[1, 8\] has 8 undefined.*allocation 'junk'"):
        k.run(torch.ones(1, 8), torch.zeros(1, 8), torch.zeros(1, 8), config=CHECK)


# ============================================================================
# 4. The end-of-program check and its message
# ============================================================================

T_DYN = pl.dynamic("T")


def _splitk_kernel(padded_rows_out: bool = False, seed_rows: str = "init"):
    """Split-K: ``acc[t_pad, 32] = x @ w`` by 4 K-slices atomically added into a
    zero-initialised FP32 scratch; ``out`` gets rows [0, T) (or every padded
    row when ``padded_rows_out``).

    ``seed_rows``: ``"init"`` = ``init_value=0`` on ``acc``; ``"T"`` = no
    init_value, a seed task zero-fills rows [0, T) only (the padded rows stay
    undefined while the atomic adds cover them).
    """
    @pl.jit
    def splitk(x: pl.Tensor[[T_DYN, 64], pl.BF16], w: pl.Tensor[[64, 32], pl.BF16],
               out: pl.Out[pl.Tensor[[T_DYN, 32], pl.FP32]],
               out_pad: pl.PartialOut[pl.Tensor[[16, 32], pl.FP32]]):  # written only with padded_rows_out
        t = pl.tensor.dim(x, 0)
        t_pad = (t + 15) // 16 * 16
        if seed_rows == "init":
            acc = pl.create_tensor([t_pad, 32], pl.FP32, init_value=0, capacity=16)
        else:
            acc = pl.create_tensor([t_pad, 32], pl.FP32, capacity=16)
            with pl.at(name_hint="seed"):
                acc[0:t, :] = pl.full([t, 32], pl.FP32, 0.0)
        for kb in pl.spmd(4, name_hint="linear_splitk"):
            xt = pl.slice(x, [16, 16], [0, kb * 16], valid_shape=[t, 16])
            part = pl.matmul(xt, w[kb * 16:kb * 16 + 16, :])  # 16 rows: padded rows included
            pl.assemble(acc, part, [0, 0], atomic=pl.AtomicType.Add)
        with pl.at(name_hint="finish"):
            pl.assemble(out, pl.slice(acc, [16, 32], [0, 0], valid_shape=[t, 32]), [0, 0])
            if padded_rows_out:
                out_pad[0:16, :] = acc[0:16, :]
    return splitk


def _splitk_args(t=5):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    return x, w, torch.zeros(t, 32), torch.zeros(16, 32)


def test_splitk_passes_and_matches():
    x, w, out, out_pad = _splitk_args()
    prog = _splitk_kernel(padded_rows_out=True).run(x, w, out, out_pad, config=CHECK)
    ref = x.float() @ w.float()
    assert torch.allclose(out, ref, atol=1e-4)
    assert torch.allclose(out_pad[:5], ref, atol=1e-4) and bool((out_pad[5:] == 0).all())
    assert prog.dropped_init == []


def test_undefined_output_error_names_everything():
    x, w, out, out_pad = _splitk_args()
    k = _splitk_kernel()
    with pytest.raises(UndefinedOutputError) as ei:
        k.run(x, w, out, out_pad, config=RunConfig(check=True, drop_init=("acc",)))
    msg = str(ei.value)
    site = _site_of(_splitk_kernel, "acc = pl.create_tensor([t_pad, 32], pl.FP32, init_value=0")
    assert msg.startswith("kernel splitk: output 'out' [5, 32] has 160 undefined written element(s) in box [0:5, 0:32]")
    assert f"origin: allocation 'acc' [16, 32] pl.FP32 at {site} (init_value dropped by the mutation hook)" in msg
    add_site = _site_of(_splitk_kernel, "pl.assemble(acc, part, [0, 0], atomic=pl.AtomicType.Add)")
    assert (f"first consumed undefined by task 'linear_splitk' (#0) block 0 at {add_site} "
            "(atomic add onto undefined)") in msg
    assert "written to 'out' by task(s) 'finish' (#1)" in msg
    assert bool((out == 0).all())  # a failed program leaves the caller's tensors untouched


def test_padding_rows_garbage_detected_only_if_it_reaches_an_output():
    # zero fill covers rows [0, T) while the split-K atomic adds cover all 16 padded rows
    x, w, out, out_pad = _splitk_args(t=5)
    prog = _splitk_kernel(seed_rows="T").run(x, w, out, out_pad, config=CHECK)
    assert torch.allclose(out, x.float() @ w.float(), atol=1e-4)  # padded garbage never reached 'out'
    assert prog.sanitizer.taints  # ... although the atomic adds did consume undefined padding rows
    with pytest.raises(UndefinedOutputError) as ei:
        _splitk_kernel(padded_rows_out=True, seed_rows="T").run(x, w, out, out_pad, config=CHECK)
    msg = str(ei.value)
    assert "output 'out_pad' [16, 32] has 352 undefined written element(s) in box [5:16, 0:32]" in msg
    assert "allocation 'acc' [16, 32] pl.FP32" in msg and "no init_value, and not written before it was read" in msg
    assert "task 'linear_splitk' (#1) block 0" in msg and "atomic add onto undefined" in msg


def test_inout_written_undefined_is_reported_unwritten_out_is_not():
    @pl.jit
    def k(state: pl.InOut[pl.Tensor[[4, 8], pl.FP32]], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        junk = pl.create_tensor([4, 8], pl.FP32)
        with pl.at(name_hint="w"):
            state[2:3, :] = junk[2:3, :]

    st = torch.randn(4, 8)
    before = st.clone()
    with pytest.raises(UndefinedOutputError, match=r"output 'state' \[4, 8\] has 8 undefined written element\(s\) "
                                                   r"in box \[2:3, 0:8\]"):
        k.run(st, torch.zeros(4, 8), config=CHECK)
    assert torch.equal(st, before)


def test_reading_an_out_parameter_before_writing_it():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
        with pl.at(name_hint="rmw"):
            y[0:4, :] = y[0:4, :] + 1.0

    with pytest.raises(UndefinedOutputError, match=r"origin: Out parameter 'y' \[4, 8\] pl.FP32 \(read before the "
                                                   r"program wrote it\)"):
        k.run(torch.zeros(4, 8), config=CHECK)


def test_several_origins_are_listed():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        p = pl.create_tensor([1, 8], pl.FP32)
        q = pl.create_tensor([1, 8], pl.FP32)
        with pl.at(name_hint="mix"):
            y[0:1, :] = p[0:1, :]
            y[1:2, :] = q[0:1, :]

    with pytest.raises(UndefinedOutputError, match=r"origin: allocation 'p'(.|\n)*other undefined origins: 'q'"):
        k.run(torch.zeros(2, 8), config=CHECK)


# ============================================================================
# 5. The mutation hook
# ============================================================================

def test_mutation_hook_is_off_by_default_and_validated():
    assert RunConfig().drop_init == ()
    with pytest.raises(pto.ConfigError, match="drop_init"):
        RunConfig(drop_init="acc").validate()


def test_mutation_hook_context_manager_and_config_agree():
    x, w, out, out_pad = _splitk_args()
    k = _splitk_kernel()
    with drop_init_values("acc"), pytest.raises(UndefinedOutputError, match="allocation 'acc'"):
        k.run(x, w, out, out_pad, config=CHECK)
    with drop_init_values("not_an_allocation"):
        prog = k.run(x, w, out, out_pad, config=CHECK)
    assert prog.dropped_init == []
    prog = k.run(x, w, out, out_pad, config=CHECK)  # restored: passes
    assert torch.allclose(out, x.float() @ w.float(), atol=1e-4)
    # unchecked, the mutation really leaves stale memory behind (nothing raises)
    prog = k.run(x, w, out, out_pad, config=RunConfig(drop_init=("acc",)))
    assert prog.dropped_init == ["acc"]


# ============================================================================
# 6. Mutation tests on small kernels with the seed-kernel patterns
# ============================================================================

NB, BLK, KSEL = 4, 8, 6  # pages in the block table, rows per page, index slots per token


def _sentinel_kernel():
    """Sparse gather through a -1 sentinel index list and a block table (the
    prefill_attention_swa cmp_indices / cmp block-table pattern): ``idx
    [T, KSEL]`` starts at -1 (init_value), a task fills slot ``k < t % KSEL``
    of token ``t`` with a logical key; ``out[t] = sum of kv rows of the valid
    slots``, each slot's physical row found through ``table`` (init 0, row 0
    set by a task)."""
    @pl.jit
    def sentinel(kv: pl.Tensor[[NB * BLK, 16], pl.FP32], out: pl.Out[pl.Tensor[[T_DYN, 16], pl.FP32]]):
        t_n = pl.tensor.dim(out, 0)
        idx = pl.create_tensor([t_n, KSEL], pl.INT32, init_value=-1)
        table = pl.create_tensor([1, NB], pl.INT32, init_value=0)
        with pl.at(name_hint="fill_meta"):
            pl.write(table, [0, 0], 2)  # logical page 0 -> physical page 2; other pages stay 0
            for t in pl.range(t_n):
                for k in pl.range(t % KSEL):
                    pl.write(idx, [t, k], (t * 3 + k * 5) % (NB * BLK))
        for t in pl.spmd(t_n, name_hint="sparse_gather"):
            acc = pl.full([1, 16], pl.FP32, 0.0)
            for k in pl.range(KSEL):
                key = pl.read(idx, [t, k])
                if key >= 0:  # the sentinel gates the gather
                    page = pl.read(table, [0, key // BLK])
                    acc = acc + kv[page * BLK + key % BLK:page * BLK + key % BLK + 1, :]
            out[t:t + 1, :] = acc
    return sentinel


def _sentinel_golden(kv, t_n):
    table = [2, 0, 0, 0]
    out = torch.zeros(t_n, 16)
    for t in range(t_n):
        for k in range(t % KSEL):
            key = (t * 3 + k * 5) % (NB * BLK)
            out[t] += kv[table[key // BLK] * BLK + key % BLK]
    return out


def test_sentinel_pattern_passes_and_matches():
    kv = torch.randn(NB * BLK, 16)
    out = torch.zeros(11, 16)
    _sentinel_kernel().run(kv, out, config=CHECK)
    assert torch.allclose(out, _sentinel_golden(kv, 11), atol=1e-5)


# idx: token 0 slot 0 is the first read; table: page 0 was set by a task, token 2's key 11 is on page 1
@pytest.mark.parametrize("name,where", [("idx", "idx[0, 0]"), ("table", "table[0, 1]")])
def test_sentinel_pattern_mutations_are_caught(name, where):
    kv = torch.randn(NB * BLK, 16)
    out = torch.zeros(11, 16)
    with pytest.raises(UndefinedValueError) as ei:
        _sentinel_kernel().run(kv, out, config=RunConfig(check=True, drop_init=(name,)))
    msg = str(ei.value)
    assert f"allocation {name!r}" in msg and "init_value dropped by the mutation hook" in msg
    use = "a branch condition" if name == "idx" else "a slice start"
    assert use in msg and "task 'sparse_gather'" in msg and where in msg


PAD_ROWS, PAD_COLS = 8, 32


def _pad_kernel(all_rows_out: bool):
    """An 8-row pad read by a row-tile op (the prefill_compressor_ratio128
    pooled-pad pattern): ``pooled [8, 32]`` is zero at allocation, a pool task
    writes row 0 only, an RMSNorm task normalises all 8 rows as one tile into
    ``normed`` (uninitialised, fully written), and the finalize task copies
    row 0 (or, with ``all_rows_out``, all 8 rows) to the output."""
    @pl.jit
    def pad_norm(x: pl.Tensor[[16, PAD_COLS], pl.FP32],
                 out: pl.PartialOut[pl.Tensor[[PAD_ROWS, PAD_COLS], pl.FP32]]):  # row 0 only, or all rows
        pooled = pl.create_tensor([PAD_ROWS, PAD_COLS], pl.FP32, init_value=0)
        normed = pl.create_tensor([PAD_ROWS, PAD_COLS], pl.FP32)
        with pl.at(name_hint="pool"):
            pooled[0:1, :] = pl.col_sum(x[0:16, :])
        with pl.at(name_hint="rms_norm_pad"):
            p = pooled[0:PAD_ROWS, :]
            ms = pl.row_sum(p * p) * (1.0 / PAD_COLS)
            inv = pl.rsqrt(ms + 1e-6)
            normed[0:PAD_ROWS, :] = pl.row_expand_mul(p, inv)
        with pl.at(name_hint="finalize"):
            if all_rows_out:
                out[0:PAD_ROWS, :] = normed[0:PAD_ROWS, :]
            else:
                out[0:1, :] = normed[0:1, :]
    return pad_norm


def _pad_golden(x):
    out = torch.zeros(PAD_ROWS, PAD_COLS)
    p = x.sum(0)
    out[0] = p * torch.rsqrt(p.pow(2).mean() + 1e-6)
    return out


@pytest.mark.parametrize("all_rows_out", [False, True])
def test_pad_pattern_passes_and_matches(all_rows_out):
    x = torch.randn(16, PAD_COLS)
    out = torch.zeros(PAD_ROWS, PAD_COLS)
    _pad_kernel(all_rows_out).run(x, out, config=CHECK)
    assert torch.allclose(out, _pad_golden(x), atol=1e-5)


def test_pad_pattern_mutation_caught_when_pad_rows_reach_the_output():
    x = torch.randn(16, PAD_COLS)
    out = torch.zeros(PAD_ROWS, PAD_COLS)
    with pytest.raises(UndefinedOutputError) as ei:
        _pad_kernel(True).run(x, out, config=RunConfig(check=True, drop_init=("pooled",)))
    msg = str(ei.value)
    assert "output 'out' [8, 32] has 224 undefined written element(s) in box [1:8, 0:32]" in msg
    assert "allocation 'pooled' [8, 32] pl.FP32" in msg and "task 'rms_norm_pad' (#1) block 0" in msg


def test_pad_pattern_mutation_silent_when_pad_rows_are_discarded():
    # the row-wise norm keeps each row's garbage in that row; row 0 alone reaches the output
    x = torch.randn(16, PAD_COLS)
    out = torch.zeros(PAD_ROWS, PAD_COLS)
    prog = _pad_kernel(False).run(x, out, config=RunConfig(check=True, drop_init=("pooled",)))
    assert prog.dropped_init == ["pooled"]
    assert torch.allclose(out, _pad_golden(x), atol=1e-5)


def _int8_pad_kernel():
    """The qkv_proj_rope decode pattern: T = 8 tokens padded to the 16-row
    matmul tile. ``x_i8 [16, 32] INT8`` is uninitialised and only rows [0, T)
    are written; the INT8 x INT8 matmul reads all 16 rows (its padded output
    rows are undefined) into ``acc_i32 [16, 16]``; the dequant task reads rows
    [0, T) only."""
    @pl.jit
    def int8_pad(x: pl.Tensor[[T_DYN, 32], pl.FP32], w: pl.Tensor[[32, 16], pl.INT8],
                 out: pl.Out[pl.Tensor[[T_DYN, 16], pl.FP32]]):
        t = pl.tensor.dim(x, 0)
        t_pad = (t + 15) // 16 * 16
        x_i8 = pl.create_tensor([t_pad, 32], pl.INT8, capacity=16)
        acc_i32 = pl.create_tensor([t_pad, 16], pl.INT32, capacity=16)
        with pl.at(name_hint="quant"):
            q = pl.cast(pl.cast(x[0:t, :], pl.INT32, mode="rint"), pl.INT8)
            x_i8[0:t, :] = q
        with pl.at(name_hint="int8_matmul"):
            acc_i32[0:16, :] = pl.matmul(x_i8[0:16, :], w[0:32, :])  # rows t..15: never-written padding
        with pl.at(name_hint="dequant"):
            out[0:t, :] = pl.cast(acc_i32[0:t, :], pl.FP32) * 0.5
    return int8_pad


def test_int8_padding_rows_read_into_discarded_matmul_rows_report_nothing():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, (8, 32), generator=g).float()
    w = torch.randint(-5, 6, (32, 16), generator=g).to(torch.int8)
    out = torch.zeros(8, 16)
    prog = _int8_pad_kernel().run(x, w, out, config=CHECK)
    assert torch.equal(out, (x @ w.float()) * 0.5)
    # the padding rows were consumed undefined (by the matmul), and that is legal
    (oid, cons), = prog.sanitizer.taints
    assert prog.buffers[oid - 1].name == "x_i8" and cons.task == "int8_matmul" and cons.how == "load"


# ============================================================================
# 7. Errors stay PtoErrors
# ============================================================================

def test_tile_subscript_assign_still_rejects_non_tiles():
    a = _tile((2, 2))
    with pytest.raises(DslError):
        a[0:1, 0:1] = "x"


# ============================================================================
# 8. The registered seed kernels (tiny preset): mutation tests and clean runs
# ============================================================================

def _run_case(name, mode, drop=(), preset="tiny", **options):
    from pto.golden import get_case, run_jit
    cr = get_case(name).build(preset, mode, **options)
    return run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=True,
                   config=RunConfig(drop_init=tuple(drop)))


def _all_case_modes():
    from pto.golden import all_cases
    out = []
    for c in all_cases("model"):
        for m in c.modes:
            out.append((c.name, m, {}))
            if c.seed_variant:
                out.append((c.name, m, {"seed_scopes": True}))
    return out


@pytest.mark.parametrize("name,mode,options", _all_case_modes(),
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_every_registered_model_kernel_passes_check_mode(name, mode, options):
    res = _run_case(name, mode, **options)
    assert res.passed, res.error
    assert res.program.dropped_init == []


@pytest.mark.parametrize("name", ["qkv_proj_rope", "hc_pre"])
@pytest.mark.parametrize("t", [1, 7, 20])
def test_split_k_kernels_pass_check_mode_at_ragged_t(name, t):
    # T not a multiple of the 16-row matmul tile: the padded scratch rows must never reach an output
    res = _run_case(name, "prefill", T=t)
    assert res.passed, res.error
    pad = {b.name: b.shape[0] for b in res.program.buffers if b.kind == "scratch"}
    assert pad["qr_fp32" if name == "qkv_proj_rope" else "mixes_raw"] > t  # padded rows exist (tile of 16)


# (kernel, mode, allocation, output reported, first consumer task)
LOAD_BEARING = [
    ("hc_pre", "decode", "mixes_raw", "x_mixed", "hc_pre_linear"),
    ("hc_pre", "prefill", "mixes_raw", "x_mixed", "hc_pre_linear"),
    ("qkv_proj_rope", "decode", "qr_fp32", "q", "qr_proj_matmul"),
    ("qkv_proj_rope", "prefill", "qr_fp32", "q", "qr_proj_matmul"),
    ("qkv_proj_rope", "decode", "kv_fp32", "kv", "kv_proj_matmul"),
    ("qkv_proj_rope", "prefill", "kv_fp32", "kv", "kv_proj_matmul"),
]


@pytest.mark.parametrize("name,mode,alloc,output,consumer", LOAD_BEARING)
def test_dropping_a_split_k_init_value_is_caught(name, mode, alloc, output, consumer):
    with pytest.raises(UndefinedOutputError) as ei:
        _run_case(name, mode, drop=[alloc])
    msg = str(ei.value)
    assert f"output {output!r}" in msg
    assert re.search(rf"origin: allocation {alloc!r} \[\d+, \d+\] pl.FP32 at \S+/{name}\.py:\d+ "
                     r"\(init_value dropped by the mutation hook\)", msg)
    assert re.search(rf"first consumed undefined by task {consumer!r} \(#\d+\) block \d+ at \S+/{name}\.py:\d+ "
                     r"\(atomic add onto undefined\)", msg)
    assert _run_case(name, mode).passed  # restored: passes


def test_dropping_the_cmp_indices_sentinel_is_caught():
    with pytest.raises(UndefinedValueError) as ei:
        _run_case("prefill_attention_swa", "prefill", drop=["cmp_indices"])
    msg = str(ei.value)
    assert "a branch condition" in msg and "prefill_sparse_attn.py" in msg
    assert re.search(r"origin: allocation 'cmp_indices' \[\d+, \d+\] pl.INT32 at \S+/prefill_attention_swa\.py:\d+",
                     msg)
    assert re.search(r"first consumed undefined by task 'gather_kv' \(#\d+\) block \d+", msg)
    assert _run_case("prefill_attention_swa", "prefill").passed


def test_cmp_block_table_init_is_dead_in_the_swa_block():
    """Finding: prefill_attention_swa's ``cmp_block_table`` (init_value=0) is
    never read, because every compressed index is -1 and the sparse gather
    consults the table only for slots >= 0 (reference pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`:
    "the block table content is therefore irrelevant"). Dropping its
    init_value is therefore not observable, and check mode rightly passes."""
    res = _run_case("prefill_attention_swa", "prefill", drop=["cmp_block_table"])
    prog = res.program
    assert res.passed and prog.dropped_init == ["cmp_block_table"]
    table = [b for b in prog.buffers if b.name == "cmp_block_table"]
    assert len(table) == 1
    assert not any(buf is table[0] for t in prog.graph.tasks for buf, _k, _box in t.footprints)


def test_compressor_pooled_pad_init_keeps_discarded_rows_only():
    """Finding: prefill_compressor_ratio128's ``pooled_kv_pad`` pad rows (and
    rows of windows without a destination) are normalised row by row and then
    never written to ``cmp_kv``, so with the init_value dropped the NaN rows
    are consumed by the rmsnorm_rope task and discarded: check mode passes
    and so does the golden comparison. The init makes the discarded rows
    deterministic (reference pypto-lib `prefill_compressor_ratio128.py`), it does not guard an output."""
    res = _run_case("prefill_compressor_ratio128", "prefill", drop=["pooled_kv_pad"])
    prog = res.program
    assert res.passed and prog.dropped_init == ["pooled_kv_pad"]
    consumed = {(prog.buffers[oid - 1].name, cons.task) for oid, cons in prog.sanitizer.taints}
    assert consumed == {("pooled_kv_pad", "prefill_hca_c128_rmsnorm_rope")}


def test_qkv_decode_padding_rows_report_nothing():
    """Decode T = 8 is padded to the 16-row matmul tile: the split-K targets
    and the INT8 scratch have 16 rows, rows 8..15 are never written by the
    quantiser, and check mode reports nothing (this implementation reads
    the tails through valid_shape; the pattern test above covers a kernel
    that reads the padding rows into discarded matmul rows)."""
    res = _run_case("qkv_proj_rope", "decode")
    assert res.passed
    shapes = {b.name: list(b.shape) for b in res.program.buffers if b.kind == "scratch"}
    assert shapes["qr_i8_matmul"][0] == 16 and shapes["qr_fp32"][0] == 16 and shapes["kv_fp32"][0] == 16
    assert res.program.stats.tasks > 0


@pytest.mark.parametrize("drop,rc,needle", [
    ([], 0, "PASS hc_pre decode"),
    (["--drop-init", "mixes_raw"], 1, "FAIL hc_pre decode (init_value dropped: mixes_raw): UndefinedOutputError"),
])
def test_pto_check_prints_a_pass_line_or_the_error(capsys, drop, rc, needle):
    from pto.cli import main
    assert main(["check", "hc_pre", "--preset", "tiny", "--mode", "decode", *drop]) == rc
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap long lines
    assert needle in out
    if rc:
        assert "origin: allocation 'mixes_raw'" in out and "first consumed undefined by task 'hc_pre_linear'" in out
