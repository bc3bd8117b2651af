"""Shared expert: the W8A8 INT8 SwiGLU FFN with the ``swiglu_limit`` clamp over all tokens.

Math (pypto-lib `models/deepseek/v4-flash/expert_shared.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`; transformers
``DeepseekV4MLP``), per token row, ``L = swiglu_limit``, ``F = moe_intermediate_size``:

    g  = (x_i8 @ w1^T in INT32) * x_scale * w1_scale              # [F] gate projection
    u  = (x_i8 @ w3^T in INT32) * x_scale * w3_scale              # [F] up projection
    h  = silu(min(g, L)) * clamp(u, -L, L)                        # gate clamped from above only
    h_i8, h_scale = int8_per_row(h)
    sh = bf16_rne((h_i8 @ w2^T in INT32) * h_scale * w2_scale)    # [D]

Weights are INT8 per output channel (rows of ``w1 / w3 [F, D]`` and ``w2 [D, F]``, the HF
``[out, in]`` layout) with FP32 scales; the activation is gate's ``x_norm_i8`` /
``x_norm_scale`` (no second quantisation).

Kernel (:func:`expert_shared`): ``sh_gate_up_act_q`` (token tiles: both INT8 matmuls,
dequant, clamp, SwiGLU, per-row INT8 of ``h`` into ``h_i8`` / ``h_scale``), then ``sh_w2``
(row tiles of ``t_pad = round_up(T, 16)`` rows x hidden column tiles: ``h_i8 @ w2^T``,
dequant, BF16 ``rint``, valid rows stored). The ``w2`` matmul reads all ``t_pad`` rows of
``h_i8``, so its pad rows ``T .. t_pad`` must be zero: ``h_i8`` is zero-initialised at
allocation (pypto-lib commit 3b6971a3, ``h_tile_i8``); ``seed_scopes=True`` keeps the seed form
(static ``h_i8`` at capacity and a ``sh_h_seed`` task zero-filling rows ``[0, t_pad)``;
bit-identical). Deviations: CPU-sized tiles (the whole ``F`` per matmul, up to 128 token
rows); the per-row ``h_scale`` is a ``[t_pad, 1]`` tensor (the reference broadcasts it over 8
columns because a ``[*, 1]`` store is below the 32-byte minimum); INT32 codes are cast
straight to INT8 (:func:`gate.int8_codes`; the reference's FP16 hop is the identity here).
"""

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import pto.language as pl
from pto.errors import BindError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_reldiff, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.gate import int8_codes
from pto.models.deepseek_v4.qkv_proj_rope import (INT8_SCALE_MAX, int8_row_amax, quantize_per_row_int8,
                                                  quantize_weight_per_column)
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, check_seed_capacity, check_token_capacity, mode_tokens, need,
                                           round_up, token_capacity, token_tile)
from pto.models.deepseek_v4.weight_format import act_dtype, is_bf16, weight_dtype, with_weight_format

__all__ = ["TOLERANCES", "SH_T_TILE", "SH_D_TILE", "quantize_weight_per_row", "swiglu_int8_rows",
           "down_int8_rows", "swiglu_bf16_rows", "down_bf16_rows", "expert_ffn_tiling", "expert_shared_kernels", "expert_shared", "golden_swiglu_ffn",
           "golden_expert_shared", "make_expert_weights", "make_expert_activations", "build_expert_shared"]

# pypto-lib `models/deepseek/v4-flash/expert_routed.py`; pypto-lib `models/deepseek/v4-flash/expert_shared.py`; the pypto-lib tests' tolerances: sh / recv_y ratio_reldiff(diff_thd=2e-3, pct_thd=0.01).
TOLERANCES: dict[str, tuple[float, float]] = {"sh": (2e-3, 0.01)}

# ---- kernel ----
T_DYN = pl.dynamic("T")
SH_T_TILE = 128  # token rows per sh_gate_up_act_q block [8]
SH_M_TILE = 128  # rows per sh_w2 block, a multiple of MATMUL_M_TILE [16]
SH_D_TILE = 1024  # hidden columns per sh_w2 block [256]


def expert_ffn_tiling(cfg: DeepSeekV4Config, kernel: str) -> SimpleNamespace:
    """Sizes shared by the routed and shared expert kernels: ``d``, ``f``, ``d_tile`` (the
    largest of ``SH_D_TILE`` or less dividing ``hidden_size``), ``limit``.

    Raises:
        ConfigError: ``hidden_size`` or ``moe_intermediate_size`` not a positive multiple of 32
            (INT8 rows of 32 bytes), or an INT32 accumulator that could overflow
            (``K * 127^2 >= 2^31``).
    """
    D, Fd = cfg.hidden_size, cfg.moe_intermediate_size
    need(D > 0 and D % 32 == 0, kernel, cfg, f"hidden_size={D} must be a positive multiple of 32")
    need(Fd > 0 and Fd % 32 == 0, kernel, cfg, f"moe_intermediate_size={Fd} must be a positive multiple of 32")
    need(max(D, Fd) * 127 * 127 < 2 ** 31, kernel, cfg, "INT32 accumulation could overflow")
    d_tile = min(SH_D_TILE, D)
    while D % d_tile:
        d_tile //= 2
    return SimpleNamespace(d=D, f=Fd, d_tile=d_tile, limit=float(cfg.swiglu_limit))


def swiglu_int8_rows(a_i8, a_scale, w1, w1_scale, w3, w3_scale, limit: float):
    """SwiGLU of INT8 activation rows: ``a_i8 [M, D]`` INT8 with dequant scale ``a_scale [M, 1]``
    FP32; ``w1 / w3 [F, D]`` INT8 tiles with ``[1, F]`` FP32 scales. Returns ``h [M, F]`` FP32
    ``= silu(min(g, limit)) * clamp(u, -limit, limit)`` with ``g = acc1 * a_scale * w1_scale``
    (INT32 accumulation, dequant in that order) and ``silu(g) = g / (1 + exp(-g))``."""
    g = pl.col_expand_mul(pl.row_expand_mul(pl.cast(pl.matmul(a_i8, w1, b_trans=True), pl.FP32), a_scale),
                          w1_scale)
    u = pl.col_expand_mul(pl.row_expand_mul(pl.cast(pl.matmul(a_i8, w3, b_trans=True), pl.FP32), a_scale),
                          w3_scale)
    g = pl.minimum(g, limit)  # upper clamp only (transformers `models/deepseek_v4/modeling_deepseek_v4.py`)
    u = pl.maximum(pl.minimum(u, limit), -limit)
    return g * pl.recip(pl.exp(pl.neg(g)) + 1.0) * u


def swiglu_bf16_rows(a, w1, w3, limit: float):
    """Unquantised SwiGLU (weight_format "bf16"): ``a [M, D]`` BF16 rows, ``w1 / w3 [F, D]``
    BF16 tiles; ``h [M, F]`` FP32 as :func:`swiglu_int8_rows` with ``g = a @ w1^T``,
    ``u = a @ w3^T`` (BF16 x BF16 -> FP32, no scales)."""
    g = pl.minimum(pl.matmul(a, w1, b_trans=True), limit)
    u = pl.maximum(pl.minimum(pl.matmul(a, w3, b_trans=True), limit), -limit)
    return g * pl.recip(pl.exp(pl.neg(g)) + 1.0) * u


def down_bf16_rows(h_bf16, w2, row_weight=None):
    """``(h_bf16 [M, F] @ w2 [Dt, F]^T)`` FP32 (BF16 x BF16 -> FP32), times ``row_weight
    [M, 1]`` FP32 when given (weight_format "bf16")."""
    y = pl.matmul(h_bf16, w2, b_trans=True)
    return y if row_weight is None else pl.row_expand_mul(y, row_weight)


def quantize_h_rows(h):
    """Per-row INT8 of the FP32 tile ``h [M, F]``: ``(codes [M, F] INT8, scale [M, 1] FP32 =
    1/s)`` with ``s = 127 / max(amax, 1e-4)`` (as :func:`quantize_per_row_int8`)."""
    s = pl.div(INT8_SCALE_MAX, int8_row_amax(h))  # number / tile: one IEEE division, no [M, 1] fill
    return int8_codes(h, s), pl.recip(s)


def down_int8_rows(h_i8, row_scale, w2, w2_scale):
    """``(h_i8 [M, F] @ w2 [Dt, F]^T in INT32) * row_scale [M, 1] * w2_scale [1, Dt]`` FP32."""
    return pl.col_expand_mul(pl.row_expand_mul(pl.cast(pl.matmul(h_i8, w2, b_trans=True), pl.FP32), row_scale),
                             w2_scale)


@functools.lru_cache(maxsize=None)
def expert_shared_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the shared expert for ``cfg`` (cached per config and variant).

    Shapes (``D = hidden_size``, ``F = moe_intermediate_size``): ``x_i8 [T, D] INT8``,
    ``x_scale [T, 1] FP32``, ``w1, w3 [F, D] INT8``, ``w1_scale, w3_scale [F] FP32``,
    ``w2 [D, F] INT8``, ``w2_scale [D] FP32``, ``sh [T, D] BF16`` (Out). GM scratch
    (``t_pad = round_up(T, 16)``, capacity :func:`token_capacity`): ``h_i8 [t_pad, F] INT8``
    zero-initialised at allocation, ``h_scale [t_pad, 1] FP32`` uninitialised (rows ``>= T``
    never read). ``cfg.weight_format == "bf16"`` (weight_format.py): ``x_i8``, ``w1``, ``w3``,
    ``w2`` and the ``h_i8`` scratch are BF16, ``h`` is rounded to BF16 instead of quantised and
    the scales (``x_scale``, ``w*_scale``) are not read.

    Returns:
        namespace with the inline body ``expert_shared(x_i8, x_scale, w1, w1_scale, w3,
        w3_scale, w2, w2_scale, sh)`` (returns ``sh``), its entry ``expert_shared_test`` and
        ``seed_scopes``.

    Raises:
        ConfigError: ``cfg`` cannot be tiled (:func:`expert_ffn_tiling`). At run time
            ``CapacityError`` for ``round_up(T, 16)`` above the capacity (before any task).
    """
    tl = expert_ffn_tiling(cfg, "expert_shared")
    D, Fd, DT, L = tl.d, tl.f, tl.d_tile, tl.limit
    cap = token_capacity(cfg)
    n_d = D // DT
    WD, AD, bf16 = weight_dtype(cfg), act_dtype(cfg), is_bf16(cfg)

    @pl.jit.inline
    def expert_shared(x_i8: pl.Tensor[[T_DYN, D], AD],
                      x_scale: pl.Tensor[[T_DYN, 1], pl.FP32],
                      w1: pl.Tensor[[Fd, D], WD],
                      w1_scale: pl.Tensor[[Fd], pl.FP32],
                      w3: pl.Tensor[[Fd, D], WD],
                      w3_scale: pl.Tensor[[Fd], pl.FP32],
                      w2: pl.Tensor[[D, Fd], WD],
                      w2_scale: pl.Tensor[[D], pl.FP32],
                      sh: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
        """Shared-expert SwiGLU FFN (module docstring); returns ``sh``."""
        t = pl.tensor.dim(x_i8, 0)
        t_pad = round_up(t, MATMUL_M_TILE)
        if seed_scopes:
            check_seed_capacity("expert_shared", "h_i8", t_pad, t, cap)
            h_i8 = pl.create_tensor([cap, Fd], AD, name="h_i8")
        else:
            h_i8 = pl.create_tensor([t_pad, Fd], AD, init_value=0, capacity=cap, name="h_i8")
        h_scale = pl.create_tensor([t_pad, 1], pl.FP32, capacity=cap, name="h_scale")
        w1s, w3s = pl.reshape(w1_scale, [1, Fd]), pl.reshape(w3_scale, [1, Fd])
        w2s = pl.reshape(w2_scale, [1, D])

        if seed_scopes:
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="sh_h_seed", allow_early_resolve=True):
                h_i8[0:t_pad, 0:Fd] = pl.full([t_pad, Fd], AD, 0)

        TT = token_tile(t, SH_T_TILE)
        for b in pl.spmd(-(-t // TT), name_hint="sh_gate_up_act_q", allow_early_resolve=True):
            t0 = b * TT
            rows = min(TT, t - t0)
            if bf16:
                a = pl.slice(x_i8, [TT, D], [t0, 0], valid_shape=[rows, D])
                h = swiglu_bf16_rows(a, w1[0:Fd, 0:D], w3[0:Fd, 0:D], L)
                pl.assemble(h_i8, pl.set_validshape(pl.cast(h, pl.BF16, mode="rint"), rows, Fd), [t0, 0])
                continue
            # the valid rows alone: exact INT32 products and per-row ops (pad rows change no valid row)
            h = swiglu_int8_rows(x_i8[t0:t0 + rows, 0:D], x_scale[t0:t0 + rows, 0:1], w1[0:Fd, 0:D], w1s[0:1, 0:Fd],
                                 w3[0:Fd, 0:D], w3s[0:1, 0:Fd], L)
            codes, hs = quantize_h_rows(h)
            pl.assemble(h_i8, codes, [t0, 0])
            pl.assemble(h_scale, hs, [t0, 0])

        MT = min(SH_M_TILE, t_pad)
        n_m = -(-t_pad // MT)
        for b in pl.spmd(n_m * n_d, name_hint="sh_w2", allow_early_resolve=True):
            m0, d0 = (b // n_d) * MT, (b % n_d) * DT
            m = min(MT, t_pad - m0)
            rows = min(m, t - m0)
            hq = pl.slice(h_i8, [m, Fd], [m0, 0])  # all t_pad rows: the pad rows are the init zeros
            if bf16:
                y = down_bf16_rows(hq, pl.slice(w2, [DT, Fd], [d0, 0]))
            else:
                hs = pl.slice(h_scale, [m, 1], [m0, 0], valid_shape=[rows, 1])
                y = down_int8_rows(hq, hs, pl.slice(w2, [DT, Fd], [d0, 0]), w2s[0:1, d0:d0 + DT])
            pl.assemble(sh, pl.set_validshape(pl.cast(y, pl.BF16, mode="rint"), rows, DT), [m0, d0])
        return sh

    expert_shared_test = pl.jit.entry(expert_shared, name="expert_shared_test")
    return SimpleNamespace(expert_shared=expert_shared, expert_shared_test=expert_shared_test,
                           seed_scopes=seed_scopes)


@pl.jit.inline
def expert_shared(x_i8: pl.Tensor, x_scale: pl.Tensor, w1: pl.Tensor, w1_scale: pl.Tensor, w3: pl.Tensor,
                  w3_scale: pl.Tensor, w2: pl.Tensor, w2_scale: pl.Tensor, sh: pl.Out[pl.Tensor], cfg,
                  seed_scopes: bool = False):
    """Stable inline signature ``expert_shared(x_i8, x_scale, w1, w1_scale, w3, w3_scale, w2,
    w2_scale, sh, cfg, seed_scopes=False) -> sh`` (shapes and errors in
    :func:`expert_shared_kernels`)."""
    return expert_shared_kernels(cfg, seed_scopes).expert_shared(x_i8, x_scale, w1, w1_scale, w3, w3_scale, w2,
                                                                 w2_scale, sh)
# ---- end kernel ----


def quantize_weight_per_row(
    w: torch.Tensor,  # [N, K] float, rows are output channels (HF layout)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([N, K] int8, [N] fp32)
    """Symmetric per-output-row INT8 weight quantisation (pypto-lib `models/deepseek/v4-flash/` INT8 conventions):
    :func:`quantize_weight_per_column` of ``w^T``, transposed back.

    Raises:
        BindError: ``w`` is not a float rank-2 tensor.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise BindError(f"quantize_weight_per_row: w must be a float [N, K] tensor, got {w.dtype} {list(w.shape)}")
    q, s = quantize_weight_per_column(w.T)
    return q.T.contiguous(), s


def golden_swiglu_ffn(
    x: torch.Tensor,  # [M, D] int8 codes ("int8") | float activations ("bf16")
    x_scale: torch.Tensor | None,  # [M, 1] fp32 ("int8")
    w1: torch.Tensor, w1_scale: torch.Tensor | None,  # [F, D] int8 | float ; [F]
    w3: torch.Tensor, w3_scale: torch.Tensor | None,  # [F, D] ; [F]
    w2: torch.Tensor, w2_scale: torch.Tensor | None,  # [D, F] ; [D]
    limit: float,
    *,
    weight_format: str = "int8",
    row_weight: torch.Tensor | None = None,  # [M, 1] fp32 routing weight
    round_h: bool = False,
) -> torch.Tensor:  # [M, D] fp32
    """One expert's clamped SwiGLU FFN on ``M`` rows, FP32 result (transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``"int8"``: integer products exact (FP64, returned through INT32 semantics), dequant
    ``acc * x_scale * w_scale``; ``h`` re-quantised per row (:func:`quantize_per_row_int8`),
    ``y = acc2 * (h_scale * row_weight) * w2_scale``. ``"bf16"``: plain FP32 matmuls with the
    float weights (scales ignored) and ``y = (h @ w2^T) * row_weight``, ``h`` rounded to BF16
    (RNE) first when ``round_h`` (the bf16 kernels' activation). ``silu`` is ``F.silu``; clamps
    ``g <= limit``, ``-limit <= u <= limit``.
    """
    if weight_format == "int8":
        xd = x.double()
        g = (xd @ w1.double().T).float() * x_scale * w1_scale.float()
        u = (xd @ w3.double().T).float() * x_scale * w3_scale.float()
    else:
        xf = x.float()
        g = xf @ w1.float().T
        u = xf @ w3.float().T
    h = F.silu(g.clamp(max=limit)) * u.clamp(min=-limit, max=limit)
    if weight_format == "int8":
        hq, hs = quantize_per_row_int8(h)
        rs = hs if row_weight is None else hs * row_weight.float()
        return (hq.double() @ w2.double().T).float() * rs * w2_scale.float()
    if round_h:
        h = h.to(torch.bfloat16).float()
    y = h @ w2.float().T
    return y if row_weight is None else y * row_weight.float()


def golden_expert_shared(
    x: torch.Tensor,  # [T, D] int8 | float
    x_scale: torch.Tensor | None,  # [T, 1] fp32
    w1: torch.Tensor, w1_scale: torch.Tensor | None,  # [F, D] ; [F]
    w3: torch.Tensor, w3_scale: torch.Tensor | None,  # [F, D] ; [F]
    w2: torch.Tensor, w2_scale: torch.Tensor | None,  # [D, F] ; [D]
    cfg: DeepSeekV4Config,
    *,
    weight_format: str = "int8",
    float32: bool = False,
) -> torch.Tensor:  # [T, D] bf16 (fp32 with float32=True)
    """Shared-expert golden (pypto-lib `models/deepseek/v4-flash/expert_shared.py`): :func:`golden_swiglu_ffn` over all rows,
    BF16 (RNE) unless ``float32`` (parity mode: no rounding of ``sh``; for ``"bf16"`` nor of
    ``h``, which the kernel rounds to BF16).

    Raises:
        BindError: unknown ``weight_format`` or shapes off ``cfg``.
    """
    fn = "golden_expert_shared"
    if weight_format not in ("int8", "bf16"):
        raise BindError(f"{fn}: weight_format must be 'int8' or 'bf16', got {weight_format!r}")
    D, Fd = cfg.hidden_size, cfg.moe_intermediate_size
    for name, t, shape in (("w1", w1, (Fd, D)), ("w3", w3, (Fd, D)), ("w2", w2, (D, Fd))):
        if tuple(t.shape) != shape:
            raise BindError(f"{fn}: {name} must be {list(shape)}, got {list(t.shape)}")
    if x.dim() != 2 or x.shape[1] != D:
        raise BindError(f"{fn}: x must be [T, {D}], got {list(x.shape)}")
    y = golden_swiglu_ffn(x, x_scale, w1, w1_scale, w3, w3_scale, w2, w2_scale, float(cfg.swiglu_limit),
                          weight_format=weight_format, round_h=not float32)
    return y if float32 else y.to(torch.bfloat16)


def make_expert_weights(cfg: DeepSeekV4Config, n_experts: int | None, gen: torch.Generator, *,
                        std: float = 1.5, weight_format: str = "int8") -> dict[str, torch.Tensor]:
    """Expert weights ``w1, w3 [.., F, D]``, ``w2 [.., D, F]`` drawn ``N(0, 1) * std /
    sqrt(fan_in)`` (so unit-RMS inputs give pre-activations of std ~``std``; the FLASH
    checkpoint's routed weights are ~1.6), quantised per output row for ``"int8"`` (FP32
    scales ``[.., F]`` / ``[.., D]``), BF16 with unit scales for ``"bf16"``. ``n_experts=None``
    gives one expert without the leading dim. Draw order: w1, w3, w2, one expert at a time.
    """
    D, Fd = cfg.hidden_size, cfg.moe_intermediate_size
    out = {k: [] for k in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")}
    for _ in range(1 if n_experts is None else n_experts):
        for name, shape in (("w1", (Fd, D)), ("w3", (Fd, D)), ("w2", (D, Fd))):
            w = torch.randn(*shape, generator=gen) * (std / shape[1] ** 0.5)
            if weight_format == "int8":
                q, s = quantize_weight_per_row(w)
            else:
                q, s = w.to(torch.bfloat16), torch.ones(shape[0])
            out[name].append(q)
            out[name + "_scale"].append(s)
    if n_experts is None:
        return {k: v[0] for k, v in out.items()}
    return {k: torch.stack(v) for k, v in out.items()}


def make_expert_activations(cfg: DeepSeekV4Config, T: int, gen: torch.Generator, *,
                            weight_format: str = "int8") -> dict[str, torch.Tensor]:
    """``x_i8 [T, D]`` INT8 and ``x_scale [T, 1]`` FP32: per-row INT8 of ``N(0, 1)`` rows, scales
    around ``1/40`` as gate produces for unit-RMS rows; for ``"bf16"`` the rows in BF16 and
    unit scales (the same draw)."""
    x = torch.randn(T, cfg.hidden_size, generator=gen)
    if weight_format == "bf16":
        return {"x_i8": x.to(torch.bfloat16), "x_scale": torch.ones(T, 1)}
    q, s = quantize_per_row_int8(x)
    return {"x_i8": q, "x_scale": s}


# ---- registration ----
_SH_INPUTS = ("x_i8", "x_scale", "w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def build_expert_shared(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                        std: float = 1.5, seed_scopes: bool = False, weight_format: str = "int8") -> CaseRun:
    """KernelCase builder: the shared expert at ``preset`` in ``mode`` (decode 8 tokens, prefill
    128) or ``T`` tokens; ``std`` scales the weights (about 7 puts 10-20 % of the pre-activations
    past ``swiglu_limit``); ``seed_scopes=True`` selects the seed-task variant;
    ``weight_format="bf16"`` the unquantised kernel (BF16 fixture, golden with the kernel's
    BF16 ``h``). ``sh`` is compared with ``ratio_reldiff(2e-3, 0.01)`` in both formats.

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, or an untileable config.
    """
    cfg, T = mode_tokens(preset, mode, T)
    cfg = with_weight_format(cfg, weight_format)
    check_token_capacity("expert_shared", cfg, T)  # before any input is built
    gen = torch.Generator().manual_seed(seed)
    ins = make_expert_activations(cfg, T, gen, weight_format=weight_format)
    ins.update(make_expert_weights(cfg, None, gen, std=std, weight_format=weight_format))
    specs = [TensorSpec(k, list(ins[k].shape), ins[k].dtype, init_value=ins[k]) for k in _SH_INPUTS]
    specs.append(TensorSpec("sh", [T, cfg.hidden_size], torch.bfloat16, is_output=True))

    def golden(v: dict) -> None:
        v["sh"] = golden_expert_shared(*(v[k] for k in _SH_INPUTS), cfg, weight_format=weight_format)

    label = (f"{preset} {mode} T={T}" + (" seed_scopes" if seed_scopes else "")
             + (" weight_format=bf16" if weight_format == "bf16" else ""))
    return CaseRun(expert_shared_kernels(cfg, bool(seed_scopes)).expert_shared_test, specs, golden,
                   {"sh": ratio_reldiff(*TOLERANCES["sh"])}, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase("expert_shared", build_expert_shared, modes=("decode", "prefill"), seed_variant=True,
                    description="shared expert: W8A8 SwiGLU with the swiglu_limit clamp, init-0 h_i8 (pypto-lib `expert_shared.py`)"))
