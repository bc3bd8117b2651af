"""The GM access fast paths (subscript loads and stores, padded pl.slice, pl.assemble,
element reads) have exactly the effects of the general paths: the same tile (values, dtype,
sizes, strides, valid shape), the same GM contents, the same footprint records and the same
block counters, on random views and windows. A buffer flagged ``slow`` takes the general
paths, which is what the comparison runs against."""

import random

import torch

import pto
import pto.language as pl
from pto.language import _ctx


def _record(blk, out):
    out.append(("counters", blk.bytes, blk.ld, blk.st, [(b.name, box, k) for b, box, k in blk.fp]))


def _tile(t):
    d = t.data
    return (d.dtype, tuple(d.shape), d.stride(), d.clone(), t.valid)


def _run(ops, x0, y0, view, slow):
    """Run ``ops`` on views of an In tensor ``x`` and an InOut tensor ``y``; returns what they gave."""
    out = []

    @pl.jit
    def kern(x: pl.Tensor, y: pl.InOut[pl.Tensor]):
        x.buf.slow = y.buf.slow = slow  # slow: every access takes the general path
        xv, yv = view(x), view(y)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="ops"):
            for op in ops:
                kind = op[0]
                if kind == "load":
                    _, src, a0, b0, a1, b1 = op
                    out.append(_tile((xv if src == "x" else yv)[a0:b0, a1:b1]))
                elif kind == "padded":
                    _, a0, a1, s0, s1, v0, v1 = op
                    out.append(_tile(pl.slice(xv, [s0, s1], [a0, a1], valid_shape=[v0, v1])))
                elif kind == "store":
                    _, a0, a1, n0, n1 = op
                    yv[a0:a0 + n0, a1:a1 + n1] = pl.full([n0, n1], yv.data.dtype, 3)
                elif kind == "assemble":
                    _, a0, a1, n0, n1, v0, v1, atomic = op
                    t = pl.full([n0, n1], yv.data.dtype, 2)
                    if (v0, v1) != (n0, n1):
                        t = pl.set_validshape(t, v0, v1)
                    pl.assemble(yv, t, [a0, a1], atomic=pl.AtomicType.Add if atomic else None)
                elif kind == "read":
                    _, src, i, j = op
                    out.append(pl.read(xv if src == "x" else yv, [i, j]))
            _record(_ctx.state.block, out)
        return y

    y = y0.clone()
    kern.run(x0, y, config=pto.RunConfig(check=False))
    return out, y


def _views():
    """(root shape, view function on a GM tensor) pairs: whole roots, row and column windows,
    rows narrower than a root row (a [R, C] root seen as [R * k, C / k])."""
    yield (6, 8), lambda t: t
    yield (6, 8), lambda t: pl.slice(t, [4, 5], [1, 2])
    yield (6, 8), lambda t: pl.slice(t, [5, 8], [1, 0])
    yield (6, 8), lambda t: pl.reshape(t, [12, 4])
    yield (6, 8), lambda t: pl.slice(pl.reshape(t, [24, 2]), [20, 2], [3, 0])
    yield (5, 1), lambda t: t


def test_gm_fast_paths_match_the_general_paths():
    rng = random.Random(4)
    compared = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for shape, view in _views():
            x0 = (torch.randn(shape) * 20).to(dtype)
            y0 = (torch.randn(shape) * 20).to(dtype)
            R, C = _view_shape(shape, view, dtype)
            for _ in range(12):
                ops = []
                for _ in range(10):
                    a0, a1 = rng.randrange(R), rng.randrange(C)
                    n0, n1 = rng.randrange(1, R - a0 + 1), rng.randrange(1, C - a1 + 1)
                    if rng.random() < 0.3:  # whole rows of the view, often
                        a1, n1 = 0, C
                    k = rng.randrange(6)
                    if k == 0:
                        ops.append(("load", rng.choice("xy"), a0, a0 + n0, a1, a1 + n1))
                    elif k == 1:
                        s0, s1 = n0 + rng.randrange(3), n1 + rng.randrange(3)
                        ops.append(("padded", a0, a1, s0, s1, rng.randrange(1, n0 + 1), rng.randrange(1, n1 + 1)))
                    elif k == 2:
                        ops.append(("store", a0, a1, n0, n1))
                    elif k == 3:
                        v0, v1 = (n0, n1) if rng.random() < 0.5 else (rng.randrange(1, n0 + 1), rng.randrange(1, n1 + 1))
                        atomic = dtype != torch.bfloat16 and rng.random() < 0.3
                        ops.append(("assemble", a0, a1, n0, n1, v0, v1, atomic))
                    else:
                        ops.append(("read", rng.choice("xy"), a0, a1))
                fast, y_fast = _run(ops, x0, y0, view, False)
                slow, y_slow = _run(ops, x0, y0, view, True)
                assert len(fast) == len(slow)
                for f, s in zip(fast, slow):
                    if type(f) is tuple and f and isinstance(f[3], torch.Tensor):
                        assert f[:3] == s[:3] and f[4] == s[4] and torch.equal(f[3], s[3]), (ops, f, s)
                    else:
                        assert f == s, (ops, f, s)
                assert torch.equal(y_fast, y_slow), ops
                compared += 1
    assert compared == 3 * 6 * 12


def _view_shape(shape, view, dtype):
    got = []

    @pl.jit
    def probe(x: pl.Tensor):
        got.append(tuple(view(x).shape))

    probe.run(torch.zeros(shape, dtype=dtype), config=pto.RunConfig(check=False))
    return got[0]
