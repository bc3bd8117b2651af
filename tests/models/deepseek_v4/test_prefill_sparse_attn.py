"""prefill_sparse_attn DSL kernel (pypto-lib `models/deepseek/v4-flash/prefill_sparse_attn.py`) at the tiny preset: golden
comparisons, the -1 sentinel (nothing gathered, zero row, no NaN), the never-read compressed
cache, the task graph of the manual-scope o-projection, tiling and input errors."""

import math

import pytest
import torch

import pto
from pto.errors import BindError, CapacityError, ConfigError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_sparse_attn import (golden_prefill_sparse_attn, make_sparse_attn_inputs,
                                                        prefill_sparse_attn_kernels, sparse_attn_tiling)

TINY = get_config("tiny")
FLASH = get_config("flash")
ARGS = ("q", "ori_kv", "swa_indices", "cmp_kv", "cmp_block_table", "cmp_indices", "attn_sink", "num_tokens",
        "rope_cos", "rope_sin", "wo_a", "wo_b", "wo_b_scale")


def _kernel(d, cfg=TINY, check=True):
    """Run the kernel entry on the input dict ``d``; returns (attn_out, program)."""
    out = torch.zeros(d["q"].shape[0], cfg.hidden_size, dtype=torch.bfloat16)
    prog = prefill_sparse_attn_kernels(cfg).prefill_sparse_attn_test.run(*(d[n] for n in ARGS), out,
                                                                        config=pto.RunConfig(check=check))
    return out, prog


def _golden(d, cfg=TINY):
    return golden_prefill_sparse_attn(*(d[n] for n in ARGS), cfg,
                                      cmp_candidate_limit=sparse_attn_tiling(cfg).cmp_cols)


def _reads(prog, task_name, buffer):
    """Read boxes of ``buffer`` recorded by the blocks of the task called ``task_name``."""
    return [box for t in prog.graph.tasks if t.name == task_name
            for b in t.blocks for buf, box, kind in b.fp if buf.name == buffer and kind == 0]


def test_tiling_follows_the_config():
    f, t = sparse_attn_tiling(FLASH), sparse_attn_tiling(TINY)
    # FLASH is the reference's ATTN_TILE 128 x 3 blocks, SPARSE_PAD 384, cmp columns 0:256 (pypto-lib `prefill_sparse_attn.py`)
    assert (f.key_tile, f.key_blocks, f.swa_blocks, f.max_compressed, f.sparse_pad, f.cmp_cols) == \
        (128, 3, 1, 192, 384, 256)
    assert (f.rope_head_tile, f.proj_a_n_tile, f.proj_b_n_tile, f.act_col_tile) == (4, 128, 1024, 512)
    assert (t.key_tile, t.key_blocks, t.swa_blocks, t.sparse_pad, t.cmp_cols) == (64, 2, 1, 128, TINY.index_topk)
    assert t.rope_head_tile == TINY.heads_per_group == 2


@pytest.mark.parametrize("change,what", [({"sliding_window": 160}, "sliding_window=160"),
                                         ({"hidden_size": 130}, "hidden_size=130"),
                                         ({"o_lora_rank": 200}, "o_lora_rank=200"),
                                         ({"num_attention_heads": 24, "o_groups": 4}, "heads_per_group=6")])
def test_tiling_rejects_untileable_configs(change, what):
    with pytest.raises(ConfigError, match=what):
        prefill_sparse_attn_kernels(TINY.replace(**change))


@pytest.mark.parametrize("opts", [{}, {"compress_ratio": 0, "T": 40, "num_tokens": 29},
                                  {"compress_ratio": 128, "T": 72, "num_tokens": 70}])
def test_matches_golden(opts):
    cr = get_case("prefill_sparse_attn").build("tiny", "prefill", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode: sanitizer + races
    assert res.passed, res.error
    out = res.actual["attn_out"]
    nt = opts.get("num_tokens", 128)
    assert torch.count_nonzero(out[nt:]) == 0
    assert res.outputs["attn_out"].stats["max_abs"] <= 1e-3


def test_all_invalid_query_row_is_zero_and_gathers_nothing():
    d = make_sparse_attn_inputs(TINY, 24, 24, seed=5, compress_ratio=4)
    bad = 7
    d["swa_indices"][bad] = -1
    d["cmp_indices"][bad] = -1
    # slot 0 of both caches holds NaN: no window (keys pos-W+1 >= 1) and no used compressed
    # slot maps there, so any read of slot 0 would poison the output
    d["ori_kv"].view(-1, TINY.head_dim)[0] = float("nan")
    d["cmp_kv"].view(-1, TINY.head_dim)[0] = float("nan")
    out, prog = _kernel(d)
    assert not torch.isnan(out).any()
    assert torch.count_nonzero(out[bad]) == 0
    assert torch.equal(out[bad], _golden(d)[bad])
    for buffer in ("ori_kv", "cmp_kv"):
        boxes = _reads(prog, "gather_kv", buffer)
        assert boxes and not any(r0 == 0 for r0, _, _, _ in boxes), buffer
    # the gather reads exactly the valid rows: one box per run of consecutive rows
    rows = sum(r1 - r0 for r0, r1, _, _ in _reads(prog, "gather_kv", "ori_kv"))
    assert rows == int((d["swa_indices"] >= 0).sum())


def test_compressed_cache_is_never_read_when_every_cmp_index_is_invalid():
    d = make_sparse_attn_inputs(TINY, 32, 30, seed=2, compress_ratio=0)
    assert int(d["cmp_indices"].max()) == -1
    ref, prog = _kernel(d)
    assert _reads(prog, "gather_kv", "cmp_kv") == [] and _reads(prog, "gather_kv", "cmp_block_table") == []
    for fill in (float("nan"), 1e30, 0.0):
        d["cmp_kv"] = torch.full_like(d["cmp_kv"], fill)
        d["cmp_block_table"] = torch.full_like(d["cmp_block_table"], -5)
        out, _ = _kernel(d, check=False)
        assert torch.equal(out, ref), fill


def test_task_graph_and_manual_scope_order():
    T = 40
    d = make_sparse_attn_inputs(TINY, T, T, seed=1)
    _, prog = _kernel(d)
    tasks = prog.graph.tasks
    tl = sparse_attn_tiling(TINY)
    G, n_qt = TINY.o_groups, math.ceil(T / 32)
    counts = {}
    for t in tasks:
        counts[t.name] = counts.get(t.name, 0) + 1
    assert counts == {"gather_kv": 1, "build_bias": 1, "qk_pv": 1, "merge_norm": 1, "rope_cs": 1, "rope": 1,
                      "proj_a_mm": G * TINY.o_lora_rank // tl.proj_a_n_tile, "quant": n_qt * G,
                      "proj_b_mm": 4 * G, "proj_b_act": 1}
    by = {t.name: t for t in tasks}
    assert by["gather_kv"].n_blocks == math.ceil(T / 4) * tl.key_blocks
    assert by["rope"].n_blocks == (TINY.num_attention_heads // tl.rope_head_tile) * math.ceil(T / 64)
    merge, rope = by["merge_norm"].id, by["rope"].id
    assert by["rope"].preds >= {merge, by["rope_cs"].id}
    proj_a = [t for t in tasks if t.name == "proj_a_mm"]
    quant = [t for t in tasks if t.name == "quant"]
    proj_b = [t for t in tasks if t.name == "proj_b_mm"]
    per_group_a = len(proj_a) // G
    for i, t in enumerate(proj_a):  # manual scope: exactly the explicit deps
        assert t.manual and t.preds == {merge, rope}
    for i, t in enumerate(quant):
        g = i % G
        assert t.manual and t.preds == {a.id for a in proj_a[g * per_group_a:(g + 1) * per_group_a]}
    for i, t in enumerate(proj_b):
        g = i % G
        assert t.manual and t.preds == {q.id for q in quant[g::G]}
    assert by["proj_b_act"].preds == {t.id for t in proj_b}


def test_bad_compressed_slots_raise_bind_error():
    d = make_sparse_attn_inputs(TINY, 8, 8, seed=0, compress_ratio=4)
    page = int(d["cmp_indices"][0, 0]) // TINY.block_size
    d["cmp_block_table"][page] = -1
    with pytest.raises(BindError, match=rf"cmp_indices\[0, 0\] = .* maps to cmp_block_table\[{page}\] = -1"):
        _kernel(d, check=False)
    d = make_sparse_attn_inputs(TINY, 8, 8, seed=0, compress_ratio=4)
    d["cmp_indices"][2, 1] = TINY.cmp_kv_block_num * TINY.block_size
    with pytest.raises(BindError, match="past the compressed block table"):
        _kernel(d, check=False)


def test_token_count_above_capacity_raises_before_any_task():
    d = make_sparse_attn_inputs(TINY, 129, 129, seed=0, compress_ratio=0)
    with pytest.raises(CapacityError, match="sparse_kv"):
        _kernel(d, check=False)


def test_wrong_argument_shape_raises_bind_error():
    d = make_sparse_attn_inputs(TINY, 8, 8, seed=0, compress_ratio=4)
    d["attn_sink"] = d["attn_sink"][:-1].contiguous()
    with pytest.raises(BindError, match="attn_sink"):
        _kernel(d)


@pytest.mark.slow
def test_flash_prefill_matches_golden():
    cr = get_case("prefill_sparse_attn").build("flash", "prefill")
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error
    assert res.program.stats.tasks == 6 + 64 + 32 + 32 + 1


def test_stable_inline_signature():
    import pto.language as pl
    from pto.models.deepseek_v4.prefill_sparse_attn import prefill_sparse_attn

    @pl.jit
    def entry(q: pl.Tensor, ori_kv: pl.Tensor, swa_indices: pl.Tensor, cmp_kv: pl.Tensor,
              cmp_block_table: pl.Tensor, cmp_indices: pl.Tensor, attn_sink: pl.Tensor,
              num_tokens: pl.Scalar[pl.INT32], rope_cos: pl.Tensor, rope_sin: pl.Tensor, wo_a: pl.Tensor,
              wo_b: pl.Tensor, wo_b_scale: pl.Tensor, attn_out: pl.Out[pl.Tensor]):
        return prefill_sparse_attn(q, ori_kv, swa_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink,
                                   num_tokens, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale, attn_out, TINY)

    d = make_sparse_attn_inputs(TINY, 20, 17, seed=8)
    out = torch.zeros(20, TINY.hidden_size, dtype=torch.bfloat16)
    entry(*(d[n] for n in ARGS), out)
    ref, _ = _kernel(d, check=False)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("num_tokens", [-1, 17])
def test_num_tokens_outside_the_chunk_is_a_bind_error(num_tokens):
    d = make_sparse_attn_inputs(TINY, 16, 16, seed=5)
    d["num_tokens"] = num_tokens
    with pytest.raises(BindError, match="num_tokens"):
        _kernel(d)
