"""The attention's KV RMSNorm weight is ``layers.{i}.attn.kv_norm.weight`` in the published
DeepSeek-V4-Flash checkpoint (its MTP shard lists ``mtp.0.attn.kv_norm.weight``); pto expected,
wrote and loaded ``attn.norm.weight``, so a real FP8 checkpoint would have been refused as
missing a tensor. transformers maps either name onto ``self_attn.kv_norm``."""

from pto.models.deepseek_v4.checkpoint import expected_mtp_tensors, expected_tensors
from pto.models.deepseek_v4.config import get_config


def test_kv_norm_is_named_as_published():
    cfg = get_config("tiny")
    names = set(expected_tensors(cfg))
    for i in range(cfg.num_hidden_layers):
        assert f"layers.{i}.attn.kv_norm.weight" in names
        assert f"layers.{i}.attn.norm.weight" not in names
    assert expected_tensors(cfg)["layers.0.attn.kv_norm.weight"][0] == (cfg.head_dim,)
    mtp = set(expected_mtp_tensors(cfg))
    assert "mtp.0.attn.kv_norm.weight" in mtp and "mtp.0.attn.norm.weight" not in mtp
