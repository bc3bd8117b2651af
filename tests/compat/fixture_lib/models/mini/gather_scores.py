"""Scores of each token's query against KV rows picked by an index table (-1 = no row), in
pypto-lib's conventions: pl.array.create task-id fan-in for deps=, pl.create_l1 filled with
pl.gather_row, scalar pl.cast to pl.INDEX, pl.prefetch, a lane split with pl.split_aiv,
pl.concat, pl.create_tile as a reduction scratch, and an In parameter the kernel writes
(pypto infers InOut; pto warns). Golden: torch gather + float32 matmul."""
import pypto.language as pl

T, K, D, N_ROWS = 4, 16, 32, 64


@pl.jit
def gather_scores(
    q: pl.Tensor[[T, D], pl.BF16],
    kv: pl.Tensor[[N_ROWS, D], pl.BF16],
    idx: pl.Tensor[[T, K], pl.INT32],
    scores: pl.Out[pl.Tensor[[T, 2 * K], pl.FP32]],
    row_max: pl.Tensor[[T, 1], pl.FP32],
):
    tids = pl.array.create(T, pl.TASK_ID)
    for t in pl.range(T):
        with pl.spmd(1, name_hint="gather") as tid:
            kv_l1 = pl.create_l1([K, D], pl.BF16)
            pl.prefetch(kv, [0, 0], [N_ROWS, D])
            for k in pl.range(K):
                slot = pl.read(idx, [t, k])
                if slot >= 0:
                    kv_l1 = pl.gather_row(kv_l1, kv, [k, 0], [pl.cast(slot, pl.INDEX), 0], [1, D])
                else:
                    kv_l1 = pl.assemble(kv_l1, pl.full([1, D], dtype=pl.BF16, value=0.0), [k, 0])
            scores[t:t + 1, 0:K] = pl.matmul(q[t:t + 1, :], kv_l1, b_trans=True, out_dtype=pl.FP32)
        tids[t] = tid
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="finish", deps=[tids],
               optimizations=[pl.split(pl.SplitMode.UP_DOWN)]):
        for lane in pl.split_aiv(2, mode=pl.SplitMode.NONE):
            r0 = lane * (T // 2)
            left = scores[r0:r0 + T // 2, 0:K // 2]
            right = scores[r0:r0 + T // 2, K // 2:K]
            scores[r0:r0 + T // 2, K:2 * K] = pl.concat(pl.mul(left, 2.0), pl.neg(right))
            tmp = pl.create_tile([T // 2, K], dtype=pl.FP32, target_memory=pl.MemorySpace.Vec)
            row_max[r0:r0 + T // 2, 0:1] = pl.row_max(scores[r0:r0 + T // 2, 0:K], tmp)
    return scores


def golden(tensors):
    import torch
    idx = tensors["idx"].long()
    rows = tensors["kv"].float()[idx.clamp(min=0)] * (idx >= 0).unsqueeze(-1)  # [T, K, D]
    s = torch.einsum("td,tkd->tk", tensors["q"].float(), rows)
    half = K // 2
    tensors["scores"][:] = torch.cat([s, s[:, :half] * 2, -s[:, half:]], dim=1)
    tensors["row_max"][:] = s.max(dim=1, keepdim=True).values


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, ratio_allclose, run_jit

    def init_idx():
        g = torch.Generator().manual_seed(1)
        i = torch.randint(0, N_ROWS, (T, K), generator=g, dtype=torch.int32)
        i[:, ::5] = -1
        return i

    result = run_jit(
        fn=gather_scores,
        specs=[TensorSpec("q", [T, D], torch.bfloat16, init_value=torch.randn),
               TensorSpec("kv", [N_ROWS, D], torch.bfloat16, init_value=torch.randn),
               TensorSpec("idx", [T, K], torch.int32, init_value=init_idx),
               TensorSpec("scores", [T, 2 * K], torch.float32, is_output=True),
               TensorSpec("row_max", [T, 1], torch.float32, init_value=0.0, is_output=True)],
        golden_fn=golden,
        compare_fn={"scores": ratio_allclose(atol=1e-4, rtol=1e-4, max_error_ratio=0.0),
                    "row_max": ratio_allclose(max_error_ratio=0.0)},
        rtol=1e-4, atol=1e-4,
    )
    if not result.passed:
        print(result.error)
        raise SystemExit(1)
