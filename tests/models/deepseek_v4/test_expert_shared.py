"""expert_shared (W8A8 SwiGLU with the swiglu_limit clamp) vs its golden and transformers'
``DeepseekV4MLP`` (pypto-lib `models/deepseek/v4-flash/expert_shared.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`): the seed_scopes variant is
bit-identical, h_i8 is zero-initialised at allocation (its pad rows feed the w2 matmul),
and with large weights 10-20 % of the gate / up pre-activations cross the limit."""

import functools

import pytest
import torch

import pto
from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.expert_shared import (build_expert_shared, expert_shared_kernels, golden_expert_shared)

from dsv4_checks import assert_capacity_error_before_any_task, build_past_capacity_check, find_buffer

TINY = get_config("tiny")
CLAMP_STD = 7.0  # weight scale at which 10-20 % of the g and u values cross swiglu_limit = 10


@functools.lru_cache(maxsize=None)
def _run(preset="tiny", mode="prefill", T=None, seed_scopes=False, std=1.5):
    cr = build_expert_shared(preset, mode, T=T, seed_scopes=seed_scopes, std=std)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=preset == "tiny")
    return cr, res


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("prefill", 9), ("prefill", 1)])
def test_expert_shared_matches_golden_and_seed_variant_is_bit_identical(mode, T):
    (_, res), (_, seeded) = _run(mode=mode, T=T), _run(mode=mode, T=T, seed_scopes=True)
    assert res.passed, res.error
    assert seeded.passed, seeded.error
    assert torch.equal(res.actual["sh"], seeded.actual["sh"])
    g, gs = res.program.graph, seeded.program.graph
    assert [t.name for t in g.tasks] == ["sh_gate_up_act_q", "sh_w2"]
    assert g.named_edges() == {("sh_gate_up_act_q", "sh_w2")}
    assert [t.name for t in gs.tasks] == ["sh_h_seed", "sh_gate_up_act_q", "sh_w2"]
    t = res.actual["sh"].shape[0]
    # the w2 matmul reads the seed's zeros only where pad rows exist (T not a multiple of 16)
    pad_edge = {("sh_h_seed", "sh_w2")} if t % 16 else set()
    assert gs.named_edges() == {("sh_gate_up_act_q", "sh_w2"), ("sh_h_seed", "sh_gate_up_act_q")} | pad_edge


def test_expert_shared_h_i8_is_zero_initialised_at_t_pad():
    _, res = _run(T=9)
    h = find_buffer(res.program, "h_i8")
    assert h.shape == (16, TINY.moe_intermediate_size) and h.init_value == 0
    _, seeded = _run(T=9, seed_scopes=True)
    hs = find_buffer(seeded.program, "h_i8")
    assert hs.shape == (128, TINY.moe_intermediate_size) and hs.init_value is None
    seed = next(t for t in seeded.program.graph.tasks if t.name == "sh_h_seed")
    assert [(f.kind, f.box) for f in seeded.program.footprints(seed)] == [
        ("write", (0, 16, 0, TINY.moe_intermediate_size))]


def _dequant(v):
    return {"x": v["x_i8"].float() * v["x_scale"],
            **{w: v[w].float() * v[w + "_scale"][:, None] for w in ("w1", "w3", "w2")}}


def test_expert_shared_clamp_matches_golden_and_transformers():
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4MLP

    cr, res = _run(std=CLAMP_STD)
    assert res.passed, res.error
    v = {s.name: s.init_value for s in cr.specs if s.init_value is not None}
    dq = _dequant(v)
    L = TINY.swiglu_limit
    g, u = dq["x"] @ dq["w1"].T, dq["x"] @ dq["w3"].T
    frac_g, frac_u = float((g > L).float().mean()), float((u.abs() > L).float().mean())
    # g is clamped from above only, u on both sides: 10-20 % of all pre-activations cross
    assert 0.10 <= (frac_g + frac_u) / 2 <= 0.20 and frac_g > 0.05 and frac_u > 0.05, (frac_g, frac_u)
    # the golden's clamped SwiGLU (unquantised form) equals transformers' shared MLP
    hf = DeepseekV4MLP(DeepseekV4Config(hidden_size=TINY.hidden_size, moe_intermediate_size=TINY.moe_intermediate_size,
                                        swiglu_limit=L))
    with torch.no_grad():
        hf.gate_proj.weight.copy_(dq["w1"])
        hf.up_proj.weight.copy_(dq["w3"])
        hf.down_proj.weight.copy_(dq["w2"])
        want = hf(dq["x"])
    got = golden_expert_shared(dq["x"], None, dq["w1"], None, dq["w3"], None, dq["w2"], None, TINY,
                               weight_format="bf16", float32=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    # the quantised kernel stays within W8A8 noise of the unquantised model
    rel = (res.actual["sh"].float() - want).norm() / want.norm()
    assert float(rel) < 0.02


@pytest.mark.parametrize("seed_scopes", [False, True])
def test_expert_shared_capacity_error_before_any_task(seed_scopes, monkeypatch):
    cr = build_past_capacity_check(monkeypatch, build_expert_shared, "tiny", "prefill", T=129, seed_scopes=seed_scopes)
    assert_capacity_error_before_any_task(cr, "h_i8")


def test_expert_shared_tiling_errors():
    with pytest.raises(pto.ConfigError, match="moe_intermediate_size=40"):
        expert_shared_kernels(TINY.replace(moe_intermediate_size=40))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_expert_shared_flash(mode):
    (_, res), (_, seeded) = _run("flash", mode), _run("flash", mode, seed_scopes=True)
    assert res.passed, res.error
    assert torch.equal(res.actual["sh"], seeded.actual["sh"])
