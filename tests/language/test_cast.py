"""pl.cast: every rounding mode on ties and directed cases, saturation, and a
hypothesis comparison against an exact float64 / grid reference (hw-native-sys/pypto `docs/en/user/`)."""

import bisect
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto.language as pl
from pto.errors import DslError
from pto.language.tile_ops import Tile

MODES = ("none", "rint", "round", "floor", "ceil", "trunc")


def cast1(value, src, dst, mode):
    """Cast one value through a [1, 1] tile; returns a Python float/int."""
    t = Tile(torch.tensor([[value]], dtype=src.torch))
    return pl.cast(t, dst, mode=mode).data.reshape(-1)[0].item()


# ---- the tie examples -------------------------------------------------------------

# 1.01953125 = 1 + 5/256 lies exactly between the BF16 neighbours 1.015625 and 1.0234375
TIE_BF16 = 1.01953125


@pytest.mark.parametrize("mode, expected", [
    ("rint", 1.015625), ("none", 1.015625),  # ties to even (mantissa ...0100 is even)
    ("round", 1.0234375),                      # ties away from zero
    ("trunc", 1.015625), ("floor", 1.015625), ("ceil", 1.0234375),
])
def test_fp32_to_bf16_positive_tie(mode, expected):
    assert cast1(TIE_BF16, pl.FP32, pl.BF16, mode) == expected


@pytest.mark.parametrize("mode, expected", [
    ("rint", -1.015625), ("none", -1.015625), ("round", -1.0234375),
    ("trunc", -1.015625), ("floor", -1.0234375), ("ceil", -1.015625),
])
def test_fp32_to_bf16_negative_tie(mode, expected):
    assert cast1(-TIE_BF16, pl.FP32, pl.BF16, mode) == expected


def test_fp32_to_bf16_tie_to_even_goes_up_when_the_upper_neighbour_is_even():
    # 1.02734375 lies between 1.0234375 (odd mantissa) and 1.03125 (even)
    assert cast1(1.02734375, pl.FP32, pl.BF16, "rint") == 1.03125
    assert cast1(1.02734375, pl.FP32, pl.BF16, "round") == 1.03125


def test_fp32_to_bf16_non_tie_rounds_to_nearest_in_every_nearest_mode():
    v = 1.01953125 + 2 ** -20  # just above the tie
    for mode in ("rint", "round", "none"):
        assert cast1(v, pl.FP32, pl.BF16, mode) == 1.0234375


@pytest.mark.parametrize("mode, values", [
    ("rint", [2, -2, 0, -0, 2, -2, 2, -3]),
    ("none", [2, -2, 0, -0, 2, -2, 2, -3]),
    ("round", [3, -3, 1, -1, 2, -2, 2, -3]),
    ("floor", [2, -3, 0, -1, 1, -2, 2, -3]),
    ("ceil", [3, -2, 1, 0, 2, -1, 3, -2]),
    ("trunc", [2, -2, 0, 0, 1, -1, 2, -2]),
])
def test_fp32_to_int32_ties_and_negatives(mode, values):
    src = Tile(torch.tensor([[2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 2.4, -2.6]]))
    out = pl.cast(src, pl.INT32, mode=mode)
    assert out.data.dtype == torch.int32
    assert out.data.reshape(-1).tolist() == values


def test_mode_codes_match_names():
    src = Tile(torch.tensor([[2.5, -2.5, 1.7, -1.7]]))
    for name, code in pl.CAST_MODES.items():
        if name == "odd":
            continue
        assert torch.equal(pl.cast(src, pl.INT32, mode=code).data, pl.cast(src, pl.INT32, mode=name).data)


def test_default_mode_is_round_half_away():
    assert cast1(2.5, pl.FP32, pl.INT32, "round") == 3
    assert pl.cast(Tile(torch.tensor([[2.5]])), pl.INT32).data.item() == 3


@pytest.mark.parametrize("mode", ["odd", 6, "nearest", 9])
def test_unsupported_modes_raise(mode):
    with pytest.raises(DslError, match="mode"):
        pl.cast(Tile(torch.ones(1, 1)), pl.INT32, mode=mode)


# ---- saturation ----------------------------------------------------------------------------

def test_int8_saturation_from_float_and_int():
    f = Tile(torch.tensor([[127.4, 127.6, 300.0, -128.4, -128.6, -1e9]]))
    assert pl.cast(f, pl.INT8, mode="rint").data.tolist() == [[127, 127, 127, -128, -128, -128]]
    i = Tile(torch.tensor([[300, -300, 127, -129, 128]], dtype=torch.int32))
    assert pl.cast(i, pl.INT8).data.tolist() == [[127, -128, 127, -128, 127]]
    h = Tile(torch.tensor([[300.7, -300.2, 126.9]], dtype=torch.float16))
    assert pl.cast(h, pl.INT8, mode="trunc").data.tolist() == [[127, -128, 126]]


def test_float_to_int_nan_is_zero_and_inf_saturates():
    src = Tile(torch.tensor([[float("nan"), float("inf"), -float("inf")]]))
    for dt in (pl.INT8, pl.INT16, pl.INT32, pl.UINT8):
        assert pl.cast(src, dt, mode="rint").data.to(torch.int64).tolist() == [[0, dt.max, dt.min]]


def test_fp32_to_int64_saturates_at_both_ends():
    src = Tile(torch.tensor([[1e30, -1e30, 2.0 ** 62, -2.0 ** 63]]))
    out = pl.cast(src, pl.INT64, mode="trunc").data.tolist()
    assert out == [[2 ** 63 - 1, -2 ** 63, 2 ** 62, -2 ** 63]]


def test_int_narrowing_saturates_and_widening_is_exact():
    src = Tile(torch.tensor([[70000, -70000, 5]], dtype=torch.int32))
    assert pl.cast(src, pl.INT16).data.tolist() == [[32767, -32768, 5]]
    assert pl.cast(src, pl.INT64).data.tolist() == [[70000, -70000, 5]]
    u = Tile(torch.tensor([[4_000_000_000]], dtype=torch.uint32))
    assert pl.cast(u, pl.INT32).data.item() == 2 ** 31 - 1


def test_fp32_to_fp16_overflow_rint_is_inf_directed_modes_saturate():
    src = Tile(torch.tensor([[70000.0, -70000.0, 65519.0]]))
    assert pl.cast(src, pl.FP16, mode="rint").data.float().tolist() == [[math.inf, -math.inf, 65504.0]]
    assert pl.cast(src, pl.FP16, mode="trunc").data.float().tolist() == [[65504.0, -65504.0, 65504.0]]
    assert pl.cast(src, pl.FP16, mode="floor").data.float().tolist()[0][:2] == [65504.0, -math.inf]


def test_widening_casts_are_exact_and_keep_nan_inf():
    src = Tile(torch.tensor([[1.5, float("nan"), float("inf"), -0.0]], dtype=torch.bfloat16))
    out = pl.cast(src, pl.FP32, mode="none").data
    assert out[0, 0] == 1.5 and math.isnan(out[0, 1]) and out[0, 2] == math.inf
    assert math.copysign(1.0, float(out[0, 3])) == -1.0


def test_cast_to_same_dtype_is_a_copy_and_keeps_valid_shape():
    src = Tile(torch.ones(4, 4), valid=(2, 3))
    out = pl.cast(src, pl.FP32)
    out.data[0, 0] = 7
    assert src.data[0, 0] == 1 and out.valid == (2, 3)


def test_cast_to_bool():
    src = Tile(torch.tensor([[0.0, -0.0, 2.0, float("nan")]]))
    assert pl.cast(src, pl.BOOL).data.tolist() == [[False, False, True, True]]


# ---- int sources wider than the target's mantissa: one rounding of the exact value -----------

@pytest.mark.parametrize("mode, expected", [
    ("rint", 2 ** 24 + 2 ** 17), ("round", 2 ** 24 + 2 ** 17), ("none", 2 ** 24 + 2 ** 17),
    ("floor", 2 ** 24), ("trunc", 2 ** 24), ("ceil", 2 ** 24 + 2 ** 17),
])
def test_int32_to_bf16_is_rounded_once(mode, expected):
    # 2^24 + 2^16 + 1 is just above the BF16 midpoint 2^24 + 2^16; rounding through FP32
    # first would land on the midpoint and then (ties to even) on 2^24.
    assert cast1(2 ** 24 + 2 ** 16 + 1, pl.INT32, pl.BF16, mode) == expected


@pytest.mark.parametrize("mode, expected", [("rint", 2048), ("round", 2050), ("floor", 2048), ("ceil", 2050),
                                            ("trunc", 2048)])
def test_int32_to_fp16_tie(mode, expected):
    assert cast1(2049, pl.INT32, pl.FP16, mode) == expected


# ---- hypothesis: every mode against an independent reference ---------------------------------

def _grid(tdtype):
    """Sorted finite values of a 16-bit float dtype and, per value, whether its mantissa is even."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    vals = bits.view(tdtype).to(torch.float64)
    keep = torch.isfinite(vals)
    vals, raw = vals[keep].tolist(), (bits[keep].to(torch.int32) & 1).tolist()
    table = {}
    for v, r in zip(vals, raw):
        if v not in table or r == 0:  # +0/-0: both even
            table[v] = r == 0
    keys = sorted(table)
    return keys, [table[k] for k in keys]


GRIDS = {pl.BF16.name: _grid(torch.bfloat16), pl.FP16.name: _grid(torch.float16)}


def ref_to_float16ish(v: float, dst, mode: str) -> float:
    """Round ``v`` to a 16-bit float grid under ``mode`` (finite ``v`` within range)."""
    keys, even = GRIDS[dst.name]
    i = bisect.bisect_left(keys, v)
    if i < len(keys) and keys[i] == v:
        return v
    lo, hi = keys[i - 1], keys[i]
    if mode == "floor":
        return lo
    if mode == "ceil":
        return hi
    if mode == "trunc":
        return lo if v > 0 else hi
    dl, dh = v - lo, hi - v
    if dl != dh:
        return lo if dl < dh else hi
    if mode == "round":
        return hi if v > 0 else lo
    return lo if even[i - 1] else hi


def ref_to_int(v: float, dst, mode: str) -> int:
    if math.isnan(v):
        return 0
    if math.isinf(v):
        return dst.max if v > 0 else dst.min
    if mode in ("rint", "none"):
        r = round(v)  # Python: half to even
    elif mode == "round":
        r = int(math.copysign(math.floor(abs(v) + 0.5), v))
    else:
        r = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[mode](v)
    return max(dst.min, min(dst.max, r))


f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-6e4, max_value=6e4)
f32_halves = st.integers(-2 ** 12, 2 ** 12).map(lambda k: k / 2 + (1 / 4 if k % 3 == 0 else 0))


@settings(max_examples=300, deadline=None)
@given(v=st.one_of(f32, f32_halves), mode=st.sampled_from(MODES), dst=st.sampled_from([pl.BF16, pl.FP16]))
def test_fp32_to_16bit_float_matches_grid_reference(v, mode, dst):
    v = float(np.float32(v))
    got = cast1(v, pl.FP32, dst, mode)
    want = ref_to_float16ish(v, dst, mode)
    if abs(want) > 65504 and dst is pl.FP16:
        return
    assert got == want, (v, mode, dst)


@settings(max_examples=300, deadline=None)
@given(v=st.integers(-2 ** 31, 2 ** 31 - 1), mode=st.sampled_from(MODES))
def test_int32_to_bf16_matches_grid_reference(v, mode):
    assert cast1(v, pl.INT32, pl.BF16, mode) == ref_to_float16ish(float(v), pl.BF16, mode), (v, mode)


@settings(max_examples=300, deadline=None)
@given(v=st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), f32_halves),
       mode=st.sampled_from(MODES), dst=st.sampled_from([pl.INT8, pl.INT16, pl.INT32, pl.UINT8]))
def test_fp32_to_int_matches_python_reference(v, mode, dst):
    v = float(np.float32(v))
    assert cast1(v, pl.FP32, dst, mode) == ref_to_int(v, dst, mode), (v, mode, dst)


@settings(max_examples=200, deadline=None)
@given(v=st.integers(-2 ** 31, 2 ** 31 - 1), mode=st.sampled_from(MODES))
def test_int32_to_fp32_matches_numpy_neighbours(v, mode):
    r = np.float32(v)  # numpy rounds int -> float32 to nearest even
    lo = r if float(r) <= v else np.nextafter(r, np.float32(-np.inf))
    hi = r if float(r) >= v else np.nextafter(r, np.float32(np.inf))
    want = {"floor": lo, "ceil": hi, "trunc": lo if v > 0 else hi, "rint": r, "none": r}.get(mode)
    if mode == "round":
        dl, dh = v - float(lo), float(hi) - v
        want = (hi if v > 0 else lo) if dl == dh else r
    assert cast1(v, pl.INT32, pl.FP32, mode) == float(want), (v, mode)



def _np_int_to_fp32(v: int, mode: str) -> float:
    """The FP32 value of integer ``v`` under ``mode``, from numpy's nearest-even conversion and its
    neighbours (independent of pl.cast)."""
    r = np.float32(v)
    lo = r if float(r) <= v else np.nextafter(r, np.float32(-np.inf))
    hi = r if float(r) >= v else np.nextafter(r, np.float32(np.inf))
    if mode == "round" and v - float(lo) == float(hi) - v and lo != hi:
        return float(hi if v > 0 else lo)
    return float({"floor": lo, "ceil": hi, "trunc": lo if v > 0 else hi}.get(mode, r))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("src", [torch.int32, torch.int64])
def test_int_to_fp32_tile_near_2_pow_24_matches_numpy_neighbours(mode, src):
    # a tile whose magnitudes stay within 2^24 converts in one step; one element past it sends the
    # whole tile through the exact rounding path: both give numpy's neighbours in every mode
    for edge in (1 << 24, (1 << 24) + 1, (1 << 24) + 3, -(1 << 24) - 3, (1 << 25) + 2):
        vals = [0, 7, -9, 1 << 23, -(1 << 24), edge]
        got = pl.cast(Tile(torch.tensor([vals], dtype=src)), pl.FP32, mode=mode).data[0].tolist()
        want = [_np_int_to_fp32(v, mode) for v in vals]
        assert got == want, (edge, mode, got, want)
