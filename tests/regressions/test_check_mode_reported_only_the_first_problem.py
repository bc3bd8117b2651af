"""Regression: check mode stopped at the first race or the first bad output.

A run with a race inside one task, a missing write-after-read edge between two other
tasks and two broken outputs reported only the first race (raised while the program
ran), and a run with two broken outputs only the first output. Now the race checker
records every race, grouped by task pair (or task) and buffer, and the program raises
one RaceError at its end listing every group (the first on the first line) followed by
the output problems; without races, one UndefinedOutputError lists every output problem.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import RaceError, UndefinedOutputError

CHECK = pto.RunConfig(check=True)


@pl.jit
def many_problems(x: pl.Tensor[[8, 16], pl.FP32], kv: pl.InOut[pl.Tensor[[8, 16], pl.FP32]],
                  y: pl.Out[pl.Tensor[[8, 16], pl.FP32]], z: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    junk = pl.create_tensor([8, 16], pl.FP32)  # never written
    s = pl.create_tensor([1, 16], pl.FP32)
    for b in pl.spmd(8, name_hint="same_row"):  # 8 blocks write one row: 28 racing block pairs
        s[0:1, :] = x[b:b + 1, :]
    with pl.at(name_hint="attend"):
        y[0:8, :] = kv[0:8, :] * 2.0
    with pl.manual_scope():
        with pl.at(name_hint="cache_write"):  # overwrites what 'attend' read, no edge
            kv[0:8, :] = x[0:8, :]
    with pl.at(name_hint="junk_out"):
        z[0:4, :] = junk[0:4, :]  # undefined rows 0..4; rows 4..8 never written


def test_every_race_and_output_problem_is_reported():
    with pytest.raises(RaceError) as ei:
        many_problems.run(torch.randn(8, 16), torch.randn(8, 16), torch.zeros(8, 16), torch.zeros(8, 16),
                          config=CHECK)
    msg = str(ei.value)
    first, *rest = msg.split("\n")
    assert first.startswith("kernel many_problems: blocks 0 and 1 of task 'same_row'")
    assert first.endswith("[and 27 more overlap(s) of these accesses] [29 races in 2 places in all; every place "
                          "below]")
    assert rest[0].startswith("  - kernel many_problems: task 'attend' (#1, ") and "task 'cache_write' (#2, " in rest[0]
    assert "write-after-read hazard" in rest[0]
    assert rest[1] == "  and 2 output problem(s):"
    assert rest[2].startswith("  - kernel many_problems: output 'z' [8, 16] has 64 undefined written element(s) in "
                              "box [0:4, 0:16]")
    assert any(r.startswith("  - kernel many_problems: output 'z' [8, 16] has 64 element(s) the program never "
                            "wrote, in box [4:8, 0:16]") for r in rest)


@pl.jit
def two_bad_outputs(y: pl.Out[pl.Tensor[[4, 8], pl.FP32]], z: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    a = pl.create_tensor([4, 8], pl.FP32)
    with pl.at(name_hint="out"):
        y[0:4, :] = a[0:4, :]
        z[0:2, :] = pl.full([2, 8], pl.FP32, 1.0)


def test_every_output_problem_is_reported_without_races():
    with pytest.raises(UndefinedOutputError) as ei:
        two_bad_outputs.run(torch.zeros(4, 8), torch.zeros(4, 8), config=CHECK)
    lines = str(ei.value).split("\n")
    assert lines[0] == ("kernel two_bad_outputs: output 'y' [4, 8] has 32 undefined written element(s) in box "
                        "[0:4, 0:8] [2 output problems in all; every one below]")
    assert lines[1].startswith("  origin: allocation 'a' [4, 8] pl.FP32")
    assert lines[-1].startswith("  - kernel two_bad_outputs: output 'z' [4, 8] has 16 element(s) the program never "
                                "wrote, in box [2:4, 0:8]")
