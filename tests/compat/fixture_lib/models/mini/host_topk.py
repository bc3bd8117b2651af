"""Top-8 of 128 scores per row through a @pl.jit.host entry: pl.sort32 + pl.mrgsort, the mask
gathers for values and indices, and topk_pair_compare for the index output (ties may pick
either index). error_distribution measures the values. Golden: torch.topk."""
import pypto.language as pl

B, N, TOPK = 2, 128, 8


@pl.jit
def topk_fwd(scores: pl.Tensor[[B, N], pl.FP32], vals: pl.Out[pl.Tensor[[B, TOPK], pl.FP32]],
             ids: pl.Out[pl.Tensor[[B, TOPK], pl.INT32]]):
    for b in pl.spmd(B, name_hint="topk"):
        pairs = pl.sort32(scores[b:b + 1, :], pl.arange(0, [1, N], dtype=pl.UINT32))
        pairs = pl.mrgsort(pairs, block_len=64)
        top = pairs[:, 0:2 * TOPK]
        vals[b:b + 1, :] = pl.gather(top, mask_pattern=pl.tile.MaskPattern.P0101)
        ids[b:b + 1, :] = pl.gather(top, mask_pattern=pl.tile.MaskPattern.P1010, output_dtype=pl.INT32)
    return vals, ids


@pl.jit.host
def topk_host(scores: pl.Tensor[[B, N], pl.FP32], vals: pl.Out[pl.Tensor[[B, TOPK], pl.FP32]],
              ids: pl.Out[pl.Tensor[[B, TOPK], pl.INT32]]):
    return topk_fwd(scores, vals, ids)


def golden(t):
    import torch
    v, i = torch.topk(t["scores"], TOPK, dim=-1)
    t["vals"][:] = v
    t["ids"][:] = i.to(torch.int32)


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, error_distribution, run_jit
    from golden.validation import topk_pair_compare  # a harness submodule import

    def init_scores():
        s = torch.randn(B, N)
        s[0, 3] = s[0, 70] = 9.0  # a tie: either index is right
        return s

    result = run_jit(
        fn=topk_host,
        specs=[TensorSpec("scores", [B, N], torch.float32, init_value=init_scores),
               TensorSpec("vals", [B, TOPK], torch.float32, is_output=True),
               TensorSpec("ids", [B, TOPK], torch.int32, is_output=True)],
        golden_fn=golden,
        compare_fn={"vals": error_distribution(always_pass=False), "ids": topk_pair_compare("vals")},
    )
    if not result.passed:
        print(result.error)
        raise SystemExit(1)
