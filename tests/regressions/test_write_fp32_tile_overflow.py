"""Regression: ``pl.write`` of a float past FP32's range (1e39, 3.5e38) into an FP32 *tile* raised
torch's bare RuntimeError ("value cannot be converted to type float without overflow"), while the
same value into an FP32 GM tensor, into FP16/BF16 tiles and through ``pl.write_values`` became
+-inf (IEEE rounding). All four now agree."""

import pytest
import torch

import pto.language as pl


def _kernel(how: str, value: float):
    """A kernel writing the Python float ``value`` (not a pl.Scalar: that would be FP32 already)
    into element [0, 1] of an FP32 tile with ``how``, then storing the tile into ``y``."""
    @pl.jit
    def k(y: pl.Out[pl.Tensor[[1, 4], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
            t = pl.full([1, 4], pl.FP32, 0)
            if how == "write":
                pl.write(t, [0, 1], value)
            else:
                pl.write_values(t, [0, 1], [value])
            y[0:1, 0:4] = t
        return y
    return k


@pytest.mark.parametrize("value, want", [(1e39, float("inf")), (-1e39, float("-inf")), (3.5e38, float("inf")),
                                         (1e300, float("inf")), (3.0e38, 3.0e38)])
def test_write_into_fp32_tile_rounds_like_write_values(value, want):
    got = {}
    for how in ("write", "write_values"):
        y = torch.zeros(1, 4)
        _kernel(how, value)(y)
        got[how] = y
    assert torch.equal(got["write"], got["write_values"])
    assert got["write"][0, 1].item() == torch.tensor(want, dtype=torch.float32).item()
    assert got["write"][0, 0].item() == 0.0 and got["write"][0, 2].item() == 0.0
