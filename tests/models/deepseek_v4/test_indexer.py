"""The lightning indexer (prefill and decode) against its golden (tiny; FLASH slow).

The kernel's INT8 scores follow the golden's operation order, so selections are compared
exactly (order included) where the fixture has no near-ties; the registered cases use
topk_set_compare (sets, boundary ties within rounding allowed). The golden's score is checked
against a float64 per-head loop written from transformers `models/deepseek_v4/modeling_deepseek_v4.py`.
"""

import pytest
import torch

import pto
from pto.errors import CapacityError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_indexer import decode_indexer_entry
from pto.models.deepseek_v4.prefill_indexer import (
    _ARG_ORDER as ARGS,
    golden_indexer_query,
    golden_prefill_indexer,
    make_indexer_inputs,
    prefill_indexer_entry,
)

TINY = get_config("tiny")
K = TINY.index_topk


def inputs(starts, S, num_tokens=None, seed=0):
    d = make_indexer_inputs(TINY, starts, S, len(starts) * S if num_tokens is None else num_tokens, seed)
    if len(starts) == 1:
        d["idx_block_table"] = d["idx_block_table"][0]
    return d


def run(d, *, seed_scopes=False, decode=False, check=True):
    entry = (decode_indexer_entry if decode else prefill_indexer_entry)(TINY, seed_scopes)
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    prog = entry.run(*args, config=pto.RunConfig(check=check))
    return args[-1], prog


def golden(d, **kw):
    return golden_prefill_indexer(**{k: d[k] for k in ARGS}, cfg=TINY, **kw)


@pytest.mark.parametrize("case, mode, opts", [
    ("prefill_indexer", "prefill", {}), ("prefill_indexer", "prefill", {"start_pos": 0, "T": 37}),
    ("prefill_indexer", "prefill", {"start_pos": 3, "num_tokens": 50, "seed_scopes": True}),
    ("decode_indexer", "decode", {}), ("decode_indexer", "decode", {"num_tokens": 5})])
def test_registry_cases_match_golden(case, mode, opts):
    cr = get_case(case).build("tiny", mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


@pytest.mark.parametrize("start", [0, 64, 300])
def test_kernel_selection_equals_golden_exactly(start):
    d = inputs([start], 128)
    got, _ = run(d)
    assert torch.equal(got, golden(d))


def test_topk_tail_exact_k_and_strict_subset():
    d = inputs([0], 128)
    got, _ = run(d)
    n_valid = (got >= 0).sum(dim=1)
    pos = d["position_ids"].long()
    assert torch.equal(n_valid, ((pos + 1) // 4).clamp(max=K).to(n_valid.dtype))  # min(K, visible)
    assert got[0:3].eq(-1).all()  # positions 0..2 see no compressed row
    assert got[3:7, 0].eq(0).all() and got[3:7, 1:].eq(-1).all()  # key row 0 next to -1 entries
    assert set(got[4 * K - 1].tolist()) == set(range(K))  # exactly K visible: all of them
    assert all(int(v) < (int(p) + 1) // 4 for p, row in zip(pos, got) for v in row if v >= 0)  # causal
    assert len(set(got[127].tolist())) == K and max(got[127].tolist()) < 32  # 32 visible, a strict subset


def test_ties_keep_ascending_entry_order():
    d = inputs([60], 16)
    d["idx_kv_cache"][:] = d["idx_kv_cache"][0, 0]  # every key equal: every visible score ties
    d["idx_kv_scale"][:] = d["idx_kv_scale"][0, 0]
    got, _ = run(d)
    want = golden(d)
    assert torch.equal(got, want)
    for t, p in enumerate(d["position_ids"].tolist()):
        nv = min(K, (p + 1) // 4)
        assert got[t, :nv].tolist() == list(range(nv))


def test_golden_score_matches_float64_per_head_loop():
    d = inputs([40], 8)
    _, scores, n_vis = golden(d, return_scores=True)
    pos = d["position_ids"].long()
    q, q_dq = golden_indexer_query(d["qr"], d["qr_scale"], d["wq_b"], d["wq_b_scale"], d["cos_table"][pos],
                                   d["sin_table"][pos], d["hadamard"], TINY.index_n_heads)
    HI, c, bs = TINY.index_n_heads, TINY.index_head_dim, TINY.block_size
    w = d["x"].double() @ d["weights_proj"].double() * HI ** -0.5 * c ** -0.5
    table = d["idx_block_table"].long()
    for t in (0, 7):
        for s in (0, int(n_vis[t]) - 1):
            row = int(table[s // bs]) * bs + s % bs
            k = d["idx_kv_cache"].view(-1, c)[row].double()
            ref = sum(float(w[t, h]) * max(0.0, float(q[t, h].double() @ k) * float(q_dq[t, h])) for h in range(HI))
            ref *= float(d["idx_kv_scale"].view(-1)[row])
            assert abs(float(scores[t, s]) - ref) <= 1e-5 * abs(ref) + 1e-7


def test_float32_mode_rotation_leaves_scores_unchanged():
    d = inputs([40], 8)
    c = TINY.index_head_dim
    H = torch.linalg.qr(torch.randn(c, c, dtype=torch.float64))[0].float()
    keys = torch.randn(d["idx_kv_cache"].shape)
    f32 = dict(d, qr=d["q_res"], wq_b=d["wq_b_float"], idx_kv_scale=torch.ones_like(d["idx_kv_scale"]))
    _, s_plain, _ = golden(dict(f32, hadamard=torch.eye(c), idx_kv_cache=keys), weight_format="bf16",
                           float32=True, return_scores=True)
    _, s_rot, _ = golden(dict(f32, hadamard=H, idx_kv_cache=(keys.view(-1, c) @ H).view(keys.shape)),
                         weight_format="bf16", float32=True, return_scores=True)
    assert torch.allclose(s_plain, s_rot, rtol=1e-4, atol=1e-5)


def test_decode_inactive_request_rows_are_minus_one():
    d = inputs([0, 3, 6, 122], 2)
    d["position_ids"][2:4] = -1  # request 1 inactive (decode_metadata convention)
    got, _ = run(d, decode=True)
    assert got[2:4].eq(-1).all()
    assert torch.equal(got, golden(d))


def test_seed_variant_bit_identical_and_task_names():
    d = inputs([20], 24)
    a, prog_a = run(d)
    b, prog_b = run(d, seed_scopes=True)
    assert torch.equal(a, b)
    names = [t.name for t in prog_a.graph.tasks]
    assert names == ["prefill_idx_q_proj", "prefill_idx_q_rope_hadamard_quant", "prefill_idx_weights_proj",
                     "prefill_idx_score", "prefill_idx_topk"]
    assert [t.name for t in prog_b.graph.tasks] == names[:3] + ["prefill_idx_score_init"] + names[3:]


def test_score_row_past_its_capacity_raises_before_any_task():
    d = inputs([0], 4)
    d["position_ids"] = torch.tensor([40000, 40001, 40002, 40003], dtype=torch.int32)
    with pytest.raises(CapacityError, match="score row"):
        run(d)


@pytest.mark.slow
@pytest.mark.parametrize("case, mode", [("prefill_indexer", "prefill"), ("decode_indexer", "decode")])
def test_flash_matches_golden(case, mode):
    cr = get_case(case).build("flash", mode)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=False)
    assert res.passed, res


def test_score_wide_init_value_is_needed():
    """Mutation test: without its allocation-time fill the unscored (invisible) columns of the
    score row reach the sort undefined and the selections come out undefined."""
    d = inputs([0], 24)
    entry = prefill_indexer_entry(TINY)
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    with pytest.raises(pto.UndefinedOutputError, match="cmp_topk_indices"):
        entry.run(*args, config=pto.RunConfig(check=True, drop_init=("score_wide",)))


@pytest.mark.parametrize("splits", [(20, 28), (3, 1, 44)])
def test_chunk_splits_select_the_same_rows_bit_for_bit(splits):
    d = inputs([30], sum(splits))
    one, _ = run(d, check=False)
    parts, lo = [], 0
    for s in splits:
        part = dict(d)
        for k in ("x", "qr", "qr_scale", "position_ids", "cmp_topk_indices"):
            part[k] = d[k][lo:lo + s]
        part["num_tokens"] = s
        parts.append(run(part, check=False)[0])
        lo += s
    assert torch.equal(torch.cat(parts), one)


def test_topk_set_compare_allows_only_boundary_ties():
    from pto.models.deepseek_v4.prefill_indexer import topk_set_compare
    scores = torch.tensor([[5.0, 4.0, 3.0, 3.0, 1.0]])
    cmp = topk_set_compare(scores, torch.tensor([5]))
    want = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    assert cmp(torch.tensor([[1, 0, 2]], dtype=torch.int32), want)[0]  # order does not matter
    assert cmp(torch.tensor([[0, 1, 3]], dtype=torch.int32), want)[0]  # 3 ties with the k-th score
    ok, detail = cmp(torch.tensor([[0, 1, 4]], dtype=torch.int32), want)
    assert not ok and "1 rows differ" in detail
    assert cmp.margin(torch.tensor([[0, 1, 4]], dtype=torch.int32), want)["margin"] == float("inf")
    assert cmp.margin(want, want)["margin"] == 0.0
