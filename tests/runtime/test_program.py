"""Program statistics and failure behaviour (docs/dsl.md, 9; runtime/program.py)."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import CapacityError, DslError, HeapExhaustedError

M, K, N = 32, 64, 16


@pl.jit
def mm(a: pl.Tensor[[M, K], pl.BF16], b: pl.Tensor[[K, N], pl.BF16], c: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
    for blk in pl.spmd(2, name_hint="mm"):
        r = blk * 16
        c[r:r + 16, :] = pl.matmul(a[r:r + 16, :], b[:, :])
    with pl.at(name_hint="scale"):
        c[:, :] = c[:, :] * 0.5
    return c


def test_statistics_count_tasks_blocks_edges_ops_bytes_flops():
    a = torch.randn(M, K).to(torch.bfloat16)
    b = torch.randn(K, N).to(torch.bfloat16)
    c = torch.zeros(M, N)
    p = mm.run(a, b, c)
    s = p.stats
    assert torch.allclose(c, 0.5 * (a.float() @ b.float()), atol=1e-4)
    assert (s.tasks, s.blocks, s.edges, s.dummies) == (2, 3, 1, 0)
    assert s.tile_ops == 2 + 1  # two matmuls, one mul
    assert s.flops == 2 * M * N * K + M * N
    # mm: per block a[16, K] + b[K, N] bf16 loaded, c[16, N] fp32 stored; scale: c loaded and stored
    assert s.bytes == 2 * (16 * K * 2 + K * N * 2 + 16 * N * 4) + 2 * M * N * 4
    assert s.heap_peak_bytes == 0 and s.wall_us > 0 and s.task_wall_us > 0
    assert p.graph[0].cube and not p.graph[1].cube
    row = s.as_row()
    assert row["tasks"] == 2 and row["edges"] == 1


@pytest.mark.parametrize("check", [False, True])
def test_a_failing_program_leaves_out_and_inout_caller_tensors_untouched(check):
    @pl.jit
    def k(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]],
          z: pl.InOut[pl.Tensor[[4, 4], pl.FP32]]):
        with pl.at(name_hint="writes"):
            y[:, :] = x[:, :]
            z[:, :] = x[:, :]
        with pl.at(name_hint="fails"):
            t = x[0:5, :]
        return y

    x, y, z = torch.randn(4, 4), torch.full((4, 4), 3.0), torch.full((4, 4), 4.0)
    with pytest.raises(DslError, match="out of bounds"):
        k.run(x, y, z, config=pto.RunConfig(check=check))
    assert (y == 3).all() and (z == 4).all()


def test_capacity_and_heap_failures_leave_outputs_untouched_and_run_no_task():
    calls = []

    @pl.jit
    def k(x: pl.Tensor[[4, 4], pl.FP32], y: pl.Out[pl.Tensor[[4, 4], pl.FP32]], n: pl.Scalar[pl.INT32]):
        with pl.at(name_hint="first"):
            calls.append(1)
            y[:, :] = x[:, :]
        s = pl.create_tensor([n, 1024], pl.FP32, capacity=8)
        return y

    y = torch.zeros(4, 4)
    with pytest.raises(CapacityError):
        k.run(torch.ones(4, 4), y, 9)
    with pytest.raises(HeapExhaustedError):
        k.run(torch.ones(4, 4), y, 8, config=pto.RunConfig(heap_bytes=4096))
    assert (y == 0).all()
    k.run(torch.ones(4, 4), y, 8)
    assert (y == 1).all()


def test_program_ending_inside_a_task_or_after_an_error_resets_the_runtime():
    @pl.jit
    def boom(x: pl.Tensor[[4], pl.FP32]):
        with pl.at(name_hint="t"):
            raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        boom.run(torch.zeros(4))
    # the runtime is usable again
    p = mm.run(torch.zeros(M, K, dtype=torch.bfloat16), torch.zeros(K, N, dtype=torch.bfloat16), torch.zeros(M, N))
    assert p.stats.tasks == 2
    with pytest.raises(DslError, match="outside a running"):
        pl.create_tensor([1], pl.FP32)


def test_out_parameter_result_is_only_copied_back_on_success_and_partial_out_keeps_unwritten_elements():
    @pl.jit
    def partial(y: pl.PartialOut[pl.Tensor[[4, 4], pl.FP32]]):
        with pl.at(name_hint="half"):
            y[0:2, :] = pl.full([2, 4], pl.FP32, 1.0)
        return y

    y = torch.full((4, 4), 9.0)
    partial.run(y, config=pto.RunConfig(check=True))
    assert (y[0:2] == 1).all() and (y[2:] == 9).all()
