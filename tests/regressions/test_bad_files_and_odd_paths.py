"""Regression: bad files and odd paths that got a traceback, or did something else than asked.

* ``pto trace --out PATH`` renamed its temporary file over whatever PATH was: a symbolic link
  became a regular file (its target untouched) and a device such as ``/dev/null`` was replaced
  by a regular file;
* a ``config.json`` field of the wrong JSON type (``layer_types: 5``, ``compress_rates: [4]``,
  ``rope_parameters: {"main": 5}``, a string YaRN factor, string ``compress_ratios``) raised
  TypeError / AttributeError / ValueError (exit 1) instead of a ConfigError naming it; a string
  ``layer_types`` was split into characters, and ``hc_sinkhorn_iters: -1`` was accepted;
* a ``model.safetensors.index.json`` whose ``weight_map`` is not an object of file names raised
  AttributeError / TypeError;
* ``pto checkpoint tiny DIR --seed N`` with ``N >= 2**64`` raised torch's overflow ValueError, and a
  failed safetensors write (its own SafetensorError, e.g. EFBIG) got through as exit 1;
* a checkpoint path with rich markup or an emoji code in it (``x[/bold]``, ``ck:smile:x``) made the
  success line raise MarkupError after the checkpoint was written, or printed another path;
* ``pto run moe`` (no ``--preset``) ran the MoE kernels at ``flash`` (minutes, about 13 GB) although
  ``pto demo`` and the benchmarks cap them at ``demo``;
* a UTF-8 byte-order mark at the start of ``--input-ids-file`` was read as part of the first id;
* a key given twice (``--opt T=4 --opt T=8``, ``--dim``, ``--drop-init``) silently took the last one,
  and ``pto checkpoint tiny ""`` wrote into the current directory.
"""

import json
import os
import stat
import threading

import pytest

from pto.cli import main, resolve_target
from pto.errors import CheckpointError, ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import DeepSeekV4Config, get_config
from pto.models.deepseek_v4.weights import open_checkpoint
from pto.runtime.trace import write_trace

TRACE = {"traceEvents": [], "displayTimeUnit": "ns"}


def test_write_trace_follows_a_symlink_and_keeps_the_mode(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_trace(TRACE, str(link))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text()) == TRACE
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]  # no temporary left


def test_write_trace_writes_a_fifo_instead_of_replacing_it(tmp_path):
    # a FIFO stands for any file that is not regular (a device such as /dev/null): written to, never
    # replaced (a test on /dev/null itself would replace the machine's /dev/null if this broke)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_trace(TRACE, str(fifo))
    reader.join(timeout=30)
    assert json.loads(got[0]) == TRACE
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_trace_cli_empty_path_and_symlink(tmp_path, capsys):
    assert main(["trace", "example_splitk_matmul", "--out", ""]) == 2
    assert "error: --out: an empty path" in capsys.readouterr().err
    real = tmp_path / "t.json"
    real.write_text("old")
    (tmp_path / "l.json").symlink_to(real)
    assert main(["trace", "example_splitk_matmul", "--out", str(tmp_path / "l.json")]) == 0
    assert (tmp_path / "l.json").is_symlink() and "traceEvents" in json.loads(real.read_text())


def _hf(**changes) -> dict:
    doc = get_config("tiny").to_hf()
    doc.update(changes)
    return doc


@pytest.mark.parametrize("changes, says", [
    ({"layer_types": 5}, "layer_types must be a list, got 5"),
    ({"layer_types": "abc"}, "layer_types must be a list, got 'abc'"),
    ({"mlp_layer_types": 5}, "mlp_layer_types must be a list, got 5"),
    ({"compress_rates": [4]}, "compress_rates must be an object, got [4]"),
    ({"compress_rates": []}, "compress_rates must be an object, got []"),
    ({"rope_parameters": {"main": 5}}, "rope_parameters.main must be an object, got 5"),
    ({"rope_parameters": {"compress": 5}}, "rope_parameters.compress must be an object, got 5"),
    ({"rope_parameters": {"compress": {"factor": "x"}}}, "rope_parameters.compress.factor must be a number, got 'x'"),
    ({"rope_parameters": {"main": {"rope_theta": True}}}, "rope_parameters.main.rope_theta must be a number, got True"),
    ({"rope_parameters": {"compress": {"original_max_position_embeddings": 1.5}}},
     "rope_parameters.compress.original_max_position_embeddings must be an integer, got 1.5"),
    ({"layer_types": None, "compress_ratios": ["a"] * 6}, "compress_ratios entries must be integers, got 'a'"),
    ({"layer_types": None, "compress_ratios": 4}, "compress_ratios must be a list, got 4"),
    ({"hc_sinkhorn_iters": -1}, "hc_sinkhorn_iters=-1 must be positive"),
])
def test_config_fields_of_the_wrong_type_are_config_errors(changes, says):
    with pytest.raises(ConfigError) as ei:
        DeepSeekV4Config.from_hf(_hf(**changes))
    assert says in str(ei.value)


def test_config_from_hf_still_reads_the_written_config():
    cfg = get_config("tiny")
    back = DeepSeekV4Config.from_hf(cfg.to_hf())
    assert back.compress_ratios == cfg.compress_ratios and back.rope_scaling == cfg.rope_scaling
    assert back.rope_theta == cfg.rope_theta and back.compress_rope_theta == cfg.compress_rope_theta


def test_generate_on_a_config_of_the_wrong_type_exits_2(tmp_path, capsys):
    ckpt = write_tiny_checkpoint(tmp_path / "t", seed=0)
    doc = json.loads((ckpt / "config.json").read_text())
    doc["rope_parameters"] = {"main": 5}
    (ckpt / "config.json").write_text(json.dumps(doc))
    assert main(["generate", str(ckpt), "--input-ids", "5 17"]) == 2
    err = capsys.readouterr().err
    assert "rope_parameters.main must be an object, got 5" in err and "Traceback" not in err


@pytest.mark.parametrize("weight_map, says", [
    (5, "weight_map must be an object of tensor name -> file name, got 5"),
    ({"model.embed_tokens.weight": 3}, "weight_map['model.embed_tokens.weight'] must be a file name, got 3"),
])
def test_a_malformed_index_is_a_checkpoint_error(tmp_path, weight_map, says):
    ckpt = write_tiny_checkpoint(tmp_path / "t", seed=0, shards=2)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError) as ei:
        open_checkpoint(str(ckpt), "bf16")
    assert says in str(ei.value)


def test_checkpoint_seed_past_a_torch_seed(tmp_path, capsys):
    assert main(["checkpoint", "tiny", str(tmp_path / "c"), "--seed", str(2 ** 64)]) == 2
    assert "seed must be an integer in [0, 2**64), got 18446744073709551616" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_failed_safetensors_write_exits_2_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def refuse(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: File too large (os error 27)")

    monkeypatch.setattr(safetensors.torch, "save_file", refuse)
    assert main(["checkpoint", "tiny", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "cannot write a checkpoint to" in err and "File too large" in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("name", ["x[/bold]", "ck:smile:x", "[bold]ck"])
def test_checkpoint_paths_print_as_they_are(tmp_path, capsys, name):
    assert main(["checkpoint", "tiny", str(tmp_path / name)]) == 0
    assert f"to {tmp_path / name}" in capsys.readouterr().out
    assert (tmp_path / name / "config.json").is_file()


def test_run_without_a_preset_caps_the_moe_at_demo():
    t = resolve_target("moe", None, None, {})
    assert t.title == "moe decode (demo preset)"
    assert t.case_run.label.startswith("demo")
    assert resolve_target("moe", "tiny", None, {}).title == "moe decode"
    assert resolve_target("rms_norm", None, "decode", {}).title == "rms_norm decode"


def test_input_ids_file_with_a_byte_order_mark(tmp_path, capsys):
    ckpt = write_tiny_checkpoint(tmp_path / "t", seed=0)
    f = tmp_path / "ids.txt"
    f.write_bytes("\ufeff5 17 300\n".encode("utf-8"))
    assert main(["generate", str(ckpt), "--input-ids-file", str(f), "--max-new-tokens", "2", "--backend", "golden",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == [3]


@pytest.mark.parametrize("argv, says", [
    (["run", "example_splitk_matmul", "--opt", "T=4", "--opt", "T=8"], "--opt T is given twice ('T=8' after T=4)"),
    (["run", "rms_norm", "--preset", "tiny", "--dim", "T=3", "--dim", "T=4"], "--dim T is given twice"),
    (["check", "hc_pre", "--preset", "tiny", "--drop-init", "mixes_raw", "--drop-init", "mixes_raw"],
     "--drop-init mixes_raw is given twice"),
    (["checkpoint", "tiny", ""], "pto checkpoint: an empty directory name"),
])
def test_options_given_twice_and_an_empty_directory(capsys, argv, says):
    assert main(argv) == 2
    assert f"error: {says}" in capsys.readouterr().err
