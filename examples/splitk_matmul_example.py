"""Split-K matmul: ``c = a @ b`` with BF16 ``a [M, K]``, ``b [K, N]`` and an FP32 result.

One SPMD task of ``(M / M_TILE) * K_SPLIT`` blocks: block ``(m, s)`` multiplies
rows ``m`` over the K slice ``s`` (a K loop of ``matmul`` + ``matmul_acc``
with FP32 accumulation) and atomically adds its ``[M_TILE, N]`` partial sum
into a scratch ``acc`` created with ``init_value=0``. A second task copies
``acc`` into ``c``. Allocation-time initialisation replaces the zero-fill
("seed") task; ``seed_scopes=True`` builds the seed variant for comparison
(one more task and one more edge, same result bit for bit).
"""

import torch

import pto.language as pl
from pto.golden import CaseRun, KernelCase, TensorSpec, ratio_allclose, register, run_jit

M, K, N = 64, 512, 64
M_TILE = 32
K_SPLIT = 4                 # blocks per row tile along K
K_SLICE = K // K_SPLIT      # 128 columns of K per block
K_TILE = 64                 # inner K step of one block
assert K % (K_SPLIT * K_TILE) == 0 and M % M_TILE == 0


def make_kernel(seed_scopes: bool = False):
    """The split-K kernel; ``seed_scopes`` zero-fills ``acc`` with a task instead of ``init_value=0``."""

    @pl.jit
    def splitk_matmul(a: pl.Tensor[[M, K], pl.BF16], b: pl.Tensor[[K, N], pl.BF16],
                      c: pl.Out[pl.Tensor[[M, N], pl.FP32]]):
        if seed_scopes:
            acc = pl.create_tensor([M, N], pl.FP32)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="seed_zero"):
                acc[0:M, 0:N] = pl.full([M, N], pl.FP32, 0.0)
        else:
            acc = pl.create_tensor([M, N], pl.FP32, init_value=0)
        for blk in pl.spmd((M // M_TILE) * K_SPLIT, name_hint="splitk_mm"):
            m0 = (blk // K_SPLIT) * M_TILE
            k0 = (blk % K_SPLIT) * K_SLICE
            part = pl.matmul(a[m0:m0 + M_TILE, k0:k0 + K_TILE], b[k0:k0 + K_TILE, 0:N], out_dtype=pl.FP32)
            for kk in pl.range(K_TILE, K_SLICE, K_TILE):
                part = pl.matmul_acc(part, a[m0:m0 + M_TILE, k0 + kk:k0 + kk + K_TILE],
                                     b[k0 + kk:k0 + kk + K_TILE, 0:N])
            pl.assemble(acc, part, [m0, 0], atomic=pl.AtomicType.Add)
        for blk in pl.spmd(M // M_TILE, name_hint="copy_out"):
            c[blk * M_TILE:(blk + 1) * M_TILE, :] = acc[blk * M_TILE:(blk + 1) * M_TILE, :]
        return c

    return splitk_matmul


splitk_matmul = make_kernel(False)
splitk_matmul_seeded = make_kernel(True)


def golden_matmul(values: dict) -> None:
    """Torch reference: ``c = a.float() @ b.float()`` (a ``[M, K]`` bf16, b ``[K, N]`` bf16, c fp32)."""
    values["c"][:] = values["a"].float() @ values["b"].float()


def build(preset: str = "flash", mode: str = "default", seed_scopes: bool = False) -> CaseRun:
    """The registered case; ``preset`` is ignored."""
    specs = [TensorSpec("a", [M, K], torch.bfloat16, init_value=torch.randn),
             TensorSpec("b", [K, N], torch.bfloat16, init_value=torch.randn),
             TensorSpec("c", [M, N], torch.float32, is_output=True)]
    cmp = {"c": ratio_allclose(atol=1e-3, rtol=1e-5, max_error_ratio=0.0)}
    fn = splitk_matmul_seeded if seed_scopes else splitk_matmul
    return CaseRun(fn, specs, golden_matmul, cmp, label="seed task" if seed_scopes else "init_value=0")


register(KernelCase("example_splitk_matmul", build, modes=("default",), takes_preset=False, seed_variant=True,
                    group="example",
                    description="split-K matmul atomic-adding into an init_value=0 scratch"))


def test_splitk_matches_golden_with_two_tasks_one_edge():
    case = build()
    res = run_jit(case.fn, case.specs, case.golden, case.compare)
    assert res.passed, res.error
    g = res.program.graph
    assert [t.name for t in g] == ["splitk_mm", "copy_out"]
    assert g.edges() == {(0, 1)}
    assert res.stats.blocks == 8 + 2
    assert res.stats.heap_peak_bytes == M * N * 4  # 16 KiB, already 512-aligned
    assert res.stats.flops == 2 * M * N * K  # the copy task is a load and a store, no tile op


def test_seed_variant_costs_a_task_and_an_edge_but_matches_bit_for_bit():
    a = torch.randn(M, K).to(torch.bfloat16)
    b = torch.randn(K, N).to(torch.bfloat16)
    c_init, c_seed = torch.zeros(M, N), torch.zeros(M, N)
    p_init = splitk_matmul.run(a, b, c_init)
    p_seed = splitk_matmul_seeded.run(a, b, c_seed)
    assert torch.equal(c_init, c_seed)
    assert p_seed.stats.tasks == p_init.stats.tasks + 1
    assert p_seed.graph.named_edges() == {("seed_zero", "splitk_mm"), ("seed_zero", "copy_out"),
                                          ("splitk_mm", "copy_out")}
    case = build(seed_scopes=True)
    res = run_jit(case.fn, case.specs, case.golden, case.compare)  # check mode: seed defines acc
    assert res.passed, res.error
