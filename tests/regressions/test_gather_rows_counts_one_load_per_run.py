"""pl.gather_rows counted one GM load per row, so a key block gathered as one 128-row run of
window rows (one copy, as the slices it replaced) cost the simulator 128 load latencies: the
FLASH prefill sparse attention went 599 -> 956 simulated us and the HCA decode block 431 ->
452 us with bit-identical outputs. It now counts one load per run of consecutive rows (the
runs its footprint already records), in a plain run and in graph-only mode alike."""

import torch

import pto
import pto.language as pl

ROWS = [0, 1, 2, 7, 9, 10, 11, 3]  # runs [0, 1, 2], [7], [9, 10, 11], [3]: 4 loads


@pl.jit
def _gather(x: pl.Tensor[[16, 32], pl.BF16], y: pl.Out[pl.Tensor[[8, 32], pl.BF16]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="g"):
        y[0:8, 0:32] = pl.gather_rows(x, ROWS)  # + 1 store
    return y


def _block(prog):
    return prog.graph.tasks[0].blocks[0]


def test_one_load_per_run_of_consecutive_rows():
    x = torch.randn(16, 32).bfloat16()
    y = torch.zeros(8, 32, dtype=torch.bfloat16)
    b = _block(_gather.run(x, y, config=pto.RunConfig(check=True)))
    assert torch.equal(y, x[ROWS])
    assert (b.ld, b.st, b.bytes) == (4, 1, 2 * 8 * 32 * 2)
    meta = torch.empty(16, 32, dtype=torch.bfloat16, device="meta")
    g = _block(_gather.run(meta, torch.empty(8, 32, dtype=torch.bfloat16, device="meta"),
                           config=pto.RunConfig(execute=False)))
    assert (g.ld, g.st, g.bytes) == (b.ld, b.st, b.bytes)
