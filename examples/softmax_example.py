"""Row softmax over ``[T, N]`` FP32 with ``N = 100`` columns in 128-wide tiles.

Each block loads ``ROW_TILE`` rows into a ``[ROW_TILE, 128]`` tile whose valid
region is ``[rows, N]``; ``pl.fillpad(..., pl.PadValue.min)`` turns the padding
into the most negative finite value so that it neither wins the row max nor
adds to the row sum (``exp(min - max) == 0``):

    y[t, :] = exp(x[t, :] - max_j x[t, j]) / sum_j exp(x[t, j] - max_j x[t, j])

The result tile gets the valid shape back before its store, so only
``[rows, N]`` reaches GM.
"""

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register, run_jit

N = 100
N_TILE = 128  # physical tile width; columns N..127 are padding
ROW_TILE = 16
T = pl.dynamic("T")


@pl.jit
def softmax_kernel(x: pl.Tensor[[T, N], pl.FP32], y: pl.Out[pl.Tensor[[T, N], pl.FP32]]):
    """Row-wise softmax of ``x`` into ``y``."""
    t = pl.tensor.dim(x, 0)
    for b in pl.spmd((t + ROW_TILE - 1) // ROW_TILE, name_hint="row_softmax"):
        r0 = b * ROW_TILE
        rows = pl.min(ROW_TILE, t - r0)
        s = pl.slice(x, [ROW_TILE, N_TILE], [r0, 0], valid_shape=[rows, N])
        s = pl.fillpad(s, pl.PadValue.min)
        e = pl.exp(pl.row_expand_sub(s, pl.row_max(s)))
        p = pl.row_expand_div(e, pl.row_sum(e))
        pl.assemble(y, pl.set_validshape(p, rows, N), [r0, 0])
    return y


def golden_softmax(values: dict) -> None:
    """Torch reference: ``y = softmax(x, dim=-1)`` (x, y: ``[T, N]`` fp32)."""
    values["y"][:] = torch.softmax(values["x"], dim=-1)


def build(preset: str = "flash", mode: str = "default", T: int = 40) -> CaseRun:
    """The registered case; ``preset`` is ignored, ``T`` is the row count."""
    specs = [TensorSpec("x", [T, N], torch.float32, init_value=lambda: 4 * torch.randn(T, N)),
             TensorSpec("y", [T, N], torch.float32, is_output=True)]
    cmp = {"y": ratio_allclose(atol=1e-6, rtol=1e-5, max_error_ratio=0.0)}
    return CaseRun(softmax_kernel, specs, golden_softmax, cmp, label=f"T={T}")


register(KernelCase("example_softmax", build, modes=("default",), takes_preset=False, group="example",
                    description="row softmax with fillpad(min) over a 100-of-128 valid width"))


def test_softmax_matches_golden():
    case = build(T=40)
    res = run_jit(case.fn, case.specs, case.golden, case.compare)
    assert res.passed, res.error
    assert res.max_abs_error < 1e-6
    assert res.stats.tasks == 1 and res.stats.blocks == 3


def test_softmax_rows_sum_to_one_and_padding_never_leaks():
    x = torch.randn(5, N) * 10
    y = torch.zeros(5, N)
    softmax_kernel(x, y)
    assert torch.allclose(y.sum(-1), torch.ones(5), atol=1e-6)
    # with zero padding instead of min, a row of large negatives would be skewed
    x2 = torch.full((1, N), -50.0)
    y2 = torch.zeros(1, N)
    softmax_kernel(x2, y2)
    assert torch.allclose(y2, torch.full((1, N), 1.0 / N))
