"""Parity of the SWA attention sub-layer golden with transformers (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

``golden_prefill_attention_swa`` (``weight_format="bf16"`` = unquantised, ``float32=True`` =
no BF16 rounding anywhere) runs a sliding layer's whole attention sub-layer from the layer's
input streams: hc_pre -> input RMSNorm -> q / kv with main-profile RoPE -> raw cache scatter
-> 64-key sliding window (self included) -> attention with the per-head sink -> inverse RoPE
-> grouped o-projection -> hc_post. Compared with HF:

* ``attn_out [S, D]``: the ``self_attn`` output (before hc_post);
* ``x_out [S, hc, D]``: the stream after ``post * attn_out + comb^T X``, i.e. the input of
  the same layer's ``ffn_hc``.

The sinks are unit-scale, so they matter: the golden is also run with zero sinks and must
then miss HF by far more than the tolerance.

Tolerance: FP32 on both sides. HF computes dense logits over all S keys with a finfo.min
mask, the golden an online softmax over the 64 gathered keys; summation orders differ.
Measured: attn_out max abs ~1e-6 (values up to ~2), x_out ~2e-6 (values up to ~7).
Bounds: atol = rtol = 1e-4.

A chunked test splits the S tokens into two prefill calls (0..199, 200..460) that share the
raw kv cache, as a serving prefill does; the result must match the single HF pass with the
same bounds.

Another test runs the golden with the kernels' own numerics (BF16 weights, tables, cache
and activations; ``"bf16"`` = unquantised and ``"int8"`` = W8A8 q-b / o-b projections) and
checks that it stays within quantisation noise of the FP32 model: relative RMS error
``||golden - hf||_2 / ||hf||_2`` at most 2% for ``attn_out`` and 1% for ``x_out`` (layer 1,
measured bf16 / int8: 0.8% / 1.3% for attn_out, 0.1% / 0.2% for x_out). A wrong scale axis
or group layout in the quantised path gives errors of order 100%.
"""

import pytest
import torch

from pto.models.deepseek_v4.prefill_attention_swa import golden_prefill_attention_swa
from pto.models.deepseek_v4.prefill_sparse_attn import quantize_wo_b
from pto.models.deepseek_v4.qkv_proj_rope import quantize_weight_per_column

ATOL = 1e-4
RTOL = 1e-4
KERNEL_REL_RMS = {"attn_out": 2e-2, "x_out": 1e-2}


def _rows(inputs: dict, lo: int, hi: int, kv_cache: torch.Tensor) -> dict:
    """The parity inputs restricted to tokens ``lo .. hi-1`` (a later prefill chunk)."""
    d = dict(inputs)
    for k in ("x_hc", "ori_slot_mapping", "position_ids"):
        d[k] = inputs[k][lo:hi]
    d["kv_cache"], d["num_tokens"] = kv_cache, hi - lo
    return d


def _kernel_numerics_inputs(inputs: dict, weight_format: str) -> dict:
    """The FP32 parity inputs cast the way the kernels receive them (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`)."""
    bf16 = torch.bfloat16
    d = dict(inputs)
    for k in ("wq_a", "wkv", "attn_norm_w", "gamma_cq", "gamma_ckv", "wo_a", "freqs_cos",
              "freqs_sin", "kv_cache"):
        d[k] = inputs[k].to(bf16)
    if weight_format == "int8":
        d["wq_b"], d["wq_b_scale"] = quantize_weight_per_column(inputs["wq_b"])
        d["wo_b"], d["wo_b_scale"] = quantize_wo_b(inputs["wo_b"])
    else:
        d["wq_b"], d["wo_b"] = inputs["wq_b"].to(bf16), inputs["wo_b"].to(bf16)
    return d


@pytest.mark.parametrize("layer", [0, 1], ids=["L0", "L1"])
def test_swa_sublayer_matches_transformers(hf_run, layer):
    cfg = hf_run.cfg
    inputs = hf_run.swa_inputs(layer)
    kv_cache, x_out, mids = golden_prefill_attention_swa(
        inputs, cfg, weight_format="bf16", return_intermediates=True, float32=True)
    assert x_out.dtype == torch.float32 and mids["attn_out"].dtype == torch.float32

    attn_hf = hf_run.call(f"model.layers.{layer}.self_attn").output[0][0]  # [S, D]
    stream_hf = hf_run.call(f"model.layers.{layer}.ffn_hc").args[0][0]  # [S, hc, D]
    hf_run.compare(f"swa L{layer} attn_out (before hc_post)", mids["attn_out"], attn_hf,
                   atol=ATOL, rtol=RTOL)
    hf_run.compare(f"swa L{layer} x_out (stream after hc_post)", x_out, stream_hf,
                   atol=ATOL, rtol=RTOL)

    # every token attends to min(64, t + 1) keys through the window indices
    valid = (mids["swa_indices"] >= 0).sum(dim=1)
    want = torch.clamp(hf_run.positions + 1, max=cfg.sliding_window).to(valid.dtype)
    assert torch.equal(valid, want)

    # the sinks are exercised: dropping them moves the output far outside the tolerance
    # (checked on the first window of tokens only, to save time)
    W = cfg.sliding_window
    no_sink = dict(_rows(inputs, 0, W, inputs["kv_cache"]),
                   attn_sink=torch.zeros_like(inputs["attn_sink"]))
    _, _, mids0 = golden_prefill_attention_swa(no_sink, cfg, weight_format="bf16",
                                               return_intermediates=True, float32=True)
    assert (mids0["attn_out"] - attn_hf[:W]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("weight_format", ["bf16", "int8"])
def test_swa_kernel_numerics_within_quantisation_noise(hf_run, weight_format):
    layer = 1
    inputs = _kernel_numerics_inputs(hf_run.swa_inputs(layer), weight_format)
    _, x_out, mids = golden_prefill_attention_swa(inputs, hf_run.cfg, weight_format=weight_format,
                                                  return_intermediates=True)
    want = {"attn_out": hf_run.call(f"model.layers.{layer}.self_attn").output[0][0],
            "x_out": hf_run.call(f"model.layers.{layer}.ffn_hc").args[0][0]}
    for name, got in (("attn_out", mids["attn_out"]), ("x_out", x_out)):
        w = want[name].double()
        diff = got.double() - w
        rel_rms = float(diff.norm() / w.norm())
        print(f"[parity] swa L{layer} {name} kernel numerics ({weight_format}): "
              f"max_abs={diff.abs().max():.3e} rel_rms={rel_rms:.3e} "
              f"(tol rel_rms<={KERNEL_REL_RMS[name]:g})")
        assert rel_rms <= KERNEL_REL_RMS[name], f"{name}: rel_rms {rel_rms:.3e}"


@pytest.mark.parametrize("split", [200])
def test_swa_chunked_prefill_matches_one_transformers_pass(hf_run, split):
    layer, S = 1, hf_run.S
    inputs = hf_run.swa_inputs(layer)
    cache, x1, m1 = golden_prefill_attention_swa(_rows(inputs, 0, split, inputs["kv_cache"]),
                                                 hf_run.cfg, weight_format="bf16",
                                                 return_intermediates=True, float32=True)
    _, x2, m2 = golden_prefill_attention_swa(_rows(inputs, split, S, cache), hf_run.cfg,
                                             weight_format="bf16", return_intermediates=True,
                                             float32=True)
    attn_hf = hf_run.call(f"model.layers.{layer}.self_attn").output[0][0]
    stream_hf = hf_run.call(f"model.layers.{layer}.ffn_hc").args[0][0]
    hf_run.compare(f"swa L{layer} chunked {split}+{S - split} attn_out",
                   torch.cat([m1["attn_out"], m2["attn_out"]]), attn_hf, atol=ATOL, rtol=RTOL)
    hf_run.compare(f"swa L{layer} chunked {split}+{S - split} x_out", torch.cat([x1, x2]),
                   stream_hf, atol=ATOL, rtol=RTOL)
