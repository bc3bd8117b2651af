"""`pto pypto FILE.py`: the fixture checkout's scripts (pypto conventions) run unchanged."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pto.cli import main as cli_main
from pto.compat import run_file
from pto.compat.runner import project_root
from pto.errors import ConfigError
from pto.language import compat_ops

LIB = Path(__file__).resolve().parent / "fixture_lib"
MINI = LIB / "models" / "mini"


def _run(path, *argv, capsys=None):
    code = run_file(str(path), list(argv))
    out = capsys.readouterr() if capsys is not None else None
    return code, out


@pytest.mark.parametrize("script", ["examples/hello_spmd.py", "models/mini/rmsnorm_dyn.py",
                                    "models/mini/gather_scores.py", "models/mini/program_api.py",
                                    "models/mini/host_topk.py"])
def test_fixture_script_passes_its_golden(script, capsys):
    code, out = _run(LIB / script, capsys=capsys)
    assert code == 0, out.out + out.err
    n_outputs = {"examples/hello_spmd.py": 1, "models/mini/rmsnorm_dyn.py": 2, "models/mini/gather_scores.py": 2,
                 "models/mini/program_api.py": 1, "models/mini/host_topk.py": 2}[script]
    assert out.out.count("' PASS  shape=") == n_outputs
    assert "FAIL" not in out.out
    assert compat_ops.mode.pypto is False  # restored


def test_arguments_reach_the_script_and_options_are_reported_ignored(capsys):
    code, out = _run(MINI / "rmsnorm_dyn.py", "--mode", "prefill", "--enable-l2-swimlane", "2", "--compile-only",
                     capsys=capsys)
    assert code == 0, out.err
    assert "T=20" in out.out and "T=8 " not in out.out
    assert "enable_l2_swimlane=2" in out.out and "compile_only" in out.out


def test_sibling_modules_are_dropped_after_the_run(capsys):
    assert _run(MINI / "rmsnorm_dyn.py", "--mode", "decode", capsys=capsys)[0] == 0
    assert "config" not in sys.modules and "golden" not in sys.modules and "pypto" not in sys.modules


def test_written_in_parameter_warns_with_the_kernel_line(capsys):
    with pytest.warns(UserWarning, match="row_max: parameter is declared In but written") as rec:
        code, _ = _run(MINI / "gather_scores.py", capsys=capsys)
    assert code == 0
    w = [r for r in rec if "declared In" in str(r.message)]
    assert len(w) == 1 and w[0].filename == str(MINI / "gather_scores.py") and w[0].lineno == 40


def test_unsupported_construct_is_one_error_naming_it_and_the_line(capsys, monkeypatch):
    monkeypatch.chdir("/")  # the script is not under the cwd: its path is shown absolute
    code, out = _run(MINI / "unsupported.py", capsys=capsys)
    assert code == 1
    lines = [ln for ln in out.err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: UnsupportedConstructError: ")
    assert lines[0].endswith(f"pl.tile.print_tile: not supported by pto at {MINI / 'unsupported.py'}:8")


def test_save_data_then_replay_from_golden_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = _run(LIB / "examples" / "hello_spmd.py", "--save-data", capsys=capsys)
    assert code == 0
    work_dir = out.out.split("work_dir=")[1].split()[0]
    data = tmp_path / work_dir / "data"
    assert sorted(p.name for p in (data / "in").iterdir()) == ["x.pt"]
    assert sorted(p.name for p in (data / "out").iterdir()) == ["y.pt"]
    code, out = _run(LIB / "examples" / "hello_spmd.py", "--golden-data", str(data), capsys=capsys)
    assert code == 0 and "cache hit" in out.out
    (data / "out" / "y.pt").unlink()
    code, out = _run(LIB / "examples" / "hello_spmd.py", "--golden-data", str(data), capsys=capsys)
    assert code == 1 and "golden_data is missing files: ['out/y.pt']" in out.out


def test_cli_subcommand_and_module_entry(capsys):
    assert cli_main(["pypto", str(LIB / "examples" / "hello_spmd.py"), "-p", "a5"]) == 0
    assert "platform='a5'" in capsys.readouterr().out
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "pto.compat", str(MINI / "unsupported.py")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 1 and "pl.tile.print_tile: not supported by pto" in r.stderr


def test_bad_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        run_file(str(tmp_path / "missing.py"))
    assert cli_main(["pypto", str(tmp_path / "missing.py")]) == 2


def test_project_root_is_the_checkout():
    assert project_root(str(MINI)) == str(LIB)


PARTIAL_OUT = '''
import pypto.language as pl


@pl.jit
def first_rows(x: pl.Tensor[[8, 4], pl.FP32], y: pl.Out[pl.Tensor[[8, 4], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="half"):
        y[0:3, :] = x[0:3, :]
    return y


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit

    def golden(t):
        t["y"][0:3] = t["x"][0:3]  # rows 3.. stay the harness's zeros

    r = run_jit(first_rows, [TensorSpec("x", [8, 4], torch.float32, init_value=torch.randn),
                             TensorSpec("y", [8, 4], torch.float32, is_output=True)], golden)
    raise SystemExit(0 if r.passed else 1)
'''


def test_pypto_out_keeps_unwritten_elements_like_pypto(tmp_path, capsys):
    script = tmp_path / "partial.py"
    script.write_text(PARTIAL_OUT)
    code, out = _run(script, capsys=capsys)
    assert code == 0, out.err
    assert "'y' PASS" in out.out
