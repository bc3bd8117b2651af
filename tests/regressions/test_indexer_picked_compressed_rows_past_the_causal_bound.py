"""The CSA indexer could hand the sparse-attention cores a compressed row past the causal
bound ``(p + 1) // 4``.

Its top-k sorts the visible scores with the invisible columns masked to ``-FP32_MAX`` and kept
the first ``min(K, n_vis)`` picks by column position only. A visible score of ``-inf`` (an
overflowed ``ks * sum_h``) sorts after the masked columns, so an invisible entry took its
place: at position 9 (two visible entries, both ``-inf``) the picks were entries 2 and 3,
rows the compressor had not written yet. The decode and prefill cores attend whatever index
they get (shown below with a crafted list), so the bound is the indexer's: a pick ``>= n_vis``
is now ``-1``, in kernel and golden.
"""

import torch

import pto
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_indexer import decode_indexer_entry, golden_decode_indexer
from pto.models.deepseek_v4.decode_sparse_attn import decode_sparse_attn_kernels, make_decode_attn_inputs
from pto.models.deepseek_v4.prefill_indexer import _ARG_ORDER, make_indexer_inputs

TINY = get_config("tiny")


def test_indexer_never_picks_an_entry_past_the_causal_bound():
    d = make_indexer_inputs(TINY, [9, 21, 60, 122], 2, 8, 0)
    d["idx_kv_scale"] = torch.full_like(d["idx_kv_scale"], 3.0e38)  # every score overflows to +-inf or is 0
    out = d["cmp_topk_indices"].clone()
    decode_indexer_entry(TINY).run(*[d[k] for k in _ARG_ORDER[:-1]], out, config=pto.RunConfig(check=True))
    want, scores, n_vis = golden_decode_indexer(**{k: d[k] for k in _ARG_ORDER}, cfg=TINY, return_scores=True)
    bound = (d["position_ids"].long() + 1) // 4
    assert bool((scores == -torch.inf).any(dim=1).all())  # every row has a visible -inf score
    assert bool((out < bound[:, None]).all())  # was: 2, 2, 1, 1, 2, 9, 2, 1 picks past it per row
    assert bool((want < bound[:, None]).all())  # the golden's: 2, 2, 1, 1, 2, 9, 1, 0
    assert out[0].tolist() == [-1] * TINY.index_topk  # position 9: both visible entries are -inf
    finite = [int(j) for j in torch.nonzero(scores[6, :bound[6]] > -torch.inf).flatten()]
    assert set(out[6][:len(finite)].tolist()) == set(finite)  # the finite visible picks stay first


def test_decode_core_attends_a_crafted_row_past_the_bound():
    """The core trusts its index list: a row past ``(p + 1) // 4`` changes the output."""
    k = decode_sparse_attn_kernels(TINY, TINY.index_topk)
    d = make_decode_attn_inputs(TINY, (122, 60, 6, 0), 2, 0, n_cmp=TINY.index_topk, ratio=4)
    names = ("q", "ori_kv", "swa_indices", "cmp_kv", "cmp_block_table", "cmp_indices", "attn_sink", "rope_cos",
             "rope_sin", "wo_a", "wo_b", "wo_b_scale")
    outs = []
    for crafted in (False, True):
        v = {n: d[n].clone() for n in names}
        if crafted:  # token 4 (position 6, bound 1) also gets entry 5
            v["cmp_indices"][4, 1] = 5
        o = torch.zeros(8, TINY.hidden_size, dtype=torch.bfloat16)
        k.decode_sparse_attn_test.run(*[v[n] for n in names], o, config=pto.RunConfig(check=False))
        outs.append(o)
    assert d["cmp_indices"][4].tolist()[:2] == [0, -1]
    assert not torch.equal(outs[0][4], outs[1][4]) and torch.equal(outs[0][:4], outs[1][:4])
