"""The pto command line: registry-driven subcommands, tables, exit codes, and
one-line errors for bad input (cli.py)."""

from pathlib import Path

import pytest

from pto import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_registered_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("demo", "run", "check", "graph"):
        assert name in out
    assert set(cli.COMMANDS) >= {"demo", "run", "check", "graph"}
    code, out, _ = run_cli(capsys)
    assert code == 2 and "usage" in out


def test_demo_of_the_examples_passes_and_prints_the_table(capsys):
    code, out, _ = run_cli(capsys, "demo", "--group", "example")
    assert code == 0
    for col in ("kernel", "mode / output", "tasks", "edges", "heap", "error", "tol.", "margin", "pass", "ms",
                "golden"):
        assert col in out
    for name in ("example_add", "example_softmax", "example_rmsnorm", "example_rope", "example_splitk_matmul"):
        assert name in out
    assert "5/5 passed" in out and "FAIL" not in out


def test_demo_reports_a_failing_case_and_exits_1(capsys, monkeypatch):
    from pto.golden import get_case, load_examples
    load_examples()
    case = get_case("example_add")

    def broken(preset, mode, **kw):
        cr = case.build(preset, mode, **kw)
        golden = cr.golden

        def wrong(v):
            golden(v)
            v["z"][0, 0] += 1
        cr.golden = wrong
        return cr

    monkeypatch.setattr(case, "build", broken)
    code, out, _ = run_cli(capsys, "demo", "--only", "example_add")
    assert code == 1 and "FAIL" in out and "0/1 passed" in out


def test_run_prints_statistics(capsys):
    code, out, _ = run_cli(capsys, "run", "example_splitk_matmul")
    assert code == 0 and "tasks" in out and "heap peak" in out and "16.0 KiB" in out


def test_run_options_reach_the_builder(capsys):
    code, out, _ = run_cli(capsys, "graph", "example_splitk_matmul", "--opt", "seed_scopes=True")
    assert code == 0 and "seed_zero" in out and "3 tasks" in out and "3 edges" in out


def test_check_prints_a_pass_line(capsys):
    code, out, _ = run_cli(capsys, "check", "example_rope", "--mode", "default")
    assert code == 0 and out.startswith("PASS example_rope default: max error 0")


def test_graph_lists_tasks_and_edges(capsys):
    code, out, _ = run_cli(capsys, "graph", "example_splitk_matmul", "--footprints")
    assert code == 0
    assert "splitk_mm" in out and "copy_out" in out and "#0 splitk_mm" in out and "atomic_add acc" in out


def test_module_function_targets(capsys):
    target = f"{EXAMPLES / 'add_example.py'}:add_kernel"
    code, out, _ = run_cli(capsys, "run", target, "--dim", "T=100")
    assert code == 0 and "tasks" in out
    code, _, err = run_cli(capsys, "run", target)
    assert code == 2 and "pass --dim T=<extent>" in err
    code, out, _ = run_cli(capsys, "check", f"{EXAMPLES / 'add_example.py'}:build")
    assert code == 0 and out.startswith("PASS")
    code, out, _ = run_cli(capsys, "check", target, "--dim", "T=33")
    assert code == 0 and "no undefined outputs, no races" in out


@pytest.mark.parametrize("argv, message", [
    (["run", "no_such_kernel"], "unknown kernel 'no_such_kernel'"),
    (["check", "example_add", "--preset", "huge"], "unknown preset 'huge'"),
    (["graph", "example_add", "--mode", "sideways"], "has no mode 'sideways'"),
    (["run", "example_add", "--opt", "T"], "option 'T' is not KEY=VALUE"),
    (["run", "example_add", "--opt", "nonsense=1"], "example_add: unknown options ['nonsense'] (its options: T)"),
    (["run", "example_add", "--opt", "seed_scopes=True"], "has no seed variant"),
    (["run", "no.such.module:fn"], "cannot import module 'no.such.module'"),
    (["run", "pto.cli:nothing_here"], "has no attribute 'nothing_here'"),
    (["run", "missing_file.py:fn"], "no such file"),
    (["demo", "--preset", "huge"], "unknown preset 'huge'"),
    (["demo", "--only", "nope"], "unknown kernel(s) ['nope']"),
])
def test_bad_input_is_one_error_line_and_exit_2(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_kernel_file_without_py_suffix_is_one_error_line(capsys, tmp_path):
    f = tmp_path / "kernel_file"  # exists, but importlib finds no loader without .py
    f.write_text("x = 1\n")
    code, out, err = run_cli(capsys, "run", f"{f}:fn")
    assert code == 2 and "is not a Python file" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out and "NoneType" not in err


def test_parse_options():
    assert cli.parse_options(["T=128", "flag=True", "name=abc", "xs=[1, 2]"]) == {
        "T": 128, "flag": True, "name": "abc", "xs": [1, 2]}


def test_boolean_option_words_are_booleans():
    assert cli.parse_options(["seed_scopes=false", "a=No", "b=on", "c=True", "name=x"]) == {
        "seed_scopes": False, "a": False, "b": True, "c": True, "name": "x"}


_BUGGY_KERNEL = '''
import pto.language as pl

@pl.jit
def buggy(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(name_hint="oops"):
        y[0:8, 0:16] = x[0:8, 0:16] + undefined_name  # noqa: F821
'''


def test_a_failing_kernel_is_one_error_line_and_exit_1(capsys, tmp_path):
    path = tmp_path / "buggy_kernel.py"
    path.write_text(_BUGGY_KERNEL)
    code, out, err = run_cli(capsys, "run", f"{path}:buggy")
    assert code == 1
    assert err.startswith("error: NameError") and "undefined_name" in err
    assert "Traceback" not in out + err


def test_bad_thread_count_is_bad_input(capsys, monkeypatch):
    monkeypatch.setenv("PTO_THREADS", "99999")
    code, _, err = run_cli(capsys, "run", "example_add")
    assert code == 2 and "PTO_THREADS" in err


def test_check_drop_init_of_a_name_that_drops_nothing_is_bad_input(capsys):
    code, _, err = run_cli(capsys, "check", "hc_pre", "--preset", "tiny", "--drop-init", "mixes_rwa")
    assert code == 2 and "mixes_rwa" in err and "mixes_raw" in err


def test_demo_only_names_a_kernel_of_the_other_group(capsys):
    code, _, err = run_cli(capsys, "demo", "--group", "model", "--only", "example_add")
    assert code == 2 and "in another group than 'model'" in err
