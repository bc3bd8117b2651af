"""decode_gather_kv's grid (decode_sparse_attn.py): one block per (token, key block, part of
GATHER_ROWS = 32 key rows), the reference's hoisted-gather granularity (pypto-lib
`decode_sparse_attn_swa.py` / `decode_sparse_attn_hca.py`: 32 rows per block). The parts
write the same bytes as one block per key block did: the core's output is bit-identical to
the one-block-per-key-block grid (built here with GATHER_ROWS past the key tile); tasks and
edges are unchanged, the gather task has GP times the blocks."""

import pytest
import torch

import pto
import pto.models.deepseek_v4.decode_sparse_attn as dsa
from pto.golden import ScalarSpec, get_case
from pto.models.deepseek_v4.config import get_config

TINY = get_config("tiny")


def _run(name, fn=None):
    cr = get_case(name).build("tiny", "decode")
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    prog = (fn or cr.fn).run(*vals, config=pto.RunConfig(check=True))
    out = next(v for s, v in zip(cr.specs, vals) if getattr(s, "name", "") == "attn_out")
    return prog, out


@pytest.mark.parametrize("variant, n_cmp, key_blocks", [("swa", 0, 1), ("csa", None, 2)])
def test_parts_are_bit_identical_to_one_block_per_key_block(monkeypatch, variant, n_cmp, key_blocks):
    n_cmp = TINY.index_topk if n_cmp is None else n_cmp
    kt = dsa.decode_attn_tiling(TINY, n_cmp).key_tile
    assert (kt, dsa.GATHER_ROWS) == (64, 32)                  # tiny: two parts per key block
    T = TINY.decode_batch * TINY.decode_seq                   # 8 token rows
    prog, out = _run(f"decode_sparse_attn_{variant}")
    gather = next(t for t in prog.graph.tasks if t.name == "decode_gather_kv")
    assert len(gather.blocks) == T * key_blocks * 2           # 8 x 1 x 2 = 16 (SWA), 8 x 2 x 2 = 32 (CSA)
    monkeypatch.setattr(dsa, "GATHER_ROWS", 1 << 30)          # one block per key block (the grid before)
    one = dsa.decode_sparse_attn_kernels.__wrapped__(TINY, n_cmp).decode_sparse_attn_test
    prog1, out1 = _run(f"decode_sparse_attn_{variant}", one)
    gather1 = next(t for t in prog1.graph.tasks if t.name == "decode_gather_kv")
    assert len(gather1.blocks) == T * key_blocks
    assert torch.equal(out.view(torch.int16), out1.view(torch.int16))  # bit for bit
    assert (prog.stats.tasks, prog.stats.edges) == (prog1.stats.tasks, prog1.stats.edges)
