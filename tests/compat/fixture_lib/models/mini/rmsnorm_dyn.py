"""RMSNorm over a dynamic token dim, in pypto-lib's conventions: a sibling config module,
`with pl.spmd(n) as tid` reading pl.tile.get_block_idx(), an inline helper whose output
parameter is annotated plain pl.Tensor, bind_dynamic in the test entry, a
pl.create_tensor accumulator inside the task, a valid_shapes= tail load and
ratio_allclose. Golden: float32 torch RMSNorm."""
import pypto.language as pl

from config import HIDDEN as D, EPS, DECODE_BATCH, DECODE_SEQ, PREFILL_BATCH, PREFILL_SEQ

T_DYN = pl.dynamic("T_DYN")
D_TILE = 64
T_TILE = 8


@pl.jit.inline
def rms_norm(x: pl.Tensor[[T_DYN, D], pl.BF16], w: pl.Tensor[[D], pl.BF16], out: pl.Tensor[[T_DYN, D], pl.BF16]):
    t_dim = pl.tensor.dim(x, 0)
    with pl.spmd((t_dim + T_TILE - 1) // T_TILE, name_hint="rms_norm") as rms_tid:
        t0 = pl.tile.get_block_idx() * T_TILE
        rows = pl.min(T_TILE, t_dim - t0)
        sq = pl.create_tensor([T_TILE, D_TILE], dtype=pl.FP32)
        sq = pl.assemble(sq, pl.full([T_TILE, D_TILE], dtype=pl.FP32, value=0.0), [0, 0])
        for db in pl.range(D // D_TILE):
            xc = pl.cast(pl.load(x, [t0, db * D_TILE], [T_TILE, D_TILE], valid_shapes=[rows, D_TILE]), pl.FP32)
            sq = pl.add(sq, pl.mul(xc, xc))
        inv = pl.rsqrt(pl.add(pl.mul(pl.row_sum(sq), 1.0 / D), EPS))
        for db in pl.range(D // D_TILE):
            d0 = db * D_TILE
            xc = pl.cast(pl.load(x, [t0, d0], [T_TILE, D_TILE], valid_shapes=[rows, D_TILE]), pl.FP32)
            wc = pl.cast(pl.reshape(w[d0:d0 + D_TILE], [1, D_TILE]), pl.FP32)
            y = pl.cast(pl.col_expand_mul(pl.row_expand_mul(xc, inv), wc), pl.BF16, mode="rint")
            out[t0:t0 + rows, d0:d0 + D_TILE] = pl.set_validshape(y, rows, D_TILE)
    return rms_tid


@pl.jit
def rms_norm_test(x: pl.Tensor[[T_DYN, D], pl.BF16], w: pl.Tensor[[D], pl.BF16],
                  out: pl.Out[pl.Tensor[[T_DYN, D], pl.BF16]]):
    x.bind_dynamic(0, T_DYN)
    out.bind_dynamic(0, T_DYN)
    rms_norm(x, w, out)
    return out


def golden_rms_norm_test(tensors):
    import torch
    x = tensors["x"].float()
    inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    tensors["out"][:] = (x * inv * tensors["w"].float()).to(torch.bfloat16)


def build_tensor_specs(T):
    import torch
    from golden import TensorSpec
    return [TensorSpec("x", [T, D], torch.bfloat16, init_value=lambda: torch.randn(T, D)),
            TensorSpec("w", [D], torch.bfloat16, init_value=lambda: torch.rand(D) + 0.5),
            TensorSpec("out", [T, D], torch.bfloat16, is_output=True)]


if __name__ == "__main__":
    import argparse
    from golden import ratio_allclose, run_jit

    MODES = {"decode": DECODE_BATCH * DECODE_SEQ, "prefill": PREFILL_BATCH * PREFILL_SEQ}
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["decode", "prefill", "all"], default="all")
    parser.add_argument("--enable-l2-swimlane", type=int, nargs="?", const=1, default=0)
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    for mode in (list(MODES) if args.mode == "all" else [args.mode]):
        print(f"--- rms_norm_test {mode}: T={MODES[mode]} ---")
        result = run_jit(rms_norm_test, build_tensor_specs(MODES[mode]), golden_rms_norm_test,
                         compile_cfg=dict(dump_passes=False),
                         runtime_cfg=dict(platform="a2a3", enable_l2_swimlane=args.enable_l2_swimlane),
                         rtol=5e-3, atol=5e-3, compare_fn={"out": ratio_allclose(atol=1e-2, rtol=1.0 / 128)},
                         compile_only=args.compile_only)
        if not result.passed:
            print(result.error)
            raise SystemExit(1)
