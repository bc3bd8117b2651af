"""Parity of ``golden_prefill_compressor_ratio128`` with transformers' HCA compressor.

Reference: transformers `models/deepseek_v4/modeling_deepseek_v4.py` (HF) and pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py` (kernel contract).

One golden call over all S = 461 tokens of an HCA layer (HF's ``input_layernorm`` output,
HF's compressor weights, an empty FP32 state, an FP32 compressed pool with identity page
tables) must reproduce:

* the compressed rows: HF emits ``floor(S / 128) = 3`` entries (windows 0..127, 128..255,
  256..383; the 77-token tail emits nothing), each the per-channel softmax pool of the
  window's kv with gates ``Z + ape[slot]``, weighted RMSNorm, RoPE (compress profile);
* their positions: HF rotates entry ``w`` at ``128 w`` (the window start, read from the
  compressor's rotary call); the golden writes entry ``w`` from the token that closes the
  window (``pos = 128 w + 127``) and rotates it at ``pos + 1 - 128``; no other row of the
  pool is written;
* their visibility: HF's block bias lets token ``t`` see entry ``w`` iff ``w < (t+1) // 128``,
  i.e. iff the closing token of ``w`` is at or before ``t`` (the kernels' rule, pypto-lib `prefill_attention_hca.py`);
* the state rows ``[kv | score + ape[pos % 128]]`` against HF's ``kv_proj`` / ``gate_proj``
  outputs plus ``position_bias``.

A chunked test feeds the same tokens as two prefill calls (0..199, 200..460, and 0..127,
128..460) sharing the paged FP32 state: window 1 (128..255) then straddles the first split,
so its first 72 rows come from the state written by the first call. The rows must equal
the single HF pass with the same bounds.

Tolerance: FP32 on both sides; the golden accumulates the projections in FP64 and rounds
once, HF in FP32. Measured max abs <= 2.4e-6 on entries of order 1-3 (state rows <= 2.2e-6).
Bounds: atol = rtol = 1e-5.
"""

import pytest
import torch

from pto.models.deepseek_v4.prefill_compressor_ratio128 import (
    HCA_RATIO,
    golden_prefill_compressor_ratio128,
)

ATOL = 1e-5
RTOL = 1e-5


@pytest.mark.parametrize("layer", [3, 5], ids=["L3", "L5"])
def test_hca_compressor_matches_transformers(hf_run, layer):
    cfg = hf_run.cfg
    S, d, M = hf_run.S, cfg.head_dim, HCA_RATIO
    comp = f"model.layers.{layer}.self_attn.compressor"
    inputs = hf_run.compressor_inputs(layer)
    cmp_kv, state = golden_prefill_compressor_ratio128(**inputs, cfg=cfg)

    cmp_hf, bias_hf = hf_run.call(comp).output  # [1, 1, T, d], [1, 1, S, T]
    T = cmp_hf.shape[2]
    assert T == S // M == 3

    rows = cmp_kv.reshape(-1, d)
    written = inputs["cmp_slot_mapping"][inputs["cmp_slot_mapping"] >= 0]
    assert written.tolist() == list(range(T))  # one row per closed window, tail dropped
    assert not bool(rows[T:].any()), "golden wrote compressed rows past the closed windows"
    hf_run.compare(f"hca L{layer} compressed rows", rows[:T], cmp_hf[0, 0], atol=ATOL, rtol=RTOL)

    # positions: HF's rotary positions == the golden's window starts (closing pos + 1 - 128)
    rot = hf_run.calls[f"{comp}.rotary_emb"]
    assert len(rot) == 1
    hf_pos = rot[0].kwargs["position_ids"][0]
    closing = hf_run.positions[inputs["cmp_slot_mapping"] >= 0]
    assert torch.equal(hf_pos, closing + 1 - M)
    assert hf_pos.tolist() == [0, 128, 256]

    # visibility of entry w to token t: closing token of w at or before t
    visible = closing[None, :] <= hf_run.positions[:, None]  # [S, T]
    assert torch.equal(bias_hf[0, 0] == 0, visible)
    assert bool(torch.isneginf(bias_hf[0, 0][~visible]).all())

    # state rows: kv | score + ape[pos % 128]
    flat = state.reshape(-1, 2 * d)[inputs["state_slot_mapping"]]
    kv_hf = hf_run.call(f"{comp}.kv_proj").output[0]
    score_hf = hf_run.call(f"{comp}.gate_proj").output[0] + inputs["ape"][hf_run.positions % M]
    hf_run.compare(f"hca L{layer} state kv", flat[:, :d], kv_hf, atol=ATOL, rtol=RTOL)
    hf_run.compare(f"hca L{layer} state score+ape", flat[:, d:], score_hf, atol=ATOL, rtol=RTOL)


def _chunk(inputs: dict, lo: int, hi: int, state: torch.Tensor, cmp_kv: torch.Tensor) -> dict:
    """The compressor inputs restricted to tokens ``lo .. hi-1`` with a carried state / pool."""
    d = dict(inputs)
    for k in ("x", "position_ids", "cmp_slot_mapping", "state_slot_mapping"):
        d[k] = inputs[k][lo:hi]
    d["compress_state"], d["cmp_kv"], d["num_tokens"] = state, cmp_kv, hi - lo
    return d


@pytest.mark.parametrize("split", [200, 128], ids=["split200", "split128"])
def test_hca_compressor_chunked_matches_one_transformers_pass(hf_run, split):
    layer, cfg, S = 3, hf_run.cfg, hf_run.S
    inputs = hf_run.compressor_inputs(layer)
    cmp1, state1 = golden_prefill_compressor_ratio128(
        **_chunk(inputs, 0, split, inputs["compress_state"], inputs["cmp_kv"]), cfg=cfg)
    cmp2, _ = golden_prefill_compressor_ratio128(**_chunk(inputs, split, S, state1, cmp1), cfg=cfg)
    cmp_hf = hf_run.call(f"model.layers.{layer}.self_attn.compressor").output[0][0, 0]
    T = cmp_hf.shape[0]
    rows = cmp2.reshape(-1, cfg.head_dim)
    assert not bool(rows[T:].any())
    hf_run.compare(f"hca L{layer} chunked {split}+{S - split} compressed rows", rows[:T], cmp_hf,
                   atol=ATOL, rtol=RTOL)
