"""Regression: a Hugging Face layout checkpoint without ``model.hc_head.hc_fn`` was reported
as "missing tensor 'hc_head_fn'": a name that appears nowhere in the user's files (the
loader's canonical name). The error now also gives the name the layout stores it under.
"""

import pytest
from safetensors.torch import load_file, save_file

from pto.errors import CheckpointError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.weights import open_checkpoint


@pytest.mark.parametrize("layout,stored,canonical", [
    ("hf", "model.hc_head.hc_fn", "hc_head_fn"),
    ("hf", "model.layers.0.attn.attn_sink", "layers.0.attn.attn_sink"),
])
def test_missing_tensor_gives_its_stored_name(tmp_path, layout, stored, canonical):
    d = write_tiny_checkpoint(tmp_path / "ck", seed=0, layout=layout)
    sd = load_file(str(d / "model.safetensors"))
    del sd[stored]
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"missing tensor '{canonical}' \(stored as '{stored}', shape "):
        open_checkpoint(d)
