"""The tiny checkpoint writer and the checkpoint loader (issue 15: weights.py).

Loader checks: every tensor against the config (missing / extra / misshapen / wrong dtype
kind are CheckpointErrors naming the tensor); one file, many files with an index, many
without; the published FP8/FP4 layout dequantised at load (codecs checked on hand-computed
bytes); int8 W8A8 per-row quantisation.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pto.errors import CheckpointError
from pto.models.deepseek_v4.checkpoint import (dequantize_fp4, dequantize_fp8_block,
                                               expected_tensors, quantize_fp4,
                                               quantize_fp8_block, tiny_state,
                                               write_tiny_checkpoint)
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.weights import open_checkpoint, quantize_rows_int8


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", seed=7)


def test_writer_is_seeded_and_unit_scale():
    a, b, c = tiny_state(seed=1), tiny_state(seed=1), tiny_state(seed=2)
    assert a.keys() == b.keys() == set(expected_tensors(get_config("tiny")))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])
    for k, t in a.items():  # sinks, ape, HC biases, router bias, hash table are non-zero
        if k.endswith(("attn_sink", "ape", "_base", "gate.bias")):
            assert t.abs().min() > 0, k
        if k.endswith("norm.weight"):
            assert (t - 1).abs().max() < 0.6, k
    t2e = a["layers.0.ffn.gate.tid2eid"]
    assert t2e.dtype == torch.int64 and t2e.shape == (512, 4)
    assert all(len(set(row)) == 4 for row in t2e.tolist())
    w = a["layers.0.attn.wq_b.weight"]  # N(0,1)/sqrt(fan_in): unit-variance outputs
    assert abs(float(w.std()) * 64 ** 0.5 - 1) < 0.05


def test_load_hf_layout_matches_the_state(tiny_dir):
    ck = open_checkpoint(tiny_dir)
    state = tiny_state(seed=7)
    assert ck.layout == "hf" and ck.names == sorted(state)
    assert ck.config.compress_ratios == (0, 0, 4, 128, 4, 128)
    layer = ck.layer(2)
    assert torch.equal(layer["attn.indexer.compressor.ape"], state["layers.2.attn.indexer.compressor.ape"])
    assert set(ck.globals()) == {"embed.weight", "head.weight", "norm.weight", "hc_head_fn",
                                 "hc_head_base", "hc_head_scale"}
    with pytest.raises(CheckpointError, match="no layer 6"):
        ck.layer(6)


def test_sharded_with_and_without_index(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "sh", seed=7, shards=3)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    ref = tiny_state(seed=7)
    ck = open_checkpoint(d)
    assert torch.equal(ck.tensor("layers.5.ffn.experts.15.w2.weight"), ref["layers.5.ffn.experts.15.w2.weight"])
    (d / "model.safetensors.index.json").unlink()
    assert open_checkpoint(d).names == sorted(ref)


def _rewrite(src, dst, edit):
    """Copy checkpoint ``src`` to ``dst`` with ``edit(tensors)`` applied to its one file."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    t = load_file(str(src / "model.safetensors"))
    edit(t)
    save_file(t, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.pop("model.layers.3.attn.compressor.ape"),
     "missing tensor 'layers.3.attn.compressor.ape'"),
    (lambda t: t.update({"model.layers.0.attn.bogus.weight": torch.zeros(2)}),
     "unexpected tensor 'model.layers.0.attn.bogus.weight'"),
    (lambda t: t.update({"model.layers.1.attn.wkv.weight": torch.zeros(128, 64)}),
     r"'model.layers.1.attn.wkv.weight' has shape \[128, 64\]; expected \[128, 128\]"),
    (lambda t: t.update({"model.layers.0.ffn.gate.tid2eid": torch.zeros(512, 4)}),
     "tid2eid' has dtype F32; expected an integer table"),
    (lambda t: t.update({"head.weight": torch.zeros(512, 128, dtype=torch.int32)}),
     "'head.weight' has dtype I32 without a scale"),
])
def test_malformed_checkpoints(tiny_dir, tmp_path, edit, needle):
    d = _rewrite(tiny_dir, tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=needle):
        open_checkpoint(d)


def test_mtp_tensors_are_checked_when_present(tiny_dir, tmp_path):
    # issue 19: with num_nextn_predict_layers > 0 the loader reads mtp.*, so a partial set is an
    # error naming a missing tensor (tests/models/deepseek_v4/test_mtp_checkpoint.py: the full set)
    d = _rewrite(tiny_dir, tmp_path / "mtp", lambda t: t.update({"mtp.0.e_proj.weight": torch.zeros(4, 4)}))
    with pytest.raises(CheckpointError, match="missing tensor 'mtp.0."):
        open_checkpoint(d)


def test_missing_pieces(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        open_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(get_config("tiny").to_hf()))
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        open_checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "x.safetensors"}}')
    with pytest.raises(CheckpointError, match="x.safetensors, which does not exist"):
        open_checkpoint(tmp_path)


def test_writer_refuses_an_existing_checkpoint(tiny_dir):
    with pytest.raises(CheckpointError, match="already holds a config.json"):
        write_tiny_checkpoint(tiny_dir)
    with pytest.raises(CheckpointError, match="seed"):
        tiny_state(seed=-1)


# ---- the published FP8 / FP4 layout ----------------------------------------------------------

def test_fp4_codec_hand_computed():
    # one row of 32 values: amax 3 -> scale 2^ceil(log2(3/6)) = 2^-1 -> codes of w / 0.5
    w = torch.zeros(1, 32)
    w[0, :6] = torch.tensor([0.25, -0.5, 0.75, 3.0, -1.0, 0.1])
    packed, scale = quantize_fp4(w)
    assert float(scale.float()[0, 0]) == 0.5
    # 0.25/0.5 = 0.5 -> code 1; -1 -> 0x8|2 = 0xA; 1.5 -> 3; 6 -> 7; -2 -> 0xC; 0.2 -> 0
    assert packed.view(torch.uint8)[0, :3].tolist() == [0x1 | 0xA << 4, 0x3 | 0x7 << 4, 0xC | 0x0 << 4]
    back = dequantize_fp4(packed, scale)
    assert back[0, :6].tolist() == [0.25, -0.5, 0.75, 3.0, -1.0, 0.0]


def test_fp8_codec_hand_computed():
    w = torch.zeros(130, 4)
    w[0, 0], w[1, 1], w[129, 2] = 448.0 * 4, 1.0, -3.0  # block rows 0..127 and 128..129
    codes, scale = quantize_fp8_block(w)
    assert scale.shape == (2, 1) and scale.float().flatten().tolist() == [4.0, 0.0078125]
    back = dequantize_fp8_block(codes, scale)
    assert float(back[0, 0]) == 1792.0 and float(back[1, 1]) == 1.0 and float(back[129, 2]) == -3.0


def test_fp8_layout_loads_converted(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "fp8", seed=7, layout="fp8")
    ck = open_checkpoint(d)
    assert ck.layout == "fp8"
    ref = tiny_state(seed=7)
    stored = load_file(str(d / "model.safetensors"))
    assert stored["layers.0.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    assert stored["layers.0.attn.wq_a.scale"].dtype == torch.float8_e8m0fnu
    assert stored["layers.0.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert stored["layers.0.ffn.experts.0.w1.scale"].shape == (64, 4)
    assert stored["embed.weight"].dtype == torch.bfloat16
    for name in ("layers.0.attn.wq_a.weight", "layers.4.ffn.shared_experts.w2.weight"):
        got, want = ck.tensor(name), ref[name]
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of the block's power-of-two scale
        assert float((got - want).abs().max()) <= 2 ** -4 * float(want.abs().max()) * 2
        c, s = quantize_fp8_block(want)
        assert torch.equal(got, dequantize_fp8_block(c, s))
    e = ck.tensor("layers.1.ffn.experts.3.w2.weight")
    c, s = quantize_fp4(ref["layers.1.ffn.experts.3.w2.weight"])
    assert torch.equal(e, dequantize_fp4(c, s))
    assert torch.equal(ck.tensor("layers.2.attn.attn_sink"), ref["layers.2.attn.attn_sink"])


# ---- int8 ------------------------------------------------------------------------------------

def test_int8_weights_are_quantised_per_row(tiny_dir):
    ck = open_checkpoint(tiny_dir, "int8")
    q = ck.weight("layers.0.attn.wo_b.weight")
    w = ck.tensor("layers.0.attn.wo_b.weight")
    assert q.codes.dtype == torch.int8 and q.scale.shape == (128,)
    assert torch.equal(q.scale, w.abs().amax(dim=1) / 127)
    assert int(q.codes.abs().amax(dim=1).min()) == 127  # every row's amax maps to +-127
    assert float((q.dequantize() - w).abs().max()) <= float(q.scale.max()) / 2 + 1e-7
    assert ck.weight("layers.0.attn.wq_a.weight").dtype == torch.float32  # stays float
    z = quantize_rows_int8(torch.zeros(2, 3))  # the kernels' amax floor of 1e-4
    assert torch.equal(z.codes, torch.zeros(2, 3, dtype=torch.int8))
    assert torch.allclose(z.scale, torch.full((2,), 1e-4 / 127))
