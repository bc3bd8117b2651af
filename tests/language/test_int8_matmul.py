"""INT8 x INT8 -> INT32 tile matmul: exact against an FP64 reference on every path
(the integer GEMM for rank 2, the floating-point fallback for batched operands)."""

import pytest
import torch

import pto.language as pl
from pto.language.tile_ops import Tile


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(torch.int32)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 3), (3, 129, 5), (17, 4096, 33), (2, 16384, 4)])
@pytest.mark.parametrize("b_trans", [False, True])
def test_int8_matmul_exact(m, k, n, b_trans):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (n, k) if b_trans else (k, n), dtype=torch.int8, generator=g)
    out = pl.matmul(Tile(a), Tile(b), b_trans=b_trans)
    assert out.data.dtype == torch.int32
    assert torch.equal(out.data, _ref(a, b.t() if b_trans else b))


def test_int8_matmul_extremes_and_batched():
    a = torch.full((4, 4096), -128, dtype=torch.int8)
    out = pl.matmul(Tile(a), Tile(a), b_trans=True)
    assert int(out.data[0, 0]) == 4096 * 128 * 128  # 2^26, past FP32's exact integers
    a3 = torch.randint(-128, 128, (2, 3, 2048), dtype=torch.int8)
    b3 = torch.randint(-128, 128, (2, 2048, 5), dtype=torch.int8)
    assert torch.equal(pl.matmul(Tile(a3), Tile(b3)).data, _ref(a3, b3))
