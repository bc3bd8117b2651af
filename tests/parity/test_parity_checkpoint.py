"""The tiny random checkpoint behind the parity tests has the properties they rely on.

* Saved as safetensors and reloaded bit for bit (asserted while building); the file uses the
  upstream leaf names with a ``model.`` prefix, except ``head.weight``,
  ``model.embed_tokens.weight`` and ``model.hc_head.*`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).
* Parameters that HF initialises to zero (sinks, compressor / indexer position biases, HC
  bases, router bias, hash table) are non-zero; hash rows hold K distinct valid expert ids;
  norm weights are around 1.
* S = 461 tokens: every HCA layer emits 3 entries (windows closed at 127, 255, 383) and
  drops the 77-token tail; every CSA layer has 115 entries and its indexer keeps
  ``min(16, (t + 1) // 4)`` valid ones per query -- a strict subset for late queries.
"""

import torch


def test_checkpoint_names_are_upstream(hf_run):
    keys = set(hf_run.checkpoint_keys)
    for name in ("head.weight", "model.embed_tokens.weight", "model.hc_head.hc_fn",
                 "model.layers.0.attn.wq_a.weight", "model.layers.0.attn.attn_sink",
                 "model.layers.0.hc_attn_fn", "model.layers.0.ffn.experts.3.w1.weight",
                 "model.layers.3.ffn.gate.bias",
                 "model.layers.2.attn.indexer.compressor.wkv.weight"):
        assert name in keys, f"{name} not in the saved checkpoint"
    assert not any(k.startswith("lm_head") or ".self_attn." in k for k in keys)


def test_checkpoint_parameters_are_nontrivial(hf_run):
    cfg = hf_run.cfg
    state = hf_run.model.state_dict()
    zero_by_default = [k for k in state if k.endswith(("sinks", "position_bias", ".base",
                                                       "hc_base", "e_score_correction_bias"))]
    assert len(zero_by_default) >= 6 * 3 + 2
    for k in zero_by_default:
        assert state[k].abs().min() > 0, f"{k} has zeros"
    for k in (k for k in state if k.endswith("tid2eid")):
        t = state[k]
        assert t.shape == (cfg.vocab_size, cfg.num_experts_per_tok)
        assert int(t.min()) >= 0 and int(t.max()) < cfg.n_routed_experts
        assert all(len(set(row)) == cfg.num_experts_per_tok for row in t.tolist())
        assert len(set(t.flatten().tolist())) == cfg.n_routed_experts
    for k in (k for k in state if k.endswith("norm.weight")):
        assert (state[k] - 1).abs().max() < 0.6, k


def test_windows_close_and_indexer_selects_a_subset(hf_run):
    cfg, S = hf_run.cfg, hf_run.S
    for layer, ratio in enumerate(cfg.compress_ratios):
        if ratio == 128:
            cmp_kv, _ = hf_run.call(f"model.layers.{layer}.self_attn.compressor").output
            assert cmp_kv.shape[2] == S // 128 == 3
        elif ratio == 4:
            cmp_kv, _ = hf_run.call(f"model.layers.{layer}.self_attn.compressor").output
            topk = hf_run.call(f"model.layers.{layer}.self_attn.compressor.indexer").output[0]
            T = cmp_kv.shape[2]
            assert T == S // 4 == 115 and topk.shape == (S, cfg.index_topk)
            valid = (topk >= 0).sum(dim=1)
            want = torch.clamp((hf_run.positions + 1) // 4, max=cfg.index_topk)
            assert torch.equal(valid, want)
            assert int(valid.max()) < T  # strict subset of the entries
            assert bool((topk[topk >= 0] < T).all())
