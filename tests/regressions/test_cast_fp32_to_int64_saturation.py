"""FP32 -> INT64 of a value above 2^63 clamped to float(2^63 - 1) == 2^63 and
overflowed to -2^63 instead of saturating."""

import torch

import pto.language as pl
from pto.language.tile_ops import Tile


def test_huge_positive_saturates_to_int64_max():
    assert pl.cast(Tile(torch.tensor([[1e30]])), pl.INT64, mode="trunc").data.item() == 2 ** 63 - 1
