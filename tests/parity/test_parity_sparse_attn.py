"""Parity of ``golden_prefill_sparse_attn`` with compressed keys against transformers' CSA / HCA
attention (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

For the compressed layers the attention golden (``weight_format="bf16"``, ``float32=True``)
gets:

* ``q`` and the raw ``kv`` from ``golden_qkv_proj_rope`` (compress profile; parity checked in
  test_parity_qkv_proj_rope), the raw kv scattered into an identity-paged FP32 cache and the
  64-key window indices of ``build_window_indices``;
* the compressed entries HF computed (the compressor module's output), stored in an FP32
  compressed pool through an identity page table;
* ``cmp_indices``: HCA -- every visible entry ``w < (t + 1) // 128`` (all of them, no
  top-k); CSA -- the indexer's top-16 selection as HF returned it (``-1`` = invalid);
* HF's sinks and o-projection weights (``o_a_proj.weight.view(G, o_lora, -1)``,
  ``o_b_proj.weight``).

It must reproduce the ``self_attn`` output: one softmax with the sink over the window keys
and the selected compressed entries together (a token can be seen raw and inside a summary),
inverse RoPE at the query position, grouped o-projection.

Tolerance: FP32 on both sides, dense masked softmax (HF) vs online softmax over gathered keys
(golden). Measured max abs <= 7.8e-7 (values up to ~2). Bounds: atol = rtol = 1e-4.
"""

import pytest
import torch

from pto.models.deepseek_v4.prefill_attention_swa import build_window_indices
from pto.models.deepseek_v4.prefill_sparse_attn import golden_prefill_sparse_attn
from pto.models.deepseek_v4.qkv_proj_rope import golden_qkv_proj_rope

ATOL = 1e-4
RTOL = 1e-4
LAYERS = [2, 3, 4, 5]  # CSA, HCA, CSA, HCA


@pytest.mark.parametrize("layer", LAYERS, ids=[f"L{i}" for i in LAYERS])
def test_compressed_attention_matches_transformers(hf_run, layer):
    cfg, S = hf_run.cfg, hf_run.S
    hd, bs, topk = cfg.head_dim, cfg.block_size, cfg.index_topk
    ratio = hf_run.layer_ratio(layer)
    attn = f"model.layers.{layer}.self_attn"
    qkv = hf_run.qkv_args(layer)
    q, kv, _, _ = golden_qkv_proj_rope(**qkv, cfg=cfg, weight_format="bf16", out_bf16=False)

    pages = cfg.ori_kv_block_num
    ori_kv = torch.zeros(pages, bs, 1, hd)
    ori_kv.view(-1, hd)[:S] = kv  # token t at flat row t (identity table)
    blk = torch.arange(cfg.max_blocks_per_seq)
    table = torch.where(blk < pages, blk, torch.full_like(blk, -1)).to(torch.int32)
    swa = build_window_indices(hf_run.positions.to(torch.int32), S, table, cfg)

    cmp_hf = hf_run.call(f"{attn}.compressor").output[0][0, 0]  # [T, d]
    T = cmp_hf.shape[0]
    cpages = cfg.cmp_kv_block_num
    assert T <= cpages * bs
    cmp_kv = torch.zeros(cpages, bs, 1, hd)
    cmp_kv.view(-1, hd)[:T] = cmp_hf
    cmp_table = torch.arange(cpages, dtype=torch.int32)
    if ratio == 128:
        visible = (hf_run.positions + 1) // ratio  # entries w < visible are attended
        col = torch.arange(topk)
        cmp_idx = torch.where(col[None, :] < visible[:, None], col[None, :],
                              torch.full((S, topk), -1)).to(torch.int32)
    else:
        cmp_idx = hf_run.call(f"{attn}.compressor.indexer").output[0].to(torch.int32)  # [S, k]
    assert int((cmp_idx >= 0).sum()) > 0

    G, Lo = cfg.o_groups, cfg.o_lora_rank
    out = golden_prefill_sparse_attn(
        q, ori_kv, swa, cmp_kv, cmp_table, cmp_idx, hf_run.param(f"{attn}.sinks"), S,
        qkv["rope_cos"], qkv["rope_sin"], hf_run.param(f"{attn}.o_a_proj.weight").view(G, Lo, -1),
        hf_run.param(f"{attn}.o_b_proj.weight"), None, cfg, weight_format="bf16", float32=True)
    kind = "HCA" if ratio == 128 else "CSA"
    hf_run.compare(f"sparse attn L{layer} ({kind}, {T} entries) attn_out", out,
                   hf_run.call(attn).output[0][0], atol=ATOL, rtol=RTOL)

    # the compressed keys matter: without them the output leaves the tolerance
    none = torch.full_like(cmp_idx, -1)
    out0 = golden_prefill_sparse_attn(
        q, ori_kv, swa, cmp_kv, cmp_table, none, hf_run.param(f"{attn}.sinks"), S,
        qkv["rope_cos"], qkv["rope_sin"], hf_run.param(f"{attn}.o_a_proj.weight").view(G, Lo, -1),
        hf_run.param(f"{attn}.o_b_proj.weight"), None, cfg, weight_format="bf16", float32=True)
    assert (out0 - hf_run.call(attn).output[0][0]).abs().max() > 100 * ATOL
