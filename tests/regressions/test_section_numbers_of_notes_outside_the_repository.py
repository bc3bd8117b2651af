"""Regression: docs/distributed.md ("`moe_ep`, B.23"), KernelCase descriptions and module
docstrings cited kernels by the section numbers of notes kept outside the repository
("B.13", "A.3's commit"); a user cannot look them up. They now name the public pypto-lib
file. (test_docs_standalone.py catches the notes' file names, not their section numbers.)
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"\b[AB]\.[0-9]{1,2}\b(?!\.?[0-9])")


def test_no_section_number_of_outside_notes():
    files = subprocess.run(["git", "ls-files", "README.md", "docs", "src", "tests", "examples", "benchmarks"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    me = Path(__file__).resolve()
    hits = []
    for name in files:
        path = ROOT / name
        if path.resolve() == me or not path.is_file() or path.suffix not in (".py", ".md"):
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SECTION.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert not hits, "section numbers of notes outside the repository:\n" + "\n".join(hits[:30])


def test_descriptions_name_the_pypto_lib_file():
    from pto.golden import get_case
    import pto.models.deepseek_v4  # noqa: F401 - fills the registry
    assert get_case("decode_attention_hca").description.endswith("pypto-lib's decode_attention_hca.py")
    assert get_case("prefill_attention_swa").description.endswith("pypto-lib's prefill_attention_swa.py")
