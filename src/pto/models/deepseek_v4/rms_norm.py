"""Token RMSNorm: attention norm, FFN norm and the final norm.

Math (v4flash-kernels.md B.1; dsv4-math.md section 2, "weighted RMSNorm"), per token row,
all in FP32, mean over the hidden axis D:

    x_normed = bf16_rne((x * rsqrt(mean(x^2) + eps)) * w)

The kernel accumulates sum(x^2) over 128-wide chunks and writes BF16 with ``rint``
(round-to-nearest-even); the golden below uses torch's FP32 mean and ``.to(bfloat16)``
(also RNE), so the two differ only by FP32 summation order.
"""

from __future__ import annotations

import torch

from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = ["TOLERANCES", "golden_rms_norm", "make_rms_norm_inputs"]

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# v4flash-kernels.md B.1 / C.2 (0.005 is ratio_allclose's default max_error_ratio).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_normed": (1e-4, 1 / 128, 0.005),
}

# ---- kernel ----
# (The pto.language kernel goes here; the golden below is its numerical contract.)
# ---- end kernel ----


def golden_rms_norm(
    x: torch.Tensor,  # [T, D] bf16 (any float dtype accepted)
    w: torch.Tensor,  # [D] bf16 (any float dtype accepted)
    eps: float,  # cfg.rms_norm_eps
    *,
    out_bf16: bool = True,
) -> torch.Tensor:  # [T, D] bf16 (fp32 when out_bf16=False)
    """Weighted RMSNorm of every token row (v4flash-kernels.md B.1, dsv4-math.md 2).

    ``y = (x * rsqrt(mean(x^2, -1) + eps)) * w`` computed in FP32 from the given
    values (inputs are not re-rounded), then cast to BF16 with round-to-nearest-even
    when ``out_bf16`` (the kernel's ``cast(..., BF16, mode="rint")``), else kept FP32
    for float32 parity runs.

    Args:
        x: ``[T, D]`` activations, BF16 in the kernel test (FP32 allowed).
        w: ``[D]`` norm weight, BF16 in the kernel test (FP32 allowed).
        eps: variance epsilon, ``cfg.rms_norm_eps`` (1e-6).
        out_bf16: cast the result to BF16 (RNE); ``False`` keeps FP32.

    Returns:
        ``[T, D]`` BF16 (or FP32) normalised rows.

    Raises:
        BindError: ``x`` not rank 2, ``w`` not ``[D]``, or a non-float dtype.
    """
    if x.dim() != 2 or not x.is_floating_point():
        raise BindError(f"golden_rms_norm: x must be a float [T, D] tensor, got {x.dtype} {list(x.shape)}")
    if w.dim() != 1 or w.shape[0] != x.shape[1] or not w.is_floating_point():
        raise BindError(
            f"golden_rms_norm: w must be a float [D={x.shape[1]}] tensor, got {w.dtype} {list(w.shape)}"
        )
    xf = x.float()
    inv_rms = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    y = (xf * inv_rms) * w.float()
    return y.to(torch.bfloat16) if out_bf16 else y


def make_rms_norm_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_rms_norm` (v4flash-kernels.md B.1 test data).

    ``x = randn - 0.5`` and ``w = 1 + 0.1 * randn``, both drawn in FP32 from a
    ``torch.Generator`` seeded with ``seed`` (in that order) and rounded to BF16.

    Args:
        cfg: model config; uses ``hidden_size`` (D).
        T: number of token rows (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, D] bf16, "w": [D] bf16}`` (keys are the golden's argument names).

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_rms_norm_inputs: T must be positive, got {T}")
    D = cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen) - 0.5
    w = 1.0 + 0.1 * torch.randn(D, generator=gen)
    return {"x": x.to(torch.bfloat16), "w": w.to(torch.bfloat16)}
