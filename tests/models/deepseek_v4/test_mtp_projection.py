"""mtp_projection: the kernel against its golden, the golden against plain FP64 math."""

import pytest
import torch

from pto.golden import run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.mtp_projection import (MTP_PROJ_ARGS, build_case, golden_mtp_projection,
                                                   make_mtp_projection_inputs)


@pytest.mark.parametrize("mode,T", [("decode", None), ("prefill", None), ("prefill", 37)])
def test_kernel_matches_golden(mode, T):
    cr = build_case("tiny", mode, **({} if T is None else {"T": T}))
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


def test_golden_float_path_is_the_formula():
    # hand-written in FP64: rms-normed rows times the norm weight, through the [in, out] weights
    cfg = get_config("tiny")
    g = torch.Generator().manual_seed(1)
    T, HC, D = 3, cfg.hc_mult, cfg.hidden_size
    emb, prev = torch.randn(T, D, generator=g), torch.randn(T, HC, D, generator=g)
    ew, hw = torch.randn(D, D, generator=g) / D ** 0.5, torch.randn(D, D, generator=g) / D ** 0.5
    en, hn = 1 + 0.1 * torch.randn(D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    got = golden_mtp_projection(emb, prev, en, hn, ew, None, hw, None, cfg.rms_norm_eps)
    e64 = emb.double()
    e64 = e64 / torch.sqrt((e64 ** 2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * en.double()
    p64 = prev.double()
    p64 = p64 / torch.sqrt((p64 ** 2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * hn.double()
    want = (e64 @ ew.double())[:, None, :] + p64 @ hw.double()
    assert got.shape == (T, HC, D)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_golden_int8_is_within_quantisation_of_the_float_path():
    cfg = get_config("tiny")
    d = make_mtp_projection_inputs(cfg, 16, seed=2)
    q = golden_mtp_projection(*[d[n] for n in MTP_PROJ_ARGS[:-1]], cfg.rms_norm_eps)
    ew = d["e_proj_w"].float() * d["e_proj_scale"]
    hw = d["h_proj_w"].float() * d["h_proj_scale"]
    f = golden_mtp_projection(d["emb"], d["prev_hc"], d["enorm_w"], d["hnorm_w"], ew, None, hw, None,
                              cfg.rms_norm_eps)
    rel = (q - f).norm() / f.norm()
    assert 0 < rel < 0.02  # per-row INT8 activations: about 1 % relative RMS
