"""The CSA attention blocks (prefill_attention_csa, decode_attention_csa) against their goldens
and against each other (tiny; FLASH slow).

Compare functions are prefill_attention_csa.TOLERANCES (pypto-lib `models/deepseek/v4-flash/prefill_attention_csa.py`; the pypto-lib tests' tolerances): x_out
valid_ratio_reldiff(3e-3, 0.005, 1) over the active rows (the SWA block's) against the golden of
the kernel's column blocking, caches and states ratio_allclose.
"""

import pytest
import torch

from pto.errors import BindError
from pto.golden import get_case, ratio_allclose, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_attention_csa import (CSA_ARGS, CSA_OUTPUTS, TOLERANCES, csa_block_kernels,
                                                          golden_csa_block, make_prefill_csa_inputs)

TINY = get_config("tiny")
PER_TOKEN = ("x_hc", "ori_slot_mapping", "position_ids", "cmp_slot_mapping", "state_slot_mapping",
             "idx_state_slot_mapping", "idx_slot_mapping")
TABLES = ("block_table", "state_block_table", "cmp_block_table", "idx_state_block_table", "idx_block_table")


def run(d: dict, mode: str = "prefill", seed_scopes: bool = False, check: bool = True) -> dict:
    """Run the block's entry on clones of ``d``; returns the CSA_OUTPUTS by name."""
    import pto
    entry = csa_block_kernels(TINY, mode, seed_scopes).entry
    args = [d[n].clone() for n in CSA_ARGS]
    x_out = torch.zeros(d["x_hc"].shape)
    entry.run(*args, x_out, d["num_tokens"], config=pto.RunConfig(check=check))
    out = {n: args[CSA_ARGS.index(n)] for n in CSA_OUTPUTS if n != "x_out"}
    out["x_out"] = x_out
    return out


def tokens(d: dict, lo: int, hi: int, state: dict | None = None) -> dict:
    """Tokens ``lo .. hi-1`` of fixture ``d`` as one call, on the caches of ``state``."""
    out = {k: (v[lo:hi] if k in PER_TOKEN else v) for k, v in d.items()}
    out["num_tokens"] = hi - lo
    if state:
        out.update({k: v for k, v in state.items() if k != "x_out"})
    return out


@pytest.mark.parametrize("case, mode, opts", [
    ("prefill_attention_csa", "prefill", {"T": 32}),
    ("prefill_attention_csa", "prefill", {"T": 40, "start_pos": 100, "num_tokens": 30}),
    ("prefill_attention_csa", "prefill", {"T": 16, "start_pos": 6, "seed_scopes": True, "block_table": "identity"}),
    ("decode_attention_csa", "decode", {}),
    ("decode_attention_csa", "decode", {"reverse_tables": True, "seed_scopes": True}),
])
def test_registry_cases_match_golden(case, mode, opts):
    cr = get_case(case).build("tiny", mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


def test_partial_windows_attend_selected_compressed_rows():
    """Start of a sequence: windows are partial (pos < sliding_window) while compressed rows
    are already visible and selected (the case the first sparse attention got wrong)."""
    d = make_prefill_csa_inputs(TINY, 32, 0, 32, 0)
    *_, mids = golden_csa_block(d, TINY, "prefill", return_intermediates=True)
    pos = d["position_ids"].long()
    assert bool((pos < TINY.sliding_window - 1).all())  # every window partial
    n_sel = (mids["cmp_topk"] >= 0).sum(dim=1)
    assert torch.equal(n_sel, ((pos + 1) // 4).clamp(max=TINY.index_topk).to(n_sel.dtype))
    assert int(n_sel[-1]) == 8 and int(n_sel[2]) == 0
    out = run(d)
    x_out = golden_csa_block(d, TINY, "prefill", blocking="columns")[CSA_OUTPUTS.index("x_out")]
    assert (out["x_out"] - x_out).abs().max() < 1e-6  # measured 3.0e-8: the kernel's key blocks
    # the packed golden tiles the valid keys instead: BF16 probabilities round against other
    # block maxima, and the INT8 o-projection turns that into whole-code steps (measured 1.7e-3)
    packed = golden_csa_block(d, TINY, "prefill")[CSA_OUTPUTS.index("x_out")]
    assert (out["x_out"] - packed).abs().max() > 1e-4
    with pytest.raises(BindError, match="blocking"):
        golden_csa_block(d, TINY, "prefill", blocking="rows")


@pytest.mark.parametrize("splits", [(20, 28), (3, 1, 44)])
def test_chunk_splits_equal_one_call_bit_for_bit(splits):
    n = sum(splits)
    d = make_prefill_csa_inputs(TINY, n, 0, n, 0)
    one = run(d, check=False)
    state, xs, lo = None, [], 0
    for s in splits:
        state = run(tokens(d, lo, lo + s, state), check=False)
        xs.append(state["x_out"])
        lo += s
    for k in CSA_OUTPUTS:
        got = torch.cat(xs) if k == "x_out" else state[k]
        assert torch.equal(got, one[k]), k
    # the golden's selections are split-invariant too
    g_one = golden_csa_block(d, TINY, "prefill", return_intermediates=True)[-1]["cmp_topk"]
    g_a = golden_csa_block(tokens(d, 0, 20), TINY, "prefill", return_intermediates=True)
    state_g = dict(zip(CSA_OUTPUTS, g_a[:-1]))
    g_b = golden_csa_block(tokens(d, 20, 48, state_g), TINY, "prefill", return_intermediates=True)
    assert torch.equal(torch.cat([g_a[-1]["cmp_topk"], g_b[-1]["cmp_topk"]]), g_one)


def test_prefill_then_decode_steps_equal_longer_prefill():
    """Prefill of 21 tokens then 3 decode steps (B = 1, S = 1) equals a prefill of 24: the
    compressors and the indexer run the same core (caches and states bit for bit); the
    attention output goes through the decode core's tiles (within 1e-2 of the stream)."""
    d = make_prefill_csa_inputs(TINY, 24, 40, 24, 0)
    one = run(d, check=False)
    state = run(tokens(d, 0, 21), check=False)
    xs = [state["x_out"]]
    for t in range(21, 24):
        step = tokens(d, t, t + 1, state)
        for k in TABLES:
            step[k] = step[k][None]
        state = run(step, "decode")
        xs.append(state["x_out"])
    for k in CSA_OUTPUTS:
        if k == "x_out":
            x = torch.cat(xs)
            assert torch.equal(x[:21], one[k][:21])
            assert (x - one[k]).abs().max() <= 1e-2 * one[k].abs().max()
        else:
            assert torch.equal(state[k], one[k]), k


def test_inactive_tokens_write_nothing_and_get_zero_rows():
    d = make_prefill_csa_inputs(TINY, 24, 8, 13, 0)
    out = run(d)
    assert out["x_out"][13:].eq(0).all()
    for k in ("kv_cache", "cmp_kv", "idx_kv_cache"):
        flat_b, flat_a = d[k].reshape(-1, d[k].shape[-1]), out[k].reshape(-1, out[k].shape[-1])
        changed = set(torch.nonzero((flat_b != flat_a).any(dim=1)).flatten().tolist())
        slots = {"kv_cache": "ori_slot_mapping", "cmp_kv": "cmp_slot_mapping", "idx_kv_cache": "idx_slot_mapping"}[k]
        assert changed <= set(d[slots][:13].tolist()), k


def test_float32_golden_mode_stays_close_to_the_int8_golden():
    d = make_prefill_csa_inputs(TINY, 24, 0, 24, 0)
    x8 = golden_csa_block(d, TINY, "prefill")[-1]
    d32 = dict(d, idx_kv_cache=d["idx_kv_cache"].float() * d["idx_kv_scale"])
    x32 = golden_csa_block(d32, TINY, "prefill", float32=True)[-1]
    assert (x8 - x32).abs().max() < 0.05 * x32.abs().max()


def test_prefill_block_attends_every_selected_row_at_flash():
    """The CSA prefill core has index_topk compressed columns (no 256-candidate cap, pypto-lib `prefill_sparse_attn.py`)."""
    from pto.models.deepseek_v4.prefill_sparse_attn import sparse_attn_tiling
    flash = get_config("flash")
    tl = sparse_attn_tiling(flash, flash.index_topk)
    assert (tl.cmp_cols, tl.sparse_pad, tl.key_blocks) == (512, 640, 5)
    assert sparse_attn_tiling(flash).cmp_cols == 256  # the reference's cap stays the SWA / HCA default


@pytest.mark.slow
@pytest.mark.parametrize("case, mode, opts", [("prefill_attention_csa", "prefill", {}),
                                              ("prefill_attention_csa", "prefill", {"start_pos": 2048}),
                                              ("decode_attention_csa", "decode", {})])
def test_flash_matches_golden(case, mode, opts):
    """FLASH; ``start_pos=2048``: 512..544 visible entries, all 512 selected rows attended."""
    cr = get_case(case).build("flash", mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=False)
    assert res.passed, res


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_stable_inline_wrappers_equal_the_block_entry(mode):
    """``prefill_attention_csa`` / ``decode_attention_csa`` (the signatures a layer composes)
    run the same program as the block entry, bit for bit."""
    import pto.language as pl
    from pto.models.deepseek_v4.decode_attention_csa import decode_attention_csa, make_decode_csa_inputs
    from pto.models.deepseek_v4.prefill_attention_csa import prefill_attention_csa
    d = make_prefill_csa_inputs(TINY, 12, 5, 12, 0) if mode == "prefill" else make_decode_csa_inputs(TINY)
    want = run(d, mode, check=False)
    wrapper = prefill_attention_csa if mode == "prefill" else decode_attention_csa
    args = [d[n].clone() for n in CSA_ARGS]
    x_out = torch.zeros(d["x_hc"].shape)
    pl.jit.entry(wrapper, name=f"{mode}_attention_csa_wrapper")(*args, x_out, d["num_tokens"], TINY)
    assert torch.equal(x_out, want["x_out"])
    for k in CSA_OUTPUTS[:-1]:
        assert torch.equal(args[CSA_ARGS.index(k)], want[k]), k


def test_decode_inactive_request_attends_nothing_and_writes_nothing():
    """A decode request marked inactive (decode_metadata: position -1, every slot -1)."""
    from pto.models.deepseek_v4.decode_attention_csa import make_decode_csa_inputs
    d = make_decode_csa_inputs(TINY)
    for k in ("position_ids", "ori_slot_mapping", "cmp_slot_mapping", "state_slot_mapping", "idx_slot_mapping",
              "idx_state_slot_mapping"):
        d[k] = d[k].clone()
        d[k][2:4] = -1  # request 1
    out = run(d, "decode")
    want = dict(zip(CSA_OUTPUTS, golden_csa_block(d, TINY, "decode")))
    for k in CSA_OUTPUTS[:-1]:
        assert ratio_allclose(*TOLERANCES[k])(out[k], want[k])[0], k
    assert (out["x_out"] - want["x_out"]).abs().max() <= 1e-2 * want["x_out"].abs().max()
    for k, slots in (("cmp_kv", "cmp_slot_mapping"), ("idx_kv_cache", "idx_slot_mapping")):
        changed = (out[k] != d[k]).reshape(-1, d[k].shape[-1]).any(dim=1).nonzero().flatten().tolist()
        assert set(changed) <= set(d[slots][d[slots] >= 0].tolist()), k
    *_, mids = golden_csa_block(d, TINY, "decode", return_intermediates=True)
    assert mids["cmp_topk"][2:4].eq(-1).all() and mids["swa_indices"][2:4].eq(-1).all()


def test_cold_start_six_tokens():
    """S = 6 from position 0: queries 0..2 see no compressed row, 3..5 see row 0 only; the
    compressor emits floor(6 / 4) = 1 row; kernel and golden agree."""
    d = make_prefill_csa_inputs(TINY, 6, 0, 6, 0)
    *outs, mids = golden_csa_block(d, TINY, "prefill", return_intermediates=True)
    sel = mids["cmp_topk"]
    assert sel[:3].eq(-1).all()
    assert sel[3:, 0].eq(0).all() and sel[3:, 1:].eq(-1).all()
    out = run(d)
    changed = (out["cmp_kv"] != d["cmp_kv"]).reshape(-1, TINY.head_dim).any(dim=1).nonzero().flatten().tolist()
    assert changed == [int(d["cmp_slot_mapping"][3])]
    for k, want in zip(CSA_OUTPUTS[:-1], outs[:-1]):
        assert ratio_allclose(*TOLERANCES[k])(out[k], want)[0], k
