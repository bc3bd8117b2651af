"""The ratio-128 prefill compressor DSL kernel against its golden (tiny preset; FLASH slow).

Every run is in check mode (definedness sanitizer + race checker) unless it is a timing or
a FLASH run. Compare functions are the module's TOLERANCES (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`):
cmp_kv ratio_allclose(1e-4, 1/128, 0), compress_state ratio_allclose(1e-3, 1e-3, 0).
"""

import pytest
import torch

import pto
from pto.errors import BindError, CapacityError, ConfigError
from pto.golden import get_case, ratio_allclose, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_compressor_ratio128 import (
    HCA_RATIO,
    TOLERANCES,
    compressor_tiling,
    golden_prefill_compressor_ratio128,
    make_compressor_inputs,
    prefill_compressor_ratio128_entry,
)
from pto.runtime import Program

from dsv4_checks import compressor_chunk as chunk

TINY = get_config("tiny")
FLASH = get_config("flash")
ARG_ORDER = ("x", "compress_state", "state_block_table", "wkv", "wgate", "ape", "norm_w", "cos_table",
             "sin_table", "cmp_kv", "position_ids", "num_tokens", "cmp_slot_mapping", "state_slot_mapping")
CMP = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
INIT_TASKS = ["prefill_hca_c128_write_map", "prefill_hca_c128_kv_score_proj",
              "prefill_hca_c128_state_scatter_pre", "prefill_hca_c128_softmax_pool",
              "prefill_hca_c128_rmsnorm_rope", "prefill_hca_c128_kv_finalize"]
INIT_EDGES = {  # derived edges of the allocation-time-init variant (one window with a destination)
    ("prefill_hca_c128_kv_score_proj", "prefill_hca_c128_state_scatter_pre"),
    ("prefill_hca_c128_write_map", "prefill_hca_c128_softmax_pool"),
    ("prefill_hca_c128_state_scatter_pre", "prefill_hca_c128_softmax_pool"),
    ("prefill_hca_c128_write_map", "prefill_hca_c128_rmsnorm_rope"),
    ("prefill_hca_c128_softmax_pool", "prefill_hca_c128_rmsnorm_rope"),
    ("prefill_hca_c128_write_map", "prefill_hca_c128_kv_finalize"),
    ("prefill_hca_c128_rmsnorm_rope", "prefill_hca_c128_kv_finalize"),
}
SEED_EXTRA_EDGES = {  # the zero-fill task's WAW edges that allocation-time init removed
    ("prefill_hca_c128_norm_pad_init", "prefill_hca_c128_softmax_pool"),
    ("prefill_hca_c128_norm_pad_init", "prefill_hca_c128_rmsnorm_rope"),
}


def run_kernel(cfg, d: dict, *, check: bool = True, **opts):
    """Run the test entry on clones of fixture ``d``; returns ``(cmp_kv, compress_state, program)``."""
    entry = prefill_compressor_ratio128_entry(cfg, opts.get("max_cmp_writes"), opts.get("seed_scopes", False))
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARG_ORDER]
    prog = entry.run(*args, config=pto.RunConfig(check=check))
    return args[ARG_ORDER.index("cmp_kv")], args[ARG_ORDER.index("compress_state")], prog


def golden(cfg, d: dict):
    return golden_prefill_compressor_ratio128(**d, cfg=cfg)


def assert_matches_golden(cfg, d: dict, cmp_kv, state) -> None:
    g_cmp, g_state = golden(cfg, d)
    for name, got, want in (("cmp_kv", cmp_kv, g_cmp), ("compress_state", state, g_state)):
        ok, detail = CMP[name](got, want)
        assert ok, f"{name}: {detail}"


def changed_rows(new: torch.Tensor, old: torch.Tensor) -> list[int]:
    width = new.shape[-1]
    diff = (new.float() - old.float()).reshape(-1, width).abs().sum(dim=1)
    return diff.nonzero().flatten().tolist()


def scratch(prog, name: str) -> torch.Tensor:
    """Contents of the program's scratch tensor ``name`` right after the run (heap not reused yet)."""
    (buf,) = [b for b in prog.buffers if b.name == name]
    return buf.data.clone()


# ---------------------------------------------------------------- registry / golden agreement
@pytest.mark.parametrize("opts", [
    dict(),
    dict(T=256, start_pos=200),
    dict(T=384),
    dict(T=1, start_pos=127),
    dict(T=100, start_pos=100, num_tokens=60),
    dict(T=40, start_pos=3),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_registry_case_matches_golden(opts):
    cr = get_case("prefill_compressor_ratio128").build("tiny", "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=True)
    assert res.passed, res.error
    assert res.stats.tasks == 6


def test_registry_case_metadata():
    case = get_case("prefill_compressor_ratio128")
    assert case.modes == ("prefill",) and case.seed_variant
    cr = case.build("tiny", "prefill", T=64, start_pos=64)
    assert cr.label == "tiny prefill T=64 start_pos=64 num_tokens=64"
    assert [s.name for s in cr.specs] == list(ARG_ORDER)
    with pytest.raises(ConfigError):
        case.build("tiny", "decode")
    with pytest.raises(ConfigError):
        case.build("tiny", "prefill", T=0)


# ---------------------------------------------------------------- chunking
@pytest.mark.parametrize("start_pos", [0, 200])
def test_split_100_156_equals_single_256(start_pos):
    d = make_compressor_inputs(TINY, 256, start_pos, 256, seed=7)
    cmp_one, state_one, _ = run_kernel(TINY, d)
    cmp_a, state_a, prog_a = run_kernel(TINY, chunk(d, 0, 100))
    cmp_b, state_b, _ = run_kernel(TINY, chunk(d, 100, 256, cmp_a, state_a))
    # same tiles, same per-row arithmetic: the split is bit-identical to the single call
    assert torch.equal(cmp_b, cmp_one)
    assert torch.equal(state_b, state_one)
    assert_matches_golden(TINY, d, cmp_one, state_one)
    closing = (d["cmp_slot_mapping"] >= 0).nonzero().flatten().tolist()
    assert len(closing) == 2
    assert sorted(changed_rows(cmp_one, d["cmp_kv"])) == sorted(d["cmp_slot_mapping"][closing].tolist())
    # the first call closes a window only when its 100 tokens reach position 127
    assert len(changed_rows(cmp_a, d["cmp_kv"])) == (1 if start_pos + 100 > 127 else 0)


def test_windows_close_at_127_255_383_exactly():
    d = make_compressor_inputs(TINY, 384, 0, 384, seed=8)
    closing = (d["cmp_slot_mapping"] >= 0).nonzero().flatten().tolist()
    assert closing == [127, 255, 383]
    dst = {t: int(d["cmp_slot_mapping"][t]) for t in closing}
    cmp_kv, state = d["cmp_kv"], d["compress_state"]
    written = []
    # chunks end just before and exactly at each closing position
    for lo, hi in [(0, 127), (127, 128), (128, 200), (200, 255), (255, 256), (256, 383), (383, 384)]:
        new_cmp, state, _ = run_kernel(TINY, chunk(d, lo, hi, cmp_kv, state))
        rows = changed_rows(new_cmp, cmp_kv)
        expect = [dst[hi - 1]] if hi - 1 in dst else []  # only a chunk holding 127 / 255 / 383 writes
        assert rows == expect, (lo, hi, rows)
        written += rows
        cmp_kv = new_cmp
    assert written == [dst[127], dst[255], dst[383]]
    cmp_one, state_one, _ = run_kernel(TINY, d)
    assert torch.equal(cmp_kv, cmp_one) and torch.equal(state, state_one)
    assert_matches_golden(TINY, d, cmp_one, state_one)


def test_incomplete_window_writes_no_row_but_keeps_state():
    d = make_compressor_inputs(TINY, 100, 0, 100, seed=9)
    cmp_kv, state, prog = run_kernel(TINY, d)
    assert torch.equal(cmp_kv, d["cmp_kv"])
    flat_new, flat_old = state.view(-1, 2 * TINY.head_dim), d["compress_state"].view(-1, 2 * TINY.head_dim)
    assert sorted(changed_rows(flat_new, flat_old)) == sorted(d["state_slot_mapping"].tolist())
    assert_matches_golden(TINY, d, cmp_kv, state)
    assert torch.equal(scratch(prog, "pooled_kv_pad"), torch.zeros(8, TINY.head_dim))


def test_single_token_calls_complete_a_window():
    d = make_compressor_inputs(TINY, 8, 124, 8, seed=11)  # positions 124 .. 131, window closes at 127
    cmp_kv, state = d["cmp_kv"], d["compress_state"]
    for t in range(8):
        new_cmp, state, prog = run_kernel(TINY, chunk(d, t, t + 1, cmp_kv, state))
        assert len(changed_rows(new_cmp, cmp_kv)) == (1 if t == 3 else 0)
        cmp_kv = new_cmp
    assert_matches_golden(TINY, d, cmp_kv, state)


# ---------------------------------------------------------------- tables, slots, inactive tokens
def test_non_identity_tables_and_minus_one_destination():
    d = make_compressor_inputs(TINY, 384, 0, 384, seed=12)
    table = d["state_block_table"]
    assert not torch.equal(table[:64], torch.arange(64, dtype=table.dtype))  # (blk*17+3) % 64
    closing = [127, 255, 383]
    entries = d["cmp_slot_mapping"][closing].tolist()
    assert entries != [0, 1, 2]  # compressed entries 0, 1, 2 land on permuted rows
    cmp_map = d["cmp_slot_mapping"].clone()
    cmp_map[255] = -1  # window 1 closes but has no destination
    d = dict(d, cmp_slot_mapping=cmp_map)
    cmp_kv, state, _ = run_kernel(TINY, d)
    assert sorted(changed_rows(cmp_kv, d["cmp_kv"])) == sorted([entries[0], entries[2]])
    assert_matches_golden(TINY, d, cmp_kv, state)


def test_inactive_tokens_write_nothing():
    d = make_compressor_inputs(TINY, 128, 0, 100, seed=13)
    assert int(d["cmp_slot_mapping"][127]) == -1
    cmp_map, slot_map = d["cmp_slot_mapping"].clone(), d["state_slot_mapping"].clone()
    cmp_map[127] = 5  # would close window 0 if it were active
    full = make_compressor_inputs(TINY, 128, 0, 128, seed=13)["state_slot_mapping"]
    slot_map[100:] = full[100:]  # valid state rows on the inactive tokens
    d = dict(d, cmp_slot_mapping=cmp_map, state_slot_mapping=slot_map)
    cmp_kv, state, _ = run_kernel(TINY, d)
    assert torch.equal(cmp_kv, d["cmp_kv"])
    flat_new, flat_old = state.view(-1, 2 * TINY.head_dim), d["compress_state"].view(-1, 2 * TINY.head_dim)
    assert sorted(changed_rows(flat_new, flat_old)) == sorted(slot_map[:100].tolist())
    assert_matches_golden(TINY, d, cmp_kv, state)


def test_zero_active_tokens_touch_nothing():
    d = make_compressor_inputs(TINY, 16, 120, 0, seed=14)
    cmp_kv, state, prog = run_kernel(TINY, d)
    assert torch.equal(cmp_kv, d["cmp_kv"]) and torch.equal(state, d["compress_state"])
    assert prog.stats.tasks == 6


# ---------------------------------------------------------------- pads and the seed variant
@pytest.mark.parametrize("seed_scopes", [False, True])
def test_pooled_pad_rows_without_a_window_stay_zero(seed_scopes):
    d = make_compressor_inputs(TINY, 384, 0, 384, seed=15)
    cmp_map = d["cmp_slot_mapping"].clone()
    cmp_map[255] = -1  # slot 1 of the write map has no destination
    d = dict(d, cmp_slot_mapping=cmp_map)
    _, _, prog = run_kernel(TINY, d, seed_scopes=seed_scopes)
    pad = scratch(prog, "pooled_kv_pad")
    assert pad.shape == (8, TINY.head_dim)  # 3 write slots rounded up to the 8-row RMS tile
    nonzero = [i for i in range(8) if bool(pad[i].abs().sum() > 0)]
    assert nonzero == [0, 2]  # slot 1 (destination -1) and pad rows 3..7 stay exactly zero
    assert torch.equal(pad[1], torch.zeros(TINY.head_dim))
    assert torch.equal(pad[3:], torch.zeros(5, TINY.head_dim))
    (buf,) = [b for b in prog.buffers if b.name == "pooled_kv_pad"]
    assert buf.init_value == (None if seed_scopes else 0)


@pytest.mark.parametrize("T,start_pos", [(128, 0), (384, 0), (100, 200)])
def test_seed_variant_bit_identical(T, start_pos):
    d = make_compressor_inputs(TINY, T, start_pos, T, seed=16)
    cmp_init, state_init, prog_init = run_kernel(TINY, d)
    cmp_seed, state_seed, prog_seed = run_kernel(TINY, d, seed_scopes=True)
    assert torch.equal(cmp_init, cmp_seed)
    assert torch.equal(state_init, state_seed)
    assert prog_seed.stats.tasks == prog_init.stats.tasks + 1


def test_task_and_edge_counts_both_variants():
    d = make_compressor_inputs(TINY, 128, 0, 128, seed=17)
    _, _, prog = run_kernel(TINY, d)
    assert [t.name for t in prog.graph.tasks] == INIT_TASKS
    assert [len(t.blocks) for t in prog.graph.tasks] == [1, 2, 8, 2, 1, 1]
    assert (prog.stats.tasks, prog.stats.edges) == (6, 7)
    assert prog.graph.named_edges() == INIT_EDGES
    _, _, seed = run_kernel(TINY, d, seed_scopes=True)
    seed_tasks = INIT_TASKS[:1] + ["prefill_hca_c128_norm_pad_init"] + INIT_TASKS[1:]
    assert [t.name for t in seed.graph.tasks] == seed_tasks
    assert (seed.stats.tasks, seed.stats.edges) == (7, 9)
    assert seed.graph.named_edges() == INIT_EDGES | SEED_EXTRA_EDGES


# ---------------------------------------------------------------- capacity and errors
def test_capacity_overflow_raises_before_any_task():
    assert compressor_tiling(TINY).max_cmp_writes == 4  # 64 pages x 8 rows / 128
    big_ring = TINY.replace(hca_state_block_num=128)  # a fixture that can hold 513 tokens
    for T, cap in ((4 * HCA_RATIO + 1, None), (HCA_RATIO + 1, 1)):
        d = make_compressor_inputs(big_ring, T, 0, T, seed=18)
        entry = prefill_compressor_ratio128_entry(TINY, cap, False)
        args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARG_ORDER]
        prog = Program(entry, pto.RunConfig(check=True))
        with pytest.raises(CapacityError, match=f"T={T} tokens can close {-(-T // HCA_RATIO)} windows.*"
                                                f"write_pos_map.*max_cmp_writes={cap or 4}"):
            prog.execute(args, {})
        assert len(prog.graph.tasks) == 0  # raised at allocation
        assert torch.equal(args[ARG_ORDER.index("cmp_kv")], d["cmp_kv"])
    d = make_compressor_inputs(TINY, HCA_RATIO, 0, HCA_RATIO, seed=18)
    cmp_kv, state, _ = run_kernel(TINY, d, max_cmp_writes=1)  # exactly at the capacity
    assert_matches_golden(TINY, d, cmp_kv, state)


def test_cmp_destination_on_non_closing_token_is_a_bind_error():
    d = make_compressor_inputs(TINY, 100, 0, 100, seed=19)
    bad = d["cmp_slot_mapping"].clone()
    bad[5] = 0
    d = dict(d, cmp_slot_mapping=bad)
    with pytest.raises(BindError):
        golden(TINY, d)
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARG_ORDER]
    prog = Program(prefill_compressor_ratio128_entry(TINY), pto.RunConfig(check=True))
    with pytest.raises(BindError, match="token 5 at position 5 .* does not close"):
        prog.execute(args, {})
    assert [t.name for t in prog.graph.tasks] == ["prefill_hca_c128_write_map"]  # the first task
    assert torch.equal(args[ARG_ORDER.index("cmp_kv")], d["cmp_kv"])  # caller tensors untouched
    assert torch.equal(args[ARG_ORDER.index("compress_state")], d["compress_state"])
    # the same destination on an inactive token is ignored, by kernel and golden alike
    d2 = make_compressor_inputs(TINY, 100, 0, 90, seed=19)
    bad2 = d2["cmp_slot_mapping"].clone()
    bad2[95] = 0
    d2 = dict(d2, cmp_slot_mapping=bad2)
    cmp_kv, state, _ = run_kernel(TINY, d2)
    assert_matches_golden(TINY, d2, cmp_kv, state)


@pytest.mark.parametrize("what", ["state_slot_off_table", "state_slot_missing_in_window", "repeat_position",
                                  "cmp_slot_out_of_range", "num_tokens"])
def test_contract_violations_are_bind_errors(what):
    d = make_compressor_inputs(TINY, 128, 0, 128, seed=20)
    if what == "state_slot_off_table":
        slots = d["state_slot_mapping"].clone()
        slots[10] = slots[11]  # not the table row of position 10
        d = dict(d, state_slot_mapping=slots)
    elif what == "state_slot_missing_in_window":
        slots = d["state_slot_mapping"].clone()
        slots[10] = -1  # the golden would pool its chunk row; the kernel pools from the state
        d = dict(d, state_slot_mapping=slots)
    elif what == "repeat_position":
        pos = d["position_ids"].clone()
        pos[3] = pos[2]
        d = dict(d, position_ids=pos)
    elif what == "cmp_slot_out_of_range":
        cmp_map = d["cmp_slot_mapping"].clone()
        cmp_map[127] = TINY.cmp_kv_block_num * TINY.block_size
        d = dict(d, cmp_slot_mapping=cmp_map)
    else:
        d = dict(d, num_tokens=129)
    with pytest.raises(BindError):
        run_kernel(TINY, d)


def test_tiling_is_validated_against_the_config():
    tl = compressor_tiling(TINY)
    assert (tl.proj_n, tl.proj_k, tl.pool_h, tl.rms_rows, tl.pages_per_window) == (64, 128, 64, 8, 16)
    tf = compressor_tiling(FLASH)
    assert (tf.proj_n, tf.proj_k, tf.pool_h, tf.max_cmp_writes, tf.pad_capacity) == (64, 512, 64, 4, 8)
    with pytest.raises(ConfigError, match="head_dim"):
        compressor_tiling(TINY.replace(head_dim=96 + 4))
    with pytest.raises(ConfigError, match="hca_state_block_size"):
        compressor_tiling(TINY.replace(hca_state_block_size=48))
    with pytest.raises(ConfigError, match="hidden_size"):
        compressor_tiling(FLASH.replace(hidden_size=4096 + 256))
    with pytest.raises(ConfigError, match="less than one"):
        compressor_tiling(TINY.replace(hca_state_block_num=8))
    with pytest.raises(ConfigError, match="max_cmp_writes"):
        compressor_tiling(TINY, 0)


# ---------------------------------------------------------------- FLASH size (slow)
@pytest.mark.slow
@pytest.mark.parametrize("start_pos", [0, 128])
def test_flash_prefill_matches_golden(start_pos):
    cr = get_case("prefill_compressor_ratio128").build("flash", "prefill", start_pos=start_pos)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=True)
    assert res.passed, res.error


@pytest.mark.slow
def test_flash_seed_variant_bit_identical_with_counts():
    d = make_compressor_inputs(FLASH, 128, 0, 128, seed=21)
    cmp_init, state_init, prog = run_kernel(FLASH, d, check=False)
    cmp_seed, state_seed, seed = run_kernel(FLASH, d, check=False, seed_scopes=True)
    assert torch.equal(cmp_init, cmp_seed) and torch.equal(state_init, state_seed)
    assert [len(t.blocks) for t in prog.graph.tasks] == [1, 8, 8, 8, 1, 1]
    assert (prog.stats.tasks, prog.stats.edges) == (6, 7)
    assert (seed.stats.tasks, seed.stats.edges) == (7, 9)
    assert seed.graph.named_edges() - prog.graph.named_edges() == SEED_EXTRA_EDGES


@pytest.mark.slow
def test_flash_split_equals_single_call():
    d = make_compressor_inputs(FLASH, 128, 64, 128, seed=22)  # positions 64 .. 191, closes at 127
    cmp_one, state_one, _ = run_kernel(FLASH, d, check=False)
    cmp_a, state_a, _ = run_kernel(FLASH, chunk(d, 0, 50), check=False)
    cmp_b, state_b, _ = run_kernel(FLASH, chunk(d, 50, 128, cmp_a, state_a), check=False)
    assert torch.equal(cmp_b, cmp_one) and torch.equal(state_b, state_one)
    assert_matches_golden(FLASH, d, cmp_one, state_one)


def test_pooled_pad_init_is_kept_as_the_reference_but_not_load_bearing():
    """pooled_kv_pad keeps the reference's init=0 (pypto-lib `models/deepseek/v4-flash/prefill_compressor_ratio128.py`; pypto-lib commit 3b6971a3); dropping it
    (check mode: undefined rows poisoned) changes no output bit: rows are normalised one by one
    and only rows with a destination reach cmp_kv."""
    cr = get_case("prefill_compressor_ratio128").build("tiny", "prefill", T=40, start_pos=100)
    kept = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol, check=True)
    dropped = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol, check=True,
                      config=pto.RunConfig(drop_init=("pooled_kv_pad",)))
    assert kept.passed and dropped.passed, (kept.error, dropped.error)
    assert kept.program.stats.init_bytes > 0
    for k in kept.actual:
        assert torch.equal(kept.actual[k], dropped.actual[k]), k
