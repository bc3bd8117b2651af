"""The README's opening kernel example runs as written and stays short."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _first_python_block() -> str:
    m = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert m, "README has no python example"
    return m.group(1)


def test_readme_example_runs_and_is_about_ten_lines():
    code = _first_python_block()
    lines = [ln for ln in code.splitlines() if ln.strip()]
    assert len(lines) <= 12
    ns: dict = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), ns)  # noqa: S102 - our own README
    prog = ns["prog"]
    assert prog.stats.tasks == 1 and prog.stats.blocks == 4 and prog.stats.edges == 0


def _blocks() -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), re.S)


def test_readme_leads_with_checkpoint_then_generate_and_its_real_output(tmp_path, capsys, monkeypatch):
    """The first block is the two-command quick start; the next is what it prints (wall times
    aside); the make commands follow."""
    import shlex

    from pto.cli import main
    commands, shown, make = _blocks()[:3]
    lines = [ln.split("#")[0].strip() for ln in commands.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith("pto checkpoint tiny /tmp/tiny")
    assert lines[1].startswith("pto generate /tmp/tiny ")
    assert "make demo" in make and "make test" in make
    monkeypatch.setenv("PTO_THREADS", "1")
    capsys.readouterr()
    for ln in lines:
        argv = [a.replace("/tmp/tiny", str(tmp_path / "tiny")) for a in shlex.split(ln)[1:]]
        assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()[1:]  # after the checkpoint's "wrote ..." line
    times = re.compile(r"\d+\.\d+ (ms|ms/token|tokens/s)")
    assert [times.sub(r"T \1", ln) for ln in out] == [times.sub(r"T \1", ln) for ln in shown.strip().splitlines()]


DSL_DOC = README.parent / "docs" / "dsl.md"


def test_dsl_reference_example_runs_and_matches_torch_softmax():
    import torch
    m = re.search(r"```python\n(.*?)```", DSL_DOC.read_text(), re.S)
    assert m, "docs/dsl.md has no python example"
    ns: dict = {"__name__": "dsl_doc_example"}
    exec(compile(m.group(1), str(DSL_DOC), "exec"), ns)  # noqa: S102 - our own doc
    assert ns["prog"].stats.tasks == 1 and ns["prog"].stats.blocks == 3
    assert torch.allclose(ns["y"], torch.softmax(ns["x"], -1), atol=1e-6)
