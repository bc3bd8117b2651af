"""Parity of ``golden_qkv_proj_rope`` with transformers' attention q / kv paths (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

Per layer the golden (``weight_format="bf16"``: no quantisation; ``out_bf16=False``) runs on
HF's ``input_layernorm`` output with HF's weights (transposed to the golden's ``[in, out]``
layout) and the pto RoPE tables of the layer's profile. Compared with HF:

* ``qr`` (normalised q-LoRA latent) = ``q_a_norm`` output;
* ``q`` after the unweighted per-head RMSNorm and interleaved RoPE on the trailing 64
  channels = HF's ``q_b_norm`` output rotated by HF's own ``apply_rotary_pos_emb`` with the
  cos / sin the model passed to that layer;
* ``kv`` after the weighted RMSNorm and RoPE = HF's ``kv_norm`` output rotated the same way.

Sliding layers (0, 1) use the main profile (theta 1e4); CSA (2, 4) and HCA (3, 5) layers use
the compress profile (theta 1.6e5 + YaRN) for their ordinary q / kv too (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).
The HF cos / sin must equal the pto tables bit for bit.

Tolerance: FP32 on both sides with the same operation order, so the results are bit
identical on this machine (max abs error 0); the bound atol = rtol = 1e-5 leaves room for
summation-order differences of other BLAS builds / thread counts (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).
"""

import pytest
import torch

from pto.models.deepseek_v4.qkv_proj_rope import golden_qkv_proj_rope
from pto.models.deepseek_v4.rope import profile_for_ratio

ATOL = 1e-5
RTOL = 1e-5
KINDS = {0: "sliding", 4: "CSA", 128: "HCA"}


@pytest.mark.parametrize("layer", range(6), ids=[f"L{i}" for i in range(6)])
def test_qkv_proj_rope_matches_transformers(hf_run, layer):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb

    cfg = hf_run.cfg
    ratio = hf_run.layer_ratio(layer)
    profile = profile_for_ratio(ratio)
    label = f"qkv L{layer} ({KINDS[ratio]}, {profile} rope)"
    attn = f"model.layers.{layer}.self_attn"
    assert hf_run.model.model.layers[layer].self_attn.rope_layer_type == profile

    args = hf_run.qkv_args(layer)
    q, kv, qr, qr_scale = golden_qkv_proj_rope(**args, cfg=cfg, weight_format="bf16",
                                               out_bf16=False)
    assert torch.equal(qr_scale, torch.ones(hf_run.S, 1))

    # the cos / sin HF handed to this layer equal the pto tables (first half = one per pair)
    cos_hf, sin_hf = hf_run.call(attn).kwargs["position_embeddings"][profile]
    half = cfg.qk_rope_head_dim // 2
    assert torch.equal(cos_hf[0], args["rope_cos"][:, :half]), f"{label}: cos tables differ"
    assert torch.equal(sin_hf[0], args["rope_sin"][:, :half]), f"{label}: sin tables differ"

    q_norm = hf_run.call(f"{attn}.q_b_norm").output  # [1, H, S, d]
    q_hf = apply_rotary_pos_emb(q_norm, cos_hf, sin_hf)
    kv_norm = hf_run.call(f"{attn}.kv_norm").output  # [1, S, d]
    kv_hf = apply_rotary_pos_emb(kv_norm.view(1, hf_run.S, 1, cfg.head_dim).transpose(1, 2),
                                 cos_hf, sin_hf)  # [1, 1, S, d]

    hf_run.compare(f"{label} qr", qr, hf_run.call(f"{attn}.q_a_norm").output[0],
                   atol=ATOL, rtol=RTOL)
    hf_run.compare(f"{label} q", q, q_hf[0].transpose(0, 1), atol=ATOL, rtol=RTOL)
    hf_run.compare(f"{label} kv", kv, kv_hf[0, 0], atol=ATOL, rtol=RTOL)
    n = cfg.nope_head_dim  # the rotated slice must actually move (RoPE is exercised)
    assert (kv[1:, n:] - kv_norm[0, 1:, n:]).abs().max() > 1e-2
