"""Graph-only mode: a scalar read of an unknown element of a buffer with real storage (an INT32
scratch tensor, kept by runtime/graph_only.BufferState) named the runtime's own line as the
read site ("read at .../pto/runtime/graph_only.py:166") instead of the kernel's pl.read line.
The GraphOnlyError must name the kernel line of the read, in a block and in orchestration, as
it does for a read of a shape-only tensor."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import GraphOnlyError

GO = pto.RunConfig(execute=False)


@pl.jit
def _block_read(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    sc = pl.create_tensor([4, 8], pl.INT32, name="sc")
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
        sc[0:4, 0:8] = pl.cast(x[0:4, 0:8], pl.INT32)  # float data: unknown in graph-only mode
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="r"):
        r = pl.read(sc, [1, 2])  # READ-IN-BLOCK
        y[r:r + 1, 0:8] = x[0:1, 0:8]
    return y


@pl.jit
def _orch_read(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    sc = pl.create_tensor([4, 8], pl.INT32, name="sc")
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="w"):
        sc[0:4, 0:8] = pl.cast(x[0:4, 0:8], pl.INT32)
    r = pl.read(sc, [3, 1])  # READ-IN-ORCHESTRATION
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="u"):
        y[r:r + 1, 0:8] = x[0:1, 0:8]
    return y


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


@pytest.mark.parametrize("kernel,marker,elem", [(_block_read, "# READ-IN-BLOCK", "sc[1, 2]"),
                                                (_orch_read, "# READ-IN-ORCHESTRATION", "sc[3, 1]")])
def test_unknown_element_read_names_the_kernel_line(kernel, marker, elem):
    with pytest.raises(GraphOnlyError) as ei:
        kernel.run(torch.zeros(4, 8, device="meta"), torch.zeros(4, 8, device="meta"), config=GO)
    msg = str(ei.value)
    assert "pto/runtime/" not in msg, msg
    assert f"{elem} (read at tests/regressions/test_graph_only_read_site_named_the_runtime.py:{_line(marker)})" in msg, msg
