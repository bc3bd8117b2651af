"""Property checks of the torch goldens and fixtures (tiny preset, no DSL involved).

Covers rms_norm, hc_pre, qkv_proj_rope (quantisers, RoPE, projection golden) and hc_post.
"""

from __future__ import annotations

import math

import pytest
import torch

from pto.errors import BindError, ConfigError
from pto.models.deepseek_v4 import hc_post, hc_pre, qkv_proj_rope, rms_norm
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.hc_post import golden_hc_post, golden_hc_post_prefill, make_hc_post_inputs
from pto.models.deepseek_v4.hc_pre import golden_hc_pre, make_hc_pre_inputs
from pto.models.deepseek_v4.qkv_proj_rope import (
    golden_qkv_proj_rope,
    make_qkv_inputs,
    quantize_per_row_int8,
    quantize_weight_per_column,
    rope_interleaved,
)
from pto.models.deepseek_v4.rms_norm import golden_rms_norm, make_rms_norm_inputs

TINY = get_config("tiny")
T = 16


def _angle_tables(n_tok: int, r: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Real cos/sin rows ([n_tok, r] full-width duplicated FP32) at random positions."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 16384, (n_tok,), generator=gen).float()
    freq = 1e4 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
    ang = pos[:, None] * freq[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)


# ---- fixtures -----------------------------------------------------------------------

MAKERS = [
    lambda s: make_rms_norm_inputs(TINY, T, s),
    lambda s: make_hc_pre_inputs(TINY, T, s),
    lambda s: make_qkv_inputs(TINY, T, s),
    lambda s: make_hc_post_inputs(TINY, T, s),
]


@pytest.mark.parametrize("make", MAKERS, ids=["rms_norm", "hc_pre", "qkv", "hc_post"])
def test_fixtures_seeded_and_leave_global_rng_alone(make):
    state = torch.get_rng_state()
    a, b, c = make(7), make(7), make(8)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].numel() > 3)


def test_fixture_dtypes_and_shapes():
    r = make_rms_norm_inputs(TINY, T, 0)
    assert (r["x"].dtype, r["x"].shape, r["w"].shape) == (torch.bfloat16, (T, 128), (128,))
    h = make_hc_pre_inputs(TINY, T, 0)
    assert h["x"].shape == (T, 4, 128) and h["hc_fn"].shape == (24, 512)
    assert h["hc_base"][0].item() == pytest.approx(5.9166)
    q = make_qkv_inputs(TINY, T, 0)
    assert q["wq_b"].dtype == torch.int8 and q["wq_b"].shape == (64, 8 * 128)
    assert q["wq_b_scale"].shape == (1024,) and q["wq_b_scale"].dtype == torch.float32
    assert q["x"].abs().max() <= 1.0 and q["wq_a"].abs().max() <= 0.1
    half = TINY.qk_rope_head_dim // 2
    assert torch.equal(q["rope_cos"][:, :half], q["rope_cos"][:, half:])  # duplicated layout
    p = make_hc_post_inputs(TINY, T, 0)
    assert p["comb"].shape == (T, 16)
    assert torch.allclose(p["comb"].view(T, 4, 4).sum(dim=1), torch.ones(T, 4), atol=1e-6)


def test_hc_pre_fixture_requires_hc_mult_4():
    with pytest.raises(ConfigError, match="hc_mult=2"):
        make_hc_pre_inputs(TINY.replace(hc_mult=2), T, 0)


def test_tolerance_tables():
    assert rms_norm.TOLERANCES == {"x_normed": (1e-4, 1 / 128, 0.005)}
    assert set(hc_pre.TOLERANCES) == {"x_mixed", "post", "comb"}
    assert hc_pre.TOLERANCES["comb"] == (2.5e-5, 5e-3, 0.005)
    assert qkv_proj_rope.TOLERANCES["qr"] == (1.0, 0.0, 0.0)
    assert hc_post.TOLERANCES == {"y": (1e-3, 1e-3, 0.0)}


# ---- rms_norm -----------------------------------------------------------------------

def test_rms_norm_unit_rms_before_weight():
    inp = make_rms_norm_inputs(TINY, T, 1)
    y = golden_rms_norm(inp["x"], inp["w"], TINY.rms_norm_eps, out_bf16=False)
    unweighted = y / inp["w"].float()
    rms = unweighted.square().mean(dim=-1).sqrt()
    assert torch.allclose(rms, torch.ones(T), atol=1e-5)
    # direction is that of x
    cos = torch.nn.functional.cosine_similarity(unweighted, inp["x"].float(), dim=-1)
    assert torch.allclose(cos, torch.ones(T), atol=1e-6)


def test_rms_norm_bf16_is_rne_of_fp32():
    inp = make_rms_norm_inputs(TINY, T, 2)
    y32 = golden_rms_norm(inp["x"], inp["w"], 1e-6, out_bf16=False)
    y16 = golden_rms_norm(inp["x"], inp["w"], 1e-6)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16, y32.to(torch.bfloat16))


def test_rms_norm_rejects_bad_weight():
    with pytest.raises(BindError, match="w must be"):
        golden_rms_norm(torch.zeros(2, 8), torch.ones(7), 1e-6)


# ---- hc_pre -------------------------------------------------------------------------

def test_hc_pre_shapes_and_ranges():
    inp = make_hc_pre_inputs(TINY, T, 0)
    x_mixed, post, comb = golden_hc_pre(**inp, cfg=TINY)
    assert (x_mixed.dtype, x_mixed.shape) == (torch.bfloat16, (T, 128))
    assert (post.dtype, post.shape) == (torch.float32, (T, 4))
    assert (comb.dtype, comb.shape) == (torch.float32, (T, 16))
    assert bool(((post > 0) & (post < 2)).all())
    assert bool((comb > 0).all())


def test_hc_pre_comb_doubly_stochastic():
    inp = make_hc_pre_inputs(TINY, 64, 0)
    _, _, comb = golden_hc_pre(**inp, cfg=TINY)
    c = comb.view(64, 4, 4)  # [t, i (input), j (output)]
    assert (c.sum(dim=1) - 1).abs().max() < 1e-5  # ends on a column normalisation
    # Reference base values make comb peaked; 20 Sinkhorn iterations leave row sums
    # only within a few percent (measured max 0.027 here).
    assert (c.sum(dim=2) - 1).abs().max() < 0.05
    # With a neutral base the iteration converges: rows within 1e-3.
    inp["hc_base"] = torch.zeros_like(inp["hc_base"])
    _, _, comb0 = golden_hc_pre(**inp, cfg=TINY)
    c0 = comb0.view(64, 4, 4)
    assert (c0.sum(dim=1) - 1).abs().max() < 1e-5
    assert (c0.sum(dim=2) - 1).abs().max() < 1e-3


def test_hc_pre_matches_direct_formula():
    inp = make_hc_pre_inputs(TINY, T, 3)
    x, fn, s, b = inp["x"], inp["hc_fn"], inp["hc_scale"], inp["hc_base"]
    x_mixed, post, _ = golden_hc_pre(**inp, cfg=TINY, out_bf16=False)
    u = x.reshape(T, -1)
    u_hat = u / u.square().mean(-1, keepdim=True).add(1e-6).sqrt()
    mixes = u_hat @ fn.T  # one matmul, no K chunking
    pre = torch.sigmoid(mixes[:, :4] * s[0] + b[:4]) + 1e-6
    assert torch.allclose(post, 2 * torch.sigmoid(mixes[:, 4:8] * s[1] + b[4:8]), atol=1e-6)
    assert torch.allclose(x_mixed, (pre[:, :, None] * x).sum(1), atol=1e-6)
    x_bf, _, _ = golden_hc_pre(**inp, cfg=TINY)
    assert torch.equal(x_bf, x_mixed.to(torch.bfloat16))


def test_hc_pre_rejects_bad_shapes():
    inp = make_hc_pre_inputs(TINY, T, 0)
    inp["hc_base"] = inp["hc_base"][:20]
    with pytest.raises(BindError, match="hc_base"):
        golden_hc_pre(**inp, cfg=TINY)


def test_hc_pre_parity_with_transformers():
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    configuration = pytest.importorskip("transformers.models.deepseek_v4.configuration_deepseek_v4")
    hf_cfg = configuration.DeepseekV4Config(
        hidden_size=TINY.hidden_size, hc_mult=TINY.hc_mult, hc_sinkhorn_iters=TINY.hc_sinkhorn_iters,
        hc_eps=TINY.hc_eps, rms_norm_eps=TINY.rms_norm_eps)
    module = modeling.DeepseekV4HyperConnection(hf_cfg)
    inp = make_hc_pre_inputs(TINY, T, 5)
    with torch.no_grad():
        module.fn.copy_(inp["hc_fn"])
        module.base.copy_(inp["hc_base"])
        module.scale.copy_(inp["hc_scale"])
        post_hf, comb_hf, collapsed_hf = module(inp["x"][None])
    x_mixed, post, comb = golden_hc_pre(**inp, cfg=TINY, out_bf16=False)
    assert torch.allclose(post, post_hf[0], atol=1e-6)
    assert torch.allclose(comb, comb_hf[0].reshape(T, 16), atol=1e-6)
    assert torch.allclose(x_mixed, collapsed_hf[0], atol=1e-6)


# ---- quantisers ---------------------------------------------------------------------

def test_quantize_per_row_zero_row():
    x = torch.zeros(3, 64)
    x[1] = torch.linspace(-2, 2, 64)
    q, scale = quantize_per_row_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (3, 1) and scale.dtype == torch.float32
    assert torch.equal(q[0], torch.zeros(64, dtype=torch.int8))
    assert torch.equal(q[2], torch.zeros(64, dtype=torch.int8))
    assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
    assert q[1].min().item() == -127 and q[1].max().item() == 127


def test_quantize_per_row_round_trip_and_ties():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=gen) * torch.rand(32, 1, generator=gen) * 4
    q, scale = quantize_per_row_int8(x)
    err = (q.float() * scale - x).abs()
    assert bool((err <= scale / 2 * (1 + 1e-5) + 1e-7).all())
    assert math.isclose(scale[0, 0].item(), x[0].abs().max().item() / 127, rel_tol=1e-6)
    # amax 127 -> s = 1: 2.5 and -3.5 tie and round half to even
    q_tie, _ = quantize_per_row_int8(torch.tensor([[127.0, 2.5, -3.5, 0.5]]))
    assert q_tie.tolist() == [[127, 2, -4, 0]]


def test_quantize_weight_per_column():
    gen = torch.Generator().manual_seed(1)
    w = (torch.rand(64, 48, generator=gen) * 2 - 1) * 0.1
    w[:, 3] = 0.0
    q, scale = quantize_weight_per_column(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    assert scale[3].item() == pytest.approx(1e-4 / 127) and bool((q[:, 3] == 0).all())
    assert int(q.abs().max()) == 127
    assert bool(((q.float() * scale - w).abs() <= scale / 2 * (1 + 1e-5)).all())
    # scale 0.5 (amax 63.5): 1.25 / 0.5 = 2.5 rounds to 2
    q_tie, s_tie = quantize_weight_per_column(torch.tensor([[63.5], [1.25], [-0.75]]))
    assert s_tie.item() == 0.5 and q_tie[:, 0].tolist() == [127, 2, -2]


# ---- RoPE ---------------------------------------------------------------------------

def test_rope_inverse_undoes_rope():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(T, 8, 64, generator=gen)
    cos, sin = _angle_tables(T, 64)
    y = rope_interleaved(x, cos, sin)
    back = rope_interleaved(y, cos, sin, inverse=True)
    assert torch.allclose(back, x, atol=1e-5)
    assert not torch.allclose(y, x, atol=1e-2)
    # a rotation keeps every pair's norm
    pair_norm = lambda t: t.view(T, 8, 32, 2).norm(dim=-1)  # noqa: E731
    assert torch.allclose(pair_norm(y), pair_norm(x), atol=1e-5)


def test_rope_pair_rotation_and_half_table():
    r = 64
    cos, sin = _angle_tables(2, r, seed=4)
    x = torch.zeros(2, r)
    x[:, 0::2] = 1.0  # every pair is (1, 0) -> (cos_i, sin_i)
    y = rope_interleaved(x, cos, sin)
    assert torch.allclose(y[:, 0::2], cos[:, : r // 2]) and torch.allclose(y[:, 1::2], sin[:, : r // 2])
    y_half = rope_interleaved(x, cos[:, : r // 2], sin[:, : r // 2])
    assert torch.equal(y, y_half)
    # only the first half of a full-width table is read
    junk_cos = torch.cat([cos[:, : r // 2], torch.full((2, r // 2), 9.0)], -1)
    assert torch.equal(rope_interleaved(x, junk_cos, sin), y)
    assert rope_interleaved(x.to(torch.bfloat16), cos, sin).dtype == torch.bfloat16


def test_rope_rejects_bad_table():
    with pytest.raises(BindError, match="cos must be"):
        rope_interleaved(torch.zeros(4, 64), torch.zeros(4, 48), torch.zeros(4, 48))


# ---- qkv_proj_rope ------------------------------------------------------------------

def test_qkv_shapes_and_dtypes():
    inp = make_qkv_inputs(TINY, T, 0)
    q, kv, qr, qr_scale = golden_qkv_proj_rope(**inp, cfg=TINY)
    assert (q.dtype, q.shape) == (torch.bfloat16, (T, 8, 128))
    assert (kv.dtype, kv.shape) == (torch.bfloat16, (T, 128))
    assert (qr.dtype, qr.shape) == (torch.int8, (T, 64))
    assert (qr_scale.dtype, qr_scale.shape) == (torch.float32, (T, 1))
    q32, kv32, qr32, s32 = golden_qkv_proj_rope(**inp, cfg=TINY, out_bf16=False)
    assert torch.equal(q, q32.to(torch.bfloat16)) and torch.equal(kv, kv32.to(torch.bfloat16))
    assert torch.equal(qr, qr32) and torch.equal(qr_scale, s32)


def test_qkv_qr_is_quantised_normed_latent():
    inp = make_qkv_inputs(TINY, T, 1)
    _, _, qr, qr_scale = golden_qkv_proj_rope(**inp, cfg=TINY)
    a = inp["x"].float() @ inp["wq_a"].float()
    latent = a / a.square().mean(-1, keepdim=True).add(1e-6).sqrt() * inp["gamma_cq"].float()
    assert torch.allclose(qr_scale[:, 0], latent.abs().amax(-1) / 127, rtol=1e-5)
    assert bool(((qr.float() * qr_scale - latent).abs() <= qr_scale / 2 * (1 + 1e-4)).all())
    assert bool((qr.abs().amax(-1) == 127).all())


def test_qkv_unit_rms_with_real_rope_tables():
    inp = make_qkv_inputs(TINY, T, 2)
    cos, sin = _angle_tables(T, TINY.qk_rope_head_dim, seed=2)
    inp["rope_cos"], inp["rope_sin"] = cos, sin
    inp["gamma_ckv"] = torch.ones(TINY.head_dim)
    q, kv, _, _ = golden_qkv_proj_rope(**inp, cfg=TINY, out_bf16=False)
    # per-head RMSNorm (no weight), then a norm-preserving rotation
    assert torch.allclose(q.square().mean(-1).sqrt(), torch.ones(T, 8), atol=1e-5)
    assert torch.allclose(kv.square().mean(-1).sqrt(), torch.ones(T), atol=1e-5)
    # the nope channels of kv are untouched by RoPE: plain normalised projection
    k = inp["x"].float() @ inp["wkv"].float()
    k = k / k.square().mean(-1, keepdim=True).add(1e-6).sqrt()
    n = TINY.nope_head_dim
    assert torch.allclose(kv[:, :n], k[:, :n], atol=1e-6)
    assert torch.allclose(kv[:, n:], rope_interleaved(k[:, n:], cos, sin), atol=1e-6)


def test_qkv_bf16_weight_format_close_to_int8():
    inp = make_qkv_inputs(TINY, T, 3)
    q8, kv8, _, _ = golden_qkv_proj_rope(**inp, cfg=TINY, out_bf16=False)
    float_inp = dict(inp, wq_b=inp["wq_b"].float() * inp["wq_b_scale"], wq_b_scale=None)
    qf, kvf, qr_lat, ones = golden_qkv_proj_rope(**float_inp, cfg=TINY, weight_format="bf16",
                                                 out_bf16=False)
    assert qr_lat.dtype == torch.float32 and torch.equal(ones, torch.ones(T, 1))
    assert torch.equal(kv8, kvf)
    # only the activation INT8 rounding separates the two paths
    assert ((q8 - qf).norm() / qf.norm()).item() < 1e-2


def test_qkv_rejects_bad_arguments():
    inp = make_qkv_inputs(TINY, T, 0)
    with pytest.raises(BindError, match="weight_format"):
        golden_qkv_proj_rope(**inp, cfg=TINY, weight_format="fp8")
    with pytest.raises(BindError, match="wq_b must be an int8"):
        golden_qkv_proj_rope(**dict(inp, wq_b=inp["wq_b"].float()), cfg=TINY)
    with pytest.raises(BindError, match="rope_cos"):
        golden_qkv_proj_rope(**dict(inp, rope_cos=inp["rope_cos"][:, :32]), cfg=TINY)


# ---- hc_post ------------------------------------------------------------------------

def test_hc_post_matches_einsum():
    inp = make_hc_post_inputs(TINY, T, 0)
    y = golden_hc_post(**inp)
    c = inp["comb"].view(T, 4, 4)
    ref = inp["post"][:, :, None] * inp["x"].float()[:, None, :] + torch.einsum(
        "tij,tid->tjd", c, inp["residual"])
    assert y.dtype == torch.float32 and y.shape == (T, 4, 128)
    assert torch.allclose(y, ref, atol=1e-5)


def test_hc_post_orientation_input_i_feeds_output_j():
    inp = make_hc_post_inputs(TINY, T, 1)
    perm = torch.zeros(4, 4)
    for i in range(4):
        perm[i, (i + 1) % 4] = 1.0  # comb[i*4 + j] = 1 when j = i + 1
    inp["comb"] = perm.reshape(1, 16).expand(T, 16).clone()
    inp["post"] = torch.zeros(T, 4)
    y = golden_hc_post(**inp)
    for j in range(4):
        assert torch.equal(y[:, j], inp["residual"][:, (j - 1) % 4])


def test_hc_post_prefill_tail_rows_exactly_zero():
    inp = make_hc_post_inputs(TINY, T, 2)
    full = golden_hc_post(**inp)
    y = golden_hc_post_prefill(**inp, num_tokens=5)
    assert torch.equal(y[:5], full[:5])
    assert torch.equal(y[5:], torch.zeros_like(y[5:]))
    assert bool((full[5:] != 0).any())
    assert torch.equal(golden_hc_post_prefill(**inp, num_tokens=-3), torch.zeros_like(full))
    assert torch.equal(golden_hc_post_prefill(**inp, num_tokens=T + 4), full)
    with pytest.raises(BindError, match="num_tokens"):
        golden_hc_post_prefill(**inp, num_tokens=2.0)
