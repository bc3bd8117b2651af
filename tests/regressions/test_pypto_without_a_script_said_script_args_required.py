"""Regression: a bare ``pto pypto`` printed argparse's "the following arguments are required:
file, script_args", naming the pass-through argument list as if it had to be given. It is now
one ``error:`` line with the usage (exit 2); a script without arguments still runs.
"""

from pathlib import Path

from pto.cli import main

LIB = Path(__file__).resolve().parents[1] / "compat" / "fixture_lib"


def test_bare_pypto_is_a_usage_error(capsys):
    assert main(["pypto"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("error: pto pypto needs a pypto script to run: pto pypto FILE.py [ARGS ...] "
                   "(pypto.language served by pto, check mode; docs/porting.md)\n")


def test_a_script_with_and_without_arguments_still_runs(capsys):
    script = LIB / "examples" / "hello_spmd.py"
    assert script.is_file()
    assert main(["pypto", str(script), "-p", "a5"]) == 0
    assert main(["pypto", str(script)]) == 0
    assert main(["pypto", str(script.with_name("missing.py"))]) == 2
