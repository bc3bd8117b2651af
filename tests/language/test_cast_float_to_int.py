"""Float -> integer pl.cast (FP32 / BF16 / FP16 sources into 1-4 byte integers, computed in
FP32) against an FP64 reference: every rounding mode, saturation, NaN -> 0, ties, values
next to the rounding and range edges, and random bit patterns."""

import pytest
import torch

import pto.language as pl
from pto.language.tile_ops import Tile

_DTS = {"int8": (pl.INT8, torch.int8), "int16": (pl.INT16, torch.int16), "int32": (pl.INT32, torch.int32),
        "uint8": (pl.UINT8, torch.uint8)}
_MODES = ("none", "rint", "round", "floor", "ceil", "trunc")

SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 127.5, -128.5, 126.5, 127.49999,
           128.0, -129.0, 255.5, 256.0, 32767.5, 32768.0, -32768.5, 2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 128,
           2.0 ** 31 + 256, 2.0 ** 63, 2.0 ** 24 + 2, 8388607.5, -8388607.5, 8388608.5, float("inf"), float("-inf"),
           float("nan"), 3.4e38, -3.4e38, 1e-45, 4294967295.0]


def _reference(v: torch.Tensor, dt: torch.dtype, mode: str) -> torch.Tensor:
    """FP64, one element at a time in Python: round by ``mode``, saturate, NaN -> 0."""
    import math
    info = torch.iinfo(dt)
    out = []
    for x in v.to(torch.float64).tolist():
        if math.isnan(x):
            out.append(0)
            continue
        if math.isinf(x):
            out.append(info.max if x > 0 else info.min)
            continue
        if mode in ("none", "rint"):
            r = round(x)  # Python rounds half to even
        elif mode == "round":
            r = math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)  # exact in FP64 for FP32 inputs
        else:
            r = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[mode](x)
        out.append(min(max(r, info.min), info.max))
    return torch.tensor(out, dtype=torch.int64).to(dt)


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-2 ** 31, 2 ** 31, (3000,), dtype=torch.int64, generator=g).to(torch.int32)
    near = torch.randint(-4 * 70000, 4 * 70000, (3000,), generator=g).float() / 4
    return [torch.tensor(SPECIAL, dtype=torch.float32), bits.view(torch.float32), near,
            near + torch.randn(3000, generator=g) * 1e-3, (torch.randn(2000, generator=g) * 300).to(torch.bfloat16),
            (torch.randn(2000, generator=g) * 300).to(torch.float16)]


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("dt", sorted(_DTS))
def test_float_to_int_matches_fp64_reference(dt, mode):
    pdt, tdt = _DTS[dt]
    for v in _inputs():
        got = pl.cast(Tile(v.reshape(1, -1)), pdt, mode=mode).data.reshape(-1)
        assert got.dtype == tdt
        assert torch.equal(got, _reference(v, tdt, mode)), (dt, mode, v.dtype)
