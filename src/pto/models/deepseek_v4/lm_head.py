"""LM head: FP32 logits of the final-normed hidden rows, and the whole model head chain.

Math (pypto-lib `models/deepseek/v4-flash/lm_head.py` on one rank; transformers `models/deepseek_v4/modeling_deepseek_v4.py`; transformers
``DeepseekV4ForCausalLM.lm_head``, untied ``[V, D]``):

    logits = hidden @ weight^T              # [T, V] FP32, BF16 operands, FP32 accumulation

The model head (:func:`lm_head_kernels` ``.final_logits``) is ``hc_head`` -> the registered
``rms_norm`` (final norm) -> ``lm_head``.

Kernel (:func:`lm_head`): one task ``lm_head`` of (row tile, vocab tile) blocks, each one
FP32-accumulated matmul over the whole hidden width, the ragged last vocab tile through a
valid shape. Deviations: one rank (the reference shards the vocabulary over TP ranks and
routes shards back to their owners); vocab tiles of ``LM_V_TILE`` columns and the whole K
per matmul (reference: 256-column tiles, K in 32 chunks of 128, plus a tail task and a copy
out of a padded scratch, which a valid-shaped store makes unnecessary here).
"""

import functools
import math
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.hc_head import golden_hc_head, hc_head_kernels
from pto.models.deepseek_v4.lookup_embedding import pattern_table
from pto.models.deepseek_v4.rms_norm import golden_rms_norm, rms_norm
from pto.models.deepseek_v4.tiling import MATMUL_M_TILE, mode_tokens, need, round_up, token_capacity

__all__ = ["TOLERANCES", "LM_V_TILE", "lm_head_kernels", "lm_head", "golden_lm_head", "golden_final_logits",
           "make_lm_head_weight", "build_lm_head"]

# Default allclose rtol = atol = 1e-3 (pypto-lib `models/deepseek/v4-flash/lm_head.py`; the pypto-lib tests' tolerances): every element.
TOLERANCES: dict[str, tuple[float, float, float]] = {"logits": (1e-3, 1e-3, 0.0)}

# ---- kernel ----
T_DYN = pl.dynamic("T")
LM_M_TILE = 128  # hidden rows per block [16]
LM_V_TILE = 2048  # vocab columns per block [256]
GOLDEN_V_CHUNK = 16384  # vocab rows the golden widens to FP32 at a time (no 2-GiB copy at FLASH)


@functools.lru_cache(maxsize=None)
def lm_head_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build the LM head for ``cfg`` (cached per config).

    Shapes (``V = vocab_size``, ``D = hidden_size``, ``N = hc_mult``): ``hidden [T, D] BF16``,
    ``weight [V, D] BF16``, ``logits [T, V] FP32`` (Out). ``final_logits`` also takes ``x_hc
    [T, N, D] FP32``, ``hc_fn [N, N*D]``, ``hc_scale [1]``, ``hc_base [N]`` FP32 and ``norm_w
    [D] BF16``; its scratch ``head_x [T, D]`` and ``head_normed [T, D]`` BF16 (capacity
    :func:`token_capacity`).

    Returns:
        namespace with the inline bodies ``lm_head(hidden, weight, logits)`` (returns its task
        id) and ``final_logits(x_hc, hc_fn, hc_scale, hc_base, norm_w, weight, logits)``
        (hc_head -> rms_norm -> lm_head; returns ``logits``) and their entries
        ``lm_head_test`` / ``final_logits_test``.

    Raises:
        ConfigError: ``hidden_size`` not a positive multiple of 16 or ``vocab_size < 1``.
    """
    V, D, N = cfg.vocab_size, cfg.hidden_size, cfg.hc_mult
    need(D > 0 and D % 16 == 0, "lm_head", cfg, f"hidden_size={D} must be a positive multiple of 16")
    need(V >= 1, "lm_head", cfg, f"vocab_size={V} must be positive")
    VT = min(LM_V_TILE, round_up(V, 16))
    n_v = -(-V // VT)
    cap = token_capacity(cfg)
    hc_head = hc_head_kernels(cfg).hc_head

    @pl.jit.inline
    def lm_head(hidden: pl.Tensor[[T_DYN, D], pl.BF16],
                weight: pl.Tensor[[V, D], pl.BF16],
                logits: pl.Out[pl.Tensor[[T_DYN, V], pl.FP32]]):
        """``logits = hidden @ weight^T`` in FP32; returns the task id."""
        t = pl.tensor.dim(hidden, 0)
        MT = min(LM_M_TILE, round_up(t, MATMUL_M_TILE))
        task = pl.spmd(-(-t // MT) * n_v, name_hint="lm_head", allow_early_resolve=True)
        for b in task:
            m0, v0 = (b // n_v) * MT, (b % n_v) * VT
            rows, cols = min(MT, t - m0), min(VT, V - v0)
            h = pl.slice(hidden, [MT, D], [m0, 0], valid_shape=[rows, D])
            w = pl.slice(weight, [VT, D], [v0, 0], valid_shape=[cols, D])
            pl.assemble(logits, pl.set_validshape(pl.matmul(h, w, b_trans=True), rows, cols), [m0, v0])
        return task.tid

    @pl.jit.inline
    def final_logits(x_hc: pl.Tensor[[T_DYN, N, D], pl.FP32],
                     hc_fn: pl.Tensor[[N, N * D], pl.FP32],
                     hc_scale: pl.Tensor[[1], pl.FP32],
                     hc_base: pl.Tensor[[N], pl.FP32],
                     norm_w: pl.Tensor[[D], pl.BF16],
                     weight: pl.Tensor[[V, D], pl.BF16],
                     logits: pl.Out[pl.Tensor[[T_DYN, V], pl.FP32]]):
        """Model head: hc_head -> final rms_norm -> lm_head; returns ``logits``."""
        t = pl.tensor.dim(x_hc, 0)
        head_x = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="head_x")
        head_normed = pl.create_tensor([t, D], pl.BF16, capacity=cap, name="head_normed")
        hc_head(x_hc, hc_fn, hc_scale, hc_base, head_x)
        rms_norm(head_x, norm_w, head_normed, cfg)
        lm_head(head_normed, weight, logits)
        return logits

    return SimpleNamespace(lm_head=lm_head, final_logits=final_logits,
                           lm_head_test=pl.jit.entry(lm_head, name="lm_head_test"),
                           final_logits_test=pl.jit.entry(final_logits, name="final_logits_test"))


@pl.jit.inline
def lm_head(hidden: pl.Tensor, weight: pl.Tensor, logits: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``lm_head(hidden, weight, logits, cfg) -> task id`` (shapes and
    errors in :func:`lm_head_kernels`)."""
    return lm_head_kernels(cfg).lm_head(hidden, weight, logits)
# ---- end kernel ----


def golden_lm_head(
    hidden: torch.Tensor,  # [T, D] bf16 (fp32 for parity)
    weight: torch.Tensor,  # [V, D] bf16 (fp32 for parity)
) -> torch.Tensor:  # [T, V] fp32
    """LM head golden (pypto-lib `models/deepseek/v4-flash/lm_head.py`): ``hidden @ weight^T`` in FP32 from the given
    values, the weight widened ``GOLDEN_V_CHUNK`` rows at a time.

    Raises:
        BindError: not rank 2, non-float, or hidden widths that differ.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] \
            or not hidden.is_floating_point() or not weight.is_floating_point():
        raise BindError(f"golden_lm_head: need float hidden [T, D] and weight [V, D], got {hidden.dtype} "
                        f"{list(hidden.shape)} and {weight.dtype} {list(weight.shape)}")
    h = hidden.float()
    return torch.cat([h @ weight[v0:v0 + GOLDEN_V_CHUNK].float().T
                      for v0 in range(0, weight.shape[0], GOLDEN_V_CHUNK)], dim=1)


def golden_final_logits(x_hc, hc_fn, hc_scale, hc_base, norm_w, weight, cfg: DeepSeekV4Config, *,
                        float32: bool = False) -> torch.Tensor:
    """Model head golden: :func:`hc_head.golden_hc_head` -> :func:`rms_norm.golden_rms_norm`
    (``norm_w``, ``rms_norm_eps``) -> :func:`golden_lm_head`; ``float32`` keeps the collapsed
    and normed rows FP32 (parity with an FP32 model), else both are BF16 (RNE).

    Raises:
        BindError: shapes off ``cfg`` (from the sub-goldens).
    """
    y = golden_hc_head(x_hc, hc_fn, hc_scale, hc_base, cfg, float32=float32)
    return golden_lm_head(golden_rms_norm(y, norm_w, cfg.rms_norm_eps, out_bf16=not float32), weight)


def make_lm_head_weight(cfg: DeepSeekV4Config, seed: int) -> torch.Tensor:
    """``[V, D]`` BF16 weight :func:`pattern_table` with scale ``2^-round(log2(64 sqrt(D)))``
    (about unit-scale logits for unit rows)."""
    D = cfg.hidden_size
    return pattern_table(cfg.vocab_size, D, seed, 2.0 ** -round(math.log2(64 * D ** 0.5)))


# ---- registration ----
def build_lm_head(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                  seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: the LM head GEMM at ``preset`` in ``mode`` (decode 8 rows, prefill
    128) or ``T`` rows: ``hidden`` is RMS-normed-like ``N(0, 1)`` rows (BF16), the weight
    :func:`make_lm_head_weight`; ``logits`` within ``allclose(1e-3, 1e-3)``.

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, ``seed_scopes`` (no seed variant).
    """
    if seed_scopes:
        raise ConfigError("lm_head has no seed variant (it has no scratch)")
    cfg, T = mode_tokens(preset, mode, T)
    gen = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(T, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    weight = make_lm_head_weight(cfg, seed)
    specs = [TensorSpec("hidden", list(hidden.shape), torch.bfloat16, init_value=hidden),
             TensorSpec("weight", list(weight.shape), torch.bfloat16, init_value=weight),
             TensorSpec("logits", [T, cfg.vocab_size], torch.float32, is_output=True)]

    def golden(v: dict) -> None:
        v["logits"] = golden_lm_head(v["hidden"], v["weight"])

    return CaseRun(lm_head_kernels(cfg).lm_head_test, specs, golden, {"logits": ratio_allclose(*TOLERANCES["logits"])},
                   rtol=1e-3, atol=1e-3, label=f"{preset} {mode} T={T}")


register(KernelCase("lm_head", build_lm_head, modes=("decode", "prefill"),
                    description="LM head GEMM, FP32 logits, one rank (pypto-lib `lm_head.py`)"))
