"""Elementwise add: ``z = x + y`` over ``[T, D]`` FP32 rows, ``T`` dynamic.

One SPMD task with one block per ``ROW_TILE`` rows. The last block may be a
tail: it loads its rows with ``valid_shape`` (the rest of the tile is zero
padding) and its store writes only the valid rows.
"""

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, exact, register, run_jit

D = 128
ROW_TILE = 32
T = pl.dynamic("T")


@pl.jit
def add_kernel(x: pl.Tensor[[T, D], pl.FP32], y: pl.Tensor[[T, D], pl.FP32],
               z: pl.Out[pl.Tensor[[T, D], pl.FP32]]):
    """``z[t, :] = x[t, :] + y[t, :]`` for every row ``t``."""
    t = pl.tensor.dim(x, 0)
    for b in pl.spmd((t + ROW_TILE - 1) // ROW_TILE, name_hint="add"):
        r0 = b * ROW_TILE
        rows = pl.min(ROW_TILE, t - r0)
        xt = pl.slice(x, [ROW_TILE, D], [r0, 0], valid_shape=[rows, D])
        yt = pl.slice(y, [ROW_TILE, D], [r0, 0], valid_shape=[rows, D])
        pl.assemble(z, xt + yt, [r0, 0])
    return z


def golden_add(values: dict) -> None:
    """Torch reference: ``z = x + y`` (x, y, z: ``[T, D]`` fp32)."""
    values["z"][:] = values["x"] + values["y"]


def build(preset: str = "flash", mode: str = "default", T: int = 200) -> CaseRun:
    """The registered case; ``preset`` is ignored, ``T`` is the row count."""
    specs = [TensorSpec("x", [T, D], torch.float32, init_value=torch.randn),
             TensorSpec("y", [T, D], torch.float32, init_value=torch.randn),
             TensorSpec("z", [T, D], torch.float32, is_output=True)]
    return CaseRun(add_kernel, specs, golden_add, {"z": exact()}, label=f"T={T}")


register(KernelCase("example_add", build, modes=("default",), takes_preset=False, group="example",
                    description="elementwise add with a valid-shape tail block"))


def test_add_matches_golden_bit_exact():
    case = build(T=200)
    res = run_jit(case.fn, case.specs, case.golden, case.compare)
    assert res.passed, res.error
    assert res.max_abs_error == 0.0
    # 200 rows = 6 full blocks + a tail of 8 rows, one task, no scratch
    assert res.stats.tasks == 1 and res.stats.blocks == 7 and res.stats.heap_peak_bytes == 0


def test_add_tail_store_leaves_rows_beyond_t_alone():
    x, y = torch.randn(40, D), torch.randn(40, D)
    z = torch.full((40, D), -7.0)
    add_kernel(x[:33].contiguous(), y[:33].contiguous(), z[:33])
    assert torch.equal(z[:33], x[:33] + y[:33])
    assert torch.equal(z[33:], torch.full((7, D), -7.0))
