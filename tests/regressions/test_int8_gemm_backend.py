"""INT8 x INT8 matmuls give the same INT32 sums on either GEMM backend.

torch._int_mm is 10-30x slower than a float GEMM on some CPUs (an AMD EPYC here), so pl.matmul
picks the faster of the two exact backends by a probe; the results must not depend on it.
"""

import pytest
import torch

from pto.errors import ConfigError
from pto.language import tile_ops


@pytest.fixture
def backend():
    saved = tile_ops._INT8_GEMM[0]

    def use(mode):
        tile_ops._INT8_GEMM[0] = mode

    yield use
    tile_ops._INT8_GEMM[0] = saved


@pytest.mark.parametrize("k", [1, 64, 1024, 1025, 4096])
def test_float_backend_equals_int_mm(k):
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-128, 128, (17, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, 9), dtype=torch.int8, generator=g)
    a[0] = -128  # the largest products, 2^14 each: FP32 would lose bits past K = 1024
    b[:, 0] = -128
    expected = torch._int_mm(a, b)
    assert expected[0, 0].item() == k << 14
    got = tile_ops._int8_mm_float(a, b)
    assert got.dtype == torch.int32
    assert torch.equal(got, expected)


@pytest.mark.parametrize("mode", ["int", "float"])
def test_matmul_same_on_both_backends(backend, mode):
    backend(mode)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (16, 2048), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (32, 2048), dtype=torch.int8, generator=g)
    out = tile_ops.matmul(tile_ops.Tile(a), tile_ops.Tile(b), b_trans=True)
    assert torch.equal(out.data, torch._int_mm(a, b.t().contiguous()))


def test_bad_env_value_is_a_config_error(backend):
    backend("fast")
    a = torch.ones(2, 2, dtype=torch.int8)
    with pytest.raises(ConfigError, match="PTO_INT8_GEMM must be 'int' or 'float', got 'fast'"):
        tile_ops._int8_mm(a, a)


def test_probe_picks_a_backend(backend):
    backend(None)
    assert tile_ops._int8_gemm_backend() in ("int", "float")
    assert tile_ops._INT8_GEMM[0] in ("int", "float")
