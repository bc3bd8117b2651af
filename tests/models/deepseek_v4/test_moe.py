"""moe (single-rank FFN sub-block: hc_pre -> gate -> shared + routed experts -> hc_post) vs
its golden (pypto-lib `models/deepseek/v4-flash/moe.py`): hash and learned layers, the seed_scopes variant
bit-identical, rows of inactive or padded tokens exactly zero (9 tokens in 8-row tiles),
and the chained golden checked against its pieces."""

import functools

import pytest
import torch

from pto.golden import ScalarSpec, run_jit
from pto.models.deepseek_v4 import expert_shared as sh_mod
from pto.models.deepseek_v4 import gate as gate_mod
from pto.models.deepseek_v4 import moe as moe_mod
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.moe import build_moe, golden_moe

TINY = get_config("tiny")
GATE_TASKS = ["ffn_norm", "gate_scores"]
HC_PRE = ["hc_pre_rms", "hc_pre_linear", "split_pre_post", "comb_sinkhorn", "mix_x"]


def _values(cr) -> dict:
    return {s.name: s.to_python() if isinstance(s, ScalarSpec) else s.init_value for s in cr.specs}


@functools.lru_cache(maxsize=None)
def _run(mode="prefill", T=None, layer_id=None, num_tokens=None, seed_scopes=False, preset="tiny"):
    cr = build_moe(preset, mode, T=T, layer_id=layer_id, num_tokens=num_tokens, seed_scopes=seed_scopes)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=preset == "tiny")
    assert res.passed, res.error
    return cr, res


@pytest.mark.parametrize("mode,layer_id", [("decode", 0), ("prefill", 3)])
def test_moe_matches_golden_and_seed_variant_is_bit_identical(mode, layer_id):
    cr, res = _run(mode, layer_id=layer_id)
    _, seeded = _run(mode, layer_id=layer_id, seed_scopes=True)
    assert torch.equal(res.actual["x_next"], seeded.actual["x_next"])
    route = "route_hash" if layer_id < TINY.num_hash_layers else "route_topk"
    names = [t.name for t in res.program.graph.tasks]
    # expert_routed: a gate/up and a down task per group of row tiles (2 groups; one tile per expert with rows)
    idx = golden_moe(_values(cr), TINY, return_intermediates=True)[1]["indices"]
    down = [t.n_blocks for t in res.program.graph.tasks if t.name == "expert_down"]
    assert sum(down) == int(torch.unique(idx[idx >= 0]).numel()) and len(down) == 2
    assert names == HC_PRE + GATE_TASKS + [route, "sh_gate_up_act_q", "sh_w2", "moe_dispatch"] + [
        "expert_gate_up", "expert_down"] * 2 + ["moe_combine", "moe_shared_routed", "hc_post_prefill"]
    seeded_names = [t.name for t in seeded.program.graph.tasks]
    assert set(seeded_names) - set(names) == {"hc_pre_seed", "sh_h_seed"} and len(seeded_names) == len(names) + 2


def test_moe_padded_rows_are_exactly_zero_with_8_row_tiles(monkeypatch):
    """9 active tokens of a 16-row chunk in 8-row tiles: rows 9..15 of x_next are 0.0."""
    for mod, name in ((gate_mod, "GATE_T_TILE"), (sh_mod, "SH_T_TILE"), (moe_mod, "MOE_T_TILE")):
        monkeypatch.setattr(mod, name, 8)
    cr = build_moe("tiny", "prefill", T=16, num_tokens=9)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)
    assert res.passed, res.error
    x_next = res.actual["x_next"]
    assert bool((x_next[9:] == 0).all()) and bool((x_next[:9] != 0).any(dim=-1).all())
    blocks = {t.name: t.n_blocks for t in res.program.graph.tasks}
    assert blocks["ffn_norm"] == 2 and blocks["moe_shared_routed"] == 2 and "gate_inactive_pad" in blocks
    # padded tokens have no route: every expert_gate_up / expert_down row belongs to an active token
    v = _values(cr)
    _, mids = golden_moe(v, TINY, return_intermediates=True)
    assert bool((mids["indices"][9:] == -1).all())
    assert int((mids["indices"][:9] >= 0).sum()) == 9 * TINY.num_experts_per_tok


def test_moe_all_inactive_writes_zeros_and_runs_no_expert():
    cr = build_moe("tiny", "prefill", T=8, num_tokens=0)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)
    assert res.passed, res.error
    assert bool((res.actual["x_next"] == 0).all())
    names = [t.name for t in res.program.graph.tasks]
    assert "expert_gate_up" not in names and "expert_down" not in names and "moe_shared_routed" not in names


def test_moe_golden_is_the_chain_of_its_pieces():
    """The unquantised FP32 golden equals shared + routed over the router's choice, hand-chained."""
    from pto.models.deepseek_v4.hc_post import golden_hc_post

    cr, _ = _run("decode", layer_id=3)
    v = _values(cr)
    for k in ("w1", "w3", "w2", "sh_w1", "sh_w3", "sh_w2"):  # dequantised float weights
        v[k] = v[k].float() * v[k + "_scale"].unsqueeze(-1)
    x_next, mids = golden_moe(v, TINY, weight_format="bf16", float32=True, return_intermediates=True)
    h = mids["x_norm"]
    want = torch.zeros_like(h)
    L = TINY.swiglu_limit
    for t in range(8):
        for k in range(TINY.num_experts_per_tok):
            e = int(mids["indices"][t, k])
            g = (h[t] @ v["w1"][e].T).clamp(max=L)
            u = (h[t] @ v["w3"][e].T).clamp(-L, L)
            want[t] += mids["weights"][t, k] * ((torch.nn.functional.silu(g) * u) @ v["w2"][e].T)
        g = (h[t] @ v["sh_w1"].T).clamp(max=L)
        u = (h[t] @ v["sh_w3"].T).clamp(-L, L)
        want[t] += (torch.nn.functional.silu(g) * u) @ v["sh_w2"].T
    assert torch.allclose(mids["ffn_out"], want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(x_next, golden_hc_post(want, v["x_hc"], mids["post"], mids["comb"]), rtol=1e-5,
                          atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_moe_demo(mode):
    _, res = _run(mode, preset="demo")
    _, seeded = _run(mode, preset="demo", seed_scopes=True)
    assert torch.equal(res.actual["x_next"], seeded.actual["x_next"])


def test_moe_kernels_are_capped_at_the_demo_preset_for_the_demo_and_benchmarks():
    from pto.golden import get_case
    from pto.models.deepseek_v4.config import capped_preset

    for name in ("moe", "expert_routed"):
        assert get_case(name).max_preset == "demo"
    assert get_case("gate").max_preset is None and get_case("lm_head").max_preset is None
    assert [capped_preset(p, "demo") for p in ("tiny", "demo", "flash", "pro")] == ["tiny", "demo", "demo", "demo"]
    assert capped_preset("flash", None) == "flash"
