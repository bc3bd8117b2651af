"""pl.write_values: n consecutive element writes in one call, with the values, footprints, store
counts, errors and check-mode semantics of n scalar pl.write calls."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto
import pto.language as pl
from pto.errors import DslError, RaceError, UndefinedOutputError

CHECK = pto.RunConfig(check=True)
KEEP = pto.RunConfig(keep_footprints=True)


def _put(dst, idx, values, vector: bool):
    """``values`` into ``dst`` from ``idx``: one pl.write_values call, or one pl.write per element."""
    if vector:
        return pl.write_values(dst, idx, values)
    for k, v in enumerate(values):
        pl.write(dst, [*idx[:-1], idx[-1] + k], v)
    return dst


def _block(prog):
    b = prog.graph.tasks[0].blocks[0]
    return [(buf.name, box, kind) for buf, box, kind in b.fp], (b.ops, b.flops, b.bytes, b.ld, b.st, b.vk)


# ---- tiles --------------------------------------------------------------------

TILE_DTYPES = [pl.INT32, pl.INT8, pl.UINT8, pl.INT64, pl.BF16, pl.FP16, pl.FP32, pl.BOOL]


def _tile_kernel(dt, shape, idx, values, vector: bool):
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 64], dt]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = pl.full(shape, dt, 0)
            t = _put(t, idx, values, vector)
            y[0:1, 0:64] = pl.reshape(t, [1, 64])
        return y
    return k


def _values(draw_ints, dt, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dt.torch.is_floating_point:  # floats of any magnitude, and some ints up to 2**53 (exact in FP64)
        vals = [float(v) for v in (torch.randn(n, generator=g, dtype=torch.float64) * 10 ** draw_ints).tolist()]
        ints = torch.randint(-2 ** 53, 2 ** 53, (n,), generator=g, dtype=torch.int64).tolist()
        return [i if k % 3 == 1 else v for k, (v, i) in enumerate(zip(vals, ints))]
    if dt is pl.BOOL:
        return [int(v) for v in torch.randint(0, 2, (n,), generator=g).tolist()]
    lo, hi = (dt.min, dt.max) if dt is not pl.INT64 else (-2 ** 62, 2 ** 62)
    return [int(v) for v in torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).tolist()]


@settings(max_examples=80, deadline=None)
@given(dt=st.sampled_from(TILE_DTYPES), shape=st.sampled_from([[64], [1, 64], [4, 16], [8, 8], [2, 4, 8]]),
       data=st.data(), scale=st.integers(-3, 6), seed=st.integers(0, 999))
def test_tile_write_values_match_element_writes(dt, shape, data, scale, seed):
    head = [data.draw(st.integers(0, s - 1)) for s in shape[:-1]]
    j0 = data.draw(st.integers(0, shape[-1]))
    n = data.draw(st.integers(0, shape[-1] - j0))
    values = _values(scale, dt, n, seed)
    outs = []
    for vector in (True, False):
        y = torch.zeros(1, 64, dtype=dt.torch)
        prog = _tile_kernel(dt, shape, [*head, j0], values, vector).run(y, config=KEEP)
        outs.append((y, _block(prog)))
    (yv, bv), (ys, bs) = outs
    assert torch.equal(yv.view(torch.uint8), ys.view(torch.uint8))  # bit for bit (NaN-free values)
    assert bv == bs  # no counted op of its own; the same footprints and counters


def test_tile_write_values_of_a_view_and_of_a_read_only_load():
    """A sub-tile, a reshaped tile and a no-copy load of an In argument: the argument keeps its values."""
    @pl.jit
    def k(x: pl.Tensor[[4, 8], pl.INT32], y: pl.Out[pl.Tensor[[4, 8], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = x[0:4, 0:8]
            t = pl.write_values(t, [2, 3], [7, 8, 9])
            r = pl.write_values(pl.reshape(t, [32]), [6], [-1, -2, -3, -4])
            y[0:4, 0:8] = pl.reshape(r, [4, 8])
        return y

    x = torch.arange(32, dtype=torch.int32).reshape(4, 8)
    x0 = x.clone()
    y = torch.zeros(4, 8, dtype=torch.int32)
    k.run(x, y)
    want = x0.clone()
    want[2, 3:6] = torch.tensor([7, 8, 9])
    want.view(-1)[6:10] = torch.tensor([-1, -2, -3, -4])
    assert torch.equal(y, want) and torch.equal(x, x0)


# ---- GM tensors ---------------------------------------------------------------

GM_VIEWS = [  # (name, view of y [4, 6, 8], first index, n)
    ("3-D", lambda y: y, [2, 3, 1], 6),
    ("reshape 2-D", lambda y: pl.reshape(y, [24, 8]), [13, 2], 5),
    ("reshape 1-D", lambda y: pl.reshape(y, [192]), [37], 30),  # crosses root rows
    ("reshape [1, n]", lambda y: pl.reshape(y, [1, 192]), [0, 60], 9),
    ("slice", lambda y: y[1:3, 2:5, 1:7], [1, 2, 0], 6),
]


@pytest.mark.parametrize("name,view,idx,n", GM_VIEWS, ids=[v[0] for v in GM_VIEWS])
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_gm_write_values_match_element_writes(name, view, idx, n, check):
    values = [3 * k - 40 for k in range(n)]

    def make(vector):
        @pl.jit
        def k(x: pl.Tensor[[1, 8], pl.INT32], y: pl.InOut[pl.Tensor[[4, 6, 8], pl.INT32]]):
            s = pl.create_tensor([4, 6, 8], pl.INT32, init_value=5, name="s")
            vs, vy = view(s), view(y)  # orchestration views (a slice inside a task is a load)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
                _put(vs, idx, values, vector)
                _put(vy, idx, values, vector)  # an argument written in place too
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
                for i in pl.range(4):
                    y[i:i + 1, 0:6, 0:8] = s[i:i + 1, 0:6, 0:8] + y[i:i + 1, 0:6, 0:8]
            return y
        return k

    outs = []
    for vector in (True, False):
        y = torch.arange(192, dtype=torch.int32).reshape(4, 6, 8)
        cfg = pto.RunConfig(check=True, keep_footprints=True) if check else KEEP
        prog = make(vector).run(torch.zeros(1, 8, dtype=torch.int32), y, config=cfg)
        outs.append((y, _block(prog), [sorted(t.preds) for t in prog.graph.tasks]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1] == outs[1][1] and outs[0][2] == outs[1][2]
    fp, (ops, _, nbytes, ld, st_, _) = outs[0][1]
    assert (len(fp), st_, nbytes, ld, ops) == (2 * n, 2 * n, 2 * 4 * n, 0, 0)


def test_gm_write_values_in_orchestration_is_an_error():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        pl.write_values(y, [0, 0], [1, 2])
        return y

    with pytest.raises(DslError, match="writing y"):
        k.run(torch.zeros(1, 8, dtype=torch.int32))


# ---- check mode ---------------------------------------------------------------

@pytest.mark.parametrize("where", ["gm", "tile"])
def test_check_mode_undefined_values_and_outputs(where):
    """An undefined value read with pl.read_values is written as undefined, in its place only:
    the output it reaches is reported as an element-by-element write would be."""
    def make(vector):
        @pl.jit
        def k(x: pl.Tensor[[1, 8], pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
            s = pl.create_tensor([1, 8], pl.INT32, name="idx")  # column 3 never written
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="fill"):
                s[0:1, 0:3] = x[0:1, 0:3]
                s[0:1, 4:8] = x[0:1, 4:8]
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="use"):
                vals = pl.read_values(s, [0, 1], 4)  # columns 1..4, the third undefined
                if where == "gm":
                    y[0:1, 0:8] = x[0:1, 0:8]
                    _put(y, [0, 2], vals, vector)
                else:
                    y[0:1, 0:8] = _put(x[0:1, 0:8], [0, 2], vals, vector)
            return y
        return k

    msgs = []
    for vector in (True, False):
        x = torch.arange(8, dtype=torch.int32).reshape(1, 8) + 10
        with pytest.raises(UndefinedOutputError) as ei:
            make(vector).run(x, torch.zeros(1, 8, dtype=torch.int32), config=CHECK)
        msgs.append(str(ei.value))
    assert msgs[0] == msgs[1]
    assert "y" in msgs[0] and "[0:1, 4:5]" in msgs[0] and "allocation 'idx'" in msgs[0]


def test_check_mode_defined_values_leave_a_clean_output():
    @pl.jit
    def k(x: pl.Tensor[[1, 8], pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            pl.write_values(y, [0, 0], pl.read_values(x, [0, 0], 8))
        return y

    x = torch.arange(8, dtype=torch.int32).reshape(1, 8) * 3
    y = torch.zeros(1, 8, dtype=torch.int32)
    k.run(x, y, config=CHECK)
    assert torch.equal(y, x)


@pytest.mark.parametrize("vector", [True, False], ids=["write_values", "write"])
def test_race_between_blocks_is_reported(vector):
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        for b in pl.spmd(2, name_hint="w"):
            _put(y, [0, 3 * b], [b, b, b, b], vector)  # blocks 0 and 1 both write column 3
        return y

    with pytest.raises(RaceError, match=r"y"):
        k.run(torch.zeros(1, 8, dtype=torch.int32), config=CHECK)


# ---- errors -------------------------------------------------------------------

ERRORS = [  # (dtype, tile or GM, first index, values, message)
    (pl.INT8, "tile", [0, 2], [1, 2, 300, 4], r"value 300 out of range of pl.INT8"),
    (pl.UINT8, "tile", [0, 0], [1, -1], r"value -1 out of range of pl.UINT8"),
    (pl.INT32, "tile", [0, 6], [1, 2, 3], r"out of bounds"),
    (pl.INT32, "tile", [0, 1], [1, 2.5], r"fractional value 2.5"),
    (pl.INT8, "gm", [0, 2], [1, 2, 300, 4], r"value 300 out of range of pl.INT8"),
    (pl.INT32, "gm", [0, 6], [1, 2, 3], r"index 8 out of bounds of dim 1"),
    (pl.INT32, "gm", [0, 1], [1, 2.5], r"fractional value 2.5"),
]


@pytest.mark.parametrize("dt,where,idx,values,msg", ERRORS)
def test_errors_match_element_writes(dt, where, idx, values, msg):
    """The same error as the element writes, after the same elements were written."""
    seen = []

    def make(vector):
        @pl.jit
        def k(y: pl.Out[pl.Tensor[[1, 8], dt]]):
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
                t = pl.full([1, 8], dt, 0)
                y[0:1, 0:8] = t
                dst = t if where == "tile" else y
                try:
                    _put(dst, idx, values, vector)
                finally:
                    seen.append(pl.read_values(dst, [0, 0], 8) if where == "tile" else None)
            return y
        return k

    errs = []
    for vector in (True, False):
        y = torch.full((1, 8), 9, dtype=dt.torch)
        with pytest.raises(DslError, match=msg) as ei:
            make(vector).run(y)
        errs.append(re.sub(r"test_write_values\.py:\d+", "LINE", str(ei.value)))  # the line of _put's call
    assert errs[0] == errs[1]
    assert seen[0] == seen[1]


def test_argument_errors():
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 8], pl.INT32]], case: pl.Scalar[pl.INT32]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = pl.full([1, 8], pl.INT32, 0)
            if case == 0:
                pl.write_values(t, [0, 0], 5)
            elif case == 1:
                pl.write_values(t, [], [5])
            elif case == 2:
                pl.write_values(3, [0, 0], [5])
            else:
                pl.write_values(t, [0, 8], [])  # nothing written, no index checked
            y[0:1, 0:8] = t
        return y

    y = torch.zeros(1, 8, dtype=torch.int32)
    with pytest.raises(DslError, match="values must be a list or tuple of numbers, got int"):
        k.run(y, 0)
    with pytest.raises(DslError, match="an empty index"):
        k.run(y, 1)
    with pytest.raises(DslError, match="expected a GM tensor or a tile to write into, got int"):
        k.run(y, 2)
    k.run(y, 3)
    assert torch.equal(y, torch.zeros(1, 8, dtype=torch.int32))


def test_plain_numbers_take_one_copy(monkeypatch):
    """Plain numbers into a tile and into a scratch tensor of a plain run never reach pl.write."""
    from pto.language import tensor_ops

    def no_write(*_):
        raise AssertionError("element write")

    @pl.jit
    def k(y: pl.Out[pl.Tensor[[2, 8], pl.FP32]]):
        s = pl.create_tensor([2, 8], pl.FP32, init_value=0.0, name="s")
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            pl.write_values(s, [1, 2], [1.5, 2, -3.25])
            t = pl.write_values(pl.full([1, 8], pl.FP32, 0.0), [0, 5], [7, 8.5, 9])
            y[0:1, 0:8] = t
            y[1:2, 0:8] = s[1:2, 0:8]
        return y

    monkeypatch.setattr(tensor_ops, "write", no_write)
    y = torch.zeros(2, 8)
    k.run(y)
    assert y.tolist() == [[0, 0, 0, 0, 0, 7, 8.5, 9], [0, 0, 1.5, 2, -3.25, 0, 0, 0]]
