"""The kernels' weight formats: W8A8 INT8 (``"int8"``) or unquantised BF16 (``"bf16"``).

A kernel is built for a :class:`~pto.models.deepseek_v4.config.KernelConfig`; its
``weight_format`` field picks the path of every kernel that quantises (qkv_proj_rope's q "b"
projection, the grouped o-projection of the sparse-attention cores, the lightning indexer's
query projection, queries and key cache, the router's expert activation, the shared and
routed experts, the MoE blocks):

* ``"int8"`` (the default, pypto-lib `models/deepseek/v4-flash/` INT8 conventions): INT8
  weights per output channel with FP32 scales, activations quantised per row to INT8,
  INT8 x INT8 -> INT32 matmuls, dequantised by the two scales.
* ``"bf16"`` (issue 15's unquantised format): BF16 weights, activations rounded to BF16
  (RNE) where the INT8 path quantises them, BF16 x BF16 -> FP32 matmuls, no scale applied.
  The kernels keep their signatures: a ``*_scale`` weight input is accepted and not read
  (pass ones), an activation-scale output (``qr_scale``, ``x_norm_scale``, the indexer key
  scales) is written as ``1.0`` on the rows the INT8 path writes, so the composed programs
  and the caches have the same parameters in both formats; only the dtypes differ.

Kernel factories are cached per config, so ``with_weight_format(cfg, "bf16")`` builds a
separate set of kernels.
"""

import dataclasses

import pto.language as pl
from pto.errors import ConfigError

__all__ = ["WEIGHT_FORMATS", "weight_format_of", "is_bf16", "weight_dtype", "act_dtype", "torch_weight_dtype",
           "with_weight_format"]

WEIGHT_FORMATS = ("int8", "bf16")


def weight_format_of(cfg) -> str:
    """``cfg.weight_format`` (``"int8"`` for a config without the field, e.g. a bare
    :class:`DeepSeekV4Config`)."""
    return getattr(cfg, "weight_format", "int8")


def is_bf16(cfg) -> bool:
    """True when the kernels of ``cfg`` run the unquantised BF16 path."""
    return weight_format_of(cfg) == "bf16"


def weight_dtype(cfg):
    """DSL dtype of a quantised kernel's weight matrices: ``pl.INT8`` or ``pl.BF16``."""
    return pl.BF16 if is_bf16(cfg) else pl.INT8


def act_dtype(cfg):
    """DSL dtype of a quantised matmul's activation operand (and of the tensors carrying it
    between kernels, e.g. ``qr``, ``x_norm_i8``, the indexer keys): ``pl.INT8`` or ``pl.BF16``."""
    return pl.BF16 if is_bf16(cfg) else pl.INT8


def torch_weight_dtype(weight_format: str):
    """torch dtype of the quantised weights / activations of ``weight_format``
    (``torch.int8`` or ``torch.bfloat16``).

    Raises:
        ConfigError: an unknown format.
    """
    import torch

    if weight_format not in WEIGHT_FORMATS:
        raise ConfigError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    return torch.bfloat16 if weight_format == "bf16" else torch.int8


def with_weight_format(cfg, weight_format: str):
    """``cfg`` (a KernelConfig) with ``weight_format`` set; ``cfg`` itself when it already has it.

    Raises:
        ConfigError: an unknown format, or ``"bf16"`` asked of a config without the field.
    """
    if weight_format not in WEIGHT_FORMATS:
        raise ConfigError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    if weight_format_of(cfg) == weight_format:
        return cfg
    if not hasattr(cfg, "weight_format"):
        raise ConfigError(f"config {getattr(cfg, 'name', cfg)!r} is a model config; weight_format needs a "
                          "KernelConfig (config.kernel_config)")
    return dataclasses.replace(cfg, weight_format=weight_format).validate()
