"""The class-based API: a @pl.program with an InCore kernel (one task per call) called by the
Orchestration function, run through golden.run. Golden: torch x * w + bias."""
import pypto.language as pl

R, C = 16, 32


def build_program():
    @pl.program
    class ScaleBias:
        @pl.function(type=pl.FunctionType.InCore)
        def scale_rows(self, x: pl.Tensor[[R, C], pl.FP32], w: pl.Tensor[[1, C], pl.FP32],
                       y: pl.Out[pl.Tensor[[R, C], pl.FP32]]) -> pl.Tensor[[R, C], pl.FP32]:
            t = pl.load(x, [0, 0], [R, C])
            return pl.store(pl.col_expand_mul(t, pl.load(w, [0, 0], [1, C])), [0, 0], y)

        @pl.function(type=pl.FunctionType.Orchestration)
        def main(self, x: pl.Tensor[[R, C], pl.FP32], w: pl.Tensor[[1, C], pl.FP32],
                 bias: pl.Scalar[pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]) -> pl.Tensor[[R, C], pl.FP32]:
            tmp = pl.create_tensor([R, C], dtype=pl.FP32)
            tmp = self.scale_rows(x, w, tmp)
            with pl.at(level=pl.Level.CORE_GROUP, name_hint="bias"):
                y = pl.assemble(y, pl.add(tmp[:, :], bias), [0, 0])
            return y

    return ScaleBias


if __name__ == "__main__":
    import torch
    from golden import ScalarSpec, TensorSpec, run

    result = run(
        program=build_program(),
        specs=[TensorSpec("x", [R, C], torch.float32, init_value=torch.randn),
               TensorSpec("w", [1, C], torch.float32, init_value=torch.rand),
               ScalarSpec("bias", torch.float32, 0.5),
               TensorSpec("y", [R, C], torch.float32, is_output=True)],
        golden_fn=lambda t: t["y"].copy_(t["x"] * t["w"] + t["bias"]),
    )
    if not result.passed:
        print(result.error)
        raise SystemExit(1)
