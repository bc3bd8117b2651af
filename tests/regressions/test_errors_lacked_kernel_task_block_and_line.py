"""Regression: errors raised inside a block did not say where.

A tile-op error (``pl.add`` of an [8, 16] and a [4, 16] tile) read only
``pl.add: shape mismatch [8, 16] vs [4, 16] ...``, and an exception raised by kernel
code inside a block reached the user (and the CLI's one error line) with no kernel,
task, block or source line; paths in messages were absolute. Now a PtoError leaving a
program names the kernel, the task and block it was raised in and the kernel-source
``file:line`` (relative to the current directory); any other exception keeps its type
and message and carries that context as a note, which the CLI prints.
"""

import inspect

import pytest
import torch

import pto.language as pl
from pto.cli import main
from pto.errors import DslError
from pto.language._ctx import rel_path


@pl.jit
def add_mismatch(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    for b in pl.spmd(2, name_hint="adder"):
        a = x[b * 8:(b + 1) * 8, :]
        y[b * 8:(b + 1) * 8, :] = pl.add(a, x[0:4, :]) if b == 1 else a  # LINE-ADD


@pl.jit
def user_raises(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    for b in pl.spmd(2, name_hint="user"):
        a = x[b * 8:(b + 1) * 8, :]
        if b == 1:
            raise ValueError("row block 1 is not supported")  # LINE-RAISE
        y[b * 8:(b + 1) * 8, :] = a


def _site(tag: str) -> str:
    lines, _ = inspect.findsource(add_mismatch.fn)
    n = next(i for i, ln in enumerate(lines) if f"# {tag}" in ln) + 1
    return f"{rel_path(__file__)}:{n}"


def test_tile_op_error_names_kernel_task_block_and_relative_line():
    with pytest.raises(DslError) as ei:
        add_mismatch(torch.randn(16, 16), torch.zeros(16, 16))
    assert str(ei.value).startswith(f"kernel add_mismatch, task 'adder' (#0) block 1, at {_site('LINE-ADD')}: "
                                    "pl.add: shape mismatch [8, 16] vs [4, 16]")
    assert not _site("LINE-ADD").startswith("/")  # the tests run from the repository root


def test_user_exception_keeps_its_type_and_gets_the_context_as_a_note():
    with pytest.raises(ValueError) as ei:
        user_raises(torch.randn(16, 16), torch.zeros(16, 16))
    assert str(ei.value) == "row block 1 is not supported"
    assert ei.value.__notes__ == [f"raised in kernel user_raises, task 'user' (#0) block 1, at {_site('LINE-RAISE')}"]


def test_cli_error_line_names_where(capsys):
    assert main(["run", f"{__file__}:user_raises"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ValueError: row block 1 is not supported (raised in kernel user_raises, "
                             f"task 'user' (#0) block 1, at {_site('LINE-RAISE')})")
    assert main(["run", f"{__file__}:add_mismatch"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: DslError: kernel add_mismatch, task 'adder' (#0) block 1, at {_site('LINE-ADD')}: ")
