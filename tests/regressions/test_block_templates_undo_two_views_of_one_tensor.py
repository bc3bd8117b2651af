"""Block templates and the undo log: two Out arguments that are disjoint views of one caller
tensor are written in place; a templated (or batched) block's store into the first one was
saved through the buffer of the *last* argument on that storage (the recorder mapped a storage
to one argument), so it saved the wrong bytes (or nothing, once that buffer was saved whole)
and a program raising after the stores left 30 of 32 rows of the first argument written.
Now the argument whose bytes hold the store is the one that saves it."""

import pytest
import torch

import pto.language as pl
import pto.runtime as rt
from pto.runtime import Program, RunConfig
from pto.runtime import blocks as B

N = 1024


@pl.jit
def _writes_a(x: pl.Tensor[[N, 16], pl.FP32], a: pl.Out[pl.Tensor[[N, 16], pl.FP32]],
              b: pl.Out[pl.Tensor[[2, 16], pl.FP32]], fail: pl.Scalar[pl.INT32]):
    for i in pl.spmd(32, name_hint="wa"):
        a[i:i + 1, 0:16] = x[i:i + 1, 0:16] + 1.0
    if fail:
        raise ValueError("after the stores")


@pytest.mark.parametrize("batch", [True, False])
def test_error_after_templated_stores_into_a_view_sharing_storage_restores_it(monkeypatch, batch):
    monkeypatch.setattr(B, "_BATCH", [batch])
    B.reset_templates()
    x = torch.randn(N, 16, generator=torch.Generator().manual_seed(0))
    try:
        base = torch.zeros(N * 16 + 32)
        a, b = base[:N * 16].view(N, 16), base[N * 16:].view(2, 16)
        with rt.block_templates(True), pytest.raises(ValueError, match="after the stores"):
            Program(_writes_a, RunConfig()).execute((x, a, b, 1), {})
        info = B.template_info()
        assert info["templated"] == 30 and info["batched"] == (30 if batch else 0)  # the path under test ran
        assert torch.equal(base, torch.zeros(N * 16 + 32))
        with rt.block_templates(True):  # and a run that succeeds writes rows 0..31 of a only
            Program(_writes_a, RunConfig()).execute((x, a, b, 0), {})
        assert torch.equal(a[:32], x[:32] + 1.0) and not a[32:].any() and not b.any()
    finally:
        B.reset_templates()
