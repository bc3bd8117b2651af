"""Regression: torch.float64 was mapped to pl.FP32 (``dtypes.from_torch``), so
``pl.create_tensor(shape, torch.float64)`` silently made an FP32 tensor, a bare ``pl.Tensor``
parameter accepted a float64 tensor whose tiles reported pl.FP32 while computing in float64,
and a float64 torch tensor mixed into tile math was accepted (breaker finding M6). float64 now
has no pto dtype: each of these is a DslError / BindError saying so and pointing to pl.FP32.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError, DslError
from pto.language.dtypes import from_torch

HINT = r"float64 \(torch.float64\) has no pto dtype; use pl.FP32"


def test_from_torch_rejects_float64():
    with pytest.raises(DslError, match=HINT):
        from_torch(torch.float64)
    with pytest.raises(DslError, match=HINT):
        pl.Tensor[[2], torch.float64]


def test_create_tensor_float64_is_a_dsl_error_naming_the_site():
    @pl.jit
    def k(x: pl.Tensor[[2], pl.FP32]):
        pl.create_tensor([16, 128], torch.float64)

    with pytest.raises(DslError, match="pl.create_tensor: " + HINT + r".* at .*test_float64_silently"):
        k(torch.zeros(2))


def test_bare_tensor_parameter_rejects_float64():
    @pl.jit
    def k(x: pl.Tensor):
        pass

    with pytest.raises(BindError, match=r"kernel k: parameter 'x': " + HINT):
        k(torch.zeros(4, dtype=torch.float64))
    k(torch.zeros(4, dtype=torch.float32))  # FP32 still binds


@pytest.mark.parametrize("how", ["operand", "full", "cast"])
def test_float64_in_tile_math_is_a_dsl_error(how):
    @pl.jit
    def k(x: pl.Tensor[[2, 8], pl.FP32]):
        with pl.at(name_hint="t"):
            a = x[:, :]
            if how == "operand":
                a + torch.zeros(2, 8, dtype=torch.float64)
            elif how == "full":
                pl.full([2, 8], torch.float64, 1.0)
            else:
                pl.cast(a, torch.float64)

    with pytest.raises(DslError, match=HINT):
        k(torch.zeros(2, 8))
