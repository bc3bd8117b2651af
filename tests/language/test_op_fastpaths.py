"""The per-op fast paths of tile_ops / tensor_ops (issues 15 and 17) give what the general paths
give: the same tensor (dtype, shape, strides, bits), the same mask and valid shape, and the same
block counters (ops, flops, vector kinds, matmuls, loads, stores, bytes, footprints). Each test
forces the general path with an argument the fast path does not take (a numpy int, a torch dtype,
an all-zero mask) and compares."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto
import pto.language as pl
from pto.language import _ctx
from pto.language import tensor_ops as T
from pto.language import tile_ops as O
from pto.language.dtypes import ALL_DTYPES, from_torch
from pto.language.tile_ops import Tile

FLOATS = [torch.bfloat16, torch.float16, torch.float32]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN payloads and -0.0 included), for exact comparisons."""
    t = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))  # fresh unit strides
    return t.view(torch.uint8) if t.dtype != torch.bool else t


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    # an empty tensor's strides carry no layout (as_strided_copy and clone pick different ones for
    # a [2, 0] window since before these fast paths): compared for non-empty tensors only
    assert a.dtype == b.dtype and a.shape == b.shape and (a.stride() == b.stride() or a.numel() == 0)
    assert torch.equal(_bits(a), _bits(b))


def _values(dtype, shape, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        v = (torch.randn(shape, generator=g) * 3).view(-1)
        specials = [float("nan"), -0.0, float("inf"), 2.5, -2.5, 1e30, -1e-30, 70000.0]
        for k in range(0, v.numel(), 5):  # every fifth element a special value (ties, overflow, NaN, -0)
            v[k] = specials[(k // 5) % len(specials)]
        return v.reshape(shape).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo, hi = (0, 255) if dtype == torch.uint8 else (-(1 << 20), 1 << 20)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _view(x: torch.Tensor, kind: int) -> torch.Tensor:
    """A contiguous tensor, its transpose (a strided view) or an offset window of it."""
    if kind == 1:
        return x.t()
    if kind == 2 and x.shape[0] > 1 and x.shape[1] > 1:
        return x[1:, 1:]
    return x


class _Counts:
    """A stand-in block: the counters _count and the loads/stores update."""

    def __init__(self):
        self.ops = self.flops = self.bytes = self.ld = self.st = self.mm = 0
        self.vk = None
        self.cube = False
        self.fp = []
        self.idx = 0

    def snapshot(self):
        return (self.ops, self.flops, self.bytes, self.ld, self.st, self.mm, self.vk and dict(self.vk), self.cube,
                list(self.fp))


def _in_block(fn):
    """``fn()``'s result and the counters it left in a stand-in block."""
    blk = _Counts()
    old = _ctx.state.block
    _ctx.state.block = blk
    try:
        out = fn()
    finally:
        _ctx.state.block = old
    return out, blk.snapshot()


@settings(max_examples=60, deadline=None)
@given(src=st.sampled_from(DTYPES), dst=st.sampled_from(DTYPES), kind=st.integers(0, 2), seed=st.integers(0, 99))
def test_typed_conversion_equals_to(src, dst, kind, seed):
    x = _view(_values(src, (5, 7), seed), kind)
    _same(O._to(x, dst), x.to(dst))


@settings(max_examples=80, deadline=None)
@given(src=st.sampled_from(DTYPES), dst=st.sampled_from([d for d in ALL_DTYPES if d.torch != torch.uint32]),
       mode=st.sampled_from(["none", "rint", "round", "floor", "ceil", "trunc"]), kind=st.integers(0, 2),
       valid=st.booleans(), seed=st.integers(0, 99))
def test_cast_fast_path_equals_general(src, dst, mode, kind, valid, seed):
    x = _view(_values(src, (4, 6), seed), kind)
    t = Tile(x, None, (2, 3) if valid else None)
    fast, cf = _in_block(lambda: pl.cast(t, dst, mode=mode))
    gen, cg = _in_block(lambda: pl.cast(t, dst.torch, mode=mode))  # a torch dtype: the general path
    _same(fast.data, gen.data)
    assert fast.valid == gen.valid and fast.mask is None and gen.mask is None and cf == cg


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from(FLOATS + [torch.int8]), m=st.integers(1, 9), k=st.integers(1, 40), n=st.integers(1, 9),
       a_trans=st.booleans(), b_trans=st.booleans(), seed=st.integers(0, 99))
def test_matmul_fast_path_equals_general(dt, m, k, n, a_trans, b_trans, seed):
    if dt == torch.int8:
        a = torch.randint(-128, 128, (m, k), generator=torch.Generator().manual_seed(seed)).to(dt)
        b = torch.randint(-128, 128, (k, n), generator=torch.Generator().manual_seed(seed + 1)).to(dt)
    else:
        a, b = _values(dt, (m, k), seed), _values(dt, (k, n), seed + 1)
        a, b = torch.nan_to_num(a, 0.0, 1.0, -1.0), torch.nan_to_num(b, 0.0, 1.0, -1.0)
    A = Tile(a.t().contiguous()) if a_trans else Tile(a)  # a_trans: a stored [K, M]
    B = Tile(b.t().contiguous()) if b_trans else Tile(b)  # b_trans: b stored [N, K]
    acc = pl.INT32 if dt == torch.int8 else pl.FP32
    fast, cf = _in_block(lambda: pl.matmul(A, B, a_trans=a_trans, b_trans=b_trans))
    fast2, cf2 = _in_block(lambda: pl.matmul(A, B, out_dtype=acc, a_trans=a_trans, b_trans=b_trans))
    gen, cg = _in_block(lambda: pl.matmul(A, B, out_dtype=acc.torch, a_trans=a_trans, b_trans=b_trans))
    _same(fast.data, gen.data)
    _same(fast2.data, gen.data)
    assert cf == cg == cf2 and cf[5] == 1 and cf[7] is True


def test_matmul_fast_path_errors_unchanged():
    a, b = Tile(torch.ones(2, 3, dtype=torch.bfloat16)), Tile(torch.ones(4, 2, dtype=torch.bfloat16))
    with pytest.raises(pto.DslError, match="K mismatch"):
        pl.matmul(a, b)
    with pytest.raises(pto.DslError, match="out_dtype must be the accumulator dtype"):
        pl.matmul(a, Tile(torch.ones(3, 2, dtype=torch.bfloat16)), out_dtype=pl.BF16)
    with pytest.raises(pto.DslError, match="operand dtypes differ"):
        pl.matmul(a, Tile(torch.ones(3, 2)))


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(DTYPES), rows=st.integers(1, 6), cols=st.integers(1, 6), kind=st.integers(0, 2),
       masked=st.booleans(), seed=st.integers(0, 99))
def test_reshape_fast_path_equals_general(dt, rows, cols, kind, masked, seed):
    x = _view(_values(dt, (rows, cols), seed), kind)
    mask = torch.arange(x.numel(), dtype=torch.int32).reshape(x.shape) % 3 if masked else None
    n = x.numel()
    for s0 in [d for d in range(1, n + 1) if n % d == 0]:
        fast = pl.reshape(Tile(x, mask), [s0, n // s0])
        gen = pl.reshape(Tile(x, mask), [np.int64(s0), n // s0])  # a numpy int: the general path
        _same(fast.data, gen.data)
        assert (fast.mask is None) == (gen.mask is None)
        if masked:
            _same(fast.mask, gen.mask)
    with pytest.raises(pto.DslError, match="cannot reshape"):
        pl.reshape(Tile(x), [n + 1, 1])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("value", [0, 0.0, -0.0, 1, -1.5, 3])
def test_full_zero_fast_path_equals_torch_full(dt, value):
    if (not dt.is_floating_point and isinstance(value, float) and not value.is_integer()) or (
            dt == torch.uint8 and value == -1.5):
        return
    d = from_torch(dt)
    if d.is_int and not d.min <= value <= d.max:
        return
    got, counts = _in_block(lambda: pl.full([3, 5], d, value))
    _same(got.data, torch.full([3, 5], value, dtype=dt))
    assert counts[0] == 1


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from(DTYPES), kind=st.integers(0, 2), i=st.integers(0, 3), j=st.integers(0, 4),
       value=st.one_of(st.integers(-300, 300), st.floats(allow_nan=True, allow_infinity=True, width=32),
                       st.sampled_from([2 ** 31, -2 ** 31 - 1, 2 ** 40, 1e40, -0.0, True])),
       seed=st.integers(0, 99))
def test_tile_write_fast_path_equals_general(dt, kind, i, j, value, seed):
    x = _values(dt, (6, 6), seed)
    fast = Tile(_view(x.clone(), kind)[:4, :5])  # a strided view of a bigger tensor, too
    gen = Tile(_view(x.clone(), kind)[:4, :5], torch.zeros(4, 5, dtype=torch.int32))  # a mask: the general path
    errs = []
    for t in (fast, gen):
        try:
            pl.write(t, [i, j], value)
            errs.append(None)
        except Exception as e:  # noqa: BLE001 - the same error either way (DslError or torch's)
            errs.append((type(e), str(e)))
    assert errs[0] == errs[1]
    _same(fast.data, gen.data)


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from(DTYPES), kind=st.integers(0, 2), seed=st.integers(0, 99),
       shape=st.sampled_from([(5, 6), (1, 1), (1, 7), (3, 1)]), data=st.data())
def test_tile_element_reads_equal_item(dt, kind, seed, shape, data):
    x = _view(_values(dt, (6, 7), seed), kind)[1:1 + shape[0], 1:1 + shape[1]]  # views with an offset
    i = data.draw(st.integers(0, x.shape[0] - 1))
    j = data.draw(st.integers(0, x.shape[1] - 1))
    want = x[i, j].item()
    got = T._item(x, (i, j))
    assert type(got) is type(want) and (got == want or (got != got and want != want))
    n = data.draw(st.integers(1, x.shape[1] - j))
    vals = pl.read_values(Tile(x), [i, j], n)
    ref = [x[i, j + k].item() for k in range(n)]
    assert [type(v) for v in vals] == [type(v) for v in ref]
    assert all(a == b or (a != a and b != b) for a, b in zip(vals, ref))


def _row_intervals_reference(base, spans):
    """By enumeration: the shortest prefix of ``spans`` whose remaining dims cover one run of rows
    (innermost row step 1, each dim's step the next one's extent times its step) is enumerated
    index by index (outer dims first); each combination covers that run, shifted."""
    k = len(spans)  # spans[k:] is one run: the empty suffix (one row), or longer
    while k > 0 and spans[-1][0] == 1 and (
            k == len(spans) or spans[k - 1][0] == spans[k][0] * (spans[k][2] - spans[k][1])):
        k -= 1
    lo = sum(q * a for q, a, _ in spans[k:])
    hi = sum(q * (b - 1) for q, _, b in spans[k:]) + 1
    out = []
    for combo in itertools.product(*[range(a, b) for _, a, b in spans[:k]]):
        r = base + sum(i * q for i, (q, _, _) in zip(combo, spans))
        out.append((r + lo, r + hi))
    return out


@settings(max_examples=200, deadline=None)
@given(base=st.integers(0, 50), dims=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5), st.integers(2, 6)),
                                               min_size=1, max_size=3))
def test_row_intervals_equal_recursive_definition(base, dims):
    spans = sorted([(q, a, a + n) for q, a, n in dims], reverse=True)
    assert T._row_intervals(base, spans) == _row_intervals_reference(base, spans)


def _block_effects(body, x: torch.Tensor, view: str):
    """Run ``body(src)`` in one block of a kernel over a copy of the ``[R, C]`` tensor ``x``:
    ``src`` is the In argument itself (``view="in"``, a no-copy In), its column window
    ``[:, 2:]`` (``"window"``, made in orchestration) or an InOut argument (``"inout"``).
    Returns what ``body`` returned and the block's counters and raw footprint records."""
    seen = {}

    def run(src):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="b"):
            blk = _ctx.state.block
            seen["out"] = body(src)
            seen["counts"] = (blk.ops, blk.flops, blk.bytes, blk.ld, blk.st, blk.mm, blk.vk,
                              [(b.name, box, kind) for b, box, kind in blk.fp])

    @pl.jit
    def k_in(x: pl.Tensor):
        run(x[:, 2:x.shape[1]] if view == "window" else x)
        return x

    @pl.jit
    def k_inout(x: pl.InOut[pl.Tensor]):
        run(x)
        return x

    (k_inout if view == "inout" else k_in).run(x.clone())
    return seen["out"], seen["counts"]


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from([torch.bfloat16, torch.float32, torch.int32]), view=st.sampled_from(["in", "window"]),
       rows=st.lists(st.integers(0, 11), min_size=1, max_size=12), c0=st.integers(0, 5), w=st.integers(1, 3),
       seed=st.integers(0, 9))
def test_gather_rows_fast_path_equals_general(dt, view, rows, c0, w, seed):
    x = _values(dt, (12, 8), seed)

    def gather(as_numpy):
        def body(src):
            want = [np.int64(r) for r in rows] if as_numpy else list(rows)  # numpy ints: the general path
            width = src.shape[1]
            c = min(c0, width - 1)
            return pl.gather_rows(src, want, col_offset=c, cols=min(w, width - c))
        return _block_effects(body, x, view)

    (fast, cf), (gen, cg) = gather(False), gather(True)
    _same(fast.data, gen.data)
    assert cf == cg


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from([torch.bfloat16, torch.float32]), a0=st.integers(0, 5), n0=st.integers(1, 6),
       a1=st.integers(0, 5), n1=st.integers(1, 6), view=st.sampled_from(["in", "window", "inout"]),
       valid=st.booleans(), seed=st.integers(0, 9))
def test_window_loads_fast_path_equals_general(dt, a0, n0, a1, n1, view, valid, seed):
    """x[a:b, c:d] and pl.slice of a 2-D view (the shared fast path) against _parse + _load (a
    numpy-int bound takes the general path): the same tile and the same block effects."""
    x = _values(dt, (8, 8), seed)
    n0, n1 = min(n0, 6 - a0), min(n1, 6 - a1)

    def load(kind):
        def body(src):
            if kind == "sub":
                return src[a0:a0 + n0, a1:a1 + n1]
            if kind == "slice":
                return pl.slice(src, [n0, n1], [a0, a1], valid_shape=[n0, n1] if valid else None)
            t = src[np.int64(a0):a0 + n0, a1:a1 + n1]
            return Tile(t.data, t.mask, (n0, n1)) if valid else t
        return _block_effects(body, x, view)

    (sub, cs), (slc, cl), (gen, cg) = load("sub"), load("slice"), load("general")
    _same(sub.data, gen.data)
    _same(slc.data, gen.data)
    assert cs == cl == cg and slc.valid == gen.valid


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from(DTYPES), rows=st.integers(1, 7), cols=st.integers(1, 7), kind=st.integers(0, 2),
       seed=st.integers(0, 99), data=st.data())
def test_tile_slice_fast_path_equals_general(dt, rows, cols, kind, seed, data):
    x = _view(_values(dt, (rows, cols), seed), kind)
    n0, n1 = x.shape
    o0, o1 = data.draw(st.integers(0, n0 - 1)), data.draw(st.integers(0, n1 - 1))
    s0, s1 = data.draw(st.integers(0, n0 - o0)), data.draw(st.integers(0, n1 - o1))
    if data.draw(st.booleans()):
        o1, s1 = 0, n1  # whole rows
    fast, cf = _in_block(lambda: pl.slice(Tile(x), [s0, s1], [o0, o1]))
    gen, cg = _in_block(lambda: pl.slice(Tile(x), [s0, s1], [np.int64(o0), o1]))  # a numpy int: general path
    _same(fast.data, gen.data)
    assert cf == cg


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int8]),
       rows=st.integers(1, 9), cols=st.integers(1, 40), kind=st.integers(0, 2), seed=st.integers(0, 99))
def test_reductions_equal_their_keyword_forms(dt, rows, cols, kind, seed):
    """The reductions pass dim and keepdim positionally (and no FP32 accumulation dtype for an
    FP32 tile): the same tensors as the keyword calls they replaced."""
    x = _view(_values(dt, (rows, cols), seed), kind)
    if dt.is_floating_point:
        x = torch.nan_to_num(x, 0.0, 7.0, -7.0) if dt != torch.float32 else x
    t = Tile(x)
    for dim, op in ((1, pl.row_sum), (0, pl.col_sum)):
        want = (x.sum(dim=dim, keepdim=True, dtype=torch.float32) if dt.is_floating_point
                else x.sum(dim=dim, keepdim=True)).to(dt)
        _same(op(t).data, want)
    _same(pl.row_max(t).data, x.amax(dim=1, keepdim=True))
    _same(pl.row_min(t).data, x.amin(dim=1, keepdim=True))
    _same(pl.col_max(t).data, x.amax(dim=0, keepdim=True))


@settings(max_examples=150, deadline=None)
@given(op=st.sampled_from(["add", "sub", "mul", "div"]), kind=st.integers(0, 2), seed=st.integers(0, 99),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 62, 2 ** 62),
                       st.sampled_from([0.1, -1e-45, 3e38, 1e300, 2 ** 24 + 1, -0.0, 0, 2 ** 63, 2 ** 70,
                                        -2 ** 63 - 1])))
def test_fp32_tile_number_ops_equal_general(op, kind, seed, value):
    """An FP32 tile with a Python number: the kept 0-dim FP32 operand gives the general path's
    tensor (the number wrapped by torch; a defined ScalarValue takes the general path)."""
    from pto.language.typing import ScalarValue
    x = _view(_values(torch.float32, (6, 9), seed), kind)
    fn = getattr(pl, op)
    try:
        gen, cg = _in_block(lambda: fn(Tile(x), ScalarValue(value, True)))
    except OverflowError:  # an int torch cannot take (beyond 64 bits): the same error either way
        with pytest.raises(OverflowError):
            fn(Tile(x), value)
        return
    fast, cf = _in_block(lambda: fn(Tile(x), value))
    _same(fast.data, gen.data)
    assert cf == cg
    if op in ("add", "mul"):  # number op tile: the same as tile op number
        _same(fn(value, Tile(x)).data, gen.data)


@settings(max_examples=100, deadline=None)
@given(mode=st.sampled_from(sorted(O.CMP_MODES)), kind=st.integers(0, 2), seed=st.integers(0, 99), near=st.booleans(),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 62, 2 ** 62),
                       st.sampled_from([0.1, -0.0, 0, 2 ** 24 + 1, 3.5e38])))
def test_fp32_tile_number_compare_equals_general(mode, kind, seed, near, value):
    """pl.cmp of an FP32 tile with a number (the kept 0-dim FP32 operand) against torch's
    comparison with the Python number; ``near``: the tile holds the FP32 neighbours of the number
    (the rounding edge)."""
    x = _view(_values(torch.float32, (4, 5), seed), kind)
    if near and value == value and abs(value) < 3e38:
        f = torch.tensor(float(value), dtype=torch.float32)
        x = torch.stack([torch.nextafter(f, torch.tensor(-float("inf"))), f,
                         torch.nextafter(f, torch.tensor(float("inf")))]).reshape(1, 3)
    fast, cf = _in_block(lambda: pl.cmp(Tile(x), value, mode))
    _same(fast.data, O.CMP_MODES[mode](x, value))
    assert cf[0] == 1 and cf[1] == x.numel()
