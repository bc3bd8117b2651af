"""Regression: four places where the command line said something that was not so.

* ``pto check KERNEL --drop-init all``: a caught drop whose error held several output problems
  printed its first line, tagged ``[3 output problems in all; every one below]``, with nothing
  below (the table shows one line per allocation);
* ``pto check KERNEL --block-order-seed K`` without ``--block-order shuffle`` ran a plain check
  and ignored the seed (docs/cli.md: an option that would be ignored is an error);
* an unknown option after a command (``pto generate CKPT --bogus``) printed the top-level usage
  line instead of the command's;
* ``pto generate`` whose requests all stopped at their first token printed ``decode 0.00
  ms/token`` although no decode step ran.
"""

import json

import pytest

from pto.cli import main
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint


def test_drop_init_sweep_detail_says_it_is_the_first_of_several(capsys):
    assert main(["check", "hc_pre", "--preset", "tiny", "--mode", "decode", "--drop-init", "all"]) == 0
    out = capsys.readouterr().out
    assert "every one below" not in out
    assert "mixes_raw: output 'x_mixed' [8, 128] has 1024 undefined written element(s)" in out
    assert "[the first of 3 output problems]" in out
    assert main(["check", "hc_pre", "--preset", "tiny", "--mode", "decode", "--drop-init", "all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["detail"].endswith("[the first of 3 output problems]") for a in doc["allocations"]] == [True]


@pytest.mark.parametrize("extra, got", [([], "no --block-order"), (["--block-order", "reverse"], "--block-order reverse")])
def test_block_order_seed_needs_the_shuffle(capsys, extra, got):
    assert main(["check", "example_splitk_matmul", "--block-order-seed", "3", *extra]) == 2
    err = capsys.readouterr().err
    assert f"error: --block-order-seed seeds the --block-order shuffle; it needs --block-order shuffle (got {got})" in err


def test_unknown_option_gets_the_commands_usage(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["generate", "some_dir", "--input-ids", "5", "--bogus"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pto generate ") and "pto generate: error: unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):
        main(["--bogus"])
    assert "pto: error: unrecognized arguments: --bogus" in capsys.readouterr().err


def test_generate_without_a_decode_step_prints_no_rate(tmp_path, capsys):
    ckpt = write_tiny_checkpoint(tmp_path / "t", seed=0)
    assert main(["generate", str(ckpt), "--input-ids", "5 17 300", "--max-new-tokens", "1", "--backend", "golden"]) == 0
    out = capsys.readouterr().out
    assert "no decode step" in out and "ms/token" not in out
    assert "(golden FP32 forward)" in out and "weights" not in out.splitlines()[-1]
