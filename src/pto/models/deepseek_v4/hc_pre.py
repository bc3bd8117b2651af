"""Hyper-connection pre-mix (mHC ``hc_pre``): collapse the ``hc_mult`` residual streams.

Math (v4flash-kernels.md A.1; dsv4-math.md 7.1), per token, FP32, ``N = hc_mult``:

    u       = flatten(x)                                   # [N*D]
    mixes   = (hc_fn @ u) * rsqrt(mean(u^2) + rms_norm_eps) # [(2+N)*N], K summed per 256-chunk
    pre     = sigmoid(mixes[0:N]   * s0 + base[0:N])  + hc_eps
    post    = 2 * sigmoid(mixes[N:2N] * s1 + base[N:2N])
    C[i, j] = softmax_j(mixes[2N + N*i + j] * s2 + base[2N + N*i + j]) + hc_eps
    C      /= colsum(C) + hc_eps; then (iters-1) x { C /= rowsum + hc_eps; C /= colsum + hc_eps }
    x_mixed = bf16_rne((x0*pre0 + x1*pre1) + (x2*pre2 + x3*pre3))

``comb[t, i*N + j]`` is ``C[i, j]`` with ``i`` the input stream and ``j`` the output
stream; Sinkhorn ends on a column normalisation, so ``sum_i C[i, j] ~= 1`` tightly and the
row sums only approximately. The RMS epsilon is ``rms_norm_eps`` (HF builds the HC input
norm with it); every other epsilon is ``hc_eps`` (both are 1e-6 in all presets).
"""

from __future__ import annotations

import torch

from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = [
    "HC_K_CHUNK",
    "HC_SCALE_REF",
    "HC_BASE_REF",
    "TOLERANCES",
    "golden_hc_pre",
    "make_hc_pre_inputs",
]

# K width of one chunk of the mixes matmul; the golden sums chunk partials in chunk order
# (v4flash-kernels.md A.1 "golden sums per 256-wide K chunk in chunk order").
HC_K_CHUNK = 256

# Real hc_scale / hc_base values used by the reference test fixture (hc_mult = 4).
HC_SCALE_REF: tuple[float, ...] = (0.0761, 0.0326, 0.2270)
HC_BASE_REF: tuple[float, ...] = (
    5.9166, -3.6223, -2.9324, -3.3124, -3.9100, -0.9384, -3.3256, -2.5240,
    2.0706, -2.5728, 0.1424, -3.9453, -3.8859, 3.4634, -3.3799, -2.6077,
    -2.7191, -2.4846, 2.0395, -0.5010, -3.5992, -2.7520, -3.3493, 3.1587,
)

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# v4flash-kernels.md A.1 / C.2. The reference harness run also sets rtol=atol=1e-3.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_mixed": (1e-4, 1 / 128, 0.005),
    "post": (2.5e-5, 5e-3, 0.005),
    "comb": (2.5e-5, 5e-3, 0.005),
}

# ---- kernel ----
# (The pto.language kernel goes here; the golden below is its numerical contract.)
# ---- end kernel ----


def _check_shape(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise BindError unless ``t`` is a float tensor of exactly ``shape``."""
    if tuple(t.shape) != tuple(shape) or not t.is_floating_point():
        raise BindError(f"{fn}: {name} must be a float tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def _sinkhorn(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn on ``[T, N, N]``: one column pass, then ``iters - 1`` (row, column) passes."""
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def golden_hc_pre(
    x: torch.Tensor,  # [T, hc_mult, D] fp32
    hc_fn: torch.Tensor,  # [mix_hc, hc_dim] fp32
    hc_scale: torch.Tensor,  # [3] fp32
    hc_base: torch.Tensor,  # [mix_hc] fp32
    cfg: DeepSeekV4Config,
    *,
    out_bf16: bool = True,
    return_pre: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Hyper-connection pre-mix golden (v4flash-kernels.md A.1, dsv4-math.md 7.1).

    Numerics: everything in FP32. ``inv_rms`` is the rsqrt of the mean of squares over
    the flattened ``hc_dim = hc_mult * D`` row plus ``cfg.rms_norm_eps``. The mixes
    matmul is split into ``HC_K_CHUNK``-wide K chunks whose ``[T, mix_hc]`` partials are
    added in chunk order, then scaled by ``inv_rms``. Sigmoid is ``torch.sigmoid``; the
    comb softmax is over the output-stream axis ``j``; Sinkhorn runs one column
    normalisation then ``cfg.hc_sinkhorn_iters - 1`` (row, column) rounds with
    ``cfg.hc_eps``. ``x_mixed`` adds the weighted streams as a pairwise tree
    (``(x0*p0 + x1*p1) + (x2*p2 + x3*p3)`` for four streams).

    Args:
        x: ``[T, hc_mult, D]`` FP32 residual streams.
        hc_fn: ``[mix_hc, hc_dim]`` FP32 mixing projection (``mix_hc = (2+hc_mult)*hc_mult``).
        hc_scale: ``[3]`` FP32 scales for the pre, post and comb logits.
        hc_base: ``[mix_hc]`` FP32 biases.
        cfg: model config (``hc_mult``, ``hidden_size``, ``rms_norm_eps``, ``hc_eps``,
            ``hc_sinkhorn_iters``).
        out_bf16: cast ``x_mixed`` to BF16 (RNE, the kernel's ``rint`` cast); ``False``
            keeps it FP32.
        return_pre: also return the stream weights ``pre`` (the kernel's ``pre_val_store``
            scratch; used by the transformers parity tests).

    Returns:
        ``(x_mixed, post, comb)``: ``x_mixed [T, D]`` BF16 (or FP32), ``post [T, hc_mult]``
        FP32 in (0, 2), ``comb [T, hc_mult*hc_mult]`` FP32 with ``comb[t, i*hc_mult + j]``
        (i = input stream, j = output stream), column sums ~= 1. With ``return_pre`` a
        fourth element ``pre [T, hc_mult]`` FP32 in (hc_eps, 1 + hc_eps).

    Raises:
        BindError: any argument with the wrong shape or a non-float dtype.
    """
    fn = "golden_hc_pre"
    hc, D = cfg.hc_mult, cfg.hidden_size
    if x.dim() != 3:
        raise BindError(f"{fn}: x must be [T, {hc}, {D}], got {list(x.shape)}")
    T = x.shape[0]
    _check_shape(fn, "x", x, (T, hc, D))
    _check_shape(fn, "hc_fn", hc_fn, (cfg.mix_hc, cfg.hc_dim))
    _check_shape(fn, "hc_scale", hc_scale, (3,))
    _check_shape(fn, "hc_base", hc_base, (cfg.mix_hc,))

    x_flat = x.float().reshape(T, cfg.hc_dim)
    w = hc_fn.float()
    inv_rms = torch.rsqrt(x_flat.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps)  # [T, 1]
    mixes_raw = torch.zeros(T, cfg.mix_hc, dtype=torch.float32)
    for k0 in range(0, cfg.hc_dim, HC_K_CHUNK):
        mixes_raw = mixes_raw + x_flat[:, k0:k0 + HC_K_CHUNK] @ w[:, k0:k0 + HC_K_CHUNK].T
    mixes = mixes_raw * inv_rms

    s = hc_scale.float()
    base = hc_base.float()
    pre = torch.sigmoid(mixes[:, :hc] * s[0] + base[:hc]) + cfg.hc_eps
    post = 2.0 * torch.sigmoid(mixes[:, hc:2 * hc] * s[1] + base[hc:2 * hc])
    comb_logits = (mixes[:, 2 * hc:] * s[2] + base[2 * hc:]).reshape(T, hc, hc)
    comb = torch.softmax(comb_logits, dim=-1) + cfg.hc_eps
    comb = _sinkhorn(comb, cfg.hc_sinkhorn_iters, cfg.hc_eps).reshape(T, hc * hc)

    xf = x.float()
    terms = [xf[:, h, :] * pre[:, h:h + 1] for h in range(hc)]
    while len(terms) > 1:  # pairwise tree: ((t0+t1) + (t2+t3)) for four streams
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    x_mixed = terms[0]
    if out_bf16:
        x_mixed = x_mixed.to(torch.bfloat16)
    if return_pre:
        return x_mixed, post, comb, pre
    return x_mixed, post, comb


def make_hc_pre_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_hc_pre` (v4flash-kernels.md A.1 test inputs).

    ``x ~ N(0, 1) * 0.05`` then ``hc_fn ~ N(0, 1) * 0.0519`` (drawn in that order from a
    ``torch.Generator`` seeded with ``seed``); ``hc_scale`` and ``hc_base`` are the fixed
    real values :data:`HC_SCALE_REF` and :data:`HC_BASE_REF`.

    Args:
        cfg: model config; ``hc_mult`` must be 4 (the fixed base has 24 values).
        T: number of tokens (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, hc_mult, D] fp32, "hc_fn": [mix_hc, hc_dim] fp32,
        "hc_scale": [3] fp32, "hc_base": [mix_hc] fp32}``.

    Raises:
        ConfigError: ``cfg.hc_mult != 4`` (no reference base for other widths).
        BindError: ``T`` not positive.
    """
    if cfg.mix_hc != len(HC_BASE_REF):
        raise ConfigError(f"make_hc_pre_inputs: config {cfg.name!r} has hc_mult={cfg.hc_mult} "
                          f"(mix_hc={cfg.mix_hc}); the reference hc_base has {len(HC_BASE_REF)} "
                          f"values (hc_mult=4)")
    if T <= 0:
        raise BindError(f"make_hc_pre_inputs: T must be positive, got {T}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hc_mult, cfg.hidden_size, generator=gen) * 0.05
    hc_fn = torch.randn(cfg.mix_hc, cfg.hc_dim, generator=gen) * 0.0519
    return {
        "x": x,
        "hc_fn": hc_fn,
        "hc_scale": torch.tensor(HC_SCALE_REF, dtype=torch.float32),
        "hc_base": torch.tensor(HC_BASE_REF, dtype=torch.float32),
    }
