"""Regression: bad command-line input that exited 1 with a raw exception (or was silently
ignored) instead of one ``error:`` line and exit code 2 (new-user breaker pass):

* ``pto checkpoint tiny DIR`` with a DIR that cannot be created (``/proc/x``, a path under a
  file) printed ``FileNotFoundError`` / ``NotADirectoryError`` "raised by the kernel", exit 1;
* ``pto checkpoint --shards N`` above the number of tensors wrote N files, most of them empty
  safetensors (100000 files for ``--shards 100000``);
* ``pto generate --input-ids-file`` of a binary file printed ``UnicodeDecodeError`` (exit 1);
* ``pto generate --chunk 0`` started generating and failed inside it (exit 1);
  ``--max-context 0`` was silently taken as "not given"; a malformed ``tokenizer.json``
  under ``--prompt`` printed the tokenizers package's bare ``Exception`` (exit 1);
* ``pto run KERNEL --opt T=<huge>`` exited 1 with torch's allocator message "raised by the
  kernel" (the size asked for is the bad input), and a BindError raised while a case built
  its inputs from the options (``prefill_compressor_ratio128 --opt T=100000``) exited 1.
"""

import json

import pytest

from pto.cli import main
from pto.errors import CheckpointError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "raised by the kernel" not in err
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", seed=0)


def test_checkpoint_into_an_uncreatable_directory_exits_2_and_leaves_nothing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _run(capsys, "checkpoint", "tiny", str(blocker / "sub" / "tiny"))
    assert code == 2
    assert "cannot write a checkpoint to" in _one_error_line(err) and "Not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_checkpoint_failure_removes_the_directories_it_made(tmp_path, monkeypatch):
    import safetensors.torch

    def fail(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(OSError, match="No space left"):
        write_tiny_checkpoint(tmp_path / "a" / "b", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_more_shards_than_tensors_is_an_error_and_shards_are_balanced(tmp_path):
    with pytest.raises(CheckpointError, match=r"shards=100000 is more than its \d+ tensors"):
        write_tiny_checkpoint(tmp_path / "big", seed=0, shards=100000)
    assert not (tmp_path / "big").exists()
    d = write_tiny_checkpoint(tmp_path / "sh", seed=0, shards=300)
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    per_file = {}
    for f in weight_map.values():
        per_file[f] = per_file.get(f, 0) + 1
    assert len(per_file) == 300 and max(per_file.values()) - min(per_file.values()) <= 1


@pytest.mark.parametrize("flags,msg", [
    (["--chunk", "0"], "error: --chunk must be a positive integer, got 0"),
    (["--chunk", "-1"], "error: --chunk must be a positive integer, got -1"),
    (["--max-context", "0"], "error: --max-context must be a positive integer, got 0"),
    (["--max-context", "-5"], "error: --max-context must be a positive integer, got -5"),
])
def test_generate_bad_sizes_exit_2_before_any_work(tiny, capsys, flags, msg):
    code, out, err = _run(capsys, "generate", str(tiny), "--input-ids", "5 6", *flags)
    assert code == 2 and out == ""
    assert _one_error_line(err) == msg


def test_generate_prompt_with_a_malformed_tokenizer_exits_2(tiny, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    d = tmp_path / "tok"
    d.mkdir()
    for f in tiny.iterdir():
        (d / f.name).symlink_to(f)
    (d / "tokenizer.json").write_text("garbage")
    code, out, err = _run(capsys, "generate", str(d), "--prompt", "hello")
    assert code == 2 and out == ""
    assert _one_error_line(err).startswith(f"error: --prompt: cannot read {d / 'tokenizer.json'}: ")


@pytest.mark.parametrize("raised", [
    # torch's CPU allocator on a size above what the machine can give (pto run rms_norm --opt T=10^8)
    "RuntimeError(\"[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 51200000000 bytes. Error code 12 (Cannot allocate memory)\")",
    "MemoryError()",
])
def test_run_with_a_size_that_exhausts_memory_exits_2(tmp_path, capsys, raised):
    # the allocation is simulated: a real one may succeed under memory overcommit and be killed later
    (tmp_path / "big.py").write_text(f"def build():\n    raise {raised}\n")
    code, out, err = _run(capsys, "run", f"{tmp_path / 'big.py'}:build")
    assert code == 2 and out == ""
    assert _one_error_line(err).startswith("error: out of memory: ")


def test_a_kernel_runtime_error_still_exits_1(tmp_path, capsys):
    (tmp_path / "bug.py").write_text("def build():\n    raise RuntimeError('shape mismatch')\n")
    code, _, err = _run(capsys, "run", f"{tmp_path / 'bug.py'}:build")
    assert code == 1 and "error: RuntimeError: shape mismatch" in err


def test_bind_error_while_building_a_case_from_its_options_exits_2(capsys):
    code, out, err = _run(capsys, "run", "prefill_compressor_ratio128", "--preset", "tiny", "--opt", "T=100000")
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert line.startswith("error: kernel 'prefill_compressor_ratio128': options {'T': 100000}: BindError: ")
    assert "exceeds the state ring" in line


def test_generate_binary_input_ids_file_exits_2(tiny, tmp_path, capsys):
    f = tmp_path / "ids.bin"
    f.write_bytes(b"5 6\n\x87\xff\x00")
    code, out, err = _run(capsys, "generate", str(tiny), "--input-ids-file", str(f))
    assert code == 2 and out == ""
    assert _one_error_line(err) == f"error: --input-ids-file: {f} is not a text file (byte 4: invalid start byte)"
