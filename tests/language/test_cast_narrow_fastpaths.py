"""pl.cast's fast paths for a float to a narrow integer (trunc without torch.trunc), INT32 -> FP32
in a nearest-even mode (one conversion, no range check) and an integer tile known or checked to
lie in [-2^24, 2^24] to FP32 give the general path's tile bit for bit (a torch dtype as the
target forces the general path), counters included."""

import pytest
import torch

import pto.language as pl
from pto.language import _ctx
from pto.language.tile_ops import Tile


class _Counts:
    def __init__(self):
        self.ops = self.flops = 0
        self.vk = None


def _cast(t, dst, mode):
    blk = _Counts()
    old = _ctx.state.block
    _ctx.state.block = blk
    try:
        out = pl.cast(t, dst, mode=mode)
    finally:
        _ctx.state.block = old
    return out, (blk.ops, blk.flops, blk.vk)


def _bits(x):
    x = x.contiguous()
    return x.view(torch.uint8) if x.numel() else x


def _floats():
    g = torch.Generator().manual_seed(0)
    v = torch.cat([torch.randn(512, generator=g) * s for s in (1, 300, 1e6, 3e9)]
                  + [torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.5, -0.5, 2.5, -2.5, 127.5,
                                   -128.5, 255.9, 2147483648.0, -2147483904.0, 65535.5])])
    return v[: v.numel() // 8 * 8].reshape(-1, 8)


def _ints():
    g = torch.Generator().manual_seed(1)
    v = torch.cat([torch.randint(-(1 << 31), (1 << 31) - 1, (256,), dtype=torch.int64, generator=g),
                   torch.tensor([16777216, 16777217, -16777217, 16777219, (1 << 31) - 1, -(1 << 31), 0, 3])])
    return v.reshape(-1, 8)


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dst", [pl.INT8, pl.INT16, pl.INT32, pl.UINT8])
@pytest.mark.parametrize("mode", ["none", "rint", "round", "floor", "ceil", "trunc"])
@pytest.mark.parametrize("view", [False, True])
def test_float_to_int_fast_path_equals_general(src, dst, mode, view):
    x = _floats().to(src)
    t = Tile(x.t() if view else x)
    fast, cf = _cast(t, dst, mode)
    gen, cg = _cast(t, dst.torch, mode)
    assert fast.data.dtype == gen.data.dtype and fast.data.stride() == gen.data.stride() and cf == cg
    assert torch.equal(_bits(fast.data), _bits(gen.data))


@pytest.mark.parametrize("src", [torch.int32, torch.int64])
@pytest.mark.parametrize("mode", ["none", "rint", "round", "floor", "ceil", "trunc"])
@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("bound", [None, 1 << 24, 1 << 30])
def test_int_to_fp32_fast_path_equals_general(src, mode, small, bound):
    x = (_ints() % (1 << 24) if small else _ints()).to(src)
    t = Tile(x)
    if bound is not None and (small or bound > 1 << 24):  # a bound that holds (what the INT8 matmuls set)
        t._ib = (x, x._version, bound)
    fast, cf = _cast(t, pl.FP32, mode)
    gen, cg = _cast(t, torch.float32, mode)
    assert fast.data.dtype == gen.data.dtype and fast.data.stride() == gen.data.stride() and cf == cg
    assert torch.equal(_bits(fast.data), _bits(gen.data))
