"""Install: ``make demo`` installs the package with its runtime dependencies only, and every
declared dependency is used; transformers and the other test-only packages come with the
``test`` / ``parity`` extras (``make test``)."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# distribution name -> module it provides
MODULE = {"torch": "torch", "numpy": "numpy", "safetensors": "safetensors", "rich": "rich", "pytest": "pytest",
          "hypothesis": "hypothesis", "pydot": "pydot", "transformers": "transformers",
          "tokenizers": "tokenizers"}


def _deps(items) -> list[str]:
    return [re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in items]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imports(folder: Path, module: str) -> list[Path]:
    pat = re.compile(rf"^\s*(import {module}\b|from {module}[. ])", re.M)
    return [p for p in folder.rglob("*.py") if pat.search(p.read_text())] + \
        [p for p in folder.rglob("*.py") if f"self.data.{module}()" in p.read_text()]


def test_every_runtime_dependency_is_used_by_the_package():
    runtime = _deps(_project()["dependencies"])
    assert set(runtime) == {"torch", "numpy", "safetensors", "rich"}
    for dist in runtime:
        assert _imports(ROOT / "src" / "pto", MODULE[dist]), f"{dist} is declared but src/pto never uses it"


def test_every_extra_is_used_by_the_tests():
    extras = _project()["optional-dependencies"]
    assert "transformers" not in _deps(_project()["dependencies"])
    for dist in _deps(extras["test"] + extras["parity"]):
        if dist == "pytest":
            continue
        assert _imports(ROOT / "tests", MODULE[dist]) or any(
            f'importorskip("{MODULE[dist]}")' in p.read_text() for p in (ROOT / "tests").rglob("*.py")), dist


def test_the_text_extra_is_used_by_the_package():
    for dist in _deps(_project()["optional-dependencies"]["text"]):  # pto generate --prompt
        assert _imports(ROOT / "src" / "pto", MODULE[dist]), f"{dist} is declared but src/pto never uses it"


def test_the_demo_path_does_not_import_test_only_packages():
    # (pydot is left out: torch.fx imports it when it is installed)
    code = ("import sys, pto.cli as c\n"
            "c.load_kernels()\n"
            "import pto.models.deepseek_v4.generate, pto.models.deepseek_v4.checkpoint, pto.models.deepseek_v4.layer\n"
            "print(sorted(m for m in ('transformers', 'pytest', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_make_demo_installs_no_extra():
    make = (ROOT / "Makefile").read_text()
    stamp = make.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "pip install -q -e .\n" in stamp + "\n" and "[" not in stamp
