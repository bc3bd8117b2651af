"""MLA query / kv projections with RMSNorm, interleaved RoPE and the INT8 q-LoRA latent.

Math (v4flash-kernels.md A.2; dsv4-math.md 2, 3), FP32 unless noted, ``n = nope_head_dim``:

    qr_f      = rmsnorm(x @ wq_a) * gamma_cq                    # [T, q_lora]
    qr, s_qr  = int8_per_row(qr_f)                               # W8A8 activation side
    q         = (qr @ wq_b  in INT32) * s_qr * wq_b_scale         # [T, H*head_dim]
    q         = per-head rmsnorm(q) (no weight); q[..., n:] = rope(q[..., n:])
    kv        = rmsnorm(x @ wkv) * gamma_ckv; kv[:, n:] = rope(kv[:, n:])
    q, kv -> BF16 (RNE); qr INT8; qr_scale = 1/s FP32

RoPE is interleaved (pairs (2i, 2i+1) rotate with frequency i) on the trailing
``qk_rope_head_dim`` channels.

RoPE table convention (taken here): ``rope_cos`` / ``rope_sin`` are per-token rows
``[T, rope_dim]`` in the *full-width duplicated* layout of the reference tables, i.e.
column ``i`` and column ``i + rope_dim/2`` both hold frequency ``i``. Only the first half
is read: pair ``i`` (channels ``2i``, ``2i+1``) uses ``cos[:, i]``, ``sin[:, i]``. This is
what the kernel's ``gather(cos, j >> 1)`` over ``j = 0..rope_dim-1`` and the reference
golden's ``cos[:, :rope_dim/2]`` both read; the duplicated second half is ignored. (A
strided ``cos[:, 0::2]`` would be wrong for this layout.) :func:`rope_interleaved` also
accepts half-width ``[T, rope_dim/2]`` tables.
"""

from __future__ import annotations

import torch

from pto.errors import BindError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = [
    "INT8_SCALE_MAX",
    "INT8_AMAX_EPS",
    "TOLERANCES",
    "quantize_per_row_int8",
    "quantize_weight_per_column",
    "rope_interleaved",
    "golden_qkv_proj_rope",
    "make_qkv_inputs",
]

INT8_SCALE_MAX = 127.0  # symmetric INT8 range +-127 (v4flash-kernels.md section 0)
INT8_AMAX_EPS = 1e-4  # floor on amax so an all-zero row/column has a finite scale

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# v4flash-kernels.md A.2 / C.2. qr: every INT8 code within +-1. The reference harness
# run also sets rtol=atol=5e-3.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "q": (1e-4, 1 / 128, 0.005),
    "kv": (1e-4, 1 / 128, 0.005),
    "qr": (1.0, 0.0, 0.0),
    "qr_scale": (2.5e-5, 5e-3, 0.005),
}

# ---- kernel ----
# (The pto.language kernel goes here; the golden below is its numerical contract.)
# ---- end kernel ----


def _check(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...], kind: str) -> None:
    """Raise BindError unless ``t`` has ``shape`` and dtype kind ``float``/``int8``."""
    ok_dtype = t.is_floating_point() if kind == "float" else t.dtype == torch.int8
    if tuple(t.shape) != tuple(shape) or not ok_dtype:
        article = "an" if kind == "int8" else "a"
        raise BindError(f"{fn}: {name} must be {article} {kind} tensor of shape {list(shape)}, "
                        f"got {t.dtype} {list(t.shape)}")


def quantize_per_row_int8(
    x: torch.Tensor,  # [..., K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # ([..., K] int8, [..., 1] fp32)
    """Symmetric per-row INT8 activation quantisation (v4flash-kernels.md section 0, W8A8).

    Per row (last axis): ``amax = max(max|x|, 1e-4)``, ``s = 127 / amax``,
    ``q = int8(fp16(rint(x * s)))`` (round-half-even to an integer, through FP16 -- exact
    for |v| <= 127 -- then truncation to INT8, as the kernel's rint/round/trunc cast chain),
    and the dequant scale is ``1 / s`` (so ``x ~= q * scale``; about ``amax / 127``).
    All arithmetic in FP32.

    Args:
        x: ``[..., K]`` float rows (any float dtype; computed in FP32).

    Returns:
        ``(q, scale)``: ``q [..., K]`` INT8 in [-127, 127]; ``scale [..., 1]`` FP32, finite
        and positive even for an all-zero row (then ``q`` is all zero).

    Raises:
        BindError: ``x`` is not a float tensor of rank >= 1.
    """
    if x.dim() < 1 or not x.is_floating_point():
        raise BindError(f"quantize_per_row_int8: x must be a float tensor of rank >= 1, "
                        f"got {x.dtype} {list(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(INT8_AMAX_EPS)
    s = INT8_SCALE_MAX / amax
    q = torch.round(xf * s).to(torch.int32).to(torch.float16).to(torch.int8)
    return q, 1.0 / s


def quantize_weight_per_column(
    w: torch.Tensor,  # [K, N] float (input dim K, output dim N)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([K, N] int8, [N] fp32)
    """Symmetric per-output-column INT8 weight quantisation (v4flash-kernels.md section 0).

    Per column ``n``: ``scale[n] = max(max_k |w[k, n]|, 1e-4) / 127``,
    ``q[k, n] = clamp(round_half_even(w[k, n] / scale[n]), -127, 127)``. FP32 arithmetic.

    Args:
        w: ``[K, N]`` float weight in ``x @ w`` layout (columns are output channels).

    Returns:
        ``(w_int8 [K, N] int8, scale [N] fp32)`` with ``w ~= w_int8 * scale``.

    Raises:
        BindError: ``w`` is not a float rank-2 tensor.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise BindError(f"quantize_weight_per_column: w must be a float [K, N] tensor, "
                        f"got {w.dtype} {list(w.shape)}")
    wf = w.float()
    scale = wf.abs().amax(dim=0).clamp_min(INT8_AMAX_EPS) / INT8_SCALE_MAX
    q = torch.round(wf / scale).clamp(-INT8_SCALE_MAX, INT8_SCALE_MAX).to(torch.int8)
    return q, scale


def rope_interleaved(
    x: torch.Tensor,  # [T, ..., r] float
    cos: torch.Tensor,  # [T, r] (full-width duplicated) or [T, r/2] float
    sin: torch.Tensor,  # same shape as cos
    inverse: bool = False,
) -> torch.Tensor:  # [T, ..., r], dtype of x
    """Interleaved RoPE on the last axis (dsv4-math.md 3; v4flash-kernels.md "RoPE tables").

    Pair ``i`` = channels ``(2i, 2i+1)`` rotates by frequency ``i``:
    ``y[2i] = x[2i]*c_i - x[2i+1]*s_i``, ``y[2i+1] = x[2i]*s_i + x[2i+1]*c_i`` with
    ``c_i = cos[t, i]``, ``s_i = sin[t, i]``. ``inverse=True`` negates the sine (the
    rotation by minus the angle, used on the attention output before o-proj).

    Table convention: a full-width ``[T, r]`` table is read from its first ``r/2``
    columns only (its second half duplicates the first); a ``[T, r/2]`` table is used as
    is. Tables broadcast over any middle axes of ``x`` (e.g. heads). Computed in FP32 (or
    wider if ``x`` is FP64) and returned in ``x.dtype``.

    Args:
        x: ``[T, ..., r]`` float, ``r`` even.
        cos: ``[T, r]`` or ``[T, r/2]`` float per-token cosines.
        sin: like ``cos``.
        inverse: rotate by the negative angle.

    Returns:
        ``[T, ..., r]`` rotated tensor, ``x.dtype``.

    Raises:
        BindError: odd ``r``, tables of another shape, or non-float inputs.
    """
    fn = "rope_interleaved"
    if x.dim() < 2 or x.shape[-1] % 2 or not x.is_floating_point():
        raise BindError(f"{fn}: x must be a float [T, ..., r] tensor with even r, "
                        f"got {x.dtype} {list(x.shape)}")
    T, r = x.shape[0], x.shape[-1]
    for name, tab in (("cos", cos), ("sin", sin)):
        if tab.dim() != 2 or tab.shape[0] != T or tab.shape[1] not in (r, r // 2) \
                or not tab.is_floating_point():
            raise BindError(f"{fn}: {name} must be a float [T={T}, {r}] or [T={T}, {r // 2}] "
                            f"table, got {tab.dtype} {list(tab.shape)}")
    if cos.shape != sin.shape:
        raise BindError(f"{fn}: cos {list(cos.shape)} and sin {list(sin.shape)} differ in shape")
    work = torch.promote_types(x.dtype, torch.float32)
    view = (T,) + (1,) * (x.dim() - 2) + (r // 2,)
    c = cos[:, : r // 2].to(work).reshape(view)
    s = sin[:, : r // 2].to(work).reshape(view)
    if inverse:
        s = -s
    xw = x.to(work)
    even, odd = xw[..., 0::2], xw[..., 1::2]
    y = torch.empty_like(xw)
    y[..., 0::2] = even * c - odd * s
    y[..., 1::2] = even * s + odd * c
    return y.to(x.dtype)


def _rms_normalize(t: torch.Tensor, eps: float) -> torch.Tensor:
    """``t * rsqrt(mean(t^2, -1) + eps)`` in FP32 (no weight)."""
    return t * torch.rsqrt(t.square().mean(dim=-1, keepdim=True) + eps)


def golden_qkv_proj_rope(
    x: torch.Tensor,  # [T, D] bf16 (already RMS-normed)
    wq_a: torch.Tensor,  # [D, q_lora] bf16
    wq_b: torch.Tensor,  # [q_lora, H*head_dim] int8 ("int8") | float ("bf16")
    wq_b_scale: torch.Tensor | None,  # [H*head_dim] fp32 ("int8"); ignored for "bf16"
    wkv: torch.Tensor,  # [D, head_dim] bf16
    rope_cos: torch.Tensor,  # [T, rope_dim] bf16, per-token full-width duplicated rows
    rope_sin: torch.Tensor,  # [T, rope_dim] bf16
    gamma_cq: torch.Tensor,  # [q_lora] bf16
    gamma_ckv: torch.Tensor,  # [head_dim] bf16
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    out_bf16: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q/KV LoRA projections + RMSNorm + RoPE golden (v4flash-kernels.md A.2).

    Numerics (FP32 throughout, inputs used at their given precision, not re-rounded):

    1. ``qr_f = (qr * rsqrt(mean(qr^2) + eps)) * gamma_cq`` with ``qr = x @ wq_a``.
    2. ``weight_format="int8"``: ``qr, qr_scale = quantize_per_row_int8(qr_f)``;
       ``acc = qr @ wq_b`` exactly in integers (computed in FP64, exact for
       ``q_lora * 127^2 < 2^53``, returned as INT32);
       ``q = (float(acc) * qr_scale) * wq_b_scale``.
       ``weight_format="bf16"``: no quantisation at all -- ``q = qr_f @ wq_b`` with the
       float ``wq_b`` (``wq_b_scale`` ignored, may be None); the ``qr`` output is then the
       FP32 normalised latent ``qr_f`` and ``qr_scale`` is all ones, so parity with an
       unquantised model is exact up to float rounding.
    3. Per head: ``q_h = q_h * rsqrt(mean(q_h^2) + eps)`` (unweighted), then interleaved
       RoPE on the trailing ``qk_rope_head_dim`` channels.
    4. ``kv = ((x @ wkv) * rsqrt(mean(.^2) + eps)) * gamma_ckv``, RoPE on its trailing
       ``qk_rope_head_dim`` channels (after gamma).
    5. ``q`` and ``kv`` cast to BF16 (RNE) when ``out_bf16``, else kept FP32.

    ``eps = cfg.rms_norm_eps``. RoPE tables follow the module-docstring convention:
    pair ``i`` uses column ``i`` of ``rope_cos`` / ``rope_sin``.

    Args:
        x: ``[T, D]`` attention-normed activations, BF16 (FP32 allowed for parity runs).
        wq_a: ``[D, q_lora]`` BF16 (float) q-LoRA down projection.
        wq_b: ``[q_lora, H*head_dim]`` INT8 per-output-column codes ("int8"), or a float
            weight ("bf16").
        wq_b_scale: ``[H*head_dim]`` FP32 dequant scale per output column ("int8").
        wkv: ``[D, head_dim]`` BF16 (float) kv projection.
        rope_cos: ``[T, rope_dim]`` per-token cosine rows (first half read).
        rope_sin: ``[T, rope_dim]`` per-token sine rows (first half read).
        gamma_cq: ``[q_lora]`` q-LoRA norm weight.
        gamma_ckv: ``[head_dim]`` kv norm weight.
        cfg: model config (``hidden_size``, ``q_lora_rank``, ``num_attention_heads``,
            ``head_dim``, ``qk_rope_head_dim``, ``rms_norm_eps``).
        weight_format: ``"int8"`` (W8A8 on the q "b" projection) or ``"bf16"``.
        out_bf16: BF16 ``q`` / ``kv`` outputs; ``False`` keeps them FP32.

    Returns:
        ``(q, kv, qr, qr_scale)``: ``q [T, H, head_dim]`` BF16 (FP32), ``kv [T, head_dim]``
        BF16 (FP32), ``qr [T, q_lora]`` INT8 codes ("int8") or FP32 latent ("bf16"),
        ``qr_scale [T, 1]`` FP32 (``1/s``; ones for "bf16"). ``out_bf16`` does not change
        ``qr`` / ``qr_scale``.

    Raises:
        BindError: unknown ``weight_format``, or an argument of the wrong shape/dtype.
    """
    fn = "golden_qkv_proj_rope"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, Lq, H, hd, r = (cfg.hidden_size, cfg.q_lora_rank, cfg.num_attention_heads,
                       cfg.head_dim, cfg.qk_rope_head_dim)
    n = cfg.nope_head_dim
    if x.dim() != 2:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    T = x.shape[0]
    _check(fn, "x", x, (T, D), "float")
    _check(fn, "wq_a", wq_a, (D, Lq), "float")
    if weight_format == "int8":
        _check(fn, "wq_b", wq_b, (Lq, H * hd), "int8")
        if wq_b_scale is None:
            raise BindError(f"{fn}: wq_b_scale [{H * hd}] is required for weight_format='int8'")
        _check(fn, "wq_b_scale", wq_b_scale, (H * hd,), "float")
    else:
        _check(fn, "wq_b", wq_b, (Lq, H * hd), "float")
    _check(fn, "wkv", wkv, (D, hd), "float")
    _check(fn, "rope_cos", rope_cos, (T, r), "float")
    _check(fn, "rope_sin", rope_sin, (T, r), "float")
    _check(fn, "gamma_cq", gamma_cq, (Lq,), "float")
    _check(fn, "gamma_ckv", gamma_ckv, (hd,), "float")

    eps = cfg.rms_norm_eps
    xf = x.float()
    qr_f = _rms_normalize(xf @ wq_a.float(), eps) * gamma_cq.float()  # [T, Lq]
    if weight_format == "int8":
        qr, qr_scale = quantize_per_row_int8(qr_f)
        acc = (qr.double() @ wq_b.double()).to(torch.int32)  # exact integer sums
        q = (acc.float() * qr_scale) * wq_b_scale.float()
    else:
        qr, qr_scale = qr_f, torch.ones(T, 1, dtype=torch.float32)
        q = qr_f @ wq_b.float()
    q = _rms_normalize(q.reshape(T, H, hd), eps)
    q = torch.cat([q[..., :n], rope_interleaved(q[..., n:], rope_cos, rope_sin)], dim=-1)

    kv = _rms_normalize(xf @ wkv.float(), eps) * gamma_ckv.float()  # [T, hd]
    kv = torch.cat([kv[:, :n], rope_interleaved(kv[:, n:], rope_cos, rope_sin)], dim=-1)
    if out_bf16:
        q, kv = q.to(torch.bfloat16), kv.to(torch.bfloat16)
    return q, kv, qr, qr_scale


def make_qkv_inputs(
    cfg: DeepSeekV4Config, T: int, seed: int, *, weight_format: str = "int8",
) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_qkv_proj_rope` (v4flash-kernels.md A.2 test data).

    Drawn from one ``torch.Generator`` seeded with ``seed``, in this order: ``x``,
    ``wq_a``, ``wq_b`` (float), ``wkv``, ``cos``, ``sin``, ``gamma_cq``, ``gamma_ckv``.
    ``x``, cos, sin and the gammas are uniform(-1, 1); weights uniform(-0.1, 0.1).
    Everything is rounded to BF16 except ``wq_b``, which for ``"int8"`` is quantised per
    output column from its FP32 draw (:func:`quantize_weight_per_column`), and for
    ``"bf16"`` is the BF16-rounded draw with ``wq_b_scale`` all ones (ignored by the
    golden). cos/sin are drawn ``[T, rope_dim/2]`` and duplicated to the full-width
    ``[T, rope_dim]`` layout (second half = first half); they are random numbers, not
    angles, like the reference fixture.

    Args:
        cfg: model config.
        T: number of tokens (> 0).
        seed: generator seed.
        weight_format: ``"int8"`` or ``"bf16"``, as for the golden.

    Returns:
        ``{"x": [T, D] bf16, "wq_a": [D, q_lora] bf16, "wq_b": [q_lora, H*head_dim] int8|bf16,
        "wq_b_scale": [H*head_dim] fp32, "wkv": [D, head_dim] bf16, "rope_cos": [T, rope_dim]
        bf16, "rope_sin": [T, rope_dim] bf16, "gamma_cq": [q_lora] bf16,
        "gamma_ckv": [head_dim] bf16}``.

    Raises:
        BindError: ``T`` not positive or unknown ``weight_format``.
    """
    if T <= 0:
        raise BindError(f"make_qkv_inputs: T must be positive, got {T}")
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"make_qkv_inputs: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, Lq, hd, r = cfg.hidden_size, cfg.q_lora_rank, cfg.head_dim, cfg.qk_rope_head_dim
    qd = cfg.q_dim
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, bound: float) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2.0 - 1.0) * bound

    bf16 = torch.bfloat16
    x = uniform(T, D, bound=1.0)
    wq_a = uniform(D, Lq, bound=0.1)
    wq_b_f = uniform(Lq, qd, bound=0.1)
    wkv = uniform(D, hd, bound=0.1)
    cos_half = uniform(T, r // 2, bound=1.0)
    sin_half = uniform(T, r // 2, bound=1.0)
    gamma_cq = uniform(Lq, bound=1.0)
    gamma_ckv = uniform(hd, bound=1.0)
    if weight_format == "int8":
        wq_b, wq_b_scale = quantize_weight_per_column(wq_b_f)
    else:
        wq_b, wq_b_scale = wq_b_f.to(bf16), torch.ones(qd, dtype=torch.float32)
    return {
        "x": x.to(bf16),
        "wq_a": wq_a.to(bf16),
        "wq_b": wq_b,
        "wq_b_scale": wq_b_scale,
        "wkv": wkv.to(bf16),
        "rope_cos": torch.cat([cos_half, cos_half], dim=-1).to(bf16),
        "rope_sin": torch.cat([sin_half, sin_half], dim=-1).to(bf16),
        "gamma_cq": gamma_cq.to(bf16),
        "gamma_ckv": gamma_ckv.to(bf16),
    }
