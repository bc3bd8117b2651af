"""The CSA (ratio-4) compressors, prefill and decode, against their goldens (tiny; FLASH slow).

Compare functions are the module's TOLERANCES (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio4.py`; the pypto-lib tests' tolerances): cmp_kv
ratio_allclose(1e-4, 1/128, 0), compress_state ratio_allclose(1e-3, 1e-3, 0). The golden is
checked against a float64 per-window loop written from transformers `models/deepseek_v4/modeling_deepseek_v4.py`.
"""

import pytest
import torch

import pto
from pto.errors import BindError, CapacityError
from pto.golden import get_case, ratio_allclose, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_compressor_ratio4 import (
    decode_compressor_ratio4_entry,
    golden_decode_compressor_ratio4,
    make_decode_compressor_ratio4_inputs,
)
from pto.models.deepseek_v4.prefill_compressor_ratio4 import (
    TOLERANCES,
    golden_prefill_compressor_ratio4,
    make_prefill_compressor_ratio4_inputs,
    prefill_compressor_ratio4_entry,
)
from pto.models.deepseek_v4.qkv_proj_rope import rope_interleaved

from dsv4_checks import compressor_chunk as chunk

TINY = get_config("tiny")
FLASH = get_config("flash")
ARGS = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
        "sin_table", "cmp_kv", "position_ids", "num_tokens", "cmp_slot_mapping", "state_slot_mapping")
CMP = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}


def run_prefill(cfg, d, *, check=True, **opts):
    entry = prefill_compressor_ratio4_entry(cfg, opts.get("max_cmp_writes"))
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    prog = entry.run(*args, config=pto.RunConfig(check=check))
    return args[ARGS.index("cmp_kv")], args[ARGS.index("compress_state")], prog


def run_decode(cfg, d, *, check=True, **opts):
    entry = decode_compressor_ratio4_entry(cfg, opts.get("max_cmp_writes"))
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    prog = entry.run(*args, config=pto.RunConfig(check=check))
    return args[ARGS.index("cmp_kv")], args[ARGS.index("compress_state")], prog


def prefill_inputs(T, start_pos=0, num_tokens=None, seed=0, cfg=TINY, state_pages=65):
    d = make_prefill_compressor_ratio4_inputs(cfg, T, start_pos, T if num_tokens is None else num_tokens, seed,
                                              state_pages)
    return {k: d[k] for k in ARGS}


def golden(d, cfg=TINY):
    return golden_prefill_compressor_ratio4(**d, cfg=cfg)


def written_rows(before, after):
    flat_b, flat_a = before.view(-1, before.shape[-1]), after.view(-1, after.shape[-1])
    return set(torch.nonzero((flat_b != flat_a).any(dim=1)).flatten().tolist())


def reference_entry(d, p_close, cfg=TINY):
    """Entry closed at ``p_close`` from transformers `models/deepseek_v4/modeling_deepseek_v4.py` in float64, one window at a time, from
    the chunk's projections (positions in the chunk) or the input state (earlier positions)."""
    c = cfg.head_dim
    pos = d["position_ids"].long().tolist()
    w = p_close // 4
    flat = d["compress_state"].view(-1, 4 * c).double()
    table = d["state_block_table"].reshape(-1, d["state_block_table"].shape[-1])[0].long()

    def row(p):
        if p in pos:
            t = pos.index(p)
            xt = d["x"][t].double()
            kv, z = d["wkv"].double() @ xt, d["wgate"].double() @ xt
            return torch.cat([kv, z + d["ape"][p % 4].double()])
        return flat[table[p // 4] * 4 + p % 4]

    kv, score = [], []
    for p in range(4 * w - 4, 4 * w):
        if w == 0:
            kv.append(torch.zeros(c, dtype=torch.float64))
            score.append(torch.full((c,), -torch.inf, dtype=torch.float64))
        else:
            r = row(p)
            kv.append(r[:c])
            score.append(r[2 * c:3 * c])
    for p in range(4 * w, 4 * w + 4):
        r = row(p)
        kv.append(r[c:2 * c])
        score.append(r[3 * c:])
    kv, score = torch.stack(kv), torch.stack(score)
    pooled = (torch.softmax(score, dim=0) * kv).sum(0)
    y = pooled / torch.sqrt(pooled.square().mean() + cfg.rms_norm_eps) * d["norm_w"].double()
    n = c - cfg.qk_rope_head_dim
    y[n:] = rope_interleaved(y[None, None, n:], d["cos_table"][4 * w:4 * w + 1].double(),
                             d["sin_table"][4 * w:4 * w + 1].double())[0, 0]
    return y


@pytest.mark.parametrize("T, start_pos", [(16, 0), (13, 6)])
def test_golden_matches_float64_per_window_reference(T, start_pos):
    d = prefill_inputs(T, start_pos)
    d["cmp_kv"] = d["cmp_kv"].float()  # keep the golden's FP32 entries unrounded
    cmp_g, _ = golden(d)
    dst = d["cmp_slot_mapping"].tolist()
    closing = [(p, s) for p, s in zip(d["position_ids"].tolist(), dst) if s >= 0]
    assert closing
    for p, s in closing:
        ref = reference_entry(d, p)
        assert torch.allclose(cmp_g.view(-1, TINY.head_dim)[s].double(), ref, rtol=1e-5, atol=1e-5), p


@pytest.mark.parametrize("opts", [{}, {"start_pos": 6, "T": 37}, {"start_pos": 3, "num_tokens": 50},
                                  {"start_pos": 1}])
def test_prefill_registry_case_matches_golden(opts):
    cr = get_case("prefill_compressor_ratio4").build("tiny", "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


@pytest.mark.parametrize("opts", [{}, {"num_tokens": 5}, {"seed": 3}])
def test_decode_registry_case_matches_golden(opts):
    cr = get_case("decode_compressor_ratio4").build("tiny", "decode", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


def test_cold_start_six_tokens_emit_one_row_and_keep_the_rest_in_state():
    d = prefill_inputs(6)
    cmp_k, state_k, _ = run_prefill(TINY, d)
    assert written_rows(d["cmp_kv"], cmp_k) == {int(d["cmp_slot_mapping"][3])}  # floor(6 / 4) = 1 entry
    assert (d["cmp_slot_mapping"] >= 0).sum() == 1
    cmp_g, state_g = golden(d)
    assert CMP["compress_state"](state_k, state_g)[0]  # the state rows of positions 4, 5 wait for window 1
    flat = state_k.view(-1, 4 * TINY.head_dim)
    for t in (4, 5):
        assert bool((flat[int(d["state_slot_mapping"][t])] != 0).any())
    assert CMP["cmp_kv"](cmp_k, cmp_g)[0]


@pytest.mark.parametrize("splits", [(100, 156), (3, 1, 252)])
def test_chunk_splits_equal_one_call_bit_for_bit(splits):
    n = sum(splits)
    d = prefill_inputs(n, state_pages=80)
    cmp_one, state_one, _ = run_prefill(TINY, d, max_cmp_writes=64, check=False)
    cmp_g_one, state_g_one = golden(d)
    cmp_kv, state, lo = d["cmp_kv"], d["compress_state"], 0
    cmp_g, state_g = cmp_kv, state
    for s in splits:
        part = chunk(d, lo, lo + s, cmp_kv, state)
        cmp_kv, state, _ = run_prefill(TINY, part, max_cmp_writes=64, check=False)
        cmp_g, state_g = golden(chunk(d, lo, lo + s, cmp_g, state_g))
        lo += s
    assert torch.equal(cmp_kv, cmp_one) and torch.equal(state, state_one)
    assert torch.equal(cmp_g, cmp_g_one) and torch.equal(state_g, state_g_one)
    assert CMP["cmp_kv"](cmp_one, cmp_g_one)[0]


def test_prefill_then_decode_steps_equal_longer_prefill():
    """Prefill of 9 tokens then 3 single-token decode steps (B = 1) equals a prefill of 12,
    bit for bit: the decode step runs the same core tiles on one row."""
    d = prefill_inputs(12)
    cmp_one, state_one, _ = run_prefill(TINY, d)
    cmp_kv, state, _ = run_prefill(TINY, chunk(d, 0, 9))
    for t in range(9, 12):
        step = chunk(d, t, t + 1, cmp_kv, state)
        step["state_block_table"] = step["state_block_table"][None]
        cmp_kv, state, _ = run_decode(TINY, step)
    assert torch.equal(cmp_kv, cmp_one) and torch.equal(state, state_one)


def test_inactive_tokens_write_nothing():
    d = prefill_inputs(32, num_tokens=10)
    cmp_k, state_k, _ = run_prefill(TINY, d)
    assert written_rows(d["cmp_kv"], cmp_k) == {int(d["cmp_slot_mapping"][t]) for t in (3, 7)}
    assert written_rows(d["compress_state"], state_k) == {int(d["state_slot_mapping"][t]) for t in range(10)}
    d2 = dict(d)
    d2["num_tokens"] = 0
    cmp0, state0, prog = run_prefill(TINY, d2)
    assert torch.equal(cmp0, d["cmp_kv"]) and torch.equal(state0, d["compress_state"])


def test_decode_requests_use_their_own_block_table_rows():
    d = {k: v for k, v in make_decode_compressor_ratio4_inputs(TINY).items() if k in ARGS}
    table = d["state_block_table"]
    assert len({int(table[b, 0]) for b in range(table.shape[0])}) == table.shape[0]  # disjoint pages
    cmp_k, state_k, _ = run_decode(TINY, d)
    cmp_g, state_g = golden_decode_compressor_ratio4(**d, cfg=TINY)
    # requests at 3 (closes window 0, no previous window), 6 (closes window 1) and top - 6 write
    assert written_rows(d["cmp_kv"], cmp_k) == set(d["cmp_slot_mapping"][d["cmp_slot_mapping"] >= 0].tolist())
    assert len(written_rows(d["cmp_kv"], cmp_k)) == 3
    assert CMP["cmp_kv"](cmp_k, cmp_g)[0] and CMP["compress_state"](state_k, state_g)[0]


def test_task_and_edge_counts_and_no_initialised_scratch():
    d = prefill_inputs(24, start_pos=5)
    _, _, prog = run_prefill(TINY, d)
    assert [t.name for t in prog.graph.tasks] == [
        "prefill_c4_write_map", "prefill_c4_kv_score_proj", "prefill_c4_state_scatter", "prefill_c4_softmax_pool",
        "prefill_c4_rmsnorm_rope", "prefill_c4_cache_write"]
    assert prog.stats.edges == 7
    assert prog.stats.init_bytes == 0  # pypto-lib `prefill_compressor_ratio4.py`: uninitialised scratch; undefined pad rows never reach cmp_kv


def test_capacity_overflow_raises_before_any_task():
    d = prefill_inputs(40)
    entry = prefill_compressor_ratio4_entry(TINY, 8)
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    with pytest.raises(CapacityError, match="max_cmp_writes=8"):
        entry(*args)


def test_contract_violations_are_bind_errors():
    d = prefill_inputs(8)
    bad = dict(d, cmp_slot_mapping=d["cmp_slot_mapping"].clone())
    bad["cmp_slot_mapping"][1] = 5  # position 1 closes no window
    with pytest.raises(BindError, match="does not close"):
        run_prefill(TINY, bad)
    with pytest.raises(BindError, match="does not close"):
        golden(bad)
    bad = dict(d, state_slot_mapping=d["state_slot_mapping"].clone())
    bad["state_slot_mapping"][2] += 1
    with pytest.raises(BindError, match="not the state row"):
        run_prefill(TINY, bad)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_flash_matches_golden(mode):
    cr = get_case(f"{mode}_compressor_ratio4").build("flash", mode)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=False)
    assert res.passed, res


def test_decode_inactive_request_rows_are_skipped():
    """A request marked inactive by decode_metadata (position -1, slots -1) writes nothing."""
    d = {k: v for k, v in make_decode_compressor_ratio4_inputs(TINY).items() if k in ARGS}
    for k in ("position_ids", "cmp_slot_mapping", "state_slot_mapping"):
        d[k] = d[k].clone()
        d[k][4:6] = -1  # request 2 (start 6, which would close window 1)
    cmp_k, state_k, _ = run_decode(TINY, d)
    cmp_g, state_g = golden_decode_compressor_ratio4(**d, cfg=TINY)
    assert len(written_rows(d["cmp_kv"], cmp_k)) == 2
    assert CMP["cmp_kv"](cmp_k, cmp_g)[0] and CMP["compress_state"](state_k, state_g)[0]
