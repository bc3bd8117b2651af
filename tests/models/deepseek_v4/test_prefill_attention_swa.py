"""prefill_attention_swa DSL sub-layer (pypto-lib `models/deepseek/v4-flash/prefill_attention_swa.py`) at the tiny preset.

Window visibility (the index builder exactly, and end to end by perturbation), a start
position well past the window with a pre-filled cache and a permuted block table, inactive
tail tokens, an all-invalid chunk, the dummy compressed metadata initialised at allocation
(never-read cache, load-bearing ``-1``), and the seed variant.
"""

import pytest
import torch

import pto
from pto.errors import BindError, PtoError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_attention_swa import (build_window_indices, golden_prefill_attention_swa,
                                                          make_swa_inputs, permuted_block_table,
                                                          prefill_attention_swa_kernels)
from pto.runtime import drop_init_values
from pto.runtime.heap import _STORAGE

TINY = get_config("tiny")
FLASH = get_config("flash")
W = TINY.sliding_window
ARGS = ("x_hc", "hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv",
        "gamma_cq", "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "block_table", "ori_slot_mapping",
        "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")


def _kernel(d, cfg=TINY, seed_scopes=False, check=False, heap_bytes=1 << 30):
    """Run the sub-layer entry on inputs ``d``; returns (kv_cache, x_out, program)."""
    kv = d["kv_cache"].clone()
    x_out = torch.zeros_like(d["x_hc"])
    args = [kv if n == "kv_cache" else d[n] for n in ARGS] + [x_out, d["num_tokens"]]
    prog = prefill_attention_swa_kernels(cfg, seed_scopes).prefill_attention_swa_test.run(
        *args, config=pto.RunConfig(check=check, heap_bytes=heap_bytes))
    return kv, x_out, prog


def _case(cfg_name="tiny", **opts):
    cr = get_case("prefill_attention_swa").build(cfg_name, "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error
    return res


def _windows(T, start_pos, num_tokens, table):
    k = prefill_attention_swa_kernels(TINY)
    pos = (start_pos + torch.arange(T)).to(torch.int32)
    out = torch.zeros(T, W, dtype=torch.int32)
    k.swa_window_indices_test.run(pos, table, num_tokens, out, config=pto.RunConfig(check=True))
    return pos, out


def _identity_table():
    b = torch.arange(TINY.max_blocks_per_seq)
    return torch.where(b < TINY.ori_kv_block_num, b, -1).to(torch.int32)


# ---------------------------------------------------------------- window indices
def test_window_start_pos_0_sees_exactly_its_window():
    T = 128  # two windows of the tiny preset
    pos, idx = _windows(T, 0, T, _identity_table())
    for p in range(T):
        lo = max(0, p - W + 1)
        assert idx[p, :p - lo + 1].tolist() == list(range(lo, p + 1)), p
        assert (idx[p, p - lo + 1:] == -1).all(), p
    assert torch.equal(idx, build_window_indices(pos, T, _identity_table(), TINY))


def test_window_through_permuted_table_with_inactive_rows():
    T, nt, start = 48, 41, 300
    table = permuted_block_table(TINY.max_blocks_per_seq, TINY.ori_kv_block_num)
    pos, idx = _windows(T, start, nt, table)
    assert torch.equal(idx, build_window_indices(pos, nt, table, TINY))
    assert (idx[nt:] == -1).all() and (idx[:nt] >= 0).all()


def test_window_index_errors():
    k = prefill_attention_swa_kernels(TINY)
    out = torch.zeros(4, W, dtype=torch.int32)
    with pytest.raises(BindError, match=r"position_ids\[2\] = -1 is negative"):
        k.swa_window_indices_test(torch.tensor([0, 1, -1, 3], dtype=torch.int32), _identity_table(), 4, out)
    last = TINY.max_blocks_per_seq * TINY.block_size
    with pytest.raises(BindError, match="block_table has"):
        k.swa_window_indices_test(torch.tensor([0, 1, 2, last], dtype=torch.int32), _identity_table(), 4, out)


# ---------------------------------------------------------------- the sub-layer
def test_start_pos_0_matches_golden_and_window_is_exact_end_to_end():
    res = _case()  # T = 128 tokens at positions 0..127
    assert res.program.graph.tasks[-1].name in ("hc_post_prefill", "hc_post_inactive_pad")
    d = make_swa_inputs(TINY, 128, 0, 128, seed=0)
    _, ref, _ = _kernel(d)
    j = 100
    d["x_hc"][j - W] += 0.5  # token j-W feeds the keys of tokens j-W .. j-1 only
    _, out, _ = _kernel(d)
    changed = (out != ref).flatten(1).any(dim=1)
    assert changed[j - W:j].all()
    assert not changed[:j - W].any() and not changed[j:].any()


def test_start_pos_past_window_prefilled_cache_permuted_table():
    T, start = 64, 300
    res = _case(T=T, start_pos=start, block_table="permuted")
    assert res.outputs["x_out"].stats["nan"] == 0
    d = make_swa_inputs(TINY, T, start, T, seed=0, block_table="permuted")
    _, ref, _ = _kernel(d)
    table, bs = d["block_table"].long(), TINY.block_size
    flat = d["kv_cache"].view(-1, TINY.head_dim)

    def row(p):
        return int(table[p // bs]) * bs + p % bs

    assert flat[row(start - W)].abs().sum() > 0  # pre-filled, but outside every window
    flat[row(start - W)] = 9.0
    _, out, _ = _kernel(d)
    assert torch.equal(out, ref)
    flat[row(start - W + 1)] = 9.0  # first key of token 0's window, and of no later token
    _, out, _ = _kernel(d)
    changed = (out != ref).flatten(1).any(dim=1)
    assert changed[0] and not changed[1:].any()


def test_inactive_tail_rows_zero_and_cache_rows_untouched():
    T, nt, start = 48, 37, 20
    res = _case(T=T, num_tokens=nt, start_pos=start)
    x_out, kv = res.actual["x_out"], res.actual["kv_cache"]
    assert torch.count_nonzero(x_out[nt:]) == 0
    d = make_swa_inputs(TINY, T, start, nt, seed=0)
    before = d["kv_cache"].view(-1, TINY.head_dim)
    after = kv.view(-1, TINY.head_dim)
    written = d["ori_slot_mapping"][:nt]
    others = torch.ones(before.shape[0], dtype=torch.bool)
    others[written] = False
    assert torch.equal(after[others], before[others])  # inactive tokens' rows included
    assert torch.equal(after[written], res.expected["kv_cache"].view(-1, TINY.head_dim)[written])


def test_all_invalid_chunk_gives_finite_output_and_gathers_nothing():
    T = 16  # one page; the chunk writes page 0 but the block table has no page for it
    d = make_swa_inputs(TINY, T, 0, T, seed=4)
    d["block_table"][0] = -1
    kv, x_out, prog = _kernel(d, check=True)
    exp_kv, exp_x = golden_prefill_attention_swa(d, TINY)
    assert torch.isfinite(x_out).all()
    assert torch.equal(kv, exp_kv)
    assert (x_out - exp_x).abs().max() < 1e-5
    gather = next(t for t in prog.graph.tasks if t.name == "gather_kv")
    assert not any(buf.name == "kv_cache" for b in gather.blocks for buf, _, _ in b.fp)


def test_dummy_compressed_metadata_is_initialised_not_filled_and_never_read():
    d = make_swa_inputs(TINY, 32, 0, 30, seed=1)
    heap = 3 << 26  # a private heap: its bytes are the stale contents of the uninitialised scratch
    outs = []
    for fill in (0x00, 0xFF, 0x7F):  # zeros, NaN (BF16/FP32), huge values
        if heap in _STORAGE:
            _STORAGE[heap].fill_(fill)
        kv, x_out, prog = _kernel(d, heap_bytes=heap)
        outs.append((kv, x_out))
    assert all(torch.equal(a, outs[0][0]) and torch.equal(b, outs[0][1]) for a, b in outs)
    names = [t.name for t in prog.graph.tasks]
    assert "prefill_swa_dummy_cmp_table" not in names and "prefill_swa_empty_cmp_meta" not in names
    gather = next(t for t in prog.graph.tasks if t.name == "gather_kv")
    assert not {"cmp_kv", "cmp_block_table"} & {buf.name for buf, _, _ in gather.footprints}


def test_minus_one_init_is_load_bearing_zero_table_is_not():
    d = make_swa_inputs(TINY, 16, 0, 16, seed=2)
    with drop_init_values("cmp_block_table"):  # never dereferenced: nothing changes
        _kernel(d, check=True)
    with drop_init_values("cmp_indices"):  # undefined sentinels: check mode stops the run
        with pytest.raises(PtoError, match="cmp_indices"):
            _kernel(d, check=True)


def test_seed_variant_bit_identical_with_exact_counts():
    d = make_swa_inputs(TINY, 128, 0, 128, seed=0)
    kv_i, x_i, p_i = _kernel(d, check=True)
    kv_s, x_s, p_s = _kernel(d, seed_scopes=True, check=True)
    assert torch.equal(kv_i, kv_s) and torch.equal(x_i, x_s)
    assert (p_i.stats.tasks, p_i.stats.edges, p_i.stats.dummies) == (60, 136, 1)
    assert (p_s.stats.tasks, p_s.stats.edges, p_s.stats.dummies) == (62, 138, 1)
    by = {t.name: t for t in p_s.graph.tasks}
    table, meta = by["prefill_swa_dummy_cmp_table"].id, by["prefill_swa_empty_cmp_meta"].id
    succ = p_s.graph.succs()
    assert sorted(p_s.graph[s].name for s in succ[meta]) == ["build_bias", "gather_kv"]
    assert succ[table] == []  # every index is -1: the table is never read
    assert [t.name for t in p_i.graph.tasks] == [t.name for t in p_s.graph.tasks if t.id not in (table, meta)]


# ---------------------------------------------------------------- FLASH (slow)
@pytest.mark.slow
def test_flash_prefill_start_pos_0():
    res = _case("flash")
    assert res.program.stats.tasks == 152


@pytest.mark.slow
def test_flash_prefill_past_window_permuted_partial_chunk():
    res = _case("flash", start_pos=1000, num_tokens=120, block_table="permuted")
    assert torch.count_nonzero(res.actual["x_out"][120:]) == 0


@pytest.mark.slow
def test_flash_seed_variant_bit_identical():
    d = make_swa_inputs(FLASH, 128, 256, 128, seed=0, block_table="permuted")
    kv_i, x_i, p_i = _kernel(d, cfg=FLASH)
    kv_s, x_s, p_s = _kernel(d, cfg=FLASH, seed_scopes=True)
    assert torch.equal(kv_i, kv_s) and torch.equal(x_i, x_s)
    assert p_s.stats.tasks == p_i.stats.tasks + 2 and p_s.stats.edges == p_i.stats.edges + 2


def test_stable_inline_signature_with_seed_scopes():
    import pto.language as pl
    from pto.models.deepseek_v4.prefill_attention_swa import prefill_attention_swa

    @pl.jit
    def entry(x_hc: pl.Tensor, hc_attn_fn: pl.Tensor, hc_attn_scale: pl.Tensor, hc_attn_base: pl.Tensor,
              attn_norm_w: pl.Tensor, wq_a: pl.Tensor, wq_b: pl.Tensor, wq_b_scale: pl.Tensor, wkv: pl.Tensor,
              gamma_cq: pl.Tensor, gamma_ckv: pl.Tensor, freqs_cos: pl.Tensor, freqs_sin: pl.Tensor,
              kv_cache: pl.InOut[pl.Tensor], block_table: pl.Tensor, ori_slot_mapping: pl.Tensor,
              position_ids: pl.Tensor, attn_sink: pl.Tensor, wo_a: pl.Tensor, wo_b: pl.Tensor,
              wo_b_scale: pl.Tensor, x_out: pl.Out[pl.Tensor], num_tokens: pl.Scalar[pl.INT32]):
        return prefill_attention_swa(x_hc, hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm_w, wq_a, wq_b,
                                     wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos, freqs_sin, kv_cache,
                                     block_table, ori_slot_mapping, position_ids, attn_sink, wo_a, wo_b,
                                     wo_b_scale, x_out, num_tokens, TINY, seed_scopes=True)

    d = make_swa_inputs(TINY, 24, 40, 21, seed=6, block_table="permuted")
    kv, x_out = d["kv_cache"].clone(), torch.zeros_like(d["x_hc"])
    prog = entry.run(*[kv if n == "kv_cache" else d[n] for n in ARGS], x_out, d["num_tokens"])
    assert "prefill_swa_empty_cmp_meta" in [t.name for t in prog.graph.tasks]
    ref_kv, ref_x, _ = _kernel(d)
    assert torch.equal(kv, ref_kv) and torch.equal(x_out, ref_x)


# ---- bad metadata is a BindError, not a silently clamped or wrapped answer ----

@pytest.mark.parametrize("num_tokens", [-1, 17, 10**6])
def test_num_tokens_outside_the_chunk_is_a_bind_error(num_tokens):
    d = make_swa_inputs(TINY, 16, 0, 16, seed=3)
    d["num_tokens"] = num_tokens
    with pytest.raises(BindError, match="num_tokens"):
        _kernel(d)
    with pytest.raises(BindError, match="num_tokens"):
        golden_prefill_attention_swa(d, TINY)


def test_block_table_entry_outside_the_cache_is_a_bind_error():
    d = make_swa_inputs(TINY, 16, 0, 16, seed=3)
    d["block_table"][0] = 2 ** 28 + 1  # times block_size, wraps INT32 into page 1
    with pytest.raises(BindError, match="not a page"):
        _kernel(d)
    with pytest.raises(BindError, match="not a page"):
        build_window_indices(d["position_ids"], 16, d["block_table"], TINY)
