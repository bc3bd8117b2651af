"""Regression: no-copy tile loads of In arguments also applied to pld windows, which are bound
with direction In but written during the run (by peers, and by this rank's own
``remote_store``): a tile loaded from a window changed under the kernel when the window was
stored into afterwards. Window arguments load copies again (``Buffer.no_copy``).
"""

import torch

import pto  # noqa: F401 - installs the runtime
import pto.language as pl
import pto.language.distributed as pld


@pl.jit
def _load_then_store(win: pld.DistributedTensor[[2, 4], pl.FP32], out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="load_store"):
        before = win[0:2, 0:4]
        pld.tile.remote_store(pl.full([2, 4], pl.FP32, 7.0), win, pld.rank(), [0, 0])
        out[0:2, 0:4] = before
    return out


def test_a_tile_loaded_from_a_window_keeps_the_values_of_its_load():
    buf = pld.alloc_window_buffer([2, 4], pl.FP32)
    win = pld.window(buf, [2, 4], pl.FP32)
    win.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4))
    out = torch.zeros(2, 4)
    _load_then_store(win, out)
    assert torch.equal(out, torch.arange(8, dtype=torch.float32).reshape(2, 4))
    assert torch.equal(win, torch.full((2, 4), 7.0))
