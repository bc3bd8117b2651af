"""DeepSeekV4Config.from_hf / to_hf and DeploymentConfig (issue 15: configs)."""

import dataclasses
import json

import pytest

from pto.errors import ConfigError
from pto.models.deepseek_v4.config import (DeepSeekV4Config, DeploymentConfig, KernelConfig, get_config,
                                           get_deployment, kernel_config)


def _model_fields(cfg):
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DeepSeekV4Config) if f.name != "name"}


@pytest.mark.parametrize("preset", ["tiny", "flash", "pro", "demo"])
def test_to_hf_from_hf_round_trip(preset):
    cfg = get_config(preset)
    back = DeepSeekV4Config.from_hf(json.loads(json.dumps(cfg.to_hf())), name=preset)
    assert _model_fields(back) == _model_fields(cfg)


def test_from_hf_reads_the_official_flash_fields():
    # the published DeepSeek-V4-Flash config.json spellings (legacy compress_ratios with the MTP entry, rope_scaling)
    flash = get_config("flash")
    hf = {"vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
          "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
          "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
          "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4,
          "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "n_routed_experts": 256,
          "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
          "sliding_window": 128, "rope_theta": 10000, "compress_rope_theta": 160000,
          "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                           "beta_fast": 32, "beta_slow": 1},
          "max_position_embeddings": 1048576, "tie_word_embeddings": False,
          "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
          "num_hash_layers": 3, "num_nextn_predict_layers": 1,
          "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
          "quantization_config": {"quant_method": "fp8"}, "expert_dtype": "fp4"}
    cfg = DeepSeekV4Config.from_hf(hf, name="flash")
    assert cfg.compress_ratios == flash.compress_ratios  # the 44th (MTP) entry is dropped
    assert cfg.max_position_embeddings == 1048576  # HF's meaning: the context length
    assert _model_fields(cfg) == _model_fields(flash.replace(max_position_embeddings=1048576))


def test_from_hf_reads_a_transformers_saved_config(tmp_path):
    cfg = get_config("tiny")
    hf = cfg.to_hf()
    del hf["qk_rope_head_dim"]  # transformers writes only partial_rotary_factor
    (tmp_path / "config.json").write_text(json.dumps(hf))
    back = DeepSeekV4Config.from_hf(tmp_path)
    assert back.qk_rope_head_dim == 64 and back.layer_types == cfg.layer_types
    assert back.num_hash_layers == 3 and back.eos_token_id == 1


@pytest.mark.parametrize("change, needle", [
    ({"hidden_size": None}, "hidden_size"),
    ({"hidden_size": "128"}, "hidden_size must be an integer"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"layer_types": ["sliding_attention"] * 5 + ["full_attention"]}, "full_attention"),
    ({"layer_types": None}, "layer_types nor compress_ratios"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"eos_token_id": "155"}, r"eos_token_id must be a non-negative integer token id, a list of them or null, got '155'"),
    ({"eos_token_id": [1, "x"]}, "eos_token_id must be"),
    ({"eos_token_id": True}, "eos_token_id must be"),
    ({"eos_token_id": -1}, "eos_token_id must be"),
    ({"bos_token_id": 0.5}, "bos_token_id must be a non-negative integer token id or null, got 0.5"),
])
def test_from_hf_rejects_bad_fields(change, needle):
    hf = get_config("tiny").to_hf()
    hf.update(change)
    with pytest.raises(ConfigError, match=needle):
        DeepSeekV4Config.from_hf(hf)


@pytest.mark.parametrize("eos, want", [(7, 7), ([7], 7), ([9, 7], (9, 7)), ([], None), (None, None)])
def test_from_hf_eos_token_id_forms(eos, want):
    """HF allows one stop id or a list of them: a list of several is kept whole (a tuple) and
    written back as a list."""
    hf = get_config("tiny").to_hf()
    hf["eos_token_id"] = eos
    cfg = DeepSeekV4Config.from_hf(hf)
    assert cfg.eos_token_id == want
    back = cfg.to_hf()["eos_token_id"]
    assert back == (list(want) if isinstance(want, tuple) else want)


def test_from_hf_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        DeepSeekV4Config.from_hf(tmp_path)


def test_deployment_config():
    tiny = get_config("tiny")
    dep = get_deployment("tiny")
    assert dep.max_blocks_per_seq == 64 and dep.decode_tokens == 8
    assert (dep.ori_kv_block_num, dep.cmp_kv_block_num, dep.csa_state_block_num, dep.hca_state_block_num) == \
        (4 * 13, 4 * 16, 4 * 34, 4 * 32)  # sized for 4 requests of 1024 tokens
    assert DeploymentConfig.of_model(tiny).block_size == tiny.block_size == 16
    with pytest.raises(ConfigError, match="max_context=2048 exceeds"):
        DeploymentConfig(max_context=2048, rope_max_pos=4096).validate(tiny.replace(max_position_embeddings=1024))
    with pytest.raises(ConfigError, match="rope_max_pos"):
        dep.replace(rope_max_pos=10)
    with pytest.raises(ConfigError, match="block_size"):
        dep.replace(block_size=0)


def test_deployment_fields_live_outside_the_model_config():
    tiny = get_config("tiny")
    hf = DeepSeekV4Config.from_hf(tiny.to_hf(), name="tiny")
    assert type(hf) is DeepSeekV4Config and not hasattr(hf, "block_size")
    assert isinstance(tiny, KernelConfig) and tiny.block_size == 16 and tiny.max_blocks_per_seq == 1024
    assert tiny.model == hf
    k = kernel_config(hf, get_deployment("tiny"))
    assert isinstance(k, KernelConfig) and k.model == hf.replace(max_position_embeddings=1024)
    assert (k.block_size, k.ori_kv_block_num, k.max_position_embeddings) == (16, 52, 1024)
    with pytest.raises(ConfigError, match="not a multiple of block_size"):
        tiny.replace(max_position_embeddings=1000)
