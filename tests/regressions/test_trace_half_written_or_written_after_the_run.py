"""Regression: ``pto trace --out FILE`` wrote FILE with a plain ``open(path, "w")``: a failure
while encoding (or a full disk, an interrupt) left a truncated JSON file, over any earlier
trace of that name; and an unwritable ``--out`` (missing directory, a directory) was only
reported after the kernel had run (minutes at FLASH size).
"""

import json

import pytest

import pto.runtime.trace as trace_mod
from pto.cli import main
from pto.runtime.trace import write_trace


def test_a_failed_write_leaves_no_partial_file_and_keeps_the_old_one(tmp_path):
    out = tmp_path / "t.json"
    write_trace({"traceEvents": [{"ph": "X", "name": "old"}]}, str(out))
    assert json.loads(out.read_text())["traceEvents"][0]["name"] == "old"
    with pytest.raises(TypeError):
        write_trace({"traceEvents": [{"ph": "X", "name": "new"}], "bad": object()}, str(out))
    assert json.loads(out.read_text())["traceEvents"][0]["name"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(obj, f):
        f.write('{"traceEvents": [')
        raise KeyboardInterrupt
    monkeypatch.setattr(trace_mod.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_trace({"traceEvents": []}, str(tmp_path / "t.json"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where,why", [("missing/t.json", "No such directory"), (".", "Is a directory")])
def test_unwritable_out_is_reported_before_the_kernel_runs(tmp_path, capsys, where, why):
    marker = tmp_path / "ran"
    (tmp_path / "k.py").write_text(f"def build():\n    open({str(marker)!r}, 'w').close()\n    raise SystemExit(9)\n")
    code = main(["trace", f"{tmp_path / 'k.py'}:build", "--out", str(tmp_path / where)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"error: cannot write {str(tmp_path / where)!r}: {why}"
    assert not marker.exists()


def test_trace_file_gets_the_usual_permissions(tmp_path):
    import os
    out = tmp_path / "t.json"
    write_trace({"traceEvents": []}, str(out))
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
