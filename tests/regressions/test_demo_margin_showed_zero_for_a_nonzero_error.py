"""Regression: the demo table printed margins with two decimals only, so a nonzero margin below
0.005 read ``0.00`` like an exact match (decode_attention_csa: error 8.94e-07, tolerance 1.10e-03,
margin 8.1e-04 shown as 0.00), and a margin just past 1 read ``1.00`` like a pass at the limit.
Now the first is in two significant digits and the second ``>1.00``; other margins unchanged."""

import re

import pytest

from pto import cli


@pytest.mark.parametrize("m,shown", [
    (None, "-"), (0.0, "0.00"), (8.127e-4, "8.1e-04"), (0.0049, "4.9e-03"), (0.005, "0.01"), (0.22, "0.22"),
    (0.999, "1.00"), (1.0, "1.00"), (1.004, ">1.00"), (1.2, "1.20"), (float("inf"), "inf")])
def test_fmt_margin(m, shown):
    assert cli._fmt_margin(m) == shown


def test_demo_csa_row_margin_matches_error_over_tolerance(capsys):
    """The row of the report: the margin column is error / tolerance of the same row, and a
    nonzero error never reads 0.00 (it did: 8.94e-07 / 1.10e-03 printed 0.00)."""
    code = cli.main(["demo", "--only", "decode_attention_csa"])
    out = capsys.readouterr().out
    assert code == 0
    row = next(line for line in out.splitlines() if line.strip().startswith("decode_attention_csa"))
    m = re.search(r"\s(\S+)\s+(\S+)\s+(\S+)\s+PASS\s", row)
    assert m, row
    error, tol, margin = m.groups()
    if float(error) != 0:
        assert margin != "0.00", row
        assert abs(float(margin.lstrip(">")) - float(error) / float(tol)) <= 0.02 * float(error) / float(tol), row
