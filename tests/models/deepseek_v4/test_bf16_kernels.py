"""The unquantised (``weight_format="bf16"``) path of every kernel that quantises: each
registered case passes against its golden in check mode at tiny (the goldens follow the
kernels' BF16 roundings), the goldens match float64 references written here, and the bf16
kernels carry no INT8 tensor. FLASH-size bf16 checks are ``slow``."""

import pytest
import torch
import torch.nn.functional as F

from pto.errors import ConfigError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.weight_format import weight_format_of, with_weight_format

# (kernel, mode) of every registered case with a bf16 path
BF16_CASES = [
    ("gate", "prefill"), ("gate", "decode"),
    ("expert_shared", "prefill"), ("expert_shared", "decode"),
    ("expert_routed", "prefill"), ("expert_routed", "decode"),
    ("moe", "prefill"), ("moe", "decode"),
    ("qkv_proj_rope", "prefill"), ("qkv_proj_rope", "decode"),
    ("prefill_sparse_attn", "prefill"),
    ("decode_sparse_attn_swa", "decode"), ("decode_sparse_attn_hca", "decode"), ("decode_sparse_attn_csa", "decode"),
    ("prefill_indexer", "prefill"), ("decode_indexer", "decode"),
    ("prefill_indexer_compressor", "prefill"), ("decode_indexer_compressor", "decode"),
    ("prefill_attention_swa", "prefill"), ("decode_attention_swa", "decode"),
    ("prefill_attention_hca", "prefill"), ("decode_attention_hca", "decode"),
    ("prefill_attention_csa", "prefill"), ("decode_attention_csa", "decode"),
    ("mtp_projection", "prefill"), ("mtp_projection", "decode"), ("mtp_layer", "prefill"), ("mtp_layer", "decode"),
]


def _run(name: str, mode: str, preset: str = "tiny", **opts):
    case = get_case(name)
    cr = case.build(preset, mode, weight_format="bf16", **opts)
    return cr, run_jit(cr.fn, cr.specs, cr.golden, cr.compare, rtol=cr.rtol, atol=cr.atol, check=preset == "tiny")


@pytest.mark.parametrize("name,mode", BF16_CASES)
def test_bf16_case_matches_its_golden(name, mode):
    cr, res = _run(name, mode)
    assert res.passed, f"{name} {mode}: {res.error}"
    assert "weight_format=bf16" in cr.label
    dtypes = {s.dtype for s in cr.specs}
    assert torch.int8 not in dtypes, f"{name}: an INT8 tensor on the bf16 path"


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("qkv_proj_rope", "prefill"), ("expert_shared", "prefill"),
                                       ("gate", "prefill"), ("prefill_sparse_attn", "prefill")])
def test_bf16_case_at_flash(name, mode):
    _, res = _run(name, mode, preset="flash")
    assert res.passed, res.error


def test_weight_format_config_and_errors():
    cfg = get_config("tiny")
    assert weight_format_of(cfg) == "int8"
    b = with_weight_format(cfg, "bf16")
    assert b.weight_format == "bf16" and with_weight_format(b, "bf16") is b and b != cfg
    with pytest.raises(ConfigError, match="weight_format must be one of"):
        with_weight_format(cfg, "fp8")
    with pytest.raises(ConfigError, match="needs a KernelConfig"):
        with_weight_format(cfg.model, "bf16")


def test_expert_golden_bf16_against_float64():
    """golden_expert_shared (bf16, the kernel's BF16 h) vs a float64 clamped SwiGLU."""
    from pto.models.deepseek_v4.expert_shared import golden_expert_shared, make_expert_weights

    cfg = get_config("tiny")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    w = make_expert_weights(cfg, None, gen, std=7.0, weight_format="bf16")
    L = float(cfg.swiglu_limit)
    xd = x.double()
    g = (xd @ w["w1"].double().T).clamp(max=L)
    u = (xd @ w["w3"].double().T).clamp(-L, L)
    h = F.silu(g) * u
    assert float((g >= L).double().mean()) > 0.01  # the clamp is exercised
    # the kernels' numerics: h rounded to BF16, sh rounded to BF16
    ref = h.to(torch.bfloat16).double() @ w["w2"].double().T
    got = golden_expert_shared(x, None, w["w1"], None, w["w3"], None, w["w2"], None, cfg, weight_format="bf16")
    assert got.dtype == torch.bfloat16
    rel = (got.double() - ref).abs() / ref.abs().clamp(min=1e-2)
    assert float((rel > 2 ** -8).double().mean()) < 0.01  # one BF16 rounding (a flip of h on a tie aside)
    # parity mode: no rounding at all, FP32 vs float64
    ref32 = h @ w["w2"].double().T
    got32 = golden_expert_shared(x, None, w["w1"], None, w["w3"], None, w["w2"], None, cfg, weight_format="bf16",
                                 float32=True)
    assert float((got32.double() - ref32).abs().max()) <= 1e-5 * float(ref32.abs().max())


def test_qkv_golden_bf16_against_float64():
    """golden_qkv_proj_rope (bf16): q = rmsnorm_h(bf16(rmsnorm(x wq_a) g) wq_b) then RoPE, in float64."""
    from pto.models.deepseek_v4.qkv_proj_rope import golden_qkv_proj_rope, make_qkv_inputs

    cfg = get_config("tiny")
    d = make_qkv_inputs(cfg, 5, 3, weight_format="bf16")
    q, kv, qr, qr_scale = golden_qkv_proj_rope(d["x"], d["wq_a"], d["wq_b"], d["wq_b_scale"], d["wkv"], d["rope_cos"],
                                               d["rope_sin"], d["gamma_cq"], d["gamma_ckv"], cfg,
                                               weight_format="bf16", out_bf16=True)
    eps, H, hd, r = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
    a = d["x"].double() @ d["wq_a"].double()
    lat = a * torch.rsqrt(a.square().mean(-1, keepdim=True) + eps) * d["gamma_cq"].double()
    assert qr.dtype == torch.bfloat16 and torch.equal(qr_scale, torch.ones(5, 1))
    assert float((qr.double() - lat).abs().max()) <= float(lat.abs().max()) / 128  # one BF16 rounding
    qq = (qr.double() @ d["wq_b"].double()).reshape(5, H, hd)
    qq = qq * torch.rsqrt(qq.square().mean(-1, keepdim=True) + eps)
    c, s = d["rope_cos"].double()[:, None, : r // 2], d["rope_sin"].double()[:, None, : r // 2]
    ev, od = qq[..., hd - r::2].clone(), qq[..., hd - r + 1::2].clone()
    qq[..., hd - r::2], qq[..., hd - r + 1::2] = ev * c - od * s, ev * s + od * c
    assert float((q.double() - qq).abs().max()) <= 1 / 64  # BF16 output of unit-RMS heads


def test_indexer_golden_bf16_scores_against_float64():
    """golden_prefill_indexer (bf16) scores: sum_h w_h relu(q_h . k_s) in float64 on its own
    BF16 query and keys, the key scale not read."""
    from pto.models.deepseek_v4.prefill_indexer import (golden_indexer_query, golden_prefill_indexer,
                                                        make_indexer_inputs)

    cfg = with_weight_format(get_config("tiny"), "bf16")
    d = make_indexer_inputs(cfg, [4 * cfg.index_topk], 8, 8, seed=2)
    d["idx_kv_scale"] = torch.full_like(d["idx_kv_scale"], 7.0)  # ignored in bf16
    args = {k: d[k] for k in ("x", "qr", "qr_scale", "wq_b", "wq_b_scale", "weights_proj", "cos_table", "sin_table",
                              "hadamard", "idx_kv_cache", "idx_kv_scale", "position_ids", "num_tokens",
                              "cmp_topk_indices")}
    args["idx_block_table"] = d["idx_block_table"][0]
    _, scores, nv = golden_prefill_indexer(**args, cfg=cfg, weight_format="bf16", return_scores=True)
    pos = d["position_ids"].long()
    q, _ = golden_indexer_query(d["qr"], d["qr_scale"], d["wq_b"], d["wq_b_scale"], d["cos_table"][pos],
                                d["sin_table"][pos], d["hadamard"], cfg.index_n_heads, "bf16")
    assert q.dtype == torch.bfloat16
    HI, c, bs = cfg.index_n_heads, cfg.index_head_dim, cfg.block_size
    w = (d["x"].double() @ d["weights_proj"].double()) * HI ** -0.5 * c ** -0.5
    N = scores.shape[1]
    rows = d["idx_block_table"][0].long()[torch.arange(N) // bs] * bs + torch.arange(N) % bs
    keys = d["idx_kv_cache"].reshape(-1, c)[rows].double()
    ref = (torch.relu(torch.einsum("thc,sc->tsh", q.double(), keys)) * w[:, None, :]).sum(-1)
    vis = torch.arange(N)[None, :] < nv[:, None]
    assert float((scores.double() - ref)[vis].abs().max()) <= 1e-5 * float(ref.abs().max())


def test_generate_backend_and_mtp_on_bf16_kernels(tmp_path):
    """``pto generate``'s auto backend is the kernels in both formats; MTP self-speculative
    decoding on the bf16 kernels (the bf16 MTP projection) gives plain greedy's tokens."""
    from types import SimpleNamespace

    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.ep_model import generate_backend
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint

    for w in ("bf16", "int8"):
        assert generate_backend(SimpleNamespace(weights=w, backend="auto", mtp=True)) == "kernels"
    assert generate_backend(SimpleNamespace(weights="bf16", backend="golden", mtp=False)) == "golden"
    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=0, mtp=True)
    dep = get_deployment("tiny").replace(max_context=64, rope_max_pos=64)
    km = KernelModel(open_checkpoint(ck, "bf16"), dep)
    assert km.kcfg.weight_format == "bf16" and km.cache.layers[2]["idx_kv"].dtype == torch.bfloat16
    plain = generate(km, [[5, 17, 300]], max_new_tokens=4, eos_token_id=None)
    km = KernelModel(open_checkpoint(ck, "bf16"), dep)
    spec = generate(km, [[5, 17, 300]], max_new_tokens=4, eos_token_id=None, mtp=True)
    assert spec.tokens == plain.tokens and spec.mtp_drafts > 0
