"""Token RMSNorm: attention norm, FFN norm and the final norm.

Math (pypto-lib `models/deepseek/v4-flash/rmsnorm.py`; transformers `models/deepseek_v4/modeling_deepseek_v4.py`, "weighted RMSNorm"), per token row,
all in FP32, mean over the hidden axis D:

    x_normed = bf16_rne((x * rsqrt(mean(x^2) + eps)) * w)

Kernel (``rms_norm``, one task ``rms_norm`` of ``ceil(T/RMS_T_TILE)`` blocks, no GM
scratch): each block loads its token rows as one ``[rows, D]`` tile (``RMS_T_TILE`` rows, the
ragged last block only its own), sums squares in FP32,
``inv = rsqrt(sum/D + eps)``, writes ``x*inv*w`` as BF16 with ``rint`` (round-to-nearest-
even). The reference uses 8-token blocks and walks D in 32 chunks of 128 per pass; on the
CPU the same math runs as a handful of large tile ops per block (128 tokens, full width), so
that the kernel stays within a small factor of the golden's wall time (rows are
independent: the token tile does not change any value). The golden below uses torch's FP32
mean and ``.to(bfloat16)`` (also RNE), so the two differ only by FP32 summation order.
"""

import functools

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.tiling import expect_tensor, mode_tokens, need, token_tile

__all__ = ["TOLERANCES", "rms_norm", "rms_norm_tiling", "rms_norm_entry", "build_rms_norm", "golden_rms_norm",
           "make_rms_norm_inputs"]

# Compare functions per output as ratio_allclose (atol, rtol, max_error_ratio);
# pypto-lib `models/deepseek/v4-flash/rmsnorm.py`; the pypto-lib tests' tolerances (0.005 is ratio_allclose's default max_error_ratio).
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "x_normed": (1e-4, 1 / 128, 0.005),
}

# ---- kernel ----
T_DYN = pl.dynamic("T")  # runtime token count
D_DYN = pl.dynamic("D")  # hidden size (checked against cfg.hidden_size)
RMS_T_TILE = 128  # token rows per block [reference: 8]; CPU-sized, see the module docstring


def rms_norm_tiling(cfg: DeepSeekV4Config) -> dict:
    """Tile sizes of :func:`rms_norm` for ``cfg``: ``{"t_tile": RMS_T_TILE, "d": hidden_size}``.

    Raises:
        ConfigError: ``hidden_size`` not a positive multiple of 16 (a BF16 tile row must
            be a whole number of 32-byte units).
    """
    D = cfg.hidden_size
    need(D > 0 and D % 16 == 0, "rms_norm", cfg, f"hidden_size={D} must be a positive multiple of 16")
    return {"t_tile": RMS_T_TILE, "d": D}


@pl.jit.inline
def rms_norm(
    x: pl.Tensor[[T_DYN, D_DYN], pl.BF16],
    w: pl.Tensor[[D_DYN], pl.BF16],
    x_normed: pl.Out[pl.Tensor[[T_DYN, D_DYN], pl.BF16]],
    cfg,
):
    """Token RMSNorm ``x_normed = bf16_rne(x * rsqrt(mean(x^2) + eps) * w)`` (pypto-lib `rmsnorm.py`).

    Stable inline signature: ``rms_norm(x, w, x_normed, cfg) -> task id``.

    Args:
        x: ``[T, D]`` BF16 activations (``D = cfg.hidden_size``), any ``T >= 0``.
        w: ``[D]`` BF16 norm weight.
        x_normed: ``[T, D]`` BF16 output; rows ``>= T`` of any tile are never written.
        cfg: model config (``hidden_size``, ``rms_norm_eps``).

    Returns:
        The task id of the single ``rms_norm`` task (``spmd(ceil(T/tile))``, ``tile =``
        :func:`token_tile` ``(T, RMS_T_TILE)``), for
        ``pl.system.task_dummy(deps=[tid])`` late-dependency gates.

    Raises:
        ConfigError: ``cfg`` cannot be tiled (:func:`rms_norm_tiling`).
        BindError: ``x``/``w``/``x_normed`` do not match ``cfg``.
    """
    tl = rms_norm_tiling(cfg)
    t = pl.tensor.dim(x, 0)
    D, TT = tl["d"], token_tile(t, tl["t_tile"])
    expect_tensor("rms_norm", "x", x, [t, D], pl.BF16)
    eps = cfg.rms_norm_eps
    w_row = pl.reshape(w, [1, D])
    task = pl.spmd((t + TT - 1) // TT, name_hint="rms_norm", allow_early_resolve=True)
    for b in task:
        t0 = b * TT
        rows = min(TT, t - t0)  # a ragged last tile computes only its own rows
        xt = pl.cast(pl.slice(x, [rows, D], [t0, 0]), pl.FP32, mode="none")
        inv = pl.rsqrt(pl.row_sum(xt * xt) / float(D) + eps, high_precision=True)  # [rows, 1]
        wt = pl.cast(w_row[0:1, 0:D], pl.FP32, mode="none")
        y = pl.col_expand_mul(pl.row_expand_mul(xt, inv), wt)
        pl.assemble(x_normed, pl.cast(y, pl.BF16, mode="rint"), [t0, 0])
    return task.tid


@functools.lru_cache(maxsize=None)
def rms_norm_entry(cfg: DeepSeekV4Config):
    """The ``@pl.jit`` test entry ``rms_norm_test(x [T, D] BF16, w [D] BF16,
    x_normed Out [T, D] BF16)`` for ``cfg`` (dims static from the config, ``T`` dynamic).

    Raises:
        ConfigError: ``cfg`` cannot be tiled.
    """
    rms_norm_tiling(cfg)
    D = cfg.hidden_size

    @pl.jit
    def rms_norm_test(
        x: pl.Tensor[[T_DYN, D], pl.BF16],
        w: pl.Tensor[[D], pl.BF16],
        x_normed: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]],
    ):
        rms_norm(x, w, x_normed, cfg)
        return x_normed

    return rms_norm_test
# ---- end kernel ----


def golden_rms_norm(
    x: torch.Tensor,  # [T, D] bf16 (any float dtype accepted)
    w: torch.Tensor,  # [D] bf16 (any float dtype accepted)
    eps: float,  # cfg.rms_norm_eps
    *,
    out_bf16: bool = True,
) -> torch.Tensor:  # [T, D] bf16 (fp32 when out_bf16=False)
    """Weighted RMSNorm of every token row (pypto-lib `models/deepseek/v4-flash/rmsnorm.py`, transformers `models/deepseek_v4/modeling_deepseek_v4.py`).

    ``y = (x * rsqrt(mean(x^2, -1) + eps)) * w`` computed in FP32 from the given
    values (inputs are not re-rounded), then cast to BF16 with round-to-nearest-even
    when ``out_bf16`` (the kernel's ``cast(..., BF16, mode="rint")``), else kept FP32
    for float32 parity runs.

    Args:
        x: ``[T, D]`` activations, BF16 in the kernel test (FP32 allowed).
        w: ``[D]`` norm weight, BF16 in the kernel test (FP32 allowed).
        eps: variance epsilon, ``cfg.rms_norm_eps`` (1e-6).
        out_bf16: cast the result to BF16 (RNE); ``False`` keeps FP32.

    Returns:
        ``[T, D]`` BF16 (or FP32) normalised rows.

    Raises:
        BindError: ``x`` not rank 2, ``w`` not ``[D]``, or a non-float dtype.
    """
    if x.dim() != 2 or not x.is_floating_point():
        raise BindError(f"golden_rms_norm: x must be a float [T, D] tensor, got {x.dtype} {list(x.shape)}")
    if w.dim() != 1 or w.shape[0] != x.shape[1] or not w.is_floating_point():
        raise BindError(
            f"golden_rms_norm: w must be a float [D={x.shape[1]}] tensor, got {w.dtype} {list(w.shape)}"
        )
    xf = x.float()
    inv_rms = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    y = (xf * inv_rms) * w.float()
    return y.to(torch.bfloat16) if out_bf16 else y


def make_rms_norm_inputs(cfg: DeepSeekV4Config, T: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fixture for :func:`golden_rms_norm` (pypto-lib `models/deepseek/v4-flash/rmsnorm.py` test data).

    ``x = randn - 0.5`` and ``w = 1 + 0.1 * randn``, both drawn in FP32 from a
    ``torch.Generator`` seeded with ``seed`` (in that order) and rounded to BF16.

    Args:
        cfg: model config; uses ``hidden_size`` (D).
        T: number of token rows (> 0).
        seed: generator seed.

    Returns:
        ``{"x": [T, D] bf16, "w": [D] bf16}`` (keys are the golden's argument names).

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_rms_norm_inputs: T must be positive, got {T}")
    D = cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen) - 0.5
    w = 1.0 + 0.1 * torch.randn(D, generator=gen)
    return {"x": x.to(torch.bfloat16), "w": w.to(torch.bfloat16)}


# ---- registration ----
def build_rms_norm(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                   seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: ``rms_norm`` at ``preset`` in ``mode`` (decode: 4x2 = 8 tokens
    at flash, prefill: 128), or ``T`` tokens; inputs from :func:`make_rms_norm_inputs`.

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, or ``seed_scopes=True`` (rms_norm
            never had a seed task).
    """
    if seed_scopes:
        raise ConfigError("rms_norm has no seed variant (it never had a seed task)")
    cfg, T = mode_tokens(preset, mode, T)
    D = cfg.hidden_size
    ins = make_rms_norm_inputs(cfg, T, seed)
    specs = [
        TensorSpec("x", [T, D], torch.bfloat16, init_value=ins["x"]),
        TensorSpec("w", [D], torch.bfloat16, init_value=ins["w"]),
        TensorSpec("x_normed", [T, D], torch.bfloat16, is_output=True),
    ]

    def golden(v: dict) -> None:
        v["x_normed"] = golden_rms_norm(v["x"], v["w"], cfg.rms_norm_eps)

    compare = {k: ratio_allclose(*tol) for k, tol in TOLERANCES.items()}
    return CaseRun(rms_norm_entry(cfg), specs, golden, compare, rtol=5e-3, atol=5e-3,
                   label=f"{preset} {mode} T={T}")


register(KernelCase("rms_norm", build_rms_norm, modes=("decode", "prefill"), seed_variant=False,
                    description="token RMSNorm, one spmd task (pypto-lib `rmsnorm.py`)"))
