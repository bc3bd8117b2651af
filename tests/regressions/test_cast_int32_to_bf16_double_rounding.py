"""INT32 -> BF16 went through FP32 (torch's float64 -> bfloat16 path) and rounded
twice: 2^24 + 2^16 + 1 landed on the midpoint 2^24 + 2^16, then on 2^24."""

import torch

import pto.language as pl
from pto.language.tile_ops import Tile


def test_int32_just_above_a_bf16_midpoint_rounds_up():
    t = Tile(torch.tensor([[2 ** 24 + 2 ** 16 + 1]], dtype=torch.int32))
    assert pl.cast(t, pl.BF16, mode="rint").data.float().item() == 2 ** 24 + 2 ** 17
