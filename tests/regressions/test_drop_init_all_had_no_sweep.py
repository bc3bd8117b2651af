"""Regression: there was no way to try every init_value of a run at once.

``pto check KERNEL --drop-init all`` took ``all`` for an allocation name (a ConfigError:
it matched nothing), and the Python API for listing a program's allocations was not
documented. Now ``--drop-init all`` drops each init_value of the run in turn and prints
a table: allocation (name, file:line), caught or not, and by which error;
``Program.allocations()`` lists the scratch allocations and
``pto.golden.mutation.drop_init_sweep`` runs the sweep.
"""

import torch

import pto
import pto.language as pl
from pto.cli import main
from pto.golden.mutation import drop_init_sweep, init_allocations


@pl.jit
def two_inits(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)  # load-bearing: atomically added onto
    spare = pl.create_tensor([8, 16], pl.FP32, init_value=0)  # never read
    for b in pl.spmd(2, name_hint="accumulate"):
        pl.assemble(acc, x[0:8, :], [0, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="out"):
        y[0:8, :] = acc[0:8, :]
    with pl.at(name_hint="touch"):
        spare[0:1, :] = x[0:1, :]


def test_python_api_lists_allocations_and_sweeps():
    x = torch.randn(8, 16)
    prog = two_inits.run(x, torch.zeros(8, 16), config=pto.RunConfig(check=True))
    allocs = prog.allocations()
    assert [(b.name, b.shape, b.init_value) for b in allocs] == [("acc", (8, 16), 0), ("spare", (8, 16), 0)]
    assert [a[0] for a in init_allocations(prog)] == ["acc", "spare"]
    rows = drop_init_sweep(lambda cfg: two_inits.run(x, torch.zeros(8, 16), config=cfg), prog)
    assert [(r.name, r.caught, r.by) for r in rows] == [("acc", True, "UndefinedOutputError"), ("spare", False, "")]


def test_cli_drop_init_all_prints_the_table(capsys):
    assert main(["check", f"{__file__}:two_inits", "--drop-init", "all"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "│" in ln]
    acc = next(ln for ln in lines if " acc " in ln)
    spare = next(ln for ln in lines if " spare " in ln)
    assert "test_drop_init_all_had_no_sweep.py:" in acc and " yes " in acc and "UndefinedOutputError" in acc
    assert " no " in spare
    assert "1 of 2 init_value(s) load-bearing (dropping them is caught); 1 not caught" in out
    assert "  acc: output 'y' [8, 16] has 128 undefined written element(s) in box [0:8, 0:16]" in out


def test_cli_drop_init_all_on_a_registry_kernel(capsys):
    assert main(["check", "hc_pre", "--preset", "tiny", "--mode", "decode", "--drop-init", "all"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if " mixes_raw " in ln)
    assert "hc_pre.py:" in row and " yes " in row and "UndefinedOutputError" in row
    assert main(["check", "hc_pre", "--preset", "tiny", "--drop-init", "all", "--drop-init", "mixes_raw"]) == 2
