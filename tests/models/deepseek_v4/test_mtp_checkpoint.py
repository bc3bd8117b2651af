"""The MTP layer's tensors: names and shapes, the tiny writer's ``mtp=True``, the loader."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pto.cli import main
from pto.errors import CheckpointError
from pto.models.deepseek_v4.checkpoint import (FP8_WEIGHTS, MTP_FP8_WEIGHTS, expected_mtp_tensors,
                                               tiny_state, write_tiny_checkpoint)
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.weights import Checkpoint, QuantWeight, attention_inputs, moe_inputs


def test_flash_mtp_layer_has_the_published_shard_count():
    # the published DeepSeek-V4-Flash MTP shard (model-00046-of-00046) holds 1575 tensors, all mtp.0.*
    want = expected_mtp_tensors(get_config("flash"))
    assert all(k.startswith("mtp.0.") for k in want)
    scaled = [k for k in want if k[len("mtp.0."):] in FP8_WEIGHTS + MTP_FP8_WEIGHTS
              or (".ffn.experts." in k and k.endswith(".weight"))]
    assert len(want) == 797 and len(scaled) == 10 + 3 * 256
    assert len(want) + len(scaled) == 1575
    assert want["mtp.0.e_proj.weight"] == ((4096, 4096), "float")
    assert want["mtp.0.hc_head_fn"] == ((4, 16384), "float")
    assert "mtp.0.ffn.gate.bias" in want and "mtp.0.ffn.gate.tid2eid" not in want
    assert not any(".compressor." in k or ".indexer." in k or "embed" in k or "head.weight" in k for k in want)


def test_tiny_state_mtp_keeps_the_main_tensors():
    cfg = get_config("tiny")
    plain, with_mtp = tiny_state(cfg, 3), tiny_state(cfg, 3, mtp=True)
    assert set(with_mtp) - set(plain) == set(expected_mtp_tensors(cfg))
    assert all(torch.equal(plain[k], with_mtp[k]) for k in plain)


@pytest.mark.parametrize("layout", ["hf", "fp8"])
def test_write_and_load_mtp(tmp_path, layout):
    d = write_tiny_checkpoint(tmp_path / layout, 1, layout=layout, mtp=True)
    names = list(load_file(str(d / "model.safetensors")))
    prefix = "mtp.0." if layout == "fp8" else "model.mtp.0."
    mtp_names = [n for n in names if ".mtp." in "." + n]
    assert mtp_names and all(n.startswith(prefix) for n in mtp_names)
    if layout == "fp8":
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            assert f.get_slice("mtp.0.e_proj.weight").get_dtype() == "F8_E4M3"
            assert f.get_slice("mtp.0.e_proj.scale").get_dtype() == "F8_E8M0"
            assert f.get_slice("mtp.0.enorm.weight").get_dtype() == "BF16"
    assert json.loads((d / "config.json").read_text())["num_nextn_predict_layers"] == 1
    ck = Checkpoint(d, "int8")
    L = ck.config.num_hidden_layers
    assert ck.has_mtp and ck.layer_prefix(L) == "mtp.0." and ck.layer_ratio(L) == 0
    w = ck.layer(L)
    assert isinstance(w["e_proj.weight"], QuantWeight) and w["enorm.weight"].shape == (128,)
    assert "embed.weight" not in ck.globals() or ck.globals().keys() == {
        "embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"}
    assert attention_inputs(ck, L)["wq_a"].shape == (128, 64)
    assert moe_inputs(ck, L)["gate_bias"].abs().sum() > 0  # learned routing (bias), not hash
    exact = Checkpoint(d, "bf16")
    ref = tiny_state(ck.config, 1, mtp=True)["mtp.0.h_proj.weight"]
    got = exact.tensor("mtp.0.h_proj.weight")
    if layout == "hf":
        assert torch.equal(got, ref)
    else:  # FP8 blocks: within the e4m3 rounding (3 mantissa bits)
        assert torch.allclose(got, ref, rtol=2 ** -3, atol=1e-6)


def test_missing_mtp_tensor_is_named(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "c", 0, mtp=True)
    f = d / "model.safetensors"
    t = load_file(str(f))
    del t["model.mtp.0.hnorm.weight"]
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match="missing tensor 'mtp.0.hnorm.weight'"):
        Checkpoint(d)


def test_no_mtp_tensors_or_config_zero(tmp_path):
    plain = Checkpoint(write_tiny_checkpoint(tmp_path / "p", 0))
    assert not plain.has_mtp
    with pytest.raises(CheckpointError, match="no MTP layers"):
        plain.layer(plain.config.num_hidden_layers)
    d = write_tiny_checkpoint(tmp_path / "z", 0, mtp=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    assert not Checkpoint(d).has_mtp  # mtp.* ignored, as transformers does


def test_cli_checkpoint_mtp(tmp_path, capsys):
    assert main(["checkpoint", "tiny", str(tmp_path / "c"), "--mtp", "--layout", "fp8"]) == 0
    assert "with the MTP layer" in capsys.readouterr().out
    assert Checkpoint(tmp_path / "c").has_mtp
