"""The demo's max-error column showed 0 for an output full of NaN: error_stats
only looked at finite differences."""

import math

import torch

from pto.golden import error_stats


def test_nan_output_is_an_infinite_error():
    assert math.isinf(error_stats(torch.full((4,), float("nan")), torch.zeros(4))["max_abs"])
