"""Hyper-connection head: collapse the ``hc_mult`` streams into one row before the final norm.

Math (pypto-lib `models/deepseek/v4-flash/hc_head.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`; transformers ``DeepseekV4HyperHead``), per
token, FP32, ``N = hc_mult``:

    u     = flatten(x)                                             # [N*D]
    mixes = (hc_fn @ u) * rsqrt(mean(u^2) + rms_norm_eps)          # [N], K summed per 256-chunk
    pre   = sigmoid(mixes * hc_scale + hc_base) + hc_eps
    y     = bf16_rne((x0*pre0 + x1*pre1) + (x2*pre2 + x3*pre3))    # [D]

No post, no comb, no Sinkhorn (unlike hc_pre). Then the final weighted RMSNorm
(``rms_norm``) and ``lm_head``.

Kernel (:func:`hc_head`): ``hc_head_rms`` (``inv_rms``), ``hc_head_linear`` (split-K
``x_flat @ hc_fn^T``: ``HEAD_OK`` K-slices atomically added into ``mixes_raw``, which is
zero-initialised at allocation, pypto-lib commit 3b6971a3) and ``hc_head_mix`` (the gate and
the weighted stream sum, BF16 ``rint``). ``seed_scopes=True`` keeps the seed form: static
scratch at capacity and a ``hc_head_seed`` task zero-filling ``mixes_raw`` rows
``[0, t_pad)`` (bit-identical). Deviations: CPU-sized tiles (4 K-slices of the whole
``hc_dim / 4`` instead of 16 of 1024; token tiles of up to 128 rows); ``inv_rms`` is computed
by one task from the whole row instead of the reference's 16 ``sq_part`` K-slices summed by
the reduce task (same value up to the FP32 summation order).
"""

import functools
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.hc_pre import HC_K_CHUNK, inv_rms_rows
from pto.models.deepseek_v4.tiling import (MATMUL_M_TILE, check_seed_capacity, check_token_capacity, mode_tokens, need,
                                           round_up, token_capacity, token_tile)

__all__ = ["TOLERANCES", "HC_HEAD_SCALE_REF", "HC_HEAD_BASE_REF", "hc_head_kernels", "hc_head", "golden_hc_head",
           "make_hc_head_inputs", "build_hc_head"]

# Fixed real values of the reference test fixture (pypto-lib `models/deepseek/v4-flash/hc_head.py`).
HC_HEAD_SCALE_REF = 0.0761
HC_HEAD_BASE_REF = (5.92, -3.62, -2.93, -3.31)

# y: ratio_allclose(1e-4, 1/128) (pypto-lib `models/deepseek/v4-flash/hc_head.py`; the pypto-lib tests' tolerances).
TOLERANCES: dict[str, tuple[float, float, float]] = {"y": (1e-4, 1 / 128, 0.005)}

# ---- kernel ----
T_DYN = pl.dynamic("T")
HEAD_OK = 4  # K-slices of hc_head_linear (atomic add into mixes_raw) [16]
HEAD_N_PAD = 16  # mixes_raw columns: hc_mult padded to the cube granule [16]
HEAD_T_TILE = 128  # token rows per hc_head_rms / hc_head_mix block [8]
HEAD_M_TILE = 128  # rows per hc_head_linear block [16]


@functools.lru_cache(maxsize=None)
def hc_head_kernels(cfg: DeepSeekV4Config, seed_scopes: bool = False) -> SimpleNamespace:
    """Build the hc head for ``cfg`` (cached per config and variant).

    Shapes (``N = hc_mult``, ``D = hidden_size``): ``x_hc [T, N, D] FP32``, ``hc_fn [N, N*D]
    FP32``, ``hc_scale [1] FP32``, ``hc_base [N] FP32``, ``y [T, D] BF16`` (Out). GM scratch
    (``t_pad = round_up(T, 16)``, capacity :func:`token_capacity`): ``mixes_raw [t_pad, 16]
    FP32`` zero-initialised at allocation, ``inv_rms [t_pad, 1] FP32`` uninitialised.

    Returns:
        namespace with the inline body ``hc_head(x_hc, hc_fn, hc_scale, hc_base, y)`` (returns
        the id of its last task, for late-dependency gates), the entry ``hc_head_test`` and
        ``seed_scopes``.

    Raises:
        ConfigError: ``hc_mult`` outside ``[1, 16]`` or ``hc_mult * hidden_size`` not split
            into ``HEAD_OK`` K-slices of whole 16-column steps. At run time
            ``CapacityError`` for ``round_up(T, 16)`` above the capacity.
    """
    N, D = cfg.hc_mult, cfg.hidden_size
    HCD = N * D
    need(1 <= N <= HEAD_N_PAD, "hc_head", cfg, f"hc_mult={N} must be in [1, {HEAD_N_PAD}]")
    need(D > 0 and HCD % (HEAD_OK * 16) == 0, "hc_head", cfg,
         f"hc_dim={HCD} must split into {HEAD_OK} K-slices of a multiple of 16 columns")
    KS = HCD // HEAD_OK
    rms_eps, hc_eps = cfg.rms_norm_eps, cfg.hc_eps
    cap = token_capacity(cfg)

    @pl.jit.inline
    def hc_head(x_hc: pl.Tensor[[T_DYN, N, D], pl.FP32],
                hc_fn: pl.Tensor[[N, HCD], pl.FP32],
                hc_scale: pl.Tensor[[1], pl.FP32],
                hc_base: pl.Tensor[[N], pl.FP32],
                y: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
        """hc head (module docstring); returns the ``hc_head_mix`` task id."""
        t = pl.tensor.dim(x_hc, 0)
        t_pad = round_up(t, MATMUL_M_TILE)
        if seed_scopes:
            check_seed_capacity("hc_head", "mixes_raw", t_pad, t, cap)
            mixes_raw = pl.create_tensor([cap, HEAD_N_PAD], pl.FP32, name="mixes_raw")
            inv_rms = pl.create_tensor([cap, 1], pl.FP32, name="inv_rms")
        else:
            mixes_raw = pl.create_tensor([t_pad, HEAD_N_PAD], pl.FP32, init_value=0, capacity=cap, name="mixes_raw")
            inv_rms = pl.create_tensor([t_pad, 1], pl.FP32, capacity=cap, name="inv_rms")
        x_flat = pl.reshape(x_hc, [t, HCD])
        base_row = pl.reshape(hc_base, [1, N])

        if seed_scopes:
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="hc_head_seed", allow_early_resolve=True):
                mixes_raw[0:t_pad, 0:HEAD_N_PAD] = pl.full([t_pad, HEAD_N_PAD], pl.FP32, 0.0)

        TT = token_tile(t, HEAD_T_TILE)
        for b in pl.spmd(-(-t // TT), name_hint="hc_head_rms", allow_early_resolve=True):
            inv_rms_rows(x_flat, inv_rms, t, b * TT, TT, rms_eps)

        MT = min(HEAD_M_TILE, t_pad)
        for b in pl.spmd(-(-t_pad // MT) * HEAD_OK, name_hint="hc_head_linear", allow_early_resolve=True):
            m0, k0 = (b // HEAD_OK) * MT, (b % HEAD_OK) * KS
            m = min(MT, t_pad - m0)
            xa = pl.slice(x_flat, [m, KS], [m0, k0], valid_shape=[min(m, t - m0), KS])
            wb = pl.slice(hc_fn, [HEAD_N_PAD, KS], [0, k0], valid_shape=[N, KS])
            pl.assemble(mixes_raw, pl.matmul(xa, wb, b_trans=True), [m0, 0], atomic=pl.AtomicType.Add)

        task = pl.spmd(-(-t // TT), name_hint="hc_head_mix", allow_early_resolve=True)
        x_rows = pl.reshape(x_hc, [t * N, D])  # row t*N + h: stream h of token t
        for b in task:
            t0 = b * TT
            rows = min(TT, t - t0)  # a ragged last tile computes only its own rows
            inv = pl.slice(inv_rms, [rows, 1], [t0, 0])
            z = pl.row_expand_mul(pl.slice(mixes_raw, [rows, N], [t0, 0]), inv)
            z = pl.col_expand_add(z * pl.read(hc_scale, [0]), base_row[0:1, 0:N])
            pre = pl.recip(pl.exp(pl.neg(z)) + 1.0) + hc_eps
            # the tokens' whole rows in one load as [rows*N, D] (row (token, stream)), every
            # x_h * pre_h in one row-broadcast multiply by pre as a [rows*N, 1] column; stream h
            # is columns h*D .. (h+1)*D of the product's [rows, N*D] view
            xr = pl.slice(x_rows, [rows * N, D], [t0 * N, 0])
            prod = pl.reshape(pl.row_expand_mul(xr, pl.reshape(pre, [rows * N, 1])), [rows, HCD])
            terms = [prod[:, h * D:(h + 1) * D] for h in range(N)]
            while len(terms) > 1:  # pairwise tree, as the golden
                terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                         for i in range(0, len(terms), 2)]
            pl.assemble(y, pl.cast(terms[0], pl.BF16, mode="rint"), [t0, 0])
        return task.tid

    hc_head_test = pl.jit.entry(hc_head, name="hc_head_test")
    return SimpleNamespace(hc_head=hc_head, hc_head_test=hc_head_test, seed_scopes=seed_scopes)


@pl.jit.inline
def hc_head(x_hc: pl.Tensor, hc_fn: pl.Tensor, hc_scale: pl.Tensor, hc_base: pl.Tensor, y: pl.Out[pl.Tensor], cfg,
            seed_scopes: bool = False):
    """Stable inline signature ``hc_head(x_hc, hc_fn, hc_scale, hc_base, y, cfg, seed_scopes=False)
    -> task id`` (shapes and errors in :func:`hc_head_kernels`)."""
    return hc_head_kernels(cfg, seed_scopes).hc_head(x_hc, hc_fn, hc_scale, hc_base, y)
# ---- end kernel ----


def golden_hc_head(
    x_hc: torch.Tensor,  # [T, hc_mult, D] fp32
    hc_fn: torch.Tensor,  # [hc_mult, hc_mult*D] fp32
    hc_scale: torch.Tensor,  # [1] fp32
    hc_base: torch.Tensor,  # [hc_mult] fp32
    cfg: DeepSeekV4Config,
    *,
    float32: bool = False,
) -> torch.Tensor:  # [T, D] bf16 (fp32 with float32=True)
    """hc head golden (pypto-lib `models/deepseek/v4-flash/hc_head.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`), FP32: ``inv_rms`` over the
    flattened row with ``rms_norm_eps``; the mixes matmul summed per ``HC_K_CHUNK``-wide K chunk
    in chunk order, then scaled by ``inv_rms``; ``pre = sigmoid(mixes * scale + base) +
    hc_eps``; the weighted streams added as a pairwise tree; BF16 (RNE) unless ``float32``.

    Raises:
        BindError: shapes off ``cfg`` or non-float inputs.
    """
    fn = "golden_hc_head"
    N, D = cfg.hc_mult, cfg.hidden_size
    if x_hc.dim() != 3 or tuple(x_hc.shape[1:]) != (N, D) or not x_hc.is_floating_point():
        raise BindError(f"{fn}: x_hc must be a float [T, {N}, {D}] tensor, got {x_hc.dtype} {list(x_hc.shape)}")
    for name, t, shape in (("hc_fn", hc_fn, (N, N * D)), ("hc_scale", hc_scale, (1,)), ("hc_base", hc_base, (N,))):
        if tuple(t.shape) != shape or not t.is_floating_point():
            raise BindError(f"{fn}: {name} must be a float tensor of shape {list(shape)}, got {t.dtype} "
                            f"{list(t.shape)}")
    T = x_hc.shape[0]
    xf = x_hc.float()
    x_flat = xf.reshape(T, N * D)
    w = hc_fn.float()
    inv = torch.rsqrt(x_flat.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps)
    mixes = torch.zeros(T, N)
    for k0 in range(0, N * D, HC_K_CHUNK):
        mixes = mixes + x_flat[:, k0:k0 + HC_K_CHUNK] @ w[:, k0:k0 + HC_K_CHUNK].T
    pre = torch.sigmoid(mixes * inv * hc_scale.float() + hc_base.float()) + cfg.hc_eps
    terms = [xf[:, h, :] * pre[:, h:h + 1] for h in range(N)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0] if float32 else terms[0].to(torch.bfloat16)


def make_hc_head_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture (pypto-lib `models/deepseek/v4-flash/hc_head.py`): ``x_hc ~ N(0, 1) * 0.05`` then ``hc_fn ~ N(0, 1) *
    0.0519`` from one ``torch.Generator(seed)``; the fixed real ``hc_scale = 0.0761`` and
    ``hc_base = (5.92, -3.62, -2.93, -3.31)``.

    Raises:
        ConfigError: ``hc_mult != 4`` (no reference base for other widths).
        BindError: ``T`` not positive.
    """
    if cfg.hc_mult != len(HC_HEAD_BASE_REF):
        raise ConfigError(f"make_hc_head_inputs: config {cfg.name!r} has hc_mult={cfg.hc_mult}; the reference "
                          f"hc_base has {len(HC_HEAD_BASE_REF)} values")
    if T <= 0:
        raise BindError(f"make_hc_head_inputs: T must be positive, got {T}")
    gen = torch.Generator().manual_seed(seed)
    return {"x_hc": torch.randn(T, cfg.hc_mult, cfg.hidden_size, generator=gen) * 0.05,
            "hc_fn": torch.randn(cfg.hc_mult, cfg.hc_dim, generator=gen) * 0.0519,
            "hc_scale": torch.tensor([HC_HEAD_SCALE_REF]), "hc_base": torch.tensor(HC_HEAD_BASE_REF)}


# ---- registration ----
def build_hc_head(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                  seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: the hc head at ``preset`` in ``mode`` (decode 8 tokens, prefill 128)
    or ``T`` tokens, fixture :func:`make_hc_head_inputs`; ``seed_scopes=True`` selects the
    seed-task variant.

    Raises:
        ConfigError: unknown preset / mode, bad ``T`` or an untileable config.
    """
    cfg, T = mode_tokens(preset, mode, T)
    check_token_capacity("hc_head", cfg, T)  # before any input is built
    ins = make_hc_head_inputs(cfg, T, seed)
    specs = [TensorSpec(k, list(v.shape), torch.float32, init_value=v) for k, v in ins.items()]
    specs.append(TensorSpec("y", [T, cfg.hidden_size], torch.bfloat16, is_output=True))

    def golden(v: dict) -> None:
        v["y"] = golden_hc_head(v["x_hc"], v["hc_fn"], v["hc_scale"], v["hc_base"], cfg)

    label = f"{preset} {mode} T={T}" + (" seed_scopes" if seed_scopes else "")
    return CaseRun(hc_head_kernels(cfg, bool(seed_scopes)).hc_head_test, specs, golden,
                   {"y": ratio_allclose(*TOLERANCES["y"])}, rtol=1e-3, atol=1e-3, label=label)


register(KernelCase("hc_head", build_hc_head, modes=("decode", "prefill"), seed_variant=True,
                    description="hyper-connection head: split-K into init-0 mixes_raw, stream collapse (pypto-lib `hc_head.py`)"))
