"""Regression: a PtoError caught by kernel code inside a block did not fail the program.

A block that wrapped a bad tile op (``pl.add`` of an [8, 16] and a [4, 16] tile) or an
undefined-scalar branch in ``try/except`` ran to its end and the program succeeded,
although docs/dsl.md promises that such errors fail it. Now the task ends with an error
of the same class naming the kernel, the task, the block and the line that raised it;
the caught error is its ``__cause__``.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError, PtoError, UndefinedValueError


@pl.jit
def tolerant_add(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    for b in pl.spmd(2, name_hint="tolerant"):
        a = x[b * 8:(b + 1) * 8, :]
        if b == 1:
            try:
                a = pl.add(a, x[0:4, :])  # shape mismatch: a DslError
            except DslError:
                pass
        y[b * 8:(b + 1) * 8, :] = a


@pl.jit
def tolerant_branch(y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
    flag = pl.create_tensor([1, 8], pl.INT32)  # never written: undefined
    with pl.at(name_hint="branch"):
        v = 0
        try:
            if pl.read(flag, [0, 0]):  # an undefined branch condition in check mode
                v = 1
        except PtoError:
            v = 2
        y[0:1, :] = pl.full([1, 8], pl.INT32, v)


def test_caught_tile_op_error_fails_the_program():
    y = torch.zeros(16, 16)
    with pytest.raises(DslError) as ei:
        tolerant_add.run(torch.randn(16, 16), y)
    msg = str(ei.value)
    assert msg.startswith("kernel tolerant_add: task 'tolerant' (#0, ")
    assert "block 1: DslError raised at " in msg and "caught by kernel code" in msg
    assert "pl.add: shape mismatch [8, 16] vs [4, 16]" in msg
    assert isinstance(ei.value.__cause__, DslError)
    assert bool((y == 0).all())  # nothing written back


def test_caught_undefined_value_error_fails_the_check_mode_run():
    with pytest.raises(UndefinedValueError, match=r"task 'branch' \(#0, .*\) block 0: UndefinedValueError raised"):
        tolerant_branch.run(torch.zeros(1, 8, dtype=torch.int32), config=pto.RunConfig(check=True))


def test_a_block_without_errors_still_passes():
    x = torch.randn(16, 16)
    y = torch.zeros(16, 16)

    @pl.jit
    def fine(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
        for b in pl.spmd(2, name_hint="copy"):
            y[b * 8:(b + 1) * 8, :] = x[b * 8:(b + 1) * 8, :]

    fine.run(x, y, config=pto.RunConfig(check=True))
    assert torch.equal(x, y)
