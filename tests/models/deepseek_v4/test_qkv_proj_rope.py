"""qkv_proj_rope DSL kernel vs its golden (pypto-lib `models/deepseek/v4-flash/qkv_proj_rope.py`): tiny preset at every
tail shape, the seed_scopes variant bit-identical, exact task names and edges of both
graphs, the init-0 split-K scratch sized from t_pad, the INT8 quantiser on all-zero rows,
capacity and tiling errors, the late_dep gate, and materialize_rope_rows; FLASH twins slow."""

import functools

import pytest
import torch

import pto
import pto.language as pl
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.qkv_proj_rope import (INT8_AMAX_EPS, INT8_SCALE_MAX, build_qkv_proj_rope,
                                                  materialize_rope_rows_entry, qkv_proj_rope, qkv_proj_rope_entry,
                                                  qkv_proj_rope_tiling)
from pto.models.deepseek_v4.rms_norm import rms_norm
from pto.models.deepseek_v4.rope import golden_materialize_rope_rows, rope_tables

from dsv4_checks import assert_capacity_error_before_any_task, assert_graph, build_past_capacity_check, find_buffer

TINY = get_config("tiny")
OUTPUTS = ("q", "kv", "qr", "qr_scale")
TASKS = ["q_rope_prepare", "qr_proj_matmul", "qr_rms_norm_quant", "qproj_matmul", "qproj_dequant_rms_nope_rope",
         "kv_proj_matmul", "kv_rms_norm_rope"]
EDGES = {("qr_proj_matmul", "qr_rms_norm_quant"), ("qr_rms_norm_quant", "qproj_matmul"),
         ("qproj_matmul", "qproj_dequant_rms_nope_rope"), ("qr_rms_norm_quant", "qproj_dequant_rms_nope_rope"),
         ("q_rope_prepare", "qproj_dequant_rms_nope_rope"), ("kv_proj_matmul", "kv_rms_norm_rope"),
         ("q_rope_prepare", "kv_rms_norm_rope")}
SEED_TASKS = ["q_rope_prepare", "qr_proj_seed", "qr_proj_matmul", "qr_rms_norm_quant", "qproj_matmul",
              "qproj_dequant_rms_nope_rope", "kv_proj_seed", "kv_proj_matmul", "kv_rms_norm_rope"]
# each seed: its split-K matmul waits for it (WAW), and its write box stays registered, so
# the reader of the accumulator also gets a (transitively implied) edge on it
SEED_EDGES = EDGES | {("qr_proj_seed", "qr_proj_matmul"), ("qr_proj_seed", "qr_rms_norm_quant"),
                      ("kv_proj_seed", "kv_proj_matmul"), ("kv_proj_seed", "kv_rms_norm_rope")}


def _run_case(cr, zero_rows=()):
    specs = cr.specs
    if zero_rows:
        x = next(s for s in specs if s.name == "x")
        xv = x.init_value.clone()
        xv[list(zero_rows)] = 0
        x.init_value = xv
    return run_jit(cr.fn, specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)


@functools.lru_cache(maxsize=None)
def _run(preset: str, mode: str, T=None, seed_scopes=False):
    return _run_case(build_qkv_proj_rope(preset, mode, T=T, seed_scopes=seed_scopes))


@pytest.mark.parametrize("T", [1, 7, 8, 16, 24, 128])
def test_qkv_matches_golden_and_seed_variant_is_bit_identical(T):
    res, seeded = _run("tiny", "prefill", T), _run("tiny", "prefill", T, True)
    for r in (res, seeded):
        assert r.passed, r.error
        assert set(r.outputs) == set(OUTPUTS)
        assert r.outputs["qr"].label == r.outputs["qr_scale"].label == "exact"  # vs golden_qr_split_k
    for name in OUTPUTS:
        assert torch.equal(res.actual[name], seeded.actual[name]), name


@pytest.mark.parametrize("T", [1, 7, 8, 16, 24, 128])
def test_qkv_graph_has_no_seed_task(T):
    assert_graph(_run("tiny", "prefill", T).program.graph, TASKS, EDGES, 7)
    assert_graph(_run("tiny", "prefill", T, True).program.graph, SEED_TASKS, SEED_EDGES, 11)


@pytest.mark.parametrize("T", [7, 24])
def test_qkv_scratch_sized_from_t_pad(T):
    prog = _run("tiny", "prefill", T).program
    t_pad = -(-T // 16) * 16
    Lq, hd, qd = TINY.q_lora_rank, TINY.head_dim, TINY.q_dim
    for name, shape, init in (("qr_fp32", (t_pad, Lq), 0), ("kv_fp32", (t_pad, hd), 0),
                              ("qr_i8_matmul", (t_pad, Lq), None), ("q_proj_i32", (t_pad, qd), None),
                              ("q_rope_cos_il", (T, 64), None)):
        b = find_buffer(prog, name)
        assert (b.shape, b.init_value) == (shape, init), name
    seeded = _run("tiny", "prefill", T, True).program
    seeded_qr = find_buffer(seeded, "qr_fp32")
    assert seeded_qr.shape == (128, Lq) and seeded_qr.init_value is None
    assert find_buffer(seeded, "q_proj_i32").shape == (128, qd)
    for seed, width in (("qr_proj_seed", Lq), ("kv_proj_seed", hd)):
        task = next(t for t in seeded.graph.tasks if t.name == seed)
        assert [(f.kind, f.box) for f in seeded.footprints(task)] == [("write", (0, t_pad, 0, width))]


@pytest.mark.parametrize("seed_scopes", [False, True])
def test_qkv_all_zero_rows_quantise_to_zero_with_finite_scale(seed_scopes):
    zero = (0, 3, 9)
    res = _run_case(build_qkv_proj_rope("tiny", "prefill", T=10, seed_scopes=seed_scopes), zero_rows=zero)
    assert res.passed, res.error
    qr, scale = res.actual["qr"], res.actual["qr_scale"]
    assert torch.equal(qr[list(zero)], torch.zeros(len(zero), TINY.q_lora_rank, dtype=torch.int8))
    assert torch.isfinite(scale).all()
    expected = torch.tensor(1.0) / (torch.tensor(INT8_SCALE_MAX) / torch.tensor(INT8_AMAX_EPS))
    assert torch.equal(scale[list(zero), 0], expected.expand(len(zero)))
    assert (res.actual["q"][list(zero)] == 0).all() and (res.actual["kv"][list(zero)] == 0).all()
    others = [t for t in range(10) if t not in zero]
    assert (qr[others].abs().amax(dim=1) == 127).all()


@pytest.mark.parametrize("seed_scopes", [False, True])
def test_qkv_capacity_error_names_tensor_before_any_task(seed_scopes, monkeypatch):
    cr = build_past_capacity_check(monkeypatch, build_qkv_proj_rope, "tiny", "prefill", T=129,
                                   seed_scopes=seed_scopes)
    assert_capacity_error_before_any_task(cr, "qr_fp32")


def test_qkv_tiling():
    with pytest.raises(pto.ConfigError, match="q_lora_rank=48"):
        qkv_proj_rope_tiling(TINY.replace(q_lora_rank=48))
    with pytest.raises(pto.ConfigError, match="num_attention_heads=6"):
        qkv_proj_rope_entry(TINY.replace(num_attention_heads=6, o_groups=3))
    fl = qkv_proj_rope_tiling(get_config("flash"))
    assert (fl.qr_n, fl.qr_k, fl.kv_n, fl.kv_k, fl.qp_n, fl.qp_per_task, fl.qd_heads) == \
        (128, 2048, 128, 1024, 1024, 2, 4)
    # block counts of the reference at FLASH: 16 qr_proj, 16 qproj, 16 dequant, 16 kv_proj
    assert (1024 // fl.qr_n * 2, 32768 // fl.qp_n // fl.qp_per_task, 64 // fl.qd_heads, 512 // fl.kv_n * 4) == \
        (16, 16, 16, 16)


T_DYN = pl.dynamic("T")


def test_qkv_late_dep_gates_kv_proj_behind_rms_norm():
    """The composition the attention blocks use: rms_norm -> task_dummy late_dep -> qkv."""
    cr = build_qkv_proj_rope("tiny", "prefill", T=9)
    D, Lq, H, hd, r, qd = (TINY.hidden_size, TINY.q_lora_rank, TINY.num_attention_heads, TINY.head_dim,
                           TINY.qk_rope_head_dim, TINY.q_dim)

    @pl.jit
    def entry(x: pl.Tensor[[T_DYN, D], pl.BF16], norm_w: pl.Tensor[[D], pl.BF16],
              wq_a: pl.Tensor[[D, Lq], pl.BF16], wq_b: pl.Tensor[[Lq, qd], pl.INT8],
              wq_b_scale: pl.Tensor[[qd], pl.FP32], wkv: pl.Tensor[[D, hd], pl.BF16],
              rope_cos: pl.Tensor[[T_DYN, r], pl.BF16], rope_sin: pl.Tensor[[T_DYN, r], pl.BF16],
              gamma_cq: pl.Tensor[[Lq], pl.BF16], gamma_ckv: pl.Tensor[[hd], pl.BF16],
              q: pl.Out[pl.Tensor[[T_DYN, H, hd], pl.BF16]], kv: pl.Out[pl.Tensor[[T_DYN, hd], pl.BF16]],
              qr: pl.Out[pl.Tensor[[T_DYN, Lq], pl.INT8]], qr_scale: pl.Out[pl.Tensor[[T_DYN, 1], pl.FP32]]):
        x_normed = pl.create_tensor([pl.tensor.dim(x, 0), D], pl.BF16, name="x_normed")
        late_dep = pl.system.task_dummy(deps=[rms_norm(x, norm_w, x_normed, TINY)])
        qkv_proj_rope(x_normed, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv,
                      q, kv, qr, qr_scale, late_dep, TINY)

    vals = {s.name: s.create_tensor() for s in cr.specs}
    prog = entry.run(vals["x"], torch.ones(D, dtype=torch.bfloat16), *[vals[s.name] for s in cr.specs[1:]],
                     config=pto.RunConfig(check=True))
    named = prog.graph.named_edges()
    assert ("rms_norm", "task_dummy") in named and ("task_dummy", "kv_proj_matmul") in named
    assert ("rms_norm", "qr_proj_matmul") in named and ("rms_norm", "kv_proj_matmul") in named
    kv_task = next(t for t in prog.graph.tasks if t.name == "kv_proj_matmul")
    assert kv_task.explicit == [next(t.id for t in prog.graph.tasks if t.kind == "dummy")]


@pytest.mark.parametrize("T,num_tokens", [(1, 1), (13, 9), (16, 0), (24, 24)])
def test_materialize_rope_rows_matches_golden(T, num_tokens):
    cos_f, sin_f = rope_tables(TINY, "main")
    cos_t, sin_t = cos_f.bfloat16(), sin_f.bfloat16()
    gen = torch.Generator().manual_seed(T)
    pos = torch.randint(0, TINY.max_position_embeddings, (T,), generator=gen, dtype=torch.int32)
    init_c = torch.full((T, TINY.qk_rope_head_dim), 3.0, dtype=torch.bfloat16)
    init_s = torch.full((T, TINY.qk_rope_head_dim), -3.0, dtype=torch.bfloat16)
    out_c, out_s = init_c.clone(), init_s.clone()
    prog = materialize_rope_rows_entry(TINY).run(cos_t, sin_t, pos, num_tokens, out_c, out_s,
                                                 config=pto.RunConfig(check=True))
    exp_c, exp_s = golden_materialize_rope_rows(cos_t, sin_t, pos, num_tokens, init_c, init_s)
    assert torch.equal(out_c, exp_c) and torch.equal(out_s, exp_s)
    assert [(t.name, t.n_blocks) for t in prog.graph.tasks] == [("qkv_rope_rows", -(-T // 8))]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_qkv_flash(mode):
    res, seeded = _run("flash", mode), _run("flash", mode, None, True)
    assert res.passed, res.error
    assert seeded.passed, seeded.error
    for name in OUTPUTS:
        assert torch.equal(res.actual[name], seeded.actual[name]), name
    assert res.program.graph.named_edges() == EDGES


@pytest.mark.parametrize("scratch,output", [("qr_fp32", "'q'"), ("kv_fp32", "'kv'")])
def test_qkv_zero_init_is_load_bearing(scratch, output):
    """Without its allocation-time zero, a split-K accumulator reaches the outputs undefined."""
    from pto.runtime.sanitizer import drop_init_values
    cr = build_qkv_proj_rope("tiny", "prefill", T=7)
    with drop_init_values(scratch), pytest.raises(pto.UndefinedOutputError, match=scratch) as err:
        run_jit(cr.fn, cr.specs, cr.golden, cr.compare)
    assert f"output {output}" in str(err.value)


def test_qkv_token_tiles_do_not_change_values(monkeypatch):
    """The CPU-sized token and M tiles are value-neutral: 8-token vector steps and 16-row
    matmul steps (the reference's) give the same bits here (rows are independent)."""
    import pto.models.deepseek_v4.qkv_proj_rope as mod
    T = 40
    big = _run("tiny", "prefill", T)
    monkeypatch.setattr(mod, "QKV_T_TILE", 8)
    monkeypatch.setattr(mod, "QKV_M_TILE", 16)
    ref = _run_case(build_qkv_proj_rope("tiny", "prefill", T=T))
    assert ref.passed, ref.error
    assert {t.name: t.n_blocks for t in ref.program.graph.tasks}["kv_rms_norm_rope"] == 5
    for name in OUTPUTS:
        assert torch.equal(big.actual[name], ref.actual[name]), name


@pytest.mark.slow
def test_qkv_every_token_count_up_to_capacity():
    failed = [T for T in range(1, 129) if not _run_case(build_qkv_proj_rope("tiny", "prefill", T=T)).passed]
    assert failed == []
