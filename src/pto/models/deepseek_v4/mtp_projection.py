"""MTP input projection: the draft layer's residual streams from the next token's embedding
and the main model's last hidden streams.

Math (pypto-lib `models/deepseek/v4-flash/mtp_projection.py`; DeepSeek-V4-Flash
``inference/model.py`` ``MTPBlock``),
per token row ``t`` and stream ``h < hc_mult``:

    e[t]       = e_proj(enorm(emb[t]))                       # [D]
    out[t, h]  = e[t] + h_proj(hnorm(prev[t, h]))            # [HC, D] FP32

``emb [T, D]`` BF16 is the embedding row of the token *after* position ``t`` (the main
model's table, shared), ``prev [T, HC, D]`` FP32 the main model's streams at ``t`` before its
``hc_head``; ``enorm`` / ``hnorm`` are weighted RMSNorms over ``D`` in FP32. ``e_proj`` /
``h_proj`` are W8A8 (the pypto-lib kernels' rule): INT8 weights ``[in, out]`` with one FP32
scale per output column, activations quantised per row (``s = 127 / max(amax, 1e-4)``),
INT32 products, dequant ``acc * (1 / s) * scale``.

Kernel (:func:`mtp_projection`): task ``mtp_projection_quant`` (token tiles: both norms and
the per-row INT8 codes of the embedding row and of every stream into GM scratch ``codes
[t_pad, (1 + HC) * D]`` INT8 and ``inv_s [t_pad, 1 + HC]`` FP32), then task
``mtp_projection_linear`` (token tile x output-column tile: the ``e_proj`` matmul once and the
``h_proj`` matmul per stream, dequant, add, store the valid rows).

Deviations from pypto-lib `mtp_projection.py`, one a line:
* no SmoothQuant factors (``e_proj_smooth`` / ``h_proj_smooth``): the published checkpoint has
  none, so they would be ones;
* the norms run on whole ``D`` rows (the reference sums 128-wide chunks: FP32 order only);
* two tasks instead of five (rms / norm / quant fused per token tile; the output copy is the
  linear task's store).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.qkv_proj_rope import (int8_quantize_rows, quantize_per_row_int8,
                                                  quantize_weight_per_column)
from pto.models.deepseek_v4.weight_format import is_bf16, weight_dtype, with_weight_format
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, expect_tensor, mode_tokens, need, round_up,
                                           token_capacity, token_tile)

__all__ = ["TOLERANCES", "MTP_PROJ_ARGS", "mtp_projection_kernels", "golden_mtp_projection",
           "make_mtp_projection_inputs", "build_case"]

REFERENCE = "pypto-lib models/deepseek/v4-flash/mtp_projection.py @ 3b6971a3"

# ratio_allclose (atol, rtol, max_error_ratio): the pypto-lib test's 1e-3 / 1e-3 / 0.05
TOLERANCES: dict[str, tuple[float, float, float]] = {"x_hc": (1e-3, 1e-3, 0.05)}

MTP_PROJ_ARGS = ("emb", "prev_hc", "enorm_w", "hnorm_w", "e_proj_w", "e_proj_scale", "h_proj_w",
                 "h_proj_scale", "x_hc")

# ---- kernel ----
T_DYN = pl.dynamic("T")
PROJ_T_TILE = 128  # token rows per block (CPU-sized; rows are independent)
PROJ_N_TILE = 512  # output columns per linear block


@functools.lru_cache(maxsize=None)
def mtp_projection_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """``mtp_projection`` (inline) and its ``@pl.jit`` test entry ``mtp_projection_test`` for
    ``cfg`` (``D = hidden_size``, ``HC = hc_mult``; argument order :data:`MTP_PROJ_ARGS`).

    Shapes: ``emb [T, D] BF16``, ``prev_hc [T, HC, D] FP32``, ``enorm_w / hnorm_w [D] BF16``,
    ``e_proj_w / h_proj_w [D, D] INT8`` (``[in, out]``), ``*_scale [D] FP32``, ``x_hc [T, HC,
    D] FP32`` (Out). GM scratch (``t_pad = round_up(T, 16)``, capacity
    :func:`token_capacity`): ``codes [t_pad, (1 + HC) * D] INT8``, ``inv_s [t_pad, 1 + HC]
    FP32``; every row ``< T`` of both is written before it is read, padding rows are never
    stored. ``cfg.weight_format == "bf16"`` (weight_format.py): BF16 weights, the normed rows
    rounded to BF16 into a BF16 ``codes`` (no ``inv_s``), BF16 x BF16 -> FP32 products with no
    scale (``*_scale`` not read).

    Raises:
        ConfigError: ``hidden_size`` not a multiple of 16.
    """
    D, HC, eps = cfg.hidden_size, cfg.hc_mult, cfg.rms_norm_eps
    need(D % 16 == 0, "mtp_projection", cfg, f"hidden_size={D} must be a multiple of 16")
    NT = min(D, PROJ_N_TILE)
    need(D % NT == 0, "mtp_projection", cfg, f"hidden_size={D} must be a multiple of {NT}")
    cap = token_capacity(cfg)
    WD, bf16 = weight_dtype(cfg), is_bf16(cfg)

    def norm_codes(x, w_row):
        """Weighted RMSNorm of the FP32 tile ``x [M, D]`` then per-row INT8: ``(codes, 1/s)``
        (bf16: the BF16 normed row, ``None``)."""
        inv = pl.rsqrt(pl.row_sum(x * x) / float(D) + eps, high_precision=True)
        xn = pl.col_expand_mul(pl.row_expand_mul(x, inv), w_row)
        if bf16:
            return pl.cast(xn, pl.BF16, mode="rint"), None
        codes, s = int8_quantize_rows(xn)
        return codes, pl.recip(s)

    @pl.jit.inline
    def mtp_projection(emb: pl.Tensor[[T_DYN, D], pl.BF16],
                       prev_hc: pl.Tensor[[T_DYN, HC, D], pl.FP32],
                       enorm_w: pl.Tensor[[D], pl.BF16],
                       hnorm_w: pl.Tensor[[D], pl.BF16],
                       e_proj_w: pl.Tensor[[D, D], WD],
                       e_proj_scale: pl.Tensor[[D], pl.FP32],
                       h_proj_w: pl.Tensor[[D, D], WD],
                       h_proj_scale: pl.Tensor[[D], pl.FP32],
                       x_hc: pl.Out[pl.Tensor[[T_DYN, HC, D], pl.FP32]]):
        """``x_hc[t, h] = e_proj(enorm(emb[t])) + h_proj(hnorm(prev_hc[t, h]))`` (module docstring)."""
        t = pl.tensor.dim(emb, 0)
        expect_tensor("mtp_projection", "prev_hc", prev_hc, [t, HC, D], pl.FP32)
        t_pad = round_up(t, MATMUL_M_TILE)
        TT = token_tile(t, PROJ_T_TILE)
        codes = pl.create_tensor([t_pad, (1 + HC) * D], WD, capacity=cap, name="codes")
        inv_s = None if bf16 else pl.create_tensor([t_pad, 1 + HC], pl.FP32, capacity=cap, name="inv_s")
        prev_flat = pl.reshape(prev_hc, [t, HC * D])
        out_flat = pl.reshape(x_hc, [t, HC * D])
        en, hn = pl.reshape(enorm_w, [1, D]), pl.reshape(hnorm_w, [1, D])
        for b in pl.spmd((t + TT - 1) // TT, name_hint="mtp_projection_quant"):
            t0 = b * TT
            en_row = pl.cast(en[0:1, 0:D], pl.FP32, mode="none")
            hn_row = pl.cast(hn[0:1, 0:D], pl.FP32, mode="none")
            rows = min(TT, t - t0)
            x = pl.cast(pl.slice(emb, [TT, D], [t0, 0], valid_shape=[rows, D]), pl.FP32, mode="none")
            c, r = norm_codes(x, en_row)
            pl.assemble(codes, pl.set_validshape(c, rows, D), [t0, 0])
            if r is not None:
                pl.assemble(inv_s, pl.set_validshape(r, rows, 1), [t0, 0])
            for h in range(HC):
                p = pl.slice(prev_flat, [TT, D], [t0, h * D], valid_shape=[rows, D])
                c, r = norm_codes(p, hn_row)
                pl.assemble(codes, pl.set_validshape(c, rows, D), [t0, (1 + h) * D])
                if r is not None:
                    pl.assemble(inv_s, pl.set_validshape(r, rows, 1), [t0, 1 + h])
        MT = min(t_pad, PROJ_T_TILE)
        n_m = (t + MT - 1) // MT
        es_row, hs_row = pl.reshape(e_proj_scale, [1, D]), pl.reshape(h_proj_scale, [1, D])

        def linear(col: int, w, s_row, n0: int, m0: int, rows: int):  # one projection of a codes block
            c = pl.slice(codes, [MT, D], [m0, col * D], valid_shape=[rows, D])
            if bf16:  # BF16 x BF16 -> FP32, no scale
                return pl.matmul(c, w)
            r = pl.slice(inv_s, [MT, 1], [m0, col], valid_shape=[rows, 1])
            return pl.col_expand_mul(pl.row_expand_mul(pl.cast(pl.matmul(c, w), pl.FP32), r), s_row[0:1, n0:n0 + NT])

        for b in pl.spmd(n_m * (D // NT), name_hint="mtp_projection_linear"):
            m0, n0 = (b % n_m) * MT, (b // n_m) * NT
            rows = min(MT, t - m0)
            we, wh = e_proj_w[0:D, n0:n0 + NT], h_proj_w[0:D, n0:n0 + NT]
            e = linear(0, we, es_row, n0, m0, rows)
            for h in range(HC):
                y = linear(1 + h, wh, hs_row, n0, m0, rows)
                pl.assemble(out_flat, pl.set_validshape(e + y, rows, NT), [m0, h * D + n0])
        return x_hc

    return SimpleNamespace(mtp_projection=mtp_projection,
                           mtp_projection_test=pl.jit.entry(mtp_projection, name="mtp_projection_test"))
# ---- end kernel ----


def golden_mtp_projection(
    emb: torch.Tensor,  # [T, D] bf16 (or fp32)
    prev_hc: torch.Tensor,  # [T, HC, D] fp32
    enorm_w: torch.Tensor,  # [D]
    hnorm_w: torch.Tensor,  # [D]
    e_proj_w,  # [D, D] int8 [in, out] with e_proj_scale, or fp32 [in, out] when the scale is None
    e_proj_scale,  # [D] fp32 or None
    h_proj_w,  # as e_proj_w
    h_proj_scale,  # [D] fp32 or None
    eps: float,
    *,
    bf16_act: bool = False,
) -> torch.Tensor:  # [T, HC, D] fp32
    """``e_proj(enorm(emb)) + h_proj(hnorm(prev_hc))`` broadcast over the streams (pypto-lib `mtp_projection.py`).

    With INT8 weights (scales given) each matrix is W8A8 by the kernels' rule
    (``quantize_per_row_int8`` of the normed rows, exact integer products in FP64, ``(acc *
    s_x) * scale``); with ``None`` scales the float weights are used as they are (the parity
    mode of the FP32 golden forward), the normed rows rounded to BF16 first when ``bf16_act``
    (the bf16 kernel).
    """
    def rms(x, w):
        x = x.float()
        return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * w.float()

    def lin(x, w, s):
        if s is None:
            return (x.to(torch.bfloat16).float() if bf16_act else x) @ w.float()
        codes, sx = quantize_per_row_int8(x)
        return (codes.double() @ w.double()).float() * sx * s[None, :]

    e = lin(rms(emb, enorm_w), e_proj_w, e_proj_scale)  # [T, D]
    T, HC, D = prev_hc.shape
    hproj = lin(rms(prev_hc.reshape(T * HC, D), hnorm_w), h_proj_w, h_proj_scale).reshape(T, HC, D)
    return e[:, None, :] + hproj


def make_mtp_projection_inputs(cfg: DeepSeekV4Config, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded inputs keyed by :data:`MTP_PROJ_ARGS` (``x_hc`` zero): BF16 ``N(0, 1)`` rows,
    FP32 ``N(0, 1)`` streams, norm weights ``1 + 0.1 N(0, 1)``, weights ``N(0, 1/D)``
    quantised per output column (``cfg.weight_format == "bf16"``: BF16, unit scales)."""
    g = torch.Generator().manual_seed(seed)
    D, HC = cfg.hidden_size, cfg.hc_mult

    def weight():
        w = torch.randn(D, D, generator=g) / D ** 0.5
        return (w.to(torch.bfloat16), torch.ones(D)) if is_bf16(cfg) else quantize_weight_per_column(w)
    ew, es = weight()
    hw, hs = weight()
    return {"emb": torch.randn(T, D, generator=g).to(torch.bfloat16),
            "prev_hc": torch.randn(T, HC, D, generator=g),
            "enorm_w": (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16),
            "hnorm_w": (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16),
            "e_proj_w": ew, "e_proj_scale": es, "h_proj_w": hw, "h_proj_scale": hs,
            "x_hc": torch.zeros(T, HC, D)}


def build_case(preset: str, mode: str, **options) -> CaseRun:
    """KernelCase builder: ``decode`` (``decode_batch * decode_seq`` rows) or ``prefill``
    (``prefill_seq`` rows); options ``T=``, ``seed=``, ``weight_format=`` (``"bf16"``: the
    unquantised kernel, same tolerance). ``x_hc`` compared by
    ``ratio_allclose(*TOLERANCES["x_hc"])`` against :func:`golden_mtp_projection`."""
    cfg, T = mode_tokens(preset, mode, options.get("T"))
    wf = str(options.get("weight_format", "int8"))
    cfg = with_weight_format(cfg, wf)
    d = make_mtp_projection_inputs(cfg, T, int(options.get("seed", 0)))
    specs = [TensorSpec(n, list(d[n].shape), d[n].dtype, d[n], is_output=(n == "x_hc")) for n in MTP_PROJ_ARGS]

    def golden(v: dict) -> None:
        a = [v[n] for n in MTP_PROJ_ARGS[:-1]]
        if wf == "bf16":  # float weights: no scale, BF16 activations as the kernel
            a[5] = a[7] = None
        v["x_hc"] = golden_mtp_projection(*a, cfg.rms_norm_eps, bf16_act=wf == "bf16")

    return CaseRun(fn=mtp_projection_kernels(cfg).mtp_projection_test, specs=specs, golden=golden,
                   compare={"x_hc": ratio_allclose(*TOLERANCES["x_hc"])},
                   label=f"mtp_projection T={T}" + (" weight_format=bf16" if wf == "bf16" else ""))


register(KernelCase("mtp_projection", build_case, modes=("decode", "prefill"),
                    description="MTP input projection: e_proj(enorm(emb)) + h_proj(hnorm(streams)), W8A8 (pypto-lib `mtp_projection.py`)"))
