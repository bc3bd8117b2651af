"""The CLI accepted options it then ignored: ``--dim`` for a dim the kernel lacks, ``--scalar``
naming a tensor parameter, ``--opt`` / ``--preset`` / ``--mode`` on a ``MODULE:FUNCTION``
target that is a plain ``@pl.jit`` function, ``--dim`` on a registry kernel. Each is now bad
input: exit 2 and one ``error:`` line. A KernelCase in a file still takes preset, mode and
options (their defaults are "not given")."""

import textwrap

import pytest

from pto import cli

MODULE = textwrap.dedent('''
    import torch
    import pto.language as pl
    from pto.golden import CaseRun, KernelCase, TensorSpec

    T = pl.dynamic("T")

    @pl.jit
    def scaled(x: pl.Tensor[[T, 8], pl.FP32], y: pl.Out[pl.Tensor[[T, 8], pl.FP32]], a: pl.Scalar[pl.FP32]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
            y[:, :] = x[:, :] * a
        return y

    def _build(preset, mode, rows=4):
        specs = [TensorSpec("x", [rows, 8], torch.float32, init_value=torch.randn),
                 TensorSpec("y", [rows, 8], torch.float32), 
                 __import__("pto.golden", fromlist=["ScalarSpec"]).ScalarSpec("a", torch.float32, 2.0)]
        def golden(v):
            v["y"][:] = v["x"] * v["a"]
        return CaseRun(scaled, specs, golden, label=f"{preset} {mode} rows={rows}")

    case = KernelCase("file_case", _build, modes=("one", "two"))
''')


@pytest.fixture
def mod(tmp_path):
    p = tmp_path / "cli_target_mod.py"
    p.write_text(MODULE)
    return str(p)


def bad(capsys, *argv) -> str:
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    return err


def test_ignored_options_are_rejected(capsys, mod):
    jit = f"{mod}:scaled"
    assert "no dynamic dim 'S'" in bad(capsys, "run", jit, "--dim", "T=4", "--dim", "S=3", "--scalar", "a=1.0")
    assert "'x' is a tensor parameter" in bad(capsys, "run", jit, "--dim", "T=4", "--scalar", "x=1.0")
    assert "'b' is not a parameter" in bad(capsys, "run", jit, "--dim", "T=4", "--scalar", "b=1.0")
    for extra in (["--preset", "tiny"], ["--mode", "prefill"], ["--opt", "T=64"]):
        err = bad(capsys, "run", jit, "--dim", "T=4", "--scalar", "a=1.0", *extra)
        assert f"--{extra[0][2:]} " in err and "@pl.jit function" in err and "ignored" in err
    assert "--dim T=4 does not apply to hc_pre" in bad(capsys, "run", "hc_pre", "--preset", "tiny", "--dim", "T=4")
    assert "--scalar" in bad(capsys, "check", "hc_pre", "--preset", "tiny", "--scalar", "a=1")
    assert "--dim" in bad(capsys, "graph", f"{mod}:case", "--dim", "T=4")


def test_accepted_options_still_work(capsys, mod):
    assert cli.main(["run", f"{mod}:scaled", "--dim", "T=4", "--scalar", "a=1.0"]) == 0
    assert cli.main(["check", f"{mod}:case", "--preset", "tiny", "--mode", "two", "--opt", "rows=3"]) == 0
    out = capsys.readouterr().out
    assert "PASS file_case two" in out
