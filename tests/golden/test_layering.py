"""The golden layer never imports the model layer (imports run language -> runtime ->
golden -> models -> cli): importing ``pto.golden`` and asking its registry for cases
loads no kernel module; the CLI loads them."""

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_golden_registry_imports_no_model_module():
    code = ("import sys, pto.golden as g\n"
            "g.all_cases()\n"
            "try:\n    g.get_case('gate')\nexcept Exception as e:\n    print(type(e).__name__)\n"
            "print(sorted(m for m in sys.modules if m.startswith('pto.models')))")
    lines = _run(code).splitlines()
    assert lines == ["ConfigError", "[]"]


def test_cli_loads_the_model_kernels():
    code = ("import sys, pto.cli as c, pto.golden as g\n"
            "c.load_kernels()\n"
            "print(g.get_case('gate').name, 'pto.models.deepseek_v4' in sys.modules)")
    assert _run(code) == "gate True"
