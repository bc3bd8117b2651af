"""Regression: ``pto pypto`` errors named the user's files by absolute path even when run from
the checkout the script is in (``error: ... not supported by pto at /home/u/lib/models/k.py:8``,
``no such file '/home/u/lib/k.py'``). A path under the current directory is now shown relative
to it, as the user typed it; one outside stays absolute.
"""

import os
from pathlib import Path

from pto.compat import run_file
from pto.compat.runner import _shown
from pto.errors import ConfigError

MINI = Path(__file__).resolve().parents[1] / "compat" / "fixture_lib" / "models" / "mini"


def _error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1
    return lines[0]


def test_script_under_the_cwd_is_named_relative(capsys, monkeypatch):
    monkeypatch.chdir(MINI.parent)
    assert run_file("mini/unsupported.py", []) == 1
    assert _error_line(capsys).endswith("pl.tile.print_tile: not supported by pto at mini/unsupported.py:8")
    monkeypatch.chdir(MINI)
    try:
        run_file("nope.py", [])
    except ConfigError as e:
        assert str(e) == "pto pypto: no such file 'nope.py'"
    else:
        raise AssertionError("a missing script must be a ConfigError")


def test_script_outside_the_cwd_keeps_its_absolute_path(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_file(str(MINI / "unsupported.py"), []) == 1
    assert _error_line(capsys).endswith(f"not supported by pto at {MINI / 'unsupported.py'}:8")


def test_only_whole_path_prefixes_are_shortened(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    assert _shown(f"at {cwd}/a/k.py:3 and {cwd}/b.py") == "at a/k.py:3 and b.py"
    assert _shown(f"at /x{cwd}/k.py and {cwd}x/k.py") == f"at /x{cwd}/k.py and {cwd}x/k.py"
