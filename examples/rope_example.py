"""Interleaved RoPE on BF16 rows of ``HD = 64`` (transformers `models/deepseek_v4/modeling_deepseek_v4.py`):
pairs ``(x[2i], x[2i+1])`` rotate by the angle whose ``cos``/``sin`` the caller
passes per row as ``[T, HD/2]`` FP32 tables:

    y[2i]   = x[2i] * cos_i - x[2i+1] * sin_i
    y[2i+1] = x[2i+1] * cos_i + x[2i] * sin_i

The kernel does it the way the device kernels do, with constant index
vectors and ``pl.gather``: ``dup_idx = [0, 0, 1, 1, ...]`` widens cos/sin to
``HD`` columns, ``swap_idx = [1, 0, 3, 2, ...]`` swaps each pair, and a
``[-1, +1, -1, +1, ...]`` sign row makes the swap a rotation. Every product
and sum is the same FP32 operation as in the golden, so the result is bit-exact.
"""

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, exact, register, run_jit

HD = 64
HALF = HD // 2
ROW_TILE = 16
T = pl.dynamic("T")


@pl.jit
def rope_kernel(x: pl.Tensor[[T, HD], pl.BF16], cos: pl.Tensor[[T, HALF], pl.FP32],
                sin: pl.Tensor[[T, HALF], pl.FP32], y: pl.Out[pl.Tensor[[T, HD], pl.BF16]]):
    """Rotate every interleaved pair of ``x`` by its row's angles into ``y``."""
    t = pl.tensor.dim(x, 0)
    for b in pl.spmd((t + ROW_TILE - 1) // ROW_TILE, name_hint="rope"):
        r0 = b * ROW_TILE
        rows = pl.min(ROW_TILE, t - r0)
        lane = pl.arange(0, [1, HD], dtype=pl.INT32)                      # 0, 1, 2, 3, ...
        dup_idx = pl.cast(pl.cast(lane, pl.FP32) * 0.5, pl.INT32, mode="floor")  # 0, 0, 1, 1, ...
        swap_idx = dup_idx * 4 + 1 - lane                                  # 1, 0, 3, 2, ...
        sign = pl.cast((lane - dup_idx * 2) * 2 - 1, pl.FP32)              # -1, +1, -1, +1, ...
        xf = pl.cast(pl.slice(x, [ROW_TILE, HD], [r0, 0], valid_shape=[rows, HD]), pl.FP32, mode="none")
        c = pl.gather(pl.slice(cos, [ROW_TILE, HALF], [r0, 0], valid_shape=[rows, HALF]), dim=-1, index=dup_idx)
        s = pl.gather(pl.slice(sin, [ROW_TILE, HALF], [r0, 0], valid_shape=[rows, HALF]), dim=-1, index=dup_idx)
        rotated = pl.col_expand_mul(pl.gather(xf, dim=-1, index=swap_idx), sign)
        yf = pl.set_validshape(xf * c + rotated * s, rows, HD)
        pl.assemble(y, pl.cast(yf, pl.BF16, mode="rint"), [r0, 0])
    return y


def golden_rope(values: dict) -> None:
    """Torch reference in FP32 (x, y: ``[T, HD]`` bf16; cos, sin: ``[T, HD/2]`` fp32)."""
    x = values["x"].float().view(-1, HALF, 2)
    c, s = values["cos"], values["sin"]
    even = x[..., 0] * c + (-x[..., 1]) * s
    odd = x[..., 1] * c + x[..., 0] * s
    values["y"][:] = torch.stack([even, odd], -1).view(-1, HD).to(torch.bfloat16)


def rope_tables(T: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, HD/2]`` fp32 of positions ``0..T-1`` with ``theta^(-2i/HD)`` frequencies."""
    freq = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def build(preset: str = "flash", mode: str = "default", T: int = 50) -> CaseRun:
    """The registered case; ``preset`` is ignored, ``T`` is the row count."""
    cos, sin = rope_tables(T)
    specs = [TensorSpec("x", [T, HD], torch.bfloat16, init_value=torch.randn),
             TensorSpec("cos", [T, HALF], torch.float32, init_value=cos),
             TensorSpec("sin", [T, HALF], torch.float32, init_value=sin),
             TensorSpec("y", [T, HD], torch.bfloat16, is_output=True)]
    return CaseRun(rope_kernel, specs, golden_rope, {"y": exact()}, label=f"T={T}")


register(KernelCase("example_rope", build, modes=("default",), takes_preset=False, group="example",
                    description="interleaved RoPE via gather index vectors, bit-exact"))


def test_rope_is_bit_exact():
    case = build(T=50)
    res = run_jit(case.fn, case.specs, case.golden, case.compare)
    assert res.passed, res.error
    assert res.max_abs_error == 0.0


def test_rope_position_zero_is_identity():
    cos, sin = rope_tables(3)
    x = torch.randn(3, HD).to(torch.bfloat16)
    y = torch.zeros(3, HD, dtype=torch.bfloat16)
    rope_kernel(x, cos, sin, y)
    assert torch.equal(y[0], x[0])
    assert not torch.equal(y[1], x[1])
