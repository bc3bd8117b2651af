"""The repository stands alone: README, docs/, docstrings, tests, examples and benchmarks
cite public sources (pypto-lib files, pypto's docs, the paper, transformers' modules) or the
repository's own docs, never notes kept outside it."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bnotes/|\bDESIGN(\.md)?\b|v4flash-kernels\.md|dsv4-math\.md|"
                     r"dsl-api\.md|golden-harness\.md|checkpoint-layout\.md|pypto-lib-files\.md|upstream\.md")


def test_no_reference_to_notes_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "README.md", "docs", "src", "tests", "examples", "benchmarks",
                            "Makefile", "pyproject.toml"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    me = Path(__file__).resolve()
    hits = []
    for name in files:
        path = ROOT / name
        if path.resolve() == me or not path.is_file() or path.suffix not in (".py", ".md", ".toml", ""):
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert not hits, "references to notes outside the repository:\n" + "\n".join(hits[:30])
