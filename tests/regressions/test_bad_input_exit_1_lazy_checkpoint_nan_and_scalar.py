"""Regression: two kinds of bad command-line input exited 1 ("the kernel failed") instead of 2:

* ``pto generate CKPT`` whose checkpoint holds a NaN in a tensor that is only read when first
  used (an expert weight, checked lazily) printed a blank line, then the CheckpointError, exit 1
  (README: a malformed checkpoint is one error line and exit code 2);
* ``pto run MODULE:FUNCTION --scalar k=abc`` (a non-number for a ``pl.Scalar[pl.INT32]``) exited 1
  with the BindError raised when the kernel bound its arguments.
"""

import safetensors.torch

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint

KERNEL = '''
import pto.language as pl

N = pl.dynamic("N")


@pl.jit
def axpb(x: pl.Tensor[[N, 64], pl.FP32], a: pl.Scalar[pl.FP32], k: pl.Scalar[pl.INT32],
         y: pl.Out[pl.Tensor[[N, 64], pl.FP32]]):
    for b in pl.spmd(1, name_hint="axpb"):
        y[0:8, 0:64] = x[0:8, 0:64] * a
'''


def test_lazily_found_nan_in_checkpoint_is_bad_input(tmp_path, capsys):
    ckpt = write_tiny_checkpoint(tmp_path / "t", seed=0)
    f = ckpt / "model.safetensors"
    tensors = safetensors.torch.load_file(str(f))
    name = "model.layers.1.ffn.experts.12.w1.weight"  # read when layer 1's experts are first loaded
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    safetensors.torch.save_file(tensors, str(f))
    code = main(["generate", str(ckpt), "--input-ids", "5 17", "--max-new-tokens", "2"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""  # no blank line from the progress bar
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: CheckpointError:") and name in lines[0] and "NaN" in lines[0]


def test_bad_scalar_value_is_bad_input(tmp_path, capsys):
    k = tmp_path / "mykern.py"
    k.write_text(KERNEL)
    code = main(["run", f"{k}:axpb", "--dim", "N=8", "--scalar", "a=2.0", "--scalar", "k=abc"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("error: --scalar k='abc':") and "int32" in err
    assert main(["run", f"{k}:axpb", "--dim", "N=8", "--scalar", "a=2.0", "--scalar", "k=3"]) == 0
