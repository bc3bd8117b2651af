"""Task footprints and buffer ids, built on first access from the task's
records: the same order (buffers by first use, then read / write / atomic add)
whether a one-block task kept its raw records or had them grouped."""

import torch

import pto.language as pl
from pto.runtime import RunConfig


@pl.jit
def _kernel(x: pl.Tensor[[16, 16], pl.FP32], z: pl.Tensor[[16, 16], pl.FP32],
            y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="raw"):  # one box per buffer and kind
        t = x[0:8, 0:16]
        y[0:8, 0:16] = t
        u = z[8:16, 0:16]
        pl.assemble(y, u, [8, 0], atomic=pl.AtomicType.Add)
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="grouped"):  # two reads of x: grouped, coalesced
        a = x[0:8, 0:16]
        b = x[8:16, 0:16]
        y[0:8, 0:16] = a + b
        u = z[0:4, 0:16]
    return y


def test_footprints_of_raw_and_grouped_records():
    p = _kernel.run(torch.randn(16, 16), torch.randn(16, 16), torch.zeros(16, 16), config=RunConfig())
    raw, grouped = p.graph.tasks
    assert [str(f) for f in p.footprints(raw)] == [
        "read x[0:8, 0:16]", "write y[0:8, 0:16]", "atomic_add y[8:16, 0:16]", "read z[8:16, 0:16]"]
    assert [str(f) for f in p.footprints(grouped)] == [
        "read x[0:16, 0:16]", "write y[0:8, 0:16]", "read z[0:4, 0:16]"]
    ids = {b.name: b.id for b in p.buffers}
    assert raw.buffers == grouped.buffers == {ids["x"], ids["y"], ids["z"]}
    assert raw.preds == set() and grouped.preds == {raw.id}
