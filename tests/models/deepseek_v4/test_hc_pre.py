"""hc_pre DSL kernel ("separate" variant) vs its golden (pypto-lib `models/deepseek/v4-flash/hc_pre.py`): tiny
preset at every tail shape, the seed_scopes variant bit-identical, exact task names and
edges of both graphs, the init-0 split-K scratch, capacity and tiling errors; FLASH twins
are slow."""

import functools

import pytest
import torch

import pto
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.hc_pre import build_hc_pre, hc_pre_entry, hc_pre_tiling

from dsv4_checks import assert_capacity_error_before_any_task, assert_graph, build_past_capacity_check, find_buffer

TINY = get_config("tiny")
TASKS = ["hc_pre_rms", "hc_pre_linear", "split_pre_post", "comb_sinkhorn", "mix_x"]
EDGES = {("hc_pre_rms", "split_pre_post"), ("hc_pre_linear", "split_pre_post"),
         ("hc_pre_rms", "comb_sinkhorn"), ("hc_pre_linear", "comb_sinkhorn"), ("split_pre_post", "mix_x")}
# the seed writes mixes_raw: the atomic adds wait for it, and its write box stays registered,
# so the two readers of mixes_raw also get a (transitively implied) edge on it
SEED_EDGES = EDGES | {("hc_pre_seed", "hc_pre_linear"), ("hc_pre_seed", "split_pre_post"),
                      ("hc_pre_seed", "comb_sinkhorn")}


@functools.lru_cache(maxsize=None)
def _run(preset: str, mode: str, T=None, seed_scopes=False):
    cr = build_hc_pre(preset, mode, T=T, seed_scopes=seed_scopes)
    return run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)


@pytest.mark.parametrize("T", [1, 7, 8, 16, 24, 128])
def test_hc_pre_matches_golden_and_seed_variant_is_bit_identical(T):
    res, seeded = _run("tiny", "prefill", T), _run("tiny", "prefill", T, True)
    for r in (res, seeded):
        assert r.passed, r.error
        assert set(r.outputs) == {"x_mixed", "post", "comb"}
    for name in ("x_mixed", "post", "comb"):
        assert torch.equal(res.actual[name], seeded.actual[name]), name
    # Sinkhorn ends on a column pass: every output stream's input weights sum to ~1
    comb = res.actual["comb"].reshape(T, TINY.hc_mult, TINY.hc_mult)
    assert torch.allclose(comb.sum(dim=1), torch.ones(T, TINY.hc_mult), atol=1e-5)


@pytest.mark.parametrize("T", [1, 7, 8, 16, 24, 128])
def test_hc_pre_graph_has_no_seed_task(T):
    assert_graph(_run("tiny", "prefill", T).program.graph, TASKS, EDGES, 5)
    assert_graph(_run("tiny", "prefill", T, True).program.graph, ["hc_pre_seed"] + TASKS, SEED_EDGES, 8)


@pytest.mark.parametrize("T", [7, 24])
def test_hc_pre_mixes_raw_is_zero_initialised_at_t_linear(T):
    prog = _run("tiny", "prefill", T).program
    mixes = find_buffer(prog, "mixes_raw")
    t_linear = -(-T // 16) * 16
    assert mixes.shape == (t_linear, 32) and mixes.init_value == 0 and mixes.kind == "scratch"
    inv_rms = find_buffer(prog, "inv_rms")
    assert inv_rms.shape == (t_linear, 1) and inv_rms.init_value is None
    seeded = _run("tiny", "prefill", T, True).program
    seeded_mixes = find_buffer(seeded, "mixes_raw")
    assert seeded_mixes.shape == (128, 32) and seeded_mixes.init_value is None
    seed = next(t for t in seeded.graph.tasks if t.name == "hc_pre_seed")
    assert [(f.kind, f.box) for f in seeded.footprints(seed)] == [("write", (0, t_linear, 0, 32))]


@pytest.mark.parametrize("seed_scopes", [False, True])
def test_hc_pre_capacity_error_names_tensor_before_any_task(seed_scopes, monkeypatch):
    cr = build_past_capacity_check(monkeypatch, build_hc_pre, "tiny", "prefill", T=129, seed_scopes=seed_scopes)
    assert_capacity_error_before_any_task(cr, "mixes_raw")


def test_hc_pre_tiling_errors():
    with pytest.raises(pto.ConfigError, match="hc_mult=9"):
        hc_pre_tiling(TINY.replace(hc_mult=9))
    with pytest.raises(pto.ConfigError, match="hidden_size=120"):
        hc_pre_entry(TINY.replace(hidden_size=120))
    tl = hc_pre_tiling(get_config("flash"))
    assert (tl.mix_pad, tl.hc_pad, tl.k_slice, tl.k_tile, tl.d_tile) == (32, 8, 4096, 4096, 4096)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_hc_pre_flash(mode):
    res, seeded = _run("flash", mode), _run("flash", mode, None, True)
    assert res.passed, res.error
    assert seeded.passed, seeded.error
    for name in ("x_mixed", "post", "comb"):
        assert torch.equal(res.actual[name], seeded.actual[name]), name
    assert res.program.graph.named_edges() == EDGES


def test_hc_pre_zero_init_is_load_bearing():
    """Without its allocation-time zero, mixes_raw reaches the outputs undefined."""
    from pto.runtime.sanitizer import drop_init_values
    cr = build_hc_pre("tiny", "prefill", T=7)
    with drop_init_values("mixes_raw"), pytest.raises(pto.UndefinedOutputError, match="mixes_raw"):
        run_jit(cr.fn, cr.specs, cr.golden, cr.compare)


def test_hc_pre_token_tiles_do_not_change_values(monkeypatch):
    """The CPU-sized token and M tiles are value-neutral: the reference's 8-token vector
    blocks and 16-row linear blocks give the same bits here (rows are independent; only the
    K tiling associates, up to how the BLAS blocks a matmul)."""
    import pto.models.deepseek_v4.hc_pre as mod
    T = 40
    big = _run("tiny", "prefill", T)
    for name in ("HC_RMS_T_TILE", "HC_SPLIT_T_TILE", "HC_COMB_T_TILE", "HC_MIX_T_TILE"):
        monkeypatch.setattr(mod, name, 8)
    monkeypatch.setattr(mod, "HC_LINEAR_M_TILE", 16)
    cr = build_hc_pre("tiny", "prefill", T=T)
    ref = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)
    assert ref.passed, ref.error
    blocks = {t.name: t.n_blocks for t in ref.program.graph.tasks}
    assert blocks == {"hc_pre_rms": 5, "hc_pre_linear": 12, "split_pre_post": 5, "comb_sinkhorn": 5, "mix_x": 5}
    for name in ("x_mixed", "post", "comb"):
        assert torch.equal(big.actual[name], ref.actual[name]), name


@pytest.mark.slow
def test_hc_pre_every_token_count_up_to_capacity():
    failed = [T for T in range(1, 129) if not _run("tiny", "prefill", T).passed]
    assert failed == []
