"""Parity of ``golden_hc_pre`` with transformers' ``DeepseekV4HyperConnection`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

For every layer and both hyper-connections (``attn_hc`` before attention, ``ffn_hc`` before
the MoE) the golden runs on the stream the HF module received and must reproduce HF's
``pre`` (recorded inside the module, see conftest), ``post``, ``comb`` (checked doubly
stochastic on both sides) and the collapsed sublayer input, before and after the sublayer's
weighted RMSNorm (``input_layernorm`` / ``post_attention_layernorm``).

Tolerance: everything is FP32 on both sides; the only differences are summation order
(the golden splits the 512-wide mixes matmul into 256-wide chunks and normalises after the
matmul, HF normalises first; the golden adds the four weighted streams as a pairwise tree).
Measured: max abs error <= 3.8e-6 (collapsed input, values up to ~20), <= 8.4e-7 on
pre / post / comb, norm-wise relative <= 5e-7. Bound: atol = rtol = 1e-5 for every output.
"""

import pytest
import torch

from pto.models.deepseek_v4.hc_pre import golden_hc_pre
from pto.models.deepseek_v4.rms_norm import golden_rms_norm

ATOL = 1e-5
RTOL = 1e-5
# Sinkhorn ends on a column pass: column sums are 1 up to hc_eps-sized terms (measured
# 1.2e-6); row sums only converge, and 20 iterations leave peaked unit-scale matrices up to
# 1.8e-2 away (layer 3 attn_hc), identically in HF and the golden.
COLSUM_TOL = 1e-5
ROWSUM_TOL = 5e-2

CASES = [(layer, site) for layer in range(6) for site in ("attn", "ffn")]


@pytest.mark.parametrize("layer,site", CASES, ids=[f"L{l}-{s}" for l, s in CASES])
def test_hc_pre_matches_transformers(hf_run, layer, site):
    cfg = hf_run.cfg
    name = f"model.layers.{layer}.{site}_hc"
    args = hf_run.hc_args(layer, site)
    x_mixed, post, comb, pre = golden_hc_pre(**args, cfg=cfg, out_bf16=False, return_pre=True)

    post_hf, comb_hf, collapsed_hf = hf_run.call(name).output
    sig_pre, sig_post = hf_run.hc_sigmoids[name]
    # the two recorded sigmoids are HF's pre and post gates, in that order
    assert torch.equal(2 * sig_post, post_hf)
    pre_hf = (sig_pre + cfg.hc_eps)[0]
    S, N = hf_run.S, cfg.hc_mult

    hf_run.compare(f"hc_pre L{layer} {site} pre", pre, pre_hf, atol=ATOL, rtol=RTOL)
    hf_run.compare(f"hc_pre L{layer} {site} post", post, post_hf[0], atol=ATOL, rtol=RTOL)
    hf_run.compare(f"hc_pre L{layer} {site} comb", comb, comb_hf[0].reshape(S, N * N),
                   atol=ATOL, rtol=RTOL)
    hf_run.compare(f"hc_pre L{layer} {site} collapsed", x_mixed, collapsed_hf[0],
                   atol=ATOL, rtol=RTOL)

    # comb is doubly stochastic on both sides: columns (over input streams i) tightly, rows
    # approximately; orientation comb[t, i*N + j], i = input stream, j = output stream.
    for label, c in (("golden", comb.reshape(S, N, N)), ("hf", comb_hf[0])):
        col_err = (c.sum(dim=-2) - 1).abs().max().item()
        row_err = (c.sum(dim=-1) - 1).abs().max().item()
        print(f"[parity] hc_pre L{layer} {site} comb {label}: max|colsum-1|={col_err:.2e} "
              f"max|rowsum-1|={row_err:.2e}")
        assert col_err <= COLSUM_TOL and row_err <= ROWSUM_TOL
        assert bool((c > 0).all())

    norm = "input_layernorm" if site == "attn" else "post_attention_layernorm"
    normed = golden_rms_norm(x_mixed, hf_run.param(f"model.layers.{layer}.{norm}.weight"),
                             cfg.rms_norm_eps, out_bf16=False)
    hf_run.compare(f"hc_pre L{layer} {site} normed input", normed,
                   hf_run.call(f"model.layers.{layer}.{norm}").output[0], atol=ATOL, rtol=RTOL)
