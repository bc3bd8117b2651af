"""Model-API defects a break test found:

* ``generate()`` took the requests' cache states before its ``try``: a CapacityError part way
  kept the states already taken, and every later call on the model failed;
* a NaN row of logits became token 0 (exit 0), e.g. from ``routed_scaling_factor: 1e39``, which
  the config accepted; so did ``norm_topk_prob: false`` (ignored), ``attention_bias: true``,
  ``swiglu_limit: 0``, token ids outside the vocabulary and ``num_nextn_predict_layers: -1``;
* a ``tid2eid`` entry outside the experts loaded and failed inside a kernel; a tensor stored in
  two files (no index) was taken from whichever came last;
* MTP counted a draft cut by an eos as accepted (``decode_steps_saved`` one too many);
* ``chunk > 128`` reached the kernels; a string or numpy prompt got "empty prompt";
* ``--input-ids-file`` named the request index, not the line, for an id outside the vocabulary.
"""

import dataclasses
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pto.cli import main
from pto.errors import BindError, CapacityError, CheckpointError, ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.weights import open_checkpoint

PROMPT = [5, 17, 300, 42, 7, 99]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("api") / "tiny", seed=0, mtp=True)


def test_a_capacity_error_part_way_returns_the_states_taken(ckpt):
    ck = open_checkpoint(ckpt, "int8")
    m = KernelModel(ck, DeploymentConfig.sized(ck.config, 4, 256, block_size=16))
    want = generate(m, [PROMPT], max_new_tokens=3).tokens
    mine = m.new_state()  # the caller's own request: 3 of 4 left
    for mtp in (False, True):
        with pytest.raises(CapacityError):
            generate(m, [PROMPT] * 4, max_new_tokens=3, mtp=mtp)
        assert list(m.cache.requests) == [mine.rid]
    m.release_state(mine)
    assert generate(m, [PROMPT] * 4, max_new_tokens=3).tokens == want * 4


@pytest.mark.parametrize("field, value, message", [
    ("routed_scaling_factor", 1e39, "routed_scaling_factor=1e\\+39 must be a positive number within FP32's range"),
    ("routed_scaling_factor", -1.0, "routed_scaling_factor=-1.0 must be a positive number"),
    ("swiglu_limit", 0, "swiglu_limit=0.0 must be a positive number"),
    ("eos_token_id", 600, "eos_token_id 600 is outside the vocabulary \\[0, 512\\)"),
    ("eos_token_id", [999999, 486], "eos_token_id 999999 is outside the vocabulary"),
    ("bos_token_id", 9999, "bos_token_id 9999 is outside the vocabulary"),
    ("num_nextn_predict_layers", -1, "num_nextn_predict_layers=-1 must not be negative"),
    ("norm_topk_prob", False, "norm_topk_prob=false is not supported"),
    ("attention_bias", True, "attention_bias=true is not supported"),
])
def test_config_values_the_model_cannot_honour_are_refused(ckpt, field, value, message):
    hf = DeepSeekV4Config.from_hf(ckpt).to_hf()
    DeepSeekV4Config.from_hf(hf)  # as written: fine
    with pytest.raises(ConfigError, match=message):
        DeepSeekV4Config.from_hf({**hf, field: value})


def test_non_finite_logits_are_an_error_not_token_zero(ckpt, monkeypatch):
    m = GoldenModel(open_checkpoint(ckpt), DeploymentConfig(max_context=64, rope_max_pos=64))
    plain = m.forward

    def nan_after_prefill(ids, state=None):
        out = plain(ids, state)
        return out if len(ids) > 1 else torch.full_like(out, float("nan"))

    monkeypatch.setattr(m, "forward", nan_after_prefill)
    with pytest.raises(CheckpointError, match="request 0, decode step 1: 512 of 512 logits are NaN or infinite"):
        generate(m, [PROMPT], max_new_tokens=3)


def test_hash_routing_table_outside_the_experts_is_a_checkpoint_error(ckpt, tmp_path):
    d = tmp_path / "tid"
    shutil.copytree(ckpt, d)
    sd = load_file(str(d / "model.safetensors"))
    name = "model.layers.0.ffn.gate.tid2eid"
    sd[name][7, 1] = 99
    save_file(sd, str(d / "model.safetensors"))
    ck = open_checkpoint(d)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' holds expert id 99 \(1 entries\) outside "
                                              rf"\[0, n_routed_experts=16\)"):
        ck.tensor("layers.0.ffn.gate.tid2eid")
    assert main(["generate", str(d), "--input-ids", "5 6", "--max-new-tokens", "2"]) == 2


def test_a_tensor_in_two_files_without_an_index_is_an_error(ckpt, tmp_path):
    d = tmp_path / "dup"
    shutil.copytree(ckpt, d)
    shutil.copy(d / "model.safetensors", d / "a.safetensors")
    with pytest.raises(CheckpointError, match=r"is stored in both a.safetensors and model.safetensors"):
        open_checkpoint(d)


def test_mtp_does_not_count_a_draft_an_eos_cut(ckpt):
    m = GoldenModel(open_checkpoint(ckpt), DeploymentConfig(max_context=64, rope_max_pos=64))
    ref = generate(m, [PROMPT], max_new_tokens=6, eos_token_id=None).tokens
    eos = ref[0][3]
    assert eos not in ref[0][:3]
    plain = generate(m, [PROMPT], max_new_tokens=6, eos_token_id=eos)
    assert plain.tokens == [ref[0][:4]] and plain.decode_steps == 3
    res = generate(m, [PROMPT], max_new_tokens=6, eos_token_id=eos, mtp=True, drafts="accept", reference=ref)
    assert res.tokens == plain.tokens and res.decode_steps == 2
    assert res.mtp_accepted == 1 and res.decode_steps_saved == plain.decode_steps - res.decode_steps


def test_a_chunk_above_the_kernels_capacity_is_refused_before_any_forward(ckpt):
    ck = open_checkpoint(ckpt, "int8")
    m = KernelModel(ck, DeploymentConfig.sized(ck.config, 4, 512, block_size=16))
    with pytest.raises(CapacityError, match="chunk 200 is more than the 128 tokens the kernels take"):
        generate(m, [list(range(2, 200))], chunk=200, max_new_tokens=2)
    assert m.stats.programs == {} and not m.cache.requests


def test_prompts_of_the_wrong_kind_are_named(ckpt):
    m = GoldenModel(open_checkpoint(ckpt), DeploymentConfig(max_context=64, rope_max_pos=64))
    with pytest.raises(BindError, match="request 0 is str '5 17', not a list of token ids"):
        generate(m, ["5 17"], max_new_tokens=1)
    with pytest.raises(BindError, match="request 1 is int 7, not a list of token ids"):
        generate(m, [[5, 17], 7], max_new_tokens=1)
    want = generate(m, [[5, 17]], max_new_tokens=2).tokens
    assert generate(m, [np.array([5, 17])], max_new_tokens=2).tokens == want
    assert generate(m, [[np.int64(5), 17]], max_new_tokens=2).tokens == want


def test_an_id_outside_the_vocabulary_in_a_file_names_its_line(ckpt, tmp_path, capsys):
    f = tmp_path / "ids.txt"
    f.write_text("5 17 300\n\n\n42 7 999\n")
    assert main(["generate", str(ckpt), "--input-ids-file", str(f), "--backend", "golden"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {f} line 4: token id 999 is outside the vocabulary [0, 512)")


def test_numpy_batches_and_stop_ids_are_accepted(ckpt):
    m = GoldenModel(open_checkpoint(ckpt), DeploymentConfig(max_context=64, rope_max_pos=64))
    want = generate(m, [[5, 17, 300]], max_new_tokens=3, eos_token_id=None)
    assert generate(m, np.array([[5, 17, 300]]), max_new_tokens=3, eos_token_id=None).tokens == want.tokens
    eos = want.tokens[0][1]
    got = generate(m, [[5, 17, 300]], max_new_tokens=3, eos_token_id=np.int64(eos))
    assert got.tokens == [want.tokens[0][:2]] and got.stop_reasons == ["eos"]
    with pytest.raises(BindError, match="got a flat list of ints"):
        generate(m, [np.int64(5), 17], max_new_tokens=1)
