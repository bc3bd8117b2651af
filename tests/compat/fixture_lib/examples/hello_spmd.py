"""y = x + 1 over row tiles: the `for b in pl.spmd(n)` form and a plain allclose check."""
import pypto.language as pl

ROWS, COLS, R_TILE = 32, 64, 8


@pl.jit
def add_one(x: pl.Tensor[[ROWS, COLS], pl.FP32], y: pl.Out[pl.Tensor[[ROWS, COLS], pl.FP32]]):
    for b in pl.spmd(ROWS // R_TILE, name_hint="add_one"):
        r0 = b * R_TILE
        y[r0:r0 + R_TILE, :] = pl.add(x[r0:r0 + R_TILE, :], 1.0)
    return y


if __name__ == "__main__":
    import argparse

    import torch
    from golden import TensorSpec, run_jit

    parser = argparse.ArgumentParser()
    parser.add_argument("-p", "--platform", default="a2a3")
    parser.add_argument("--save-data", action="store_true")
    parser.add_argument("--golden-data", default=None)
    args = parser.parse_args()
    result = run_jit(
        fn=add_one,
        specs=[TensorSpec("x", [ROWS, COLS], torch.float32, init_value=torch.randn),
               TensorSpec("y", [ROWS, COLS], torch.float32, is_output=True)],
        golden_fn=lambda t: t["y"].copy_(t["x"] + 1.0),
        golden_data=args.golden_data,
        runtime_cfg=dict(platform=args.platform, device_id=0),
        save_data=args.save_data,
    )
    print(f"work_dir={result.work_dir}")
    if not result.passed:
        print(result.error)
        raise SystemExit(1)
