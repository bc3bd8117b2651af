"""Greedy sampling: the next token id of every row of FP32 logits (argmax, lowest id on ties).

Math (transformers `models/deepseek_v4/modeling_deepseek_v4.py` and transformers' greedy ``generate``: ``torch.argmax``, whose ties go
to the first maximal index):

    next_ids[t] = min { v : logits[t, v] = max_u logits[t, u] }

Kernel (:func:`greedy_sample`): one task ``greedy_argmax`` of token-tile blocks; per block
the row is viewed as ``V / CW`` chunks of ``CW`` columns (:func:`argmax_chunk_width`): one pass
gives every chunk's max, the row max ``m`` is their max, the lowest chunk holding ``m`` is
``row_min(chunk + NC * step(m - chunk_max))`` (the saturating product of
:func:`gate.positive_step`: exact, no compare op), that chunk's ``CW`` logits are gathered and
the same formula gives the lowest column in it; the block's ids are one store. Every row needs one finite logit; ``-inf`` entries are fine (an all ``-inf`` or a NaN
row gives an unspecified id). No reference
kernel (pypto-lib samples on the host).
"""

import functools
import math
from types import SimpleNamespace

import torch

import pto.language as pl
from pto.errors import BindError, ConfigError
from pto.golden import CaseRun, KernelCase, TensorSpec, exact, register
from pto.models.deepseek_v4.config import DeepSeekV4Config
from pto.models.deepseek_v4.gate import STEP_SCALE
from pto.models.deepseek_v4.tiling import mode_tokens, need

__all__ = ["SAMPLE_T_TILE", "greedy_sample_kernels", "greedy_sample", "golden_greedy_sample", "build_greedy_sample"]

# ---- kernel ----
T_DYN = pl.dynamic("T")
SAMPLE_T_TILE = 8  # logits rows per block (a FLASH row is 129280 FP32 = 505 KiB)


def argmax_chunk_width(V: int) -> int:
    """Columns per argmax chunk: the smallest divisor of ``V`` at least ``sqrt(V)`` (404 for
    FLASH's 129280: 320 chunks), so both the chunk-max row and the gathered chunk are small."""
    return next(w for w in range(max(1, math.isqrt(V)), V + 1) if V % w == 0)


@pl.jit.inline
def lowest_max_col(x, m, width: int):
    """``[R, 1]`` FP32: the lowest column of ``x [R, width]`` FP32 holding its row's max ``m
    [R, 1]`` (``width`` where the logit is below ``m``, 0 at the maxima, plus the column id:
    ``m - x >= 0``, see :func:`gate.positive_step`)."""
    col = pl.cast(pl.arange(0, [1, width], pl.INT32), pl.FP32)
    below = pl.minimum(pl.row_expand_sub(x, m) * -STEP_SCALE * STEP_SCALE, float(width))
    return pl.row_min(pl.col_expand_add(below, col))


@functools.lru_cache(maxsize=None)
def greedy_sample_kernels(cfg: DeepSeekV4Config) -> SimpleNamespace:
    """Build greedy sampling for ``cfg`` (cached): ``greedy_sample(logits [T, V] FP32, next_ids
    Out [T] INT64) -> task id`` and its entry ``greedy_sample_test``.

    Raises:
        ConfigError: ``vocab_size`` outside ``[1, 2^23]`` (column ids and ``2V`` stay exact in
            FP32).
    """
    V = cfg.vocab_size
    need(1 <= V <= 2 ** 23, "greedy_sample", cfg, f"vocab_size={V} must be in [1, 2^23]")
    CW = argmax_chunk_width(V)
    NC = V // CW

    @pl.jit.inline
    def greedy_sample(logits: pl.Tensor[[T_DYN, V], pl.FP32], next_ids: pl.Out[pl.Tensor[[T_DYN], pl.INT64]]):
        """Argmax per row, lowest id on ties; returns the task id."""
        t = pl.tensor.dim(logits, 0)
        ST = SAMPLE_T_TILE
        task = pl.spmd(-(-t // ST), name_hint="greedy_argmax", allow_early_resolve=True)
        for b in task:
            t0 = b * ST
            rows = min(ST, t - t0)
            v = pl.slice(logits, [rows, V], [t0, 0])
            chunk_max = pl.reshape(pl.row_max(pl.reshape(v, [rows * NC, CW])), [rows, NC])
            m = pl.row_max(chunk_max)
            start = lowest_max_col(chunk_max, m, NC) * float(CW)  # first column of the lowest chunk holding m
            col_cw = pl.cast(pl.arange(0, [1, CW], pl.INT32), pl.FP32)
            cols = pl.row_expand_add(pl.col_expand(pl.full([rows, CW], pl.FP32, 0.0), col_cw), start)
            chunk = pl.gather(v, index=pl.cast(cols, pl.INT32, mode="rint"))
            ids = pl.cast(lowest_max_col(chunk, m, CW) + start, pl.INT64, mode="rint")
            pl.assemble(next_ids, pl.reshape(ids, [rows]), [t0])
        return task.tid

    return SimpleNamespace(greedy_sample=greedy_sample,
                           greedy_sample_test=pl.jit.entry(greedy_sample, name="greedy_sample_test"))


@pl.jit.inline
def greedy_sample(logits: pl.Tensor, next_ids: pl.Out[pl.Tensor], cfg):
    """Stable inline signature ``greedy_sample(logits, next_ids, cfg) -> task id`` (see
    :func:`greedy_sample_kernels`)."""
    return greedy_sample_kernels(cfg).greedy_sample(logits, next_ids)
# ---- end kernel ----


def golden_greedy_sample(logits: torch.Tensor) -> torch.Tensor:  # [T, V] float -> [T] int64
    """``torch.argmax(logits, dim=-1)`` (the first maximal index on ties).

    Raises:
        BindError: ``logits`` not a float rank-2 tensor.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise BindError(f"golden_greedy_sample: logits must be a float [T, V] tensor, got {logits.dtype} "
                        f"{list(logits.shape)}")
    return torch.argmax(logits, dim=-1)


def make_sample_logits(cfg: DeepSeekV4Config, T: int, seed: int) -> torch.Tensor:
    """``[T, V]`` FP32 logits ``N(0, 1)`` with planted ties: row 0 all equal (argmax 0), row 1
    its maximum at the last id and at a middle id (argmax the middle one), row 2 ``-inf``
    except at id 7 (argmax 7), the rest random.

    Raises:
        BindError: ``T`` not positive.
    """
    if T <= 0:
        raise BindError(f"make_sample_logits: T must be positive, got {T}")
    V = cfg.vocab_size
    x = torch.randn(T, V, generator=torch.Generator().manual_seed(seed))
    x[0] = 0.5
    if T > 1:
        x[1, V // 2] = x[1, V - 1] = 50.0
    if T > 2 and V > 7:
        x[2] = -float("inf")
        x[2, 7] = -3.0
    return x


# ---- registration ----
def build_greedy_sample(preset: str = "tiny", mode: str = "prefill", *, T: int | None = None, seed: int = 0,
                        seed_scopes: bool = False) -> CaseRun:
    """KernelCase builder: greedy sampling of :func:`make_sample_logits` rows; ids exact.

    Raises:
        ConfigError: unknown preset / mode, bad ``T``, ``seed_scopes`` (no seed variant).
    """
    if seed_scopes:
        raise ConfigError("greedy_sample has no seed variant (it has no scratch)")
    cfg, T = mode_tokens(preset, mode, T)
    logits = make_sample_logits(cfg, T, seed)
    specs = [TensorSpec("logits", list(logits.shape), torch.float32, init_value=logits),
             TensorSpec("next_ids", [T], torch.int64, is_output=True)]

    def golden(v: dict) -> None:
        v["next_ids"] = golden_greedy_sample(v["logits"])

    return CaseRun(greedy_sample_kernels(cfg).greedy_sample_test, specs, golden, {"next_ids": exact()},
                   label=f"{preset} {mode} T={T}")


register(KernelCase("greedy_sample", build_greedy_sample, modes=("decode", "prefill"),
                    description="greedy sampling: argmax of FP32 logits, lowest id on ties"))
