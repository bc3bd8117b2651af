"""RoPE frequency tables (host-side torch, not a kernel) and per-token table rows.

Two profiles (transformers `models/deepseek_v4/modeling_deepseek_v4.py`; pypto-lib `models/deepseek/v4-flash/rope_tables.py`):

* ``"main"``: base ``cfg.rope_theta`` (1e4), ``w_i = theta^(-2i/r)``, no scaling. Used only by
  sliding-only layers (``compress_ratio == 0``).
* ``"compress"``: base ``cfg.compress_rope_theta`` (1.6e5) with YaRN (``cfg.rope_scaling``):
  ``b_i = theta^(-2i/r)``; correction range
  ``low = floor(r*ln(orig/(beta_fast*2pi)) / (2 ln theta))``,
  ``high = ceil(r*ln(orig/(beta_slow*2pi)) / (2 ln theta))``, clamped to ``[0, r-1]``
  (15 / 25 at FLASH and tiny); ramp ``rho_i = clamp((i-low)/(high-low), 0, 1)``;
  ``w_i = b_i*(1-rho_i) + (b_i/factor)*rho_i``; attention factor 1 (no mscale on cos/sin).
  Used by every path of ratio-4 (CSA) and ratio-128 (HCA) layers, compressor included.

Table layout (the contract for every kernel): ``cos, sin`` are ``[max_pos, r]`` FP32 with
``cos[p, i] = cos(p * w_i)`` for ``i < r/2`` and columns ``r/2 .. r-1`` **duplicating**
columns ``0 .. r/2-1`` (``cos[p, r/2 + i] == cos[p, i]``), so a kernel can index either
``[:, :r/2]`` or ``[:, j >> 1]`` over the full width. Angles are ``p_fp32 * w_i`` in FP32
(as transformers builds them); callers cast the tables to BF16.

RoPE itself is interleaved: pair ``(2i, 2i+1)`` of the trailing ``r`` channels rotates with
``w_i``. The rotation golden lives in ``qkv_proj_rope.rope_interleaved``.
"""

from __future__ import annotations

import math

import torch

from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4.config import DeepSeekV4Config

__all__ = [
    "ROPE_PROFILES",
    "profile_for_ratio",
    "yarn_correction_range",
    "rope_inv_freq",
    "rope_tables",
    "golden_materialize_rope_rows",
]

ROPE_PROFILES: tuple[str, ...] = ("main", "compress")

# ---- kernel ----
# (``materialize_rope_rows`` in pto.language goes here; the golden below is its contract.)
# ---- end kernel ----


def profile_for_ratio(ratio: int) -> str:
    """RoPE profile of a layer from its compress ratio (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    Args:
        ratio: ``cfg.compress_ratios[layer]``: 0 (SWA), 4 (CSA) or 128 (HCA).

    Returns:
        ``"main"`` for ratio 0, ``"compress"`` for 4 and 128 (the whole layer, not only its
        compressor, uses the compress table).

    Raises:
        ConfigError: any other ratio.
    """
    if ratio == 0:
        return "main"
    if ratio in (4, 128):
        return "compress"
    raise ConfigError(f"profile_for_ratio: compress ratio {ratio!r} is not one of 0, 4, 128")


def yarn_correction_range(cfg: DeepSeekV4Config) -> tuple[int, int]:
    """YaRN correction range ``(low, high)`` of the compress profile (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``low = floor(r * ln(orig / (beta_fast * 2 pi)) / (2 ln theta))`` and
    ``high = ceil(r * ln(orig / (beta_slow * 2 pi)) / (2 ln theta))`` with
    ``r = qk_rope_head_dim``, ``theta = compress_rope_theta`` and
    ``orig = rope_scaling.original_max_position_embeddings``; clamped to ``[0, r - 1]``
    (transformers' clamp). FLASH and tiny (r = 64, theta = 1.6e5, orig = 65536,
    beta 32 / 1) give ``(15, 25)``.

    Returns:
        ``(low, high)`` pair indices (ints).
    """
    r = cfg.qk_rope_head_dim
    theta = cfg.compress_rope_theta
    ys = cfg.rope_scaling

    def corr_dim(n_rot: float) -> float:
        orig = ys.original_max_position_embeddings
        return r * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = math.floor(corr_dim(ys.beta_fast))
    high = math.ceil(corr_dim(ys.beta_slow))
    return max(low, 0), min(high, r - 1)


def rope_inv_freq(cfg: DeepSeekV4Config, profile: str) -> torch.Tensor:  # [r/2] fp32
    """Per-pair angular frequencies ``w_i`` (radians per position) of a profile.

    ``"main"``: ``rope_theta^(-2i/r)``. ``"compress"``: YaRN blend of
    ``b_i = compress_rope_theta^(-2i/r)`` and ``b_i / factor`` with the linear ramp over
    :func:`yarn_correction_range` (``high`` nudged by 1e-3 if equal to ``low``); pairs below
    ``low`` keep ``b_i``, pairs at or above ``high`` get ``b_i / factor``. Computed in FP32
    as transformers does (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    Args:
        cfg: model config (``qk_rope_head_dim``, thetas, ``rope_scaling``).
        profile: ``"main"`` or ``"compress"``.

    Returns:
        ``[r/2]`` FP32 frequencies.

    Raises:
        ConfigError: unknown profile.
    """
    r = cfg.qk_rope_head_dim
    exponents = torch.arange(0, r, 2, dtype=torch.int64).to(torch.float32) / r  # [r/2]
    if profile == "main":
        return 1.0 / (cfg.rope_theta ** exponents)
    if profile == "compress":
        base_freq = 1.0 / (cfg.compress_rope_theta ** exponents)
        low, high = yarn_correction_range(cfg)
        hi = high + 0.001 if high == low else high
        ramp = ((torch.arange(r // 2, dtype=torch.float32) - low) / (hi - low)).clamp(0.0, 1.0)
        factor = cfg.rope_scaling.factor
        return base_freq / factor * ramp + base_freq * (1.0 - ramp)
    raise ConfigError(f"rope_inv_freq: unknown RoPE profile {profile!r}; known: {ROPE_PROFILES}")


def rope_tables(
    cfg: DeepSeekV4Config,
    profile: str,
    max_pos: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([max_pos, r] fp32, [max_pos, r] fp32)
    """Full-width duplicated cos / sin tables of a profile (see the module docstring).

    ``angle[p, i] = float32(p) * w_i`` (FP32), ``cos = cos(angle)``, ``sin = sin(angle)``,
    then ``cat([t, t], -1)`` so columns ``r/2..r-1`` repeat ``0..r/2-1``. Attention factor
    is 1 for both profiles. Callers cast to BF16 for the kernels.

    Args:
        cfg: model config.
        profile: ``"main"`` or ``"compress"`` (see :func:`profile_for_ratio`).
        max_pos: number of positions (rows); default ``cfg.max_position_embeddings``.

    Returns:
        ``(cos, sin)``, each ``[max_pos, qk_rope_head_dim]`` FP32.

    Raises:
        ConfigError: unknown profile.
        BindError: ``max_pos`` not positive.
    """
    n = cfg.max_position_embeddings if max_pos is None else int(max_pos)
    if n <= 0:
        raise BindError(f"rope_tables: max_pos must be positive, got {max_pos}")
    inv_freq = rope_inv_freq(cfg, profile)
    angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)  # [n, r/2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def golden_materialize_rope_rows(
    cos_table: torch.Tensor,  # [P, r] bf16 (any float)
    sin_table: torch.Tensor,  # [P, r] bf16 (any float)
    position_ids: torch.Tensor,  # [T] int32 / int64
    num_tokens: int,
    out_cos: torch.Tensor,  # [T, r] same dtype as cos_table
    out_sin: torch.Tensor,  # [T, r] same dtype as sin_table
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, r], [T, r])
    """Per-token RoPE rows (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py` ``materialize_rope_rows``).

    Row ``t < num_tokens`` of the result is table row ``position_ids[t]`` (an exact copy,
    dtype of ``out_*``); rows ``t >= num_tokens`` keep the values of ``out_cos`` /
    ``out_sin`` (the kernel leaves them untouched). The inputs are not modified; new
    tensors are returned.

    Args:
        cos_table, sin_table: ``[P, r]`` full tables from :func:`rope_tables` (cast).
        position_ids: ``[T]`` integer absolute positions.
        num_tokens: active prefix length, ``0 <= num_tokens <= T``.
        out_cos, out_sin: ``[T, r]`` destination tensors (their tail rows are kept).

    Returns:
        ``(cos_rows, sin_rows)``, each ``[T, r]`` with the dtype of ``out_cos`` / ``out_sin``.

    Raises:
        BindError: mismatched shapes, ``num_tokens`` outside ``[0, T]``, or an active
            position outside ``[0, P)``.
    """
    fn = "golden_materialize_rope_rows"
    if cos_table.dim() != 2 or sin_table.shape != cos_table.shape:
        raise BindError(f"{fn}: cos_table/sin_table must be equal [P, r], got "
                        f"{list(cos_table.shape)} / {list(sin_table.shape)}")
    P, r = cos_table.shape
    if position_ids.dim() != 1 or position_ids.is_floating_point():
        raise BindError(f"{fn}: position_ids must be an integer [T] tensor, got "
                        f"{position_ids.dtype} {list(position_ids.shape)}")
    T = position_ids.shape[0]
    for name, t in (("out_cos", out_cos), ("out_sin", out_sin)):
        if tuple(t.shape) != (T, r):
            raise BindError(f"{fn}: {name} must be [{T}, {r}], got {list(t.shape)}")
    if not 0 <= num_tokens <= T:
        raise BindError(f"{fn}: num_tokens={num_tokens} outside [0, {T}]")
    pos = position_ids[:num_tokens].long()
    if num_tokens and (int(pos.min()) < 0 or int(pos.max()) >= P):
        raise BindError(f"{fn}: active positions span [{int(pos.min())}, {int(pos.max())}], "
                        f"table has {P} rows")
    cos_rows, sin_rows = out_cos.clone(), out_sin.clone()
    cos_rows[:num_tokens] = cos_table.index_select(0, pos).to(out_cos.dtype)
    sin_rows[:num_tokens] = sin_table.index_select(0, pos).to(out_sin.dtype)
    return cos_rows, sin_rows
