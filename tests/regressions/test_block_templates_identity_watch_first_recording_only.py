"""Block templates examined code for ``type``/``id``/``is`` on a task site's first recording
only, and never the frame running the block loop: a body that tells the block index from a
number on a path block 0 does not take ran from templates with the symbol's answer (212 wrong
rows of 256). Every recording is watched now, and so is the loop's own frame."""

import pytest
import torch

import pto.language as pl
import pto.runtime as rt
from pto.runtime.blocks import reset_templates, template_info

N = 64


@pl.jit
def in_loop(x: pl.Tensor[[N * 4, 16], pl.FP32], y: pl.Out[pl.Tensor[[N * 4, 16], pl.FP32]]):
    for b in pl.spmd(N, name_hint="in_loop"):
        t = x[b * 4:b * 4 + 4, 0:16]
        if b >= 10:  # the path block 0's recording does not take
            t = t * (1.0 if type(b) is int else 2.0)
        y[b * 4:b * 4 + 4, 0:16] = t
    return y


def _scale(b):
    return 1.0 if type(b) is int else 2.0


@pl.jit
def in_callee(x: pl.Tensor[[N * 4, 16], pl.FP32], y: pl.Out[pl.Tensor[[N * 4, 16], pl.FP32]]):
    for b in pl.spmd(N, name_hint="in_callee"):
        t = x[b * 4:b * 4 + 4, 0:16]
        if b >= 10:  # reached first by a later recording (the variant of the diverged block 10)
            t = t * _scale(b)
        y[b * 4:b * 4 + 4, 0:16] = t
    return y


def _both(kernel):
    x = torch.randn(N * 4, 16, generator=torch.Generator().manual_seed(0))
    outs = []
    for on in (False, True):
        y = torch.zeros(N * 4, 16)
        with rt.block_templates(on):
            kernel.run(x, y)
        outs.append(y)
    return x, outs


@pytest.mark.parametrize("kernel", [in_loop, in_callee], ids=["loop_frame", "later_recording"])
def test_identity_test_on_a_later_path_runs_plainly(kernel):
    was = rt.program_cache_enabled()
    rt.set_program_cache(False)
    reset_templates()
    try:
        x, (off, on) = _both(kernel)
    finally:
        rt.set_program_cache(was)
    assert torch.equal(off, x) and torch.equal(on, x)  # type(b) is int in a plain run: scale 1.0
    assert template_info()["restarts"] == 1  # a recording saw the code and gave up: rerun plainly
