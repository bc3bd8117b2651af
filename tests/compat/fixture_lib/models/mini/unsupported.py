"""Uses a construct pto does not have: the run stops with one error naming it and this line."""
import pypto.language as pl


@pl.jit
def uses_missing(x: pl.Tensor[[8, 8], pl.FP32], y: pl.Out[pl.Tensor[[8, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        y[:, :] = pl.tile.print_tile(x[:, :])
    return y


if __name__ == "__main__":
    import torch
    from golden import TensorSpec, run_jit

    run_jit(uses_missing, [TensorSpec("x", [8, 8], torch.float32), TensorSpec("y", [8, 8], torch.float32, is_output=True)],
            golden_fn=lambda t: t["y"].copy_(t["x"]))
