"""Block templates: a KeyboardInterrupt (Ctrl-C) arriving while a block is being recorded was
taken for a recording that cannot go on: the program was rerun plainly from the start and, if
the interrupt did not come again, finished as if nothing had happened. It now propagates (the
program has put back its stores), and no recorder mode or trace hook is left behind."""

import sys

import pytest
import torch

import pto.language as pl
import pto.runtime as rt
from pto.runtime import Program, RunConfig
from pto.runtime import blocks as B

N = 16
_HITS = [0]


def _ctrl_c_once():
    _HITS[0] += 1
    if _HITS[0] == 1:
        raise KeyboardInterrupt  # stands for a Ctrl-C arriving while block 0 is recorded


@pl.jit
def _rows(x: pl.Tensor[[N, 16], pl.FP32], y: pl.Out[pl.Tensor[[N, 16], pl.FP32]]):
    for b in pl.spmd(N, name_hint="rows"):
        y[b:b + 1, 0:16] = x[b:b + 1, 0:16] + 1.0
        if b == 0:
            _ctrl_c_once()
    return y


@pytest.mark.parametrize("templates", [False, True])
def test_keyboard_interrupt_while_recording_propagates(monkeypatch, templates):
    monkeypatch.setattr(B, "MIN_BLOCKS", 4)
    B.reset_templates()
    _HITS[0] = 0
    x, y = torch.randn(N, 16), torch.full((N, 16), 5.0)
    try:
        with rt.block_templates(templates), pytest.raises(KeyboardInterrupt):
            Program(_rows, RunConfig()).execute((x, y), {})
        assert _HITS[0] == 1  # not rerun
        assert torch.equal(y, torch.full((N, 16), 5.0))  # nothing half-written
        assert sys.gettrace() is None
        assert not torch.overrides._get_current_function_mode_stack()
        with rt.block_templates(templates):  # the next call runs normally
            Program(_rows, RunConfig()).execute((x, y), {})
        assert torch.equal(y, x + 1.0)
    finally:
        B.reset_templates()
