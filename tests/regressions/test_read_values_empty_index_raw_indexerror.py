"""pl.read_values with an empty index list raised a raw IndexError (``idx[-1]`` of ``[]``), and a
source that is neither a GM tensor nor a tile passed unnoticed when the count was 0. Both are
bad input: a DslError naming pl.read_values, inside a block and in orchestration, as pl.read
raises for an index of the wrong rank."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import DslError


def _kernel(where: str, call):
    @pl.jit
    def k(x: pl.Tensor[[2, 8], pl.INT32], y: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        if where == "orchestration":
            call(x)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="rd"):
            if where == "block":
                call(x)
            if where == "tile":
                call(x[0:2, 0:8])
            y[0:1, 0:8] = pl.full([1, 8], pl.INT32, 0)
        return y
    return k


@pytest.mark.parametrize("where", ["block", "orchestration", "tile"])
@pytest.mark.parametrize("n", [0, 3])
def test_empty_index_is_a_dsl_error(where, n):
    k = _kernel(where, lambda src: pl.read_values(src, [], n))
    with pytest.raises(DslError, match=r"pl\.read_values: .*index"):
        k.run(torch.zeros(2, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32),
              config=pto.RunConfig())


@pytest.mark.parametrize("n", [0, 2])
def test_source_not_a_tensor_or_tile_is_a_dsl_error(n):
    k = _kernel("block", lambda src: pl.read_values([1, 2, 3], [0], n))
    with pytest.raises(DslError, match=r"pl\.read_values: expected a tensor or tile, got list"):
        k.run(torch.zeros(2, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32))


def test_valid_calls_unchanged():
    got = []
    k = _kernel("block", lambda src: got.extend([pl.read_values(src, [1, 2], 3), pl.read_values(src, [0, 8], 0)]))
    x = torch.arange(16, dtype=torch.int32).reshape(2, 8)
    k.run(x, torch.zeros(1, 8, dtype=torch.int32))
    assert got == [[10, 11, 12], []]
