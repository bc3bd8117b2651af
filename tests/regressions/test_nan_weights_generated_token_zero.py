"""Regression: a checkpoint whose tensor held NaN (a corrupt file) loaded without complaint
and ``pto generate`` printed "tokens: 0 0" with exit 0, on both paths. Reading a tensor
that holds NaN or infinite values is now a CheckpointError naming it (``pto generate``:
one error line, exit 2).
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from pto.cli import main
from pto.errors import CheckpointError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.weights import open_checkpoint


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    d = write_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "nan", seed=0)
    sd = load_file(str(d / "model.safetensors"))
    sd["model.hc_head.hc_fn"][1, 3] = float("nan")
    sd["model.layers.0.attn.attn_sink"][0] = float("inf")
    save_file(sd, str(d / "model.safetensors"))
    return d


def test_reading_a_non_finite_tensor_is_an_error(corrupt):
    ck = open_checkpoint(corrupt)
    with pytest.raises(CheckpointError, match=r"tensor 'model.hc_head.hc_fn' holds 1 NaN or infinite value\(s\)$"):
        ck.tensor("hc_head_fn")
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.0.attn.attn_sink' holds 1 NaN"):
        ck.tensor("layers.0.attn.attn_sink")
    assert torch.isfinite(ck.tensor("layers.0.attn.wq_a.weight")).all()


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_generate_with_a_corrupt_checkpoint_exits_2(corrupt, capsys, weights):
    code = main(["generate", str(corrupt), "--input-ids", "5 6", "--max-new-tokens", "2", "--weights", weights])
    out, err = capsys.readouterr()
    assert code == 2 and "tokens" not in out
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"error: CheckpointError: checkpoint {corrupt}: tensor 'model.hc_head.hc_fn' holds 1 NaN or infinite value(s)"]
