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


def test_readme_opens_with_the_two_make_commands():
    head = README.read_text().split("```")[1]
    assert "make demo" in head and "make test" in head


DSL_DOC = README.parent / "docs" / "dsl.md"


def test_dsl_reference_example_runs_and_matches_torch_softmax():
    import torch
    m = re.search(r"```python\n(.*?)```", DSL_DOC.read_text(), re.S)
    assert m, "docs/dsl.md has no python example"
    ns: dict = {"__name__": "dsl_doc_example"}
    exec(compile(m.group(1), str(DSL_DOC), "exec"), ns)  # noqa: S102 - our own doc
    assert ns["prog"].stats.tasks == 1 and ns["prog"].stats.blocks == 3
    assert torch.allclose(ns["y"], torch.softmax(ns["x"], -1), atol=1e-6)
