"""``3.0 / tile`` was computed as ``3.0 * (1 / tile)``: two roundings instead of
one IEEE division."""

import torch

import pto.language as pl
from pto.language.tile_ops import Tile


def test_number_over_tile_is_one_division():
    x = torch.tensor([[0.7, 1.3, 2.9, 0.11]])
    for v in (3.0, 7.0, 0.375):  # exactly representable: the scalar is not rounded to FP32 first
        assert torch.equal((v / Tile(x.clone())).data, (v / x.double()).float())
        assert torch.equal(pl.div(v, Tile(x.clone())).data, (v / x.double()).float())
