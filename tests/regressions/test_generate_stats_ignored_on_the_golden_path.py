"""Regression: ``pto generate --stats`` on the golden path (``--backend golden``; before the
bf16 kernels also plain ``--weights bf16``) generated and printed no statistics, exit 0: the option was silently
dropped (the golden forward runs no kernel programs). It is now bad input, exit 2 before any
work, like ``--check`` there.
"""

import pytest

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("stats") / "tiny", seed=0)


@pytest.mark.parametrize("flags", [["--backend", "golden"], ["--weights", "int8", "--backend", "golden"]])
def test_stats_on_the_golden_path_exits_2(tiny, capsys, flags):
    assert main(["generate", str(tiny), "--input-ids", "5 6", "--stats", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: --stats reports the kernel programs: it needs the kernel path (not --backend golden)\n"
