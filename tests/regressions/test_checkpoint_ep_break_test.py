"""Checkpoint, graph-only and MTP defects a break test found:

* a tensor stored under two names (an FP8 scale as both ``.scale`` and ``.weight_scale_inv``, a
  tensor with and without the ``model.`` prefix) loaded whichever name came last;
* a ``tid2eid`` row naming one expert twice loaded, and the kernels and the golden forward then
  chose different tokens; an FP8 block scale <= 0 loaded (an E8M0 scale is a power of two);
* ``hc_sinkhorn_iters: 1000000000`` was accepted and ``generate`` spun for hours;
* a dangling ``model.safetensors`` symlink was "the index names model.safetensors" (there was no
  index), a directory in its place "No such device", and ``pto checkpoint tiny`` into a
  dangling symlink "File exists";
* ``--graph-only`` on a kernel case sent every token of a seeded hash table to experts 0..K-1
  (an argsort of shape-only values taken as ties), far from the balanced routes it promises;
* ``decode_steps_saved`` counted accepted drafts, which over a batch is more than the steps
  saved (one step decodes every request).
"""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pto.cli import _ShapeOnlyFactories
from pto.cli import main as cli_main
from pto.errors import CheckpointError, ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeepSeekV4Config, DeploymentConfig
from pto.models.deepseek_v4.generate import generate
from pto.models.deepseek_v4.model import GoldenModel
from pto.models.deepseek_v4.weights import open_checkpoint

FW = "layers.2.attn.wq_b"


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("hf") / "tiny", seed=0, mtp=True)


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("fp8") / "tiny", seed=0, layout="fp8")


def _damaged(src, dst, edit):
    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    edit(t)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_scale_stored_under_both_names_is_an_error(fp8, tmp_path):
    d = _damaged(fp8, tmp_path / "two", lambda t: t.__setitem__(FW + ".weight_scale_inv", t[FW + ".scale"].clone()))
    with pytest.raises(CheckpointError, match=rf"the scale of tensor '{FW}.weight' is stored twice, as "
                                              rf"'{FW}.scale' and '{FW}.weight_scale_inv'"):
        open_checkpoint(d)


def test_a_tensor_with_and_without_the_model_prefix_is_an_error(hf, tmp_path):
    d = _damaged(hf, tmp_path / "two", lambda t: t.__setitem__(
        "layers.0.attn_norm.weight", t["model.layers.0.attn_norm.weight"] * 0 + 5.0))
    with pytest.raises(CheckpointError, match=r"tensor 'layers.0.attn_norm.weight' is stored twice, as "
                                              r"'layers.0.attn_norm.weight' and 'model.layers.0.attn_norm.weight'"):
        open_checkpoint(d)


def test_a_hash_row_naming_an_expert_twice_is_an_error(hf, tmp_path):
    name = "model.layers.0.ffn.gate.tid2eid"

    def edit(t):
        t[name] = t[name].clone()
        t[name][17] = 3
    d = _damaged(hf, tmp_path / "dup", edit)
    ck = open_checkpoint(d)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' row 17 \[3, 3, 3, 3\] names an expert twice \(1 row\)"):
        ck.tensor("layers.0.ffn.gate.tid2eid")
    assert cli_main(["generate", str(d), "--input-ids", "5 17 300", "--max-new-tokens", "2"]) == 2


@pytest.mark.parametrize("value", [0.0, -2.0 ** -9])
def test_a_block_scale_that_is_not_positive_is_an_error(fp8, tmp_path, value):
    d = _damaged(fp8, tmp_path / "s", lambda t: t.__setitem__(FW + ".scale", torch.full_like(
        t[FW + ".scale"], 1.0, dtype=torch.float32).index_fill_(0, torch.tensor([0]), value)))
    ck = open_checkpoint(d)
    with pytest.raises(CheckpointError, match=rf"scale '{FW}.scale' holds \d+ value\(s\) <= 0"):
        ck.tensor(FW + ".weight")


def test_sinkhorn_iterations_are_bounded(hf, tmp_path):
    raw = json.loads((hf / "config.json").read_text())
    for iters in (10 ** 9, 1000):
        (tmp_path / "config.json").write_text(json.dumps(dict(raw, hc_sinkhorn_iters=iters)))
        if iters > 1000:
            with pytest.raises(ConfigError, match=r"hc_sinkhorn_iters=1000000000 is above 1000"):
                DeepSeekV4Config.from_hf(tmp_path, name="x")
        else:  # the bound itself is accepted
            assert DeepSeekV4Config.from_hf(tmp_path, name="x").hc_sinkhorn_iters == 1000


def test_dangling_links_and_directories_are_named(hf, tmp_path):
    link = tmp_path / "link"
    shutil.copytree(hf, link)
    (link / "model.safetensors").unlink()
    os.symlink("/nonexistent/x.safetensors", link / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors is a symlink to '/nonexistent/x.safetensors', "
                                              r"which does not exist"):
        open_checkpoint(link)
    folder = tmp_path / "folder"
    shutil.copytree(hf, folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"model.safetensors is a directory, not a safetensors file"):
        open_checkpoint(folder)
    os.symlink("nowhere", tmp_path / "out")
    with pytest.raises(CheckpointError, match=r"is a symlink to 'nowhere', which does not exist"):
        write_tiny_checkpoint(tmp_path / "out", seed=0)
    assert not (tmp_path / "nowhere").exists()


def test_shape_only_sorts_rotate_each_row():
    with _ShapeOnlyFactories():
        x = torch.rand(6, 8)
        assert x.is_meta
        assert x.argsort(dim=1)[:, :3].tolist() == [[r, r + 1, r + 2] for r in range(6)]
        assert torch.topk(torch.rand(3, 4), 2, dim=1)[1].tolist() == [[0, 1], [1, 2], [2, 3]]
        assert torch.rand(5).argsort().tolist() == [0, 1, 2, 3, 4]


def test_graph_only_moe_case_routes_as_a_real_run(capsys):
    counts = []
    for extra in ([], ["--graph-only"]):
        assert cli_main(["run", "moe", "--mode", "decode", "--preset", "tiny", "--json", *extra]) == 0
        counts.append(json.loads(capsys.readouterr().out)["stats"]["blocks"])
    assert counts[0] == counts[1] == 47


def test_steps_saved_over_a_batch_are_steps_not_drafts(hf):
    m = GoldenModel(open_checkpoint(hf), DeploymentConfig(max_context=64, rope_max_pos=64))
    prompts = [[5, 17, 300], [42, 7], [99, 1, 2, 3]]
    plain = generate(m, prompts, max_new_tokens=4, eos_token_id=None)
    res = generate(m, prompts, max_new_tokens=4, eos_token_id=None, mtp=True, drafts="accept",
                   reference=plain.tokens)
    assert res.tokens == plain.tokens and plain.decode_steps == 3 and res.decode_steps == 2
    assert res.mtp_accepted == 3  # one draft per request in the first step
    assert res.decode_steps_saved == plain.decode_steps - res.decode_steps == 1
