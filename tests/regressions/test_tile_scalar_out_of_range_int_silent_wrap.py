"""``int8_tile + 300`` (a Python int outside an integer tile's dtype range as the scalar of a
tile-scalar op) silently wrapped (300 acts as 44 in INT8); ``pl.maximum`` / ``pl.minimum`` /
``pl.select`` with it raised torch's raw RuntimeError. The DSL has no implicit promotion, so the
scalar takes the tile's dtype: a number outside that range is a DslError naming the op, the value
and the dtype's range, for either operand order, the functional and operator forms, an integral
float and a defined scalar from pl.read, also in graph-only mode. Scalars in range give the same
bits as before (the same-dtype torch op), and an undefined scalar (check mode) is not checked."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError

OPS = {
    "add": (lambda t, v: t + v, "pl.add"), "radd": (lambda t, v: v + t, "pl.add"),
    "sub": (lambda t, v: t - v, "pl.sub"), "rsub": (lambda t, v: v - t, "pl.sub"),
    "mul": (lambda t, v: t * v, "pl.mul"), "rmul": (lambda t, v: v * t, "pl.mul"),
    "div": (lambda t, v: t / v, "pl.div"), "rdiv": (lambda t, v: v / t, "pl.div"),
    "pl.add": (lambda t, v: pl.add(t, v), "pl.add"), "pl.sub": (lambda t, v: pl.sub(v, t), "pl.sub"),
    "maximum": (lambda t, v: pl.maximum(t, v), "pl.maximum"), "minimum": (lambda t, v: pl.minimum(t, v), "pl.minimum"),
    "select": (lambda t, v: pl.select(pl.cmp(t, 0, "gt"), t, v), "pl.select"),
}


def _kernel(dtype, body, value, from_read=False):
    @pl.jit
    def k(x: pl.Tensor[[2, 4], dtype], s: pl.Tensor[[1, 1], pl.INT64], y: pl.Out[pl.Tensor[[2, 4], dtype]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="op"):
            y[0:2, 0:4] = body(x[0:2, 0:4], pl.read(s, [0, 0]) if from_read else value)
        return y
    return k


def _x(dtype):
    return torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=dtype.torch)  # no zero: rdiv reaches its check


@pytest.mark.parametrize("mode", ["plain", "read", "graph_only"])
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 300), (pl.INT8, -129), (pl.INT8, 300.0), (pl.UINT8, -1),
                                         (pl.INT32, 1 << 31), (pl.INT16, -(1 << 15) - 1)])
def test_out_of_range_scalar_is_a_dsl_error(dtype, value, op, mode):
    body, name = OPS[op]
    k = _kernel(dtype, body, value, from_read=mode == "read")
    config = pto.RunConfig(execute=False) if mode == "graph_only" else None
    with pytest.raises(DslError, match=rf"task 'op' .*{name}: value -?\d+(\.0)? out of range of {dtype!r} "
                                       r"\[-?\d+, \d+\] \(no implicit promotion"):
        k.run(_x(dtype), torch.tensor([[int(value)]]), torch.zeros(2, 4, dtype=dtype.torch), config=config)


@pytest.mark.parametrize("from_read", [False, True])
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype,value", [(pl.INT8, 127), (pl.INT8, -128), (pl.INT8, 100.0), (pl.UINT8, 255),
                                         (pl.INT32, (1 << 31) - 1), (pl.FP32, 1 << 40), (pl.BF16, 300)])
def test_in_range_scalar_gives_the_same_bits(dtype, value, op, from_read):
    body, _ = OPS[op]
    k = _kernel(dtype, body, value, from_read)
    x = _x(dtype)
    y = torch.zeros(2, 4, dtype=dtype.torch)
    k.run(x, torch.tensor([[int(value)]]), y)
    v = int(value) if from_read or not dtype.is_float else value
    t = v if dtype.is_float else torch.tensor(int(v), dtype=dtype.torch)  # the scalar in the tile's dtype
    rm = None if dtype.is_float else "trunc"  # integer division is exact (INT32 max / 1 is INT32 max)
    want = {"add": x + t, "radd": x + t, "sub": x - t, "rsub": -x + t, "mul": x * t, "rmul": x * t,
            "div": torch.div(x, t, rounding_mode=rm), "rdiv": torch.div(t, x, rounding_mode=rm),
            "pl.add": x + t, "pl.sub": -x + t,
            "maximum": torch.clamp(x, min=v), "minimum": torch.clamp(x, max=v),
            "select": torch.where(x > 0, x, t)}[op].to(dtype.torch)
    assert torch.equal(y, want), (y, want)


def test_undefined_scalar_not_checked():
    @pl.jit
    def k(x: pl.Tensor[[2, 4], pl.INT8], y: pl.Out[pl.Tensor[[2, 4], pl.INT8]]):
        sc = pl.create_tensor([2, 4], pl.INT32, name="sc")  # never written: poisoned in check mode
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="op"):
            t = x[0:2, 0:4]
            y[0:2, 0:4] = pl.select(pl.cmp(t, 0, "gt"), t + pl.read(sc, [0, 0]), pl.read(sc, [0, 1]))
        return y
    with pytest.raises(pto.errors.UndefinedOutputError, match="y"):  # reported as undefined, not as a range error
        k.run(_x(pl.INT8), torch.zeros(2, 4, dtype=torch.int8), config=pto.RunConfig(check=True))
