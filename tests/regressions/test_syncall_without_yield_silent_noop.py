"""Regression: ``pl.system.syncall()`` called in a block that is not a step of a phased
(generator) body, e.g. in a ``for b in pl.spmd(n)`` loop, was silently a no-op, so the second
phase read data the other block had not written yet (breaker finding M5). It is now a DslError
explaining the ``yield pl.system.syncall()`` decorator form; a phased body that calls it without
``yield`` is one too.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError
from pto.runtime import RunConfig


@pl.jit
def loop_form(x: pl.Tensor[[2, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    t = pl.create_tensor([2, 128], pl.FP32, init_value=0)
    for b in pl.spmd(2, name_hint="two_phase"):
        t[b:b + 1, :] = x[b:b + 1, :]
        pl.system.syncall()
        y[b:b + 1, :] = t[1 - b:2 - b, :]


@pl.jit
def at_form(x: pl.Tensor[[2, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    with pl.at(name_hint="single"):
        pl.system.syncall()


@pl.jit
def plain_decorator(x: pl.Tensor[[2, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    @pl.spmd(2, name_hint="not_a_generator")
    def body(b):
        pl.system.syncall()


@pl.jit
def phased_without_yield(x: pl.Tensor[[2, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    t = pl.create_tensor([2, 128], pl.FP32, init_value=0)

    @pl.spmd(2, name_hint="forgot_yield")
    def body(b):
        t[b:b + 1, :] = x[b:b + 1, :]
        pl.system.syncall()
        yield pl.system.syncall()
        y[b:b + 1, :] = t[1 - b:2 - b, :]


@pl.jit
def phased(x: pl.Tensor[[2, 128], pl.FP32], y: pl.Out[pl.Tensor[[2, 128], pl.FP32]]):
    t = pl.create_tensor([2, 128], pl.FP32, init_value=0)

    @pl.spmd(2, name_hint="phased")
    def body(b):
        t[b:b + 1, :] = x[b:b + 1, :]
        yield pl.system.syncall()
        y[b:b + 1, :] = t[1 - b:2 - b, :]


@pytest.mark.parametrize("kernel,task", [(loop_form, "two_phase"), (at_form, "single"),
                                         (plain_decorator, "not_a_generator")])
@pytest.mark.parametrize("check", [False, True])
def test_syncall_outside_a_phased_body_is_a_dsl_error(kernel, task, check):
    with pytest.raises(DslError, match=rf"pl.system.syncall\(\) at .*\(task '{task}' block 0\) is not a barrier "
                                       r"here: it only works as `yield pl.system.syncall\(\)` inside a generator "
                                       r"body run with the decorator form `@pl.spmd\(n\)`"):
        kernel.run(torch.randn(2, 128), torch.zeros(2, 128), config=RunConfig(check=check))


def test_syncall_without_yield_in_a_phased_body_is_a_dsl_error():
    with pytest.raises(DslError, match=r"task 'forgot_yield' block 0: pl.system.syncall\(\) was called without "
                                       r"`yield` in phase 0"):
        phased_without_yield(torch.randn(2, 128), torch.zeros(2, 128))


def test_yielded_syncall_is_a_barrier():
    x = torch.randn(2, 128)
    y = torch.zeros(2, 128)
    p = phased.run(x, y, config=RunConfig(check=True))
    assert torch.equal(y, x.flip(0))
    assert p.stats.tasks == 1
