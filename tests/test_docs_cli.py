"""docs/cli.md documents every command and flag, and its output samples are the real output.

Every fenced ``text`` block of docs/cli.md whose first line is ``$ pto ARGS`` is a sample: the
test runs ``pto ARGS`` (all samples in document order, in one temporary directory, so that a
sample may use a file an earlier one wrote) and compares its stdout with the rest of the block
after normalising what depends on the machine: wall times (``12.3 ms``, ``0.14 s``, the
kernel / golden columns of ``pto demo``, the wall ms column of ``pto generate --stats``, the
``*_ms`` / ``*_s`` keys of JSON documents), the error and tolerance figures of ``pto demo``'s
rows (a float kernel's rounding error against its golden moves with the CPU's vector math: the
softmax example's 2.38e-07 on one machine is 1.79e-07 on another) and table widths. ``python tests/test_docs_cli.py --update`` rewrites the samples from the real
output.
"""

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cli.md"
BLOCK = re.compile(r"```text\n\$ pto (?P<args>[^\n]*)\n(?P<out>.*?)```", re.S)

_TIME_UNIT = re.compile(r"\b\d+(?:\.\d+)? ?(ms/token|tokens/s|ms|s)\b")
_TIME_KEY = re.compile(r'("(?:wall_ms|kernel_ms|golden_ms|wall_s|prefill_s|decode_ms_per_token|tokens_per_s)": )'
                       r'[-0-9.e]+')
_DEMO_TIMES = re.compile(r"(PASS|FAIL)( +)[0-9.]+( +)[0-9.]+ *$", re.M)
_PROGRAM_WALL = re.compile(r"^(│ *\w+_fwd *│.*│ *)[0-9.]+( *│) *$", re.M)  # generate --stats: wall ms
_SCI = re.compile(r"\b\d\.\d+e[-+]\d+\b")
_DEMO_ROW = re.compile(r"^.*\b(?:PASS|FAIL)\b.*$", re.M)
_RULE = re.compile(r"[─━]+")
_SPACES = re.compile(r"[ \t]+")


def normalise(text: str) -> str:
    """``text`` with machine-dependent figures replaced by ``T`` and table padding collapsed."""
    text = _TIME_KEY.sub(r"\1T", text)
    text = _TIME_UNIT.sub(r"T \1", text)
    text = _DEMO_TIMES.sub(r"\1 T T", text)
    text = _PROGRAM_WALL.sub(r"\1T\2", text)
    text = _DEMO_ROW.sub(lambda m: _SCI.sub("E", m.group(0)), text)  # demo rows: error, tolerance
    text = _RULE.sub("─", text)
    lines = [_SPACES.sub(" ", ln).strip() for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if ln)


def samples() -> list[tuple[str, str]]:
    """``(args, documented output)`` of every sample block, in document order."""
    return [(m["args"], m["out"]) for m in BLOCK.finditer(DOC.read_text())]


def run_pto(args: str, capsys) -> str:
    """stdout of ``pto ARGS`` (split like a shell would, without quotes inside words)."""
    import shlex

    from pto import cli
    capsys.readouterr()
    cli.main(shlex.split(args))
    return capsys.readouterr().out


def test_every_command_and_flag_is_documented():
    from pto import cli
    text = DOC.read_text()
    sections = {m["name"]: m["body"] for m in re.finditer(r"^## `pto (?P<name>[a-z]+)[^\n]*\n(?P<body>.*?)(?=^## |\Z)",
                                                            text, re.S | re.M)}
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    target = re.search(r"^## Target options[^\n]*\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    assert set(sections) == set(sub.choices), "one '## `pto NAME`' section per command"
    for name, p in sub.choices.items():
        # a command that takes a target points at the shared table of target options
        where = sections[name] + (target if "target options" in sections[name] else "")
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in ("--help", "--version"):
                    assert f"`{opt}" in where, f"pto {name} {opt} is not documented in docs/cli.md"


def test_samples_are_the_real_output(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PTO_THREADS", "1")
    got = samples()
    assert len(got) >= 10
    for args, documented in got:
        real = run_pto(args, capsys)
        assert normalise(real) == normalise(documented), f"docs/cli.md sample `pto {args}` differs from the real output"


def _update() -> None:
    """Rewrite every sample block of docs/cli.md with the real output."""
    import contextlib
    import io
    import tempfile

    from pto import cli
    text = DOC.read_text()
    out = []
    pos = 0
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for m in BLOCK.finditer(text):
                buf = io.StringIO()
                import shlex
                with contextlib.redirect_stdout(buf):
                    cli.main(shlex.split(m["args"]))
                out.append(text[pos:m.start()])
                real = "\n".join(ln.rstrip() for ln in buf.getvalue().rstrip().splitlines())
                out.append(f"```text\n$ pto {m['args']}\n{real}\n```")
                pos = m.end()
        finally:
            os.chdir(cwd)
    out.append(text[pos:])
    DOC.write_text("".join(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        sys.path.insert(0, str(ROOT / "src"))
        import pto.models.deepseek_v4  # noqa: F401 - the kernel registry (as tests/conftest.py does)
        _update()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
