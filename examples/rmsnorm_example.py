"""Weighted RMSNorm of BF16 token rows (transformers `models/deepseek_v4/modeling_deepseek_v4.py`):

    y[t, :] = bf16_rne(x[t, :] * rsqrt(sum_j x[t, j]^2 / D + eps) * w)

computed in FP32. Each block normalises ``ROW_TILE`` rows; a tail block loads
with ``valid_shape`` and stores only its valid rows (padded rows are zero, so
their rsqrt is large but finite and never stored).
"""

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register, run_jit

D = 256
ROW_TILE = 16
EPS = 1e-6
T = pl.dynamic("T")


@pl.jit
def rmsnorm_kernel(x: pl.Tensor[[T, D], pl.BF16], w: pl.Tensor[[D], pl.BF16],
                   y: pl.Out[pl.Tensor[[T, D], pl.BF16]]):
    """RMSNorm of every row of ``x`` with weight ``w`` into ``y``."""
    t = pl.tensor.dim(x, 0)
    for b in pl.spmd((t + ROW_TILE - 1) // ROW_TILE, name_hint="rmsnorm"):
        r0 = b * ROW_TILE
        rows = pl.min(ROW_TILE, t - r0)
        xf = pl.cast(pl.slice(x, [ROW_TILE, D], [r0, 0], valid_shape=[rows, D]), pl.FP32, mode="none")
        wf = pl.cast(pl.reshape(w[0:D], [1, D]), pl.FP32, mode="none")
        inv_rms = pl.rsqrt(pl.row_sum(xf * xf) * (1.0 / D) + EPS)  # [ROW_TILE, 1]
        yf = pl.col_expand_mul(pl.row_expand_mul(xf, inv_rms), wf)
        pl.assemble(y, pl.cast(yf, pl.BF16, mode="rint"), [r0, 0])
    return y


def golden_rmsnorm(values: dict) -> None:
    """Torch reference in FP32 (x: ``[T, D]`` bf16, w: ``[D]`` bf16, y: ``[T, D]`` bf16)."""
    xf, wf = values["x"].float(), values["w"].float()
    values["y"][:] = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * wf).to(torch.bfloat16)


def build(preset: str = "flash", mode: str = "default", T: int = 72) -> CaseRun:
    """The registered case; ``preset`` is ignored, ``T`` is the row count."""
    specs = [TensorSpec("x", [T, D], torch.bfloat16, init_value=torch.randn),
             TensorSpec("w", [D], torch.bfloat16, init_value=lambda: 1 + 0.1 * torch.randn(D)),
             TensorSpec("y", [T, D], torch.bfloat16, is_output=True)]
    cmp = {"y": ratio_allclose(atol=1e-4, rtol=1 / 128, max_error_ratio=0.005)}
    return CaseRun(rmsnorm_kernel, specs, golden_rmsnorm, cmp, label=f"T={T}")


register(KernelCase("example_rmsnorm", build, modes=("default",), takes_preset=False, group="example",
                    description="weighted RMSNorm, FP32 math, BF16 rint output"))


def test_rmsnorm_matches_golden():
    case = build(T=72)
    res = run_jit(case.fn, case.specs, case.golden, case.compare)
    assert res.passed, res.error
    # BF16 output: at most one BF16 ulp away (values are O(1..4), ulp <= 2^-6)
    assert res.max_abs_error <= 2 ** -5
    assert res.stats.tasks == 1 and res.stats.blocks == 5
