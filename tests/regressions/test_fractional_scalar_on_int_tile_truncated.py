"""``int_tile * 0.5`` computed in float and was silently truncated back to the
integer dtype (an implicit promotion the DSL does not have)."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError
from pto.language.tile_ops import Tile


def test_fractional_scalar_with_integer_tile_is_rejected():
    with pytest.raises(DslError, match="fractional scalar 0.5"):
        pl.mul(Tile(torch.tensor([[3]], dtype=torch.int32)), 0.5)
