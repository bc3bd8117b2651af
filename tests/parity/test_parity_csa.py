"""Parity of the CSA goldens (ratio-4 compressor, indexer compressor, indexer top-k, the CSA
attention sub-layer) with transformers on the team's tiny checkpoint (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

For each CSA layer (2 and 4) of the S = 461-token forward (115 compressed entries; the
indexer keeps 16 per late query, a strict subset) the goldens run in their unquantised FP32
mode (``weight_format="bf16"``, ``float32=True``) with an identity Hadamard (transformers
applies none; an orthonormal rotation of both q and k leaves the scores unchanged, checked in
tests/models/deepseek_v4/test_indexer.py):

* compressed rows (``golden_prefill_compressor_ratio4``) vs the CSA compressor's output;
* selected sets per query (``golden_prefill_indexer``) vs HF's indexer output: equal sets,
  except where the k-th and (k+1)-th golden scores lie within 1e-5 (relative) of each other,
  counted and printed;
* the sub-layer's attention output and stream update (``golden_csa_block``) vs the
  ``self_attn`` output and the ``ffn_hc`` input.

The INT8 path (W8A8 index queries, orthonormal Sylvester Hadamard in BF16, INT8 keys with
per-row scales) is measured against HF's selections: its mean overlap is printed and must
stay above 0.9 (measured: mean 0.991, min 0.938 over 458 queries at layer 2).

Tolerance: FP32 on both sides, different summation orders (attention online vs dense). Measured:
compressed rows exact (0.0), attention output max abs 8.6e-7, stream 1.9e-6; every one of the 461
selected sets equal (394 strict subsets, no boundary ties). Bounds atol = rtol = 1e-4 as the SWA
parity test.
"""

import pytest
import torch

from pto.models.deepseek_v4.prefill_attention_csa import golden_csa_block
from pto.models.deepseek_v4.prefill_compressor_ratio4 import golden_prefill_compressor_ratio4
from pto.models.deepseek_v4.prefill_indexer import golden_prefill_indexer
from pto.models.deepseek_v4.prefill_indexer_compressor import golden_prefill_indexer_compressor
from pto.models.deepseek_v4.qkv_proj_rope import quantize_per_row_int8, quantize_weight_per_column
from pto.models.deepseek_v4.rope import rope_tables

ATOL = 1e-4
RTOL = 1e-4
TIE_REL = 1e-5
INT8_MIN_OVERLAP = 0.9
STATE_PAGES = 120  # >= ceil(461 / 4) + 1 pages of 4 rows: no ring reuse inside the one call


def _csa_inputs(hf_run, layer: int) -> dict:
    """``golden_csa_block`` inputs of CSA ``layer``: one prefill call of all S tokens from the
    layer's input streams, FP32 pools with identity page tables (token ``t`` at raw row ``t``,
    entry ``w`` at compressed / key row ``w``, state row ``t``), HF weights (``nn.Linear``
    ``[out, in]``: the qkv and indexer-query goldens take the transposes, the compressors and
    the o-projection the HF layout), FP32 compress-profile tables."""
    cfg = hf_run.cfg
    assert hf_run.layer_ratio(layer) == 4, f"layer {layer} is not a CSA layer"
    S, d, c, bs = hf_run.S, cfg.head_dim, cfg.index_head_dim, cfg.block_size
    a = f"model.layers.{layer}.self_attn"
    comp, idx = f"{a}.compressor", f"{a}.compressor.indexer"
    q = hf_run.qkv_args(layer)
    hc = hf_run.hc_args(layer, "attn")
    cos, sin = rope_tables(cfg, "compress", max_pos=S)
    pos = hf_run.positions
    blk = torch.arange(cfg.max_blocks_per_seq)
    closes = (pos + 1) % 4 == 0
    entry = torch.where(closes, pos // 4, torch.full_like(pos, -1)).to(torch.int64)
    state_table = (torch.arange(cfg.max_position_embeddings // 4) % STATE_PAGES).to(torch.int32)
    G, Lo = cfg.o_groups, cfg.o_lora_rank
    return {
        "x_hc": hc["x"], "hc_attn_fn": hc["hc_fn"], "hc_attn_scale": hc["hc_scale"], "hc_attn_base": hc["hc_base"],
        "attn_norm_w": hf_run.param(f"model.layers.{layer}.input_layernorm.weight"),
        "wq_a": q["wq_a"], "wq_b": q["wq_b"], "wq_b_scale": None, "wkv": q["wkv"],
        "gamma_cq": q["gamma_cq"], "gamma_ckv": q["gamma_ckv"], "freqs_cos": cos, "freqs_sin": sin,
        "kv_cache": torch.zeros(cfg.ori_kv_block_num, bs, 1, d),
        "block_table": torch.where(blk < cfg.ori_kv_block_num, blk, -1).to(torch.int32),
        "ori_slot_mapping": pos.to(torch.int64), "position_ids": pos.to(torch.int32),
        "attn_sink": hf_run.param(f"{a}.sinks"),
        "wo_a": hf_run.param(f"{a}.o_a_proj.weight").view(G, Lo, -1), "wo_b": hf_run.param(f"{a}.o_b_proj.weight"),
        "wo_b_scale": None,
        "cmp_wkv": hf_run.param(f"{comp}.kv_proj.weight"), "cmp_wgate": hf_run.param(f"{comp}.gate_proj.weight"),
        "cmp_ape": hf_run.param(f"{comp}.position_bias"), "cmp_norm_w": hf_run.param(f"{comp}.kv_norm.weight"),
        "compress_state": torch.zeros(STATE_PAGES, 4, 4 * d), "state_block_table": state_table,
        "cmp_kv": torch.zeros(cfg.cmp_kv_block_num, bs, 1, d),
        "cmp_block_table": torch.arange(cfg.cmp_kv_block_num, dtype=torch.int32),
        "cmp_slot_mapping": entry, "state_slot_mapping": pos.to(torch.int64),
        "idx_wkv": hf_run.param(f"{idx}.kv_proj.weight"), "idx_wgate": hf_run.param(f"{idx}.gate_proj.weight"),
        "idx_ape": hf_run.param(f"{idx}.position_bias"), "idx_norm_w": hf_run.param(f"{idx}.kv_norm.weight"),
        "idx_compress_state": torch.zeros(STATE_PAGES, 4, 4 * c), "idx_state_block_table": state_table,
        "idx_state_slot_mapping": pos.to(torch.int64), "hadamard": torch.eye(c),
        "idx_kv_cache": torch.zeros(64, bs, 1, c), "idx_kv_scale": torch.ones(64, bs, 1, 1),
        "idx_block_table": torch.arange(64, dtype=torch.int32), "idx_slot_mapping": entry,
        "idx_wq_b": hf_run.param(f"{idx}.q_b_proj.weight").T.contiguous(),
        "idx_wq_b_scale": torch.ones(cfg.index_n_heads * c),
        "idx_weights_proj": hf_run.param(f"{idx}.scorer.weights_proj.weight").T.contiguous(),
        "num_tokens": S,
    }


def _index_keys(d: dict, cfg, float32: bool = True):
    """The indexer compressor golden's key cache and scales for inputs ``d``."""
    x = d["x_normed"]
    cache, scale, _ = golden_prefill_indexer_compressor(
        x, d["idx_compress_state"], d["idx_state_block_table"], d["idx_wkv"], d["idx_wgate"], d["idx_ape"],
        d["idx_norm_w"], d["freqs_cos"], d["freqs_sin"], d["hadamard"], d["idx_kv_cache"], d["idx_kv_scale"],
        d["position_ids"], d["num_tokens"], d["idx_slot_mapping"], d["idx_state_slot_mapping"], cfg, float32=float32)
    return cache, scale


def _selections(d: dict, cfg, keys, scales, qr, wq_b, hadamard, weight_format, float32):
    return golden_prefill_indexer(d["x_normed"], qr, torch.ones(qr.shape[0], 1) if d.get("qr_scale") is None
                                  else d["qr_scale"], wq_b, d["idx_wq_b_scale_q"] if weight_format == "int8"
                                  else d["idx_wq_b_scale"], d["idx_weights_proj"], d["freqs_cos"], d["freqs_sin"],
                                  hadamard, keys, scales, d["idx_block_table"], d["position_ids"], d["num_tokens"],
                                  torch.empty(d["num_tokens"], cfg.index_topk, dtype=torch.int32), cfg,
                                  weight_format=weight_format, float32=float32, return_scores=True)


def _set_mismatches(sel: torch.Tensor, want: torch.Tensor, scores: torch.Tensor) -> tuple[int, int]:
    """(rows with a different selected set beyond boundary ties, rows differing only by a tie)."""
    bad = ties = 0
    for t in range(sel.shape[0]):
        a, b = set(sel[t][sel[t] >= 0].tolist()), set(want[t][want[t] >= 0].tolist())
        if a == b:
            continue
        ranked = torch.sort(scores[t], descending=True, stable=True).values
        k = len(b)
        near = k < ranked.numel() and abs(float(ranked[k - 1] - ranked[k])) <= TIE_REL * abs(float(ranked[k - 1]))
        if near and len(a) == len(b):
            ties += 1
        else:
            bad += 1
    return bad, ties


@pytest.mark.parametrize("layer", [2, 4], ids=["L2", "L4"])
def test_csa_goldens_match_transformers(hf_run, layer):
    cfg, S = hf_run.cfg, hf_run.S
    d = _csa_inputs(hf_run, layer)
    outs = golden_csa_block(d, cfg, "prefill", weight_format="bf16", float32=True, return_intermediates=True)
    mids = outs[-1]
    a = f"model.layers.{layer}.self_attn"

    # compressed rows: 115 entries, from the block and from the compressor golden alone
    cmp_hf = hf_run.call(f"{a}.compressor").output[0][0, 0]  # [T, d]
    T = cmp_hf.shape[0]
    assert T == S // 4 == 115
    x = hf_run.call(f"model.layers.{layer}.input_layernorm").output[0]
    cmp_kv, _ = golden_prefill_compressor_ratio4(
        x, d["compress_state"], d["state_block_table"], d["cmp_wkv"], d["cmp_wgate"], d["cmp_ape"], d["cmp_norm_w"],
        d["freqs_cos"], d["freqs_sin"], d["cmp_kv"], d["position_ids"], S, d["cmp_slot_mapping"],
        d["state_slot_mapping"], cfg, float32=True)
    rows = cmp_kv.view(-1, cfg.head_dim)
    hf_run.compare(f"csa L{layer} compressed rows", rows[:T], cmp_hf, atol=ATOL, rtol=RTOL)
    assert not bool(rows[T:].any())
    hf_run.compare(f"csa L{layer} compressed rows (block)", outs[1].view(-1, cfg.head_dim)[:T], cmp_hf,
                   atol=ATOL, rtol=RTOL)

    # selected sets
    sel_hf = hf_run.call(f"{a}.compressor.indexer").output[0]  # [S, k]
    d2 = dict(d, x_normed=mids["x_normed"])
    keys, scales = _index_keys(d2, cfg)
    sel, scores, _ = _selections(d2, cfg, keys, scales, mids["qr"], d["idx_wq_b"], d["hadamard"], "bf16", True)
    assert torch.equal(sel, mids["cmp_topk"])
    bad, ties = _set_mismatches(sel, sel_hf, scores)
    n_subset = int(((hf_run.positions + 1) // 4 > cfg.index_topk).sum())
    print(f"[parity] csa L{layer} selections: {S - bad - ties}/{S} equal sets, {ties} boundary ties, "
          f"{bad} different; {n_subset} queries select a strict subset")
    assert bad == 0 and n_subset > 300
    assert torch.equal((sel >= 0).sum(1), ((hf_run.positions + 1) // 4).clamp(max=cfg.index_topk))

    # the sub-layer
    attn_hf = hf_run.call(f"{a}").output[0][0]
    stream_hf = hf_run.call(f"model.layers.{layer}.ffn_hc").args[0][0]
    hf_run.compare(f"csa L{layer} attn_out (before hc_post)", mids["attn_out"], attn_hf, atol=ATOL, rtol=RTOL)
    hf_run.compare(f"csa L{layer} x_out (stream after hc_post)", outs[-2], stream_hf, atol=ATOL, rtol=RTOL)


def _sylvester_hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def test_csa_int8_indexer_selection_overlap(hf_run):
    layer, cfg, S = 2, hf_run.cfg, hf_run.S
    d = _csa_inputs(hf_run, layer)
    mids = golden_csa_block(d, cfg, "prefill", weight_format="bf16", float32=True, return_intermediates=True)[-1]
    H = _sylvester_hadamard(cfg.index_head_dim).to(torch.bfloat16)
    d8 = dict(d, x_normed=mids["x_normed"].to(torch.bfloat16), hadamard=H,
              idx_kv_cache=torch.zeros(64, cfg.block_size, 1, cfg.index_head_dim, dtype=torch.int8))
    keys, scales = _index_keys(d8, cfg, float32=False)
    qr, qr_scale = quantize_per_row_int8(mids["qr"])
    wq_b, wq_b_scale = quantize_weight_per_column(d["idx_wq_b"])
    d8.update(qr_scale=qr_scale, idx_wq_b_scale_q=wq_b_scale,
              idx_weights_proj=d["idx_weights_proj"].to(torch.bfloat16))
    sel, _, _ = _selections(d8, cfg, keys, scales, qr, wq_b, H, "int8", False)
    sel_hf = hf_run.call(f"model.layers.{layer}.self_attn.compressor.indexer").output[0]
    overlaps = []
    for t in range(S):
        want = set(sel_hf[t][sel_hf[t] >= 0].tolist())
        if want:
            overlaps.append(len(want & set(sel[t][sel[t] >= 0].tolist())) / len(want))
    mean = sum(overlaps) / len(overlaps)
    print(f"[parity] csa L{layer} INT8 indexer selection overlap with transformers: mean {mean:.3f}, "
          f"min {min(overlaps):.3f} over {len(overlaps)} queries")
    assert mean >= INT8_MIN_OVERLAP
