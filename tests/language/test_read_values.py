"""pl.read_values: n consecutive elements in one call, with the values, footprints, load counts
and check-mode semantics of n scalar pl.read calls."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, UndefinedValueError
from pto.language.typing import ScalarValue

CHECK = pto.RunConfig(check=True)
KEEP = pto.RunConfig(keep_footprints=True)


def _pair(view, idx, n):
    """Two kernels reading ``n`` elements of ``view(x)`` from ``idx`` inside one block: one
    by pl.read_values, one by n pl.read calls. Each appends what it read to ``got``."""
    got = []

    def make(vector: bool):
        @pl.jit
        def k(x: pl.Tensor[[4, 6, 8], pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
            v = view(x)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="rd"):
                if vector:
                    got.append(pl.read_values(v, idx, n))
                else:
                    got.append([pl.read(v, [*idx[:-1], idx[-1] + j]) for j in range(n)])
                y[0:1, 0:8] = pl.full([1, 8], pl.INT32, 0)
            return y
        return k

    return make(True), make(False), got


VIEWS = [  # (name, view, first index, n, its hand-computed row-major offset in x [4, 6, 8])
    ("3-D", lambda x: x, [2, 3, 1], 6, 2 * 48 + 3 * 8 + 1),
    ("reshape 2-D", lambda x: pl.reshape(x, [24, 8]), [13, 2], 5, 13 * 8 + 2),
    ("reshape 1-D", lambda x: pl.reshape(x, [192]), [37], 30, 37),  # crosses root rows
    ("reshape [1, n]", lambda x: pl.reshape(x, [1, 192]), [0, 60], 9, 60),
    ("reshape [48, 4]", lambda x: pl.reshape(x, [48, 4]), [7, 1], 3, 7 * 4 + 1),
]


@pytest.mark.parametrize("name,view,idx,n,start", VIEWS, ids=[v[0] for v in VIEWS])
def test_gm_read_values_match_scalar_reads(name, view, idx, n, start):
    x = torch.arange(4 * 6 * 8, dtype=torch.int32).reshape(4, 6, 8) * 3 - 50
    kv, ks, got = _pair(view, idx, n)
    pv = kv.run(x, torch.zeros(1, 8, dtype=torch.int32), config=KEEP)
    ps = ks.run(x, torch.zeros(1, 8, dtype=torch.int32), config=KEEP)
    assert got[0] == got[1] == x.flatten().tolist()[start:start + n]
    assert all(type(v) is int for v in got[0])
    bv, bs = pv.graph.tasks[0].blocks[0], ps.graph.tasks[0].blocks[0]
    assert [(b.name, box, k) for b, box, k in bv.fp] == [(b.name, box, k) for b, box, k in bs.fp]
    assert len(bv.fp) == n + 1  # one box per element read, then the store
    assert (bv.ld, bv.st, bv.bytes, bv.ops) == (bs.ld, bs.st, bs.bytes, bs.ops) == (n, 1, 4 * n + 32, 1)


def test_tile_read_values_match_scalar_reads():
    got = {}

    @pl.jit
    def k(x: pl.Tensor[[3, 16], pl.BF16], y: pl.Out[pl.Tensor[[3, 16], pl.BF16]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rd"):
            t = x[0:3, 0:16]
            got["vec"] = pl.read_values(t, [1, 4], 7)
            got["one"] = [pl.read(t, [1, 4 + j]) for j in range(7)]
            got["row"] = pl.read_values(pl.reshape(t, [48]), [20], 7)
            got["empty"] = pl.read_values(t, [2, 16], 0)
            y[0:3, 0:16] = t
        return y

    x = torch.randn(3, 16).to(torch.bfloat16)
    k.run(x, torch.zeros(3, 16, dtype=torch.bfloat16))
    assert got["vec"] == got["one"] == got["row"] == x[1, 4:11].float().tolist()
    assert got["empty"] == []


def test_orchestration_read_values_count_as_scalar_reads():
    got = []

    def make(vector):
        @pl.jit
        def k(p: pl.Tensor[[10], pl.INT32], y: pl.Out[pl.Tensor[[1, 4], pl.INT32]]):
            got.append(pl.read_values(p, [2], 6) if vector else [pl.read(p, [2 + j]) for j in range(6)])
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
                y[0:1, 0:4] = pl.full([1, 4], pl.INT32, 1)
            return y
        return k

    p = torch.arange(10, dtype=torch.int32) * 7
    a = make(True).run(p, torch.zeros(1, 4, dtype=torch.int32))
    b = make(False).run(p, torch.zeros(1, 4, dtype=torch.int32))
    assert got[0] == got[1] == [14, 21, 28, 35, 42, 49]
    assert a.orch_reads == b.orch_reads == 6


@pytest.mark.parametrize("where", ["gm", "tile"])
def test_check_mode_marks_only_the_undefined_elements(where):
    got = []

    @pl.jit
    def k(x: pl.Tensor[[1, 8], pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        s = pl.create_tensor([1, 8], pl.INT32, name="idx")  # columns 3 and 5 never written
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="fill"):
            s[0:1, 0:3] = x[0:1, 0:3]
            s[0:1, 4:5] = x[0:1, 4:5]
            s[0:1, 6:8] = x[0:1, 6:8]
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="use"):
            vals = pl.read_values(s if where == "gm" else s[0:1, 0:8], [0, 1], 6)
            got.append(vals)
            y[0:1, 0:8] = x[0:1, 0:8]
            for v in vals:
                if v >= 0:  # a branch on an undefined element raises
                    pass
        return y

    x = torch.arange(8, dtype=torch.int32).reshape(1, 8) + 10
    with pytest.raises(UndefinedValueError) as ei:
        k.run(x, torch.zeros(1, 8, dtype=torch.int32), config=CHECK)
    vals = got[0]
    assert [type(v) is ScalarValue for v in vals] == [False, False, True, False, True, False]
    assert [vals[i] for i in (0, 1, 3, 5)] == [11, 12, 14, 16]
    assert "allocation 'idx'" in str(ei.value) and "a branch condition" in str(ei.value)
    if where == "gm":
        assert "idx[0, 3]" in str(ei.value)  # the first undefined element, by its GM index


def test_errors():
    @pl.jit
    def k(x: pl.Tensor[[2, 8], pl.INT32], y: pl.Out[pl.Tensor[[2, 8], pl.INT32]], n: pl.Scalar[pl.INT32]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rd"):
            pl.read_values(x, [1, 4], n)
            y[0:2, 0:8] = x[0:2, 0:8]
        return y

    x = torch.zeros(2, 8, dtype=torch.int32)
    k.run(x, torch.zeros(2, 8, dtype=torch.int32), 4)
    with pytest.raises(DslError, match=r"index 8 out of bounds of dim 1 of x \(extent 8\)"):
        k.run(x, torch.zeros(2, 8, dtype=torch.int32), 5)
    with pytest.raises(DslError, match="negative count -1"):
        k.run(x, torch.zeros(2, 8, dtype=torch.int32), -1)
