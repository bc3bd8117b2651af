"""expert_routed (one rank: group by expert, W8A8 SwiGLU, weighted combine) vs its golden and
transformers' ``DeepseekV4Experts`` (pypto-lib `models/deepseek/v4-flash/expert_routed.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`): every token
to one expert, an expert with no token (no block, no work), inactive rows, T not a multiple
of the tiles, the swiglu_limit clamp, bad expert ids."""

import functools

import pytest
import torch

import pto
from pto.golden import run_jit
from pto.models.deepseek_v4 import expert_routed as mod
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.expert_routed import build_expert_routed, golden_expert_routed

from dsv4_checks import build_past_capacity_check

TINY = get_config("tiny")
E, K = TINY.n_routed_experts, TINY.num_experts_per_tok


@functools.lru_cache(maxsize=None)
def _run(mode="prefill", T=None, routing="random", num_tokens=None, std=1.5, preset="tiny"):
    cr = build_expert_routed(preset, mode, T=T, routing=routing, num_tokens=num_tokens, std=std)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=preset == "tiny")
    assert res.passed, res.error
    return cr, res


def _inputs(cr):
    return {s.name: s.init_value for s in cr.specs if s.init_value is not None}


def _expected_blocks(indices):
    counts = torch.bincount(indices[indices >= 0].long(), minlength=E)
    return counts, int(sum(-(-int(c) // mod.ROUTED_M_TILE) for c in counts))


def _ffn_tasks(n_tiles, n_f=1, n_d=1):
    """The row tiles in min(ROUTED_GROUPS, n_tiles) groups, per group an expert_gate_up task
    (n_f blocks per tile: intermediate column tiles) and an expert_down task (n_d per tile:
    hidden column tiles); at tiny n_f = n_d = 1."""
    n_g = min(mod.ROUTED_GROUPS, n_tiles)
    sizes = [(g + 1) * n_tiles // n_g - g * n_tiles // n_g for g in range(n_g)]
    return [task for s in sizes for task in (("expert_gate_up", s * n_f), ("expert_down", s * n_d))]


@pytest.mark.parametrize("mode,T,routing,num_tokens", [
    ("decode", None, "random", None), ("prefill", None, "random", None), ("prefill", 9, "random", None),
    ("prefill", None, "one_expert", None), ("prefill", 20, "skip_last", 13), ("prefill", 16, "random", 0)])
def test_expert_routed_matches_golden(mode, T, routing, num_tokens):
    cr, res = _run(mode, T, routing, num_tokens)
    v = _inputs(cr)
    counts, n_blocks = _expected_blocks(v["indices"])
    tasks = [(t.name, t.n_blocks) for t in res.program.graph.tasks]
    # expert_ffn became gate/up + down tasks per group of row tiles (column split, 2 groups)
    assert tasks == [("moe_dispatch", 1)] + _ffn_tasks(n_blocks) + [("moe_combine", 1)]
    n = v["indices"].shape[0] if num_tokens is None else num_tokens
    assert bool((res.actual["routed_y"][n:] == 0).all())
    if routing == "one_expert":
        assert int(counts[0]) == v["indices"].shape[0]
    if routing == "skip_last":  # the expert without tokens has no block
        assert int(counts[E - 1]) == 0 and n_blocks == int((counts > 0).sum())


def test_expert_routed_splits_a_crowded_expert_into_row_tiles(monkeypatch):
    monkeypatch.setattr(mod, "ROUTED_M_TILE", 16)
    cr = build_expert_routed("tiny", "prefill", T=40, routing="one_expert")
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)
    assert res.passed, res.error
    counts, n_blocks = _expected_blocks(_inputs(cr)["indices"])
    assert int(counts[0]) == 40 and n_blocks > 16
    down = [t.n_blocks for t in res.program.graph.tasks if t.name == "expert_down"]
    assert len(down) == mod.ROUTED_GROUPS and sum(down) == n_blocks  # one block per row tile
    _, whole = _run("prefill", 40, "one_expert")
    assert torch.equal(res.actual["routed_y"], whole.actual["routed_y"])  # row tiles are value-neutral


@pytest.mark.parametrize("weight_format", ["int8", "bf16"])
def test_expert_routed_column_tiles_are_bit_identical(monkeypatch, weight_format):
    # F = 64 in 2 gate/up tiles of 32, D = 128 in 2 down tiles of 64: only output columns are
    # split (each element's reduction unchanged), so routed_y equals the one-tile run exactly
    def run():
        mod.expert_routed_kernels.cache_clear()  # the column tiles are read when the kernel is built
        cr = build_expert_routed("tiny", "decode", weight_format=weight_format)
        res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol)
        assert res.passed, res.error
        return cr, res
    _, whole = run()
    monkeypatch.setattr(mod, "ROUTED_F_TILE", 32)
    monkeypatch.setattr(mod, "ROUTED_D_TILE", 64)
    try:
        cr, split = run()
    finally:
        mod.expert_routed_kernels.cache_clear()
    _, n_tiles = _expected_blocks(_inputs(cr)["indices"])
    tasks = [(t.name, t.n_blocks) for t in split.program.graph.tasks]
    assert tasks == [("moe_dispatch", 1)] + _ffn_tasks(n_tiles, 2, 2) + [("moe_combine", 1)]
    assert torch.equal(split.actual["routed_y"], whole.actual["routed_y"])


def test_expert_routed_unquantised_golden_equals_transformers_experts_with_clamp():
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    cr, res = _run(std=7.0)
    v = _inputs(cr)
    x = v["x_i8"].float() * v["x_scale"]
    w = {k: v[k].float() * v[k + "_scale"].unsqueeze(-1) for k in ("w1", "w3", "w2")}
    g = torch.einsum("td,efd->tef", x, w["w1"])
    u = torch.einsum("td,efd->tef", x, w["w3"])
    L = TINY.swiglu_limit
    frac = (float((g > L).float().mean()) + float((u.abs() > L).float().mean())) / 2
    assert 0.10 <= frac <= 0.20, frac
    hf_cfg = DeepseekV4Config(hidden_size=TINY.hidden_size, moe_intermediate_size=TINY.moe_intermediate_size,
                              n_routed_experts=E, num_experts_per_tok=K, swiglu_limit=L)
    hf_cfg._experts_implementation = "eager"
    hf = DeepseekV4Experts(hf_cfg)
    with torch.no_grad():
        hf.gate_up_proj.copy_(torch.cat([w["w1"], w["w3"]], dim=1))
        hf.down_proj.copy_(w["w2"])
        want = hf(x, v["indices"].long(), v["weights"])
    got = golden_expert_routed(x, None, v["indices"], v["weights"], w["w1"], None, w["w3"], None, w["w2"], None,
                               TINY, weight_format="bf16", float32=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    rel = (res.actual["routed_y"] - want).norm() / want.norm()
    assert float(rel) < 0.02  # the W8A8 kernel within quantisation noise of the unquantised experts


@pytest.mark.parametrize("bad", [-2, E])
def test_expert_routed_rejects_bad_expert_id(bad):
    cr = build_expert_routed("tiny", "prefill", T=10)
    vals = [s.create_tensor() for s in cr.specs]
    vals[2][4, 1] = bad
    prog = pto.Program(cr.fn, pto.RunConfig(check=True))
    with pytest.raises(pto.BindError, match=rf"indices\[4, 1\] = {bad} outside \[-1, n_routed_experts=16\)"):
        prog.execute(vals, {})
    assert not vals[-1].any()  # nothing half-written
    v = _inputs(cr)
    v["indices"] = vals[2]
    with pytest.raises(pto.BindError, match=r"indices\[4, 1\]"):
        golden_expert_routed(*(v[k] for k in mod._ROUTED_INPUTS), TINY)


def test_expert_routed_capacity_error(monkeypatch):
    cr = build_past_capacity_check(monkeypatch, build_expert_routed, "tiny", "prefill", T=129)
    with pytest.raises(pto.CapacityError, match="recv_x"):
        cr.fn.run(*[s.create_tensor() for s in cr.specs], config=pto.RunConfig(check=True))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_expert_routed_demo(mode):
    _run(mode, preset="demo")
