"""gate (MoE router) vs its golden, hand-computed routes and float64 (pypto-lib `models/deepseek/v4-flash/gate.py`,
transformers `models/deepseek_v4/modeling_deepseek_v4.py`): learned and hash layers, the stable sqrt-softplus at -20 / -200 / +100,
the score-correction bias used for selection only, inactive rows, parallel hash tiles."""

import math

import pytest
import torch

import pto
import pto.language as pl
from pto.golden import run_jit
from pto.models.deepseek_v4 import gate as gate_mod
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.gate import build_gate, gate_kernels, golden_gate, stable_sqrt_softplus

TINY = get_config("tiny")


def _run(cr, check=True):
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=check)
    assert res.passed, res.error
    return res


def _constant_logit_inputs(cfg, T, logits):
    """x = 1 (so the normed row is ~1), gamma = 1, gate_w[e] = logits[e] / D: every token's
    logit of expert e is logits[e] * rsqrt(1 + eps)."""
    D = cfg.hidden_size
    lg = torch.as_tensor(logits, dtype=torch.float32)
    return {"x": torch.ones(T, D, dtype=torch.bfloat16), "norm_w": torch.ones(D, dtype=torch.bfloat16),
            "gate_w": (lg / D).unsqueeze(1).expand(-1, D).contiguous(),
            "gate_bias": torch.zeros(cfg.n_routed_experts)}


@pytest.mark.parametrize("layer_id,mode,T,num_tokens", [
    (3, "prefill", None, None), (0, "decode", None, None), (1, "prefill", 9, 9), (4, "prefill", 9, 7),
    (0, "prefill", 40, 0)])
def test_gate_matches_golden(layer_id, mode, T, num_tokens):
    res = _run(build_gate("tiny", mode, T=T, layer_id=layer_id, num_tokens=num_tokens))
    idx, w = res.actual["indices"], res.actual["weights"]
    n = res.actual["x_norm_i8"].shape[0] if num_tokens is None else num_tokens
    assert bool((idx[n:] == -1).all()) and bool((w[n:] == 0).all())
    assert bool((res.actual["x_norm_i8"][n:] == 0).all())
    if n:
        assert torch.allclose(w[:n].sum(dim=-1), torch.full((n,), TINY.routed_scaling_factor), atol=1e-5)
        assert all(len(set(r.tolist())) == TINY.num_experts_per_tok for r in idx[:n])
    names = [t.name for t in res.program.graph.tasks]
    route = "route_hash" if layer_id < TINY.num_hash_layers else "route_topk"
    assert names == (["ffn_norm", "gate_scores", route] if n else []) + (["gate_inactive_pad"] if n < idx.shape[0]
                                                                         else [])


def test_gate_hash_rows_are_table_rows_for_first_and_last_id():
    cr = build_gate("tiny", "prefill", T=16, layer_id=0)
    res = _run(cr)
    vals = {s.name: getattr(s, "init_value", None) for s in cr.specs}
    ids, table = vals["input_ids"], vals["tid2eid"]
    assert ids[0] == 0 and ids[1] == TINY.vocab_size - 1
    assert torch.equal(res.actual["indices"][:2], table[[0, TINY.vocab_size - 1]])
    assert torch.equal(res.actual["indices"], table[ids])


def test_gate_hash_tiles_in_parallel_equal_serial_order(monkeypatch):
    """One token-id table read by several route_hash blocks gives the bits of one block."""
    serial = _run(build_gate("tiny", "prefill", T=40, layer_id=2))
    monkeypatch.setattr(gate_mod, "GATE_T_TILE", 8)
    par = _run(build_gate("tiny", "prefill", T=40, layer_id=2))
    blocks = {t.name: t.n_blocks for t in par.program.graph.tasks}
    assert blocks["route_hash"] == 5 and blocks["ffn_norm"] == 5
    for k in ("indices", "weights", "x_norm_i8", "x_norm_scale"):
        assert torch.equal(serial.actual[k], par.actual[k]), k


@pytest.mark.parametrize("logit", [-20.0, -200.0, 100.0])
@pytest.mark.parametrize("layer_id", [0, 3])
def test_gate_extreme_logits_give_finite_weights(logit, layer_id):
    E, K, rsf = TINY.n_routed_experts, TINY.num_experts_per_tok, TINY.routed_scaling_factor
    ins = _constant_logit_inputs(TINY, 8, [logit] * E)
    res = _run(build_gate("tiny", "decode", layer_id=layer_id, inputs=ins))
    w, idx = res.actual["weights"], res.actual["indices"]
    assert bool(torch.isfinite(w).all())
    if logit == -200.0:  # even the stable softplus underflows: the 1e-20 floor gives 0, not NaN
        assert bool((w == 0).all())
    else:  # equal scores -> equal weights
        assert torch.allclose(w, torch.full_like(w, rsf / K), rtol=1e-6, atol=0)
    if layer_id >= TINY.num_hash_layers:  # all biased scores tie: the lowest expert ids
        assert torch.equal(idx, torch.arange(K, dtype=torch.int32).expand(8, K))


@pytest.mark.parametrize("bias,experts,weights", [
    ((0.0, 0.0, 0.0), (0, 1), (1.0, 0.5)),
    ((0.0, 0.0, 5.0), (0, 2), (1.2, 0.3)),
])
def test_gate_top2_of_3_hand_computed(bias, experts, weights):
    """Scores (2, 1, 0.5) after sqrt-softplus, route scale 1.5; the bias only selects."""
    cfg = TINY.replace(n_routed_experts=3, num_experts_per_tok=2)
    logits = [math.log(math.expm1(s * s)) for s in (2.0, 1.0, 0.5)]  # softplus^-1(s^2)
    ins = _constant_logit_inputs(cfg, 8, logits)
    ins["gate_bias"] = torch.tensor(bias)
    cr = build_gate("tiny", "decode", layer_id=5, inputs=ins, cfg=cfg)
    res = _run(cr)
    vals = {s.name: getattr(s, "init_value", None) for s in cr.specs}
    _, _, gi, gw = golden_gate(*(vals[k] for k in gate_mod._GATE_INPUTS), 5, 8, cfg, weight_format="bf16")
    # the selected set and each expert's weight (the list is in biased-score order)
    for idx, w in ((res.actual["indices"], res.actual["weights"]), (gi, gw)):
        for row_i, row_w in zip(idx.tolist(), w.tolist()):
            got = dict(zip(row_i, row_w))
            assert set(got) == set(experts)
            for e, want in zip(experts, weights):
                assert abs(got[e] - want) < 2e-6


def test_stable_sqrt_softplus_against_float64():
    z = torch.cat([torch.linspace(-120, 120, 481), torch.tensor([-20.0, -16.7, -10.0, -9.99, 88.8, 100.0])])
    n = z.numel()

    @pl.jit
    def sp(x: pl.Tensor[[1, n], pl.FP32], y: pl.Out[pl.Tensor[[1, n], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="sp"):
            y[0:1, 0:n] = stable_sqrt_softplus(x[0:1, 0:n])

    y = torch.zeros(1, n)
    sp(z.reshape(1, n), y)
    zd = z.double()
    want = torch.nn.functional.softplus(zd).sqrt()
    assert bool(torch.isfinite(y).all())
    keep = z > -87.0  # FP32 exp underflows further out
    rel = ((y[0].double() - want).abs() / want)[keep]
    assert float(rel.max()) < 2e-6
    assert bool((y[0][z < -104] == 0).all())
    i20 = int((z == -20.0).nonzero()[0, 0])
    assert abs(float(y[0, i20]) ** 2 - 2.061153622e-9) < 1e-13  # a naive log(1+exp(x)) gives 0


def test_int8_codes_round_half_even_saturate_and_nan_to_zero():
    # ties, the clamp edges, values past the FP32 rounding trick's range, inf and NaN
    special = [0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.49, 127.5, -128.5, -127.5, 1e7, -1.3e7, -2.0 ** 24,
               3e38, -3e38, float("inf"), -float("inf"), float("nan"), -0.0, 1e-45]
    x = torch.cat([torch.tensor(special), (torch.rand(4 * 64 - len(special), generator=torch.Generator().manual_seed(1))
                                           * 300 - 150)]).reshape(4, 64)
    s = torch.tensor([[1.0], [0.5], [2.0], [1.0]])

    @pl.jit
    def codes(x_: pl.Tensor[[4, 64], pl.FP32], s_: pl.Tensor[[4, 1], pl.FP32], y: pl.Out[pl.Tensor[[4, 64], pl.INT8]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="codes"):
            y[0:4, 0:64] = gate_mod.int8_codes(x_[0:4, 0:64], s_[0:4, 0:1])

    y = torch.zeros(4, 64, dtype=torch.int8)
    codes(x, s, y)
    v = (x * s).double()  # the FP32 product, then the exact rint / saturate / NaN -> 0 rules
    want = torch.where(torch.isnan(v), 0.0, torch.round(v).clamp(-128, 127)).to(torch.int8)
    assert torch.equal(y, want)


@pytest.mark.parametrize("n,k", [(16, 4), (40, 6), (256, 6), (384, 8)])
def test_topk_is_the_prefix_of_a_stable_descending_sort(n, k):
    """The router's top-k (sort32 + mrgsort; E = 16 tiny, 256 FLASH, 384 pro, 40 a padded
    width) against torch's stable descending argsort, ties included: rows of one repeated
    value, rows with few distinct values, a row whose ties straddle the k-th place."""
    gen = torch.Generator().manual_seed(n)
    v = torch.randn(12, n, generator=gen)
    v[0] = 0.5  # all tied: experts 0 .. k-1
    v[1] = torch.randint(0, 3, (n,), generator=gen).float()  # few distinct values
    v[2, :] = -1.0
    v[2, [n - 1, n // 2, 3]] = 2.0  # ties inside the top-k, listed lowest id first
    v[3] = torch.randn(n, generator=gen).round(decimals=1)
    m = v.shape[0]

    @pl.jit
    def topk(x: pl.Tensor[[m, n], pl.FP32], idx: pl.Out[pl.Tensor[[m, k], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="topk"):
            idx[0:m, 0:k] = gate_mod._topk_indices(x[0:m, 0:n], k)

    got = torch.zeros(m, k, dtype=torch.int32)
    topk(v, got)
    want = torch.sort(v, dim=1, descending=True, stable=True).indices[:, :k].to(torch.int32)
    assert torch.equal(got, want)
    assert got[0].tolist() == list(range(k)) and got[2, :3].tolist() == [3, n // 2, n - 1]


def test_gate_hash_id_out_of_vocab_is_bind_error_before_any_task():
    cr = build_gate("tiny", "prefill", T=10, layer_id=0)
    vals = [s.create_tensor() if hasattr(s, "create_tensor") else s.to_python() for s in cr.specs]
    vals[5][3] = TINY.vocab_size
    prog = pto.Program(cr.fn, pto.RunConfig(check=True))
    with pytest.raises(pto.BindError, match=r"input_ids\[3\] = 512"):
        prog.execute(vals, {})
    assert len(prog.graph.tasks) == 0


def test_gate_tiling_errors():
    with pytest.raises(pto.ConfigError, match="num_experts_per_tok=17"):
        gate_kernels(TINY.replace(num_experts_per_tok=17))


@pytest.mark.slow
@pytest.mark.parametrize("mode,layer_id", [("decode", 0), ("prefill", 3)])
def test_gate_flash(mode, layer_id):
    _run(build_gate("flash", mode, layer_id=layer_id), check=False)
