"""Tensors of a loop's iteration scopes were only reclaimed FIFO, i.e. never
while an older (outer) tensor was live: a long loop exhausted any heap."""

import torch

import pto
import pto.language as pl


def test_loop_scopes_reuse_their_bytes_under_an_outer_tensor():
    @pl.jit
    def k(x: pl.Tensor[[256], pl.FP32]):
        outer = pl.create_tensor([256], pl.FP32, init_value=0)
        for i in pl.range(100):
            tmp = pl.create_tensor([256], pl.FP32)

    p = k.run(torch.zeros(256), config=pto.RunConfig(heap_bytes=2048))
    assert p.stats.heap_peak_bytes == 2048
