"""The front of every attention sub-block: hc_pre -> RMSNorm -> RoPE rows -> q / kv projections.

Chain (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`, `decode_attention_swa.py`, `decode_attention_hca.py`, `prefill_attention_hca.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`), shared by the prefill and
decode blocks of every layer type:

    x_mixed, post, comb = hc_pre(x_hc)                                # [T, D] bf16, [T, hc], [T, hc*hc]
    x_normed            = rms_norm(x_mixed, attn_norm_w)
    late_dep            = task_dummy(deps=[rms_norm])                 # gates the off-critical kv paths
    cos_t, sin_t        = rope_rows(...)                              # the block's table rows
    q, kv, qr, qr_scale = qkv_proj_rope(x_normed, ..., cos_t, sin_t, late_dep)

How the RoPE rows are taken is the block's: prefill copies the active prefix
(``materialize_rope_rows``), decode copies every active token and zeroes inactive ones
(``decode_metadata``'s ``decode_rope_rows``). The golden mirrors the kernel helper.
"""

from types import SimpleNamespace

import torch

import pto.language as pl
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.hc_pre import golden_hc_pre, hc_pre
from pto.models.deepseek_v4.qkv_proj_rope import golden_qkv_proj_rope, qkv_proj_rope
from pto.models.deepseek_v4.rms_norm import golden_rms_norm, rms_norm
from pto.models.deepseek_v4.tiling import token_capacity
from pto.models.deepseek_v4.weight_format import act_dtype

__all__ = ["attention_front", "golden_attention_front"]


# ---- kernel ----
def attention_front(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                    gamma_cq, gamma_ckv, rope_rows, cfg: DeepSeekV4Config, seed_scopes: bool = False):
    """Submit the front of an attention sub-block; call it inside a ``@pl.jit.inline`` body.

    Creates the block's front scratch (uninitialised, ``T = x_hc.dim(0)`` rows, capacity
    ``token_capacity(cfg)``): ``x_mixed [T, D]`` BF16, ``post [T, hc]``, ``comb [T, hc*hc]``
    FP32, ``x_normed [T, D]`` BF16, ``rope_cos_t / rope_sin_t [T, rope_dim]`` BF16, ``q [T, H,
    head_dim]``, ``kv [T, head_dim]`` BF16, ``qr [T, q_lora]`` INT8 (BF16 for
    ``cfg.weight_format == "bf16"``), ``qr_scale [T, 1]`` FP32;
    then submits ``hc_pre``, ``rms_norm``, the ``late_dep`` join node, ``rope_rows(rope_cos_t,
    rope_sin_t)`` (the block's RoPE-row task) and ``qkv_proj_rope``. ``seed_scopes`` selects
    the seed variant of hc_pre and qkv_proj_rope.

    Args: the block's tensors of the same names (shapes as ``prefill_attention_swa``), the
    callback ``rope_rows``, the model config and the variant flag.

    Returns:
        namespace ``post, comb, x_normed, rope_cos_t, rope_sin_t, q, kv, qr, qr_scale,
        late_dep``.

    Raises:
        ConfigError / BindError / CapacityError: from the composed kernels.
    """
    D, HC, H, HD, R, LQ = (cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim,
                           cfg.qk_rope_head_dim, cfg.q_lora_rank)
    cap = token_capacity(cfg)
    t = pl.tensor.dim(x_hc, 0)
    x_mixed = pl.create_tensor([t, D], pl.BF16, capacity=cap)
    post = pl.create_tensor([t, HC], pl.FP32, capacity=cap)
    comb = pl.create_tensor([t, HC * HC], pl.FP32, capacity=cap)
    x_normed = pl.create_tensor([t, D], pl.BF16, capacity=cap)
    rope_cos_t = pl.create_tensor([t, R], pl.BF16, capacity=cap)
    rope_sin_t = pl.create_tensor([t, R], pl.BF16, capacity=cap)
    q = pl.create_tensor([t, H, HD], pl.BF16, capacity=cap)
    kv = pl.create_tensor([t, HD], pl.BF16, capacity=cap)
    qr = pl.create_tensor([t, LQ], act_dtype(cfg), capacity=cap)
    qr_scale = pl.create_tensor([t, 1], pl.FP32, capacity=cap)

    hc_pre(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, x_mixed, post, comb, cfg, seed_scopes)
    rms_tid = rms_norm(x_mixed, attn_norm_w, x_normed, cfg)
    late_dep = pl.system.task_dummy(deps=[rms_tid])
    rope_rows(rope_cos_t, rope_sin_t)
    qkv_proj_rope(x_normed, wq_a, wq_b, wq_b_scale, wkv, rope_cos_t, rope_sin_t, gamma_cq, gamma_ckv,
                  q, kv, qr, qr_scale, late_dep, cfg, seed_scopes)
    return SimpleNamespace(post=post, comb=comb, x_normed=x_normed, rope_cos_t=rope_cos_t, rope_sin_t=rope_sin_t,
                           q=q, kv=kv, qr=qr, qr_scale=qr_scale, late_dep=late_dep)
# ---- end kernel ----


def golden_attention_front(
    inputs: dict,
    rope_cos: torch.Tensor,  # [T, rope_dim] the block's RoPE rows
    rope_sin: torch.Tensor,  # [T, rope_dim]
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
) -> dict:
    """Golden of :func:`attention_front` from ``inputs`` (keys ``x_hc, hc_attn_fn,
    hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
    gamma_ckv``) and the block's RoPE rows: ``golden_hc_pre`` -> ``golden_rms_norm``
    (``cfg.rms_norm_eps``) -> ``golden_qkv_proj_rope``. ``float32``: no BF16 rounding of
    ``x_mixed``, ``x_normed``, ``q``, ``kv`` (parity mode).

    Returns:
        dict ``x_mixed, post, comb, x_normed, q, kv, qr, qr_scale``.

    Raises:
        BindError: from the sub-goldens (shapes, dtypes, ``weight_format``).
    """
    i, bf16 = inputs, not float32
    x_mixed, post, comb = golden_hc_pre(i["x_hc"], i["hc_attn_fn"], i["hc_attn_scale"], i["hc_attn_base"], cfg,
                                        out_bf16=bf16)
    x_normed = golden_rms_norm(x_mixed, i["attn_norm_w"], cfg.rms_norm_eps, out_bf16=bf16)
    q, kv, qr, qr_scale = golden_qkv_proj_rope(x_normed, i["wq_a"], i["wq_b"], i["wq_b_scale"], i["wkv"], rope_cos,
                                               rope_sin, i["gamma_cq"], i["gamma_ckv"], cfg,
                                               weight_format=weight_format, out_bf16=bf16)
    return {"x_mixed": x_mixed, "post": post, "comb": comb, "x_normed": x_normed, "q": q, "kv": kv, "qr": qr,
            "qr_scale": qr_scale}
