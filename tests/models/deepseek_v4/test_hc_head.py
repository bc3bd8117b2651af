"""hc_head (final hyper-connection collapse) vs its golden and transformers'
``DeepseekV4HyperHead`` (pypto-lib `models/deepseek/v4-flash/hc_head.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`): the seed_scopes variant
is bit-identical, mixes_raw is zero-initialised at allocation and that zero is
load-bearing, exact task names and edges."""

import functools

import pytest
import torch

import pto
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.hc_head import build_hc_head, golden_hc_head, hc_head_kernels

from dsv4_checks import assert_capacity_error_before_any_task, build_past_capacity_check, find_buffer

TINY = get_config("tiny")
TASKS = ["hc_head_rms", "hc_head_linear", "hc_head_mix"]
EDGES = {("hc_head_rms", "hc_head_mix"), ("hc_head_linear", "hc_head_mix")}


@functools.lru_cache(maxsize=None)
def _run(mode="prefill", T=None, seed_scopes=False, preset="tiny"):
    cr = build_hc_head(preset, mode, T=T, seed_scopes=seed_scopes)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=preset == "tiny")
    assert res.passed, res.error
    return cr, res


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("prefill", 9), ("prefill", 1)])
def test_hc_head_matches_golden_and_seed_variant_is_bit_identical(mode, T):
    (_, res), (_, seeded) = _run(mode, T), _run(mode, T, True)
    assert torch.equal(res.actual["y"], seeded.actual["y"])
    assert [t.name for t in res.program.graph.tasks] == TASKS
    assert res.program.graph.named_edges() == EDGES
    assert [t.name for t in seeded.program.graph.tasks] == ["hc_head_seed"] + TASKS
    assert seeded.program.graph.named_edges() == EDGES | {("hc_head_seed", "hc_head_linear"),
                                                          ("hc_head_seed", "hc_head_mix")}
    mixes = find_buffer(res.program, "mixes_raw")
    t = res.actual["y"].shape[0]
    assert mixes.shape == (-(-t // 16) * 16, 16) and mixes.init_value == 0
    assert find_buffer(seeded.program, "mixes_raw").init_value is None


def test_hc_head_zero_init_is_load_bearing():
    from pto.runtime.sanitizer import drop_init_values
    cr = build_hc_head("tiny", "prefill", T=7)
    with drop_init_values("mixes_raw"), pytest.raises(pto.UndefinedOutputError, match="mixes_raw"):
        run_jit(cr.fn, cr.specs, cr.golden, cr.compare)


def test_hc_head_golden_equals_transformers_hyper_head():
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead

    cr, _ = _run("prefill", 24)
    v = {s.name: s.init_value for s in cr.specs if s.init_value is not None}
    head = DeepseekV4HyperHead(DeepseekV4Config(hidden_size=TINY.hidden_size, hc_mult=TINY.hc_mult,
                                                hc_eps=TINY.hc_eps, rms_norm_eps=TINY.rms_norm_eps))
    with torch.no_grad():
        head.hc_fn.copy_(v["hc_fn"])
        head.hc_base.copy_(v["hc_base"])
        head.hc_scale.copy_(v["hc_scale"])
        want = head(v["x_hc"].unsqueeze(0))[0]
    got = golden_hc_head(v["x_hc"], v["hc_fn"], v["hc_scale"], v["hc_base"], TINY, float32=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed_scopes", [False, True])
def test_hc_head_capacity_error_before_any_task(seed_scopes, monkeypatch):
    cr = build_past_capacity_check(monkeypatch, build_hc_head, "tiny", "prefill", T=129, seed_scopes=seed_scopes)
    assert_capacity_error_before_any_task(cr, "mixes_raw")


def test_hc_head_tiling_errors():
    with pytest.raises(pto.ConfigError, match="hc_mult=17"):
        hc_head_kernels(TINY.replace(hc_mult=17))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_hc_head_flash(mode):
    (_, res), (_, seeded) = _run(mode, preset="flash"), _run(mode, preset="flash", seed_scopes=True)
    assert torch.equal(res.actual["y"], seeded.actual["y"])
