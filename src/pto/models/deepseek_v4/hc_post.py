"""Hyper-connection post-mix (mHC ``hc_post``): write the sublayer output back into the streams.

Math (v4flash-kernels.md B.2; dsv4-math.md 7.2), FP32, ``N = hc_mult``:

    y[:, j, :] = post[:, j] * x + sum_i comb[:, i*N + j] * residual[:, i, :]

Output stream ``j`` uses column ``j`` of the ``N x N`` comb matrix (``i`` = input stream);
in matrix form ``Y = post (x) x + C^T R``. The prefill variant computes only the first
``num_tokens`` rows and writes exact zeros into the static tail.
"""

from __future__ import annotations

import torch

from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = ["TOLERANCES", "golden_hc_post", "golden_hc_post_prefill", "make_hc_post_inputs"]

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio). The
# reference uses the default allclose with rtol = atol = 1e-3 (v4flash-kernels.md B.2 / C.2),
# i.e. no element may be out of tolerance: max_error_ratio 0.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "y": (1e-3, 1e-3, 0.0),
}

# ---- kernel ----
# (The pto.language kernels hc_post / hc_post_prefill go here; the goldens below are
# their numerical contract.)
# ---- end kernel ----


def _check_args(fn: str, x, residual, post, comb) -> tuple[int, int, int]:
    """Validate shapes; returns ``(T, N, D)`` or raises BindError."""
    if residual.dim() != 3 or not residual.is_floating_point():
        raise BindError(f"{fn}: residual must be a float [T, hc_mult, D] tensor, "
                        f"got {residual.dtype} {list(residual.shape)}")
    T, N, D = residual.shape
    for name, t, shape in (("x", x, (T, D)), ("post", post, (T, N)), ("comb", comb, (T, N * N))):
        if tuple(t.shape) != shape or not t.is_floating_point():
            raise BindError(f"{fn}: {name} must be a float tensor of shape {list(shape)}, "
                            f"got {t.dtype} {list(t.shape)}")
    return T, N, D


def golden_hc_post(
    x: torch.Tensor,  # [T, D] bf16 sublayer output
    residual: torch.Tensor,  # [T, hc_mult, D] fp32
    post: torch.Tensor,  # [T, hc_mult] fp32
    comb: torch.Tensor,  # [T, hc_mult*hc_mult] fp32, comb[t, i*hc_mult + j]
) -> torch.Tensor:  # [T, hc_mult, D] fp32
    """Hyper-connection post-mix golden (v4flash-kernels.md B.2, dsv4-math.md 7.2).

    ``y[:, j, :] = post[:, j] * x + sum_i comb[:, i*N + j] * residual[:, i, :]`` in FP32;
    the sum starts from the ``post * x`` term and adds input streams ``i = 0..N-1`` in
    order.

    Args:
        x: ``[T, D]`` sublayer output, BF16 (FP32 allowed).
        residual: ``[T, N, D]`` FP32 residual streams (``N = hc_mult``).
        post: ``[T, N]`` FP32 write-back weights (from hc_pre).
        comb: ``[T, N*N]`` FP32 stream mixing, ``i`` = input stream, ``j`` = output stream.

    Returns:
        ``[T, N, D]`` FP32 new residual streams.

    Raises:
        BindError: inconsistent shapes or non-float dtypes.
    """
    T, N, D = _check_args("golden_hc_post", x, residual, post, comb)
    c = comb.float().reshape(T, N, N)
    res = residual.float()
    y = post.float()[:, :, None] * x.float()[:, None, :]  # [T, N(j), D]
    for i in range(N):
        y = y + c[:, i, :, None] * res[:, i, None, :]
    return y


def golden_hc_post_prefill(
    x: torch.Tensor,  # [T, D] bf16
    residual: torch.Tensor,  # [T, hc_mult, D] fp32
    post: torch.Tensor,  # [T, hc_mult] fp32
    comb: torch.Tensor,  # [T, hc_mult*hc_mult] fp32
    num_tokens: int,
) -> torch.Tensor:  # [T, hc_mult, D] fp32
    """Prefill hc_post golden: :func:`golden_hc_post`, rows ``>= num_tokens`` exactly zero.

    ``num_tokens`` is clamped into ``[0, T]`` as the kernel does (v4flash-kernels.md B.2),
    so a negative count zeroes everything and a count above ``T`` keeps every row.

    Args:
        x, residual, post, comb: as for :func:`golden_hc_post`.
        num_tokens: active token rows (int).

    Returns:
        ``[T, hc_mult, D]`` FP32; rows ``>= clamp(num_tokens, 0, T)`` are ``0.0``.

    Raises:
        BindError: inconsistent shapes, non-float dtypes, or a non-integer ``num_tokens``.
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise BindError(f"golden_hc_post_prefill: num_tokens must be an int, got {num_tokens!r}")
    y = golden_hc_post(x, residual, post, comb)
    active = min(max(num_tokens, 0), y.shape[0])
    y[active:] = 0.0
    return y


def make_hc_post_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_hc_post` (the reference states no distribution).

    Drawn from one ``torch.Generator`` seeded with ``seed``, in this order:
    ``x = randn`` (BF16), ``residual = randn`` (FP32), ``post = 2 * sigmoid(randn)`` in
    (0, 2), ``comb = rand`` with every output column ``j`` normalised to sum 1 over the
    input streams ``i`` (the shape of hc_pre's Sinkhorn output).

    Args:
        cfg: model config (``hidden_size``, ``hc_mult``).
        T: number of tokens (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, D] bf16, "residual": [T, hc_mult, D] fp32, "post": [T, hc_mult] fp32,
        "comb": [T, hc_mult*hc_mult] fp32}``.

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_hc_post_inputs: T must be positive, got {T}")
    N, D = cfg.hc_mult, cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen).to(torch.bfloat16)
    residual = torch.randn(T, N, D, generator=gen)
    post = 2.0 * torch.sigmoid(torch.randn(T, N, generator=gen))
    comb = torch.rand(T, N, N, generator=gen) + 0.01
    comb = comb / comb.sum(dim=1, keepdim=True)
    return {"x": x, "residual": residual, "post": post, "comb": comb.reshape(T, N * N)}
