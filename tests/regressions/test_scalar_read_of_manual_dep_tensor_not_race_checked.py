"""Regression: ``pl.read`` and element subscripts on a ``manual_dep=True`` tensor inside a task
recorded no footprint, so check mode missed a race that goes through a scalar read (the same
race through a tile load was caught) (breaker finding H2). The read is recorded now; dependency
derivation still ignores manual_dep tensors, so no edge appears for it.
"""

import pytest
import torch

import pto.language as pl
from pto.errors import RaceError
from pto.runtime import RunConfig


def _kernel(how: str, with_deps: bool):
    @pl.jit
    def k(x: pl.Tensor[[16, 128], pl.FP32], y: pl.Out[pl.Tensor[[16, 128], pl.FP32]]):
        t = pl.create_tensor([16, 128], pl.FP32, init_value=0, manual_dep=True)
        with pl.at(name_hint="w") as w:
            t[:, :] = x[:, :]
        with pl.at(name_hint="r", deps=[w] if with_deps else None):
            if how == "read":
                s = pl.read(t, [3, 5])
            elif how == "subscript":
                s = t[3, 5]
            else:
                s = pl.read(t[3:4, :], [0, 5])  # a tile load, caught before the fix too
            y[:, :] = x[:, :] * s
    return k


@pytest.mark.parametrize("how", ["read", "subscript", "tile"])
def test_scalar_read_of_a_manual_dep_tensor_races_without_deps(how):
    with pytest.raises(RaceError, match=r"'t' \[16, 128\].*manual_dep") as ei:
        _kernel(how, False).run(torch.randn(16, 128), torch.zeros(16, 128), config=RunConfig(check=True))
    assert "'w'" in str(ei.value) and "'r'" in str(ei.value)
    box = "rows [3, 4) cols [0, 128)" if how == "tile" else "rows [3, 4) cols [5, 6)"
    assert box in str(ei.value)


@pytest.mark.parametrize("how", ["read", "subscript"])
def test_scalar_read_footprint_recorded_but_no_derived_edge(how):
    x = torch.randn(16, 128)
    y = torch.zeros(16, 128)
    p = _kernel(how, True).run(x, y, config=RunConfig(check=True))
    assert torch.equal(y, x * x[3, 5])
    r = p.graph[1]
    assert r.preds == {0}  # the explicit dep only
    assert [str(f) for f in p.footprints(r) if f.buffer == "t"] == ["read t[3:4, 5:6]"]
    # without deps= the read is recorded but derivation adds no edge for a manual_dep tensor
    p = _kernel(how, False).run(x, torch.zeros(16, 128), config=RunConfig(keep_footprints=True))
    assert p.graph[1].preds == set() and p.stats.edges == 0
    assert [str(f) for f in p.footprints(p.graph[1]) if f.buffer == "t"] == ["read t[3:4, 5:6]"]
