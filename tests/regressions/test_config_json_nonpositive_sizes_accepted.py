"""Regression: a config.json with a size that is zero or negative (``num_attention_heads: -8``,
``hidden_size: 0``, ``num_hidden_layers: 0``, ``max_position_embeddings: 0``) or more experts
per token than experts was accepted; the user then saw a tensor shape error ("expected
[-1024, 64]"), an "unexpected tensor" or a deployment field ("cmp_kv_block_num must be a
positive integer, got 0") instead of the field they got wrong.
"""

import math

import pytest

from pto.errors import ConfigError
from pto.models.deepseek_v4.config import PRESETS, DeepSeekV4Config, get_config


@pytest.mark.parametrize("key,value,msg", [
    ("num_attention_heads", -8, "num_attention_heads=-8 must be positive"),
    ("hidden_size", 0, "hidden_size=0 must be positive"),
    ("num_hidden_layers", 0, "num_hidden_layers=0 must be positive"),
    ("max_position_embeddings", 0, "max_position_embeddings=0 must be positive"),
    ("vocab_size", -1, "vocab_size=-1 must be positive"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps=-1e-06 must be a positive finite number"),
])
def test_from_hf_names_the_bad_field(key, value, msg):
    hf = get_config("tiny").to_hf()
    hf[key] = value
    with pytest.raises(ConfigError, match="^config 'hf': " + msg.replace("(", r"\(").replace("+", r"\+")):
        DeepSeekV4Config.from_hf(hf)


def test_more_experts_per_token_than_experts():
    hf = get_config("tiny").to_hf()
    hf["num_experts_per_tok"] = 1000
    with pytest.raises(ConfigError, match=r"^config.json: num_experts_per_tok=1000 exceeds n_routed_experts=16"):
        DeepSeekV4Config.from_hf(hf)


def test_a_nonfinite_rope_theta_is_an_error():
    with pytest.raises(ConfigError, match=r"rope_theta=nan must be a positive finite number"):
        get_config("tiny").replace(rope_theta=math.nan)


def test_every_preset_still_validates():
    for name in PRESETS:
        assert get_config(name).validate().name == name
