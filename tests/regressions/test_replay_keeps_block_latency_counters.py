"""A replayed program (the program cache's third call of a kernel, runtime/replay.py) copied
each block's ops, flops and bytes but not its GM load, GM store and matmul counters, so the
simulator charged a replay no per-load / per-store / per-matmul latency: the same kernel
simulated to 4.14 us on its first two calls and 1.86 us from the third on. The copy now
keeps ld, st and mm (and the vector ops by kind, vk); every call gives the same counters and the same simulated time."""

import torch

import pto
import pto.language as pl
from pto.runtime.simulate import simulate


@pl.jit
def _chain(x: pl.Tensor[[16, 64], pl.BF16], w: pl.Tensor[[64, 32], pl.BF16], s: pl.Tensor[[4], pl.FP32],
           y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="mm_scale"):
        c = pl.matmul(x[0:16, 0:64], w[0:64, 0:32])  # 2 tile loads, 1 matmul
        k = pl.read(s, [1])                           # 1 scalar load
        y[0:16, 0:32] = pl.exp(c * k)                 # 2 vector ops, 1 store
    return y


def test_replayed_blocks_keep_their_load_store_and_matmul_counts():
    seen = []
    for _ in range(4):  # plain, recorded, then replayed calls
        args = (torch.randn(16, 64).bfloat16(), torch.randn(64, 32).bfloat16(), torch.ones(4), torch.zeros(16, 32))
        prog = _chain.run(*args, config=pto.RunConfig(check=False))
        b = prog.graph.tasks[0].blocks[0]
        seen.append(((b.ops, b.ld, b.st, b.mm, b.cube, b.vk), simulate(prog, "a2a3").effective_us))
    assert [s[0] for s in seen] == [(3, 3, 1, 1, True, {"mul_s": 1, "exp": 1})] * 4
    assert len({s[1] for s in seen}) == 1
