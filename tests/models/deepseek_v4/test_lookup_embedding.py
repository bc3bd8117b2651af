"""lookup_embedding vs its golden and transformers' convention (transformers `models/deepseek_v4/modeling_deepseek_v4.py`): every
stream is an exact FP32 copy of the table row, ids 0 and vocab_size - 1 included; an id
outside the vocabulary is a BindError naming its position before any task runs."""

import pytest
import torch

import pto
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.lookup_embedding import (build_lookup_embedding, golden_lookup_embedding,
                                                     lookup_embedding_kernels)

TINY = get_config("tiny")


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("prefill", 9)])
def test_lookup_embedding_matches_golden_exactly(mode, T):
    cr = build_lookup_embedding("tiny", mode, T=T)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare)
    assert res.passed, res.error
    x_hc = res.actual["x_hc"]
    embed = cr.specs[1].init_value
    ids = cr.specs[0].init_value
    assert ids[0] == 0 and ids[1] == TINY.vocab_size - 1
    # independent check: HF's inputs_embeds.unsqueeze(2).expand(..., hc_mult, ...)
    want = torch.nn.functional.embedding(ids, embed.float()).unsqueeze(1).expand(-1, TINY.hc_mult, -1)
    assert torch.equal(x_hc, want)
    assert [t.name for t in res.program.graph.tasks] == ["embedding_lookup"]


@pytest.mark.parametrize("bad", [-1, TINY.vocab_size])
def test_lookup_embedding_rejects_out_of_vocab_id_before_any_task(bad):
    cr = build_lookup_embedding("tiny", "prefill", T=12)
    vals = [s.create_tensor() for s in cr.specs]
    vals[0][5] = bad
    prog = pto.Program(cr.fn, pto.RunConfig(check=True))
    with pytest.raises(pto.BindError, match=rf"input_ids\[5\] = {bad} outside \[0, vocab_size=512\)"):
        prog.execute(vals, {})
    assert len(prog.graph.tasks) == 0
    assert not vals[2].any()  # nothing half-written
    with pytest.raises(pto.BindError, match=r"input_ids\[5\]"):
        golden_lookup_embedding(vals[0], vals[1], TINY.hc_mult)


def test_lookup_embedding_tiling_error():
    with pytest.raises(pto.ConfigError, match="hidden_size=120"):
        lookup_embedding_kernels(TINY.replace(hidden_size=120))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_lookup_embedding_flash(mode):
    cr = build_lookup_embedding("flash", mode)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, check=False)
    assert res.passed, res.error
