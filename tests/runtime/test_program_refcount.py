"""A finished plain run has no Program <-> Buffer reference cycle (runtime/program.py,
``_EndedProgram``): the Program is freed by refcount as soon as the caller drops it, with the
cyclic GC off; its buffers' ``program`` is the ended-program sentinel."""

import gc
import weakref

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError
from pto.runtime.program import _ENDED


@pl.jit
def _k(a: pl.Tensor[[8, 64], pl.FP32], c: pl.Out[pl.Tensor[[8, 64], pl.FP32]]):
    s = pl.create_tensor([8, 64], pl.FP32, init_value=0)
    for b in pl.spmd(2, name_hint="add"):
        t = a[b * 4:b * 4 + 4, 0:64] + s[b * 4:b * 4 + 4, 0:64]
        c[b * 4:b * 4 + 4, 0:64] = t
    return c


@pytest.mark.parametrize("fail", [False, True])
def test_plain_program_is_freed_by_refcount(fail):
    a, c = torch.randn(8, 64), torch.zeros(8, 64)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        if fail:
            with pytest.raises(pto.BindError):
                _k.run(a, torch.zeros(8, 63))
        prog = _k.run(a, c)
        assert torch.equal(c, a) and prog.stats.tasks == 1 and prog.stats.edges == 0
        assert all(b.program is _ENDED for b in prog.buffers)
        ref = weakref.ref(prog)
        del prog
        assert ref() is None
    finally:
        if was:
            gc.enable()


def test_ended_program_sentinel_names_the_misuse():
    with pytest.raises(DslError, match="program that has ended"):
        _ENDED.orchestration_read(None, None)
    assert _ENDED.cur_block is None and _ENDED.sanitizer is None
