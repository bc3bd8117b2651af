"""run_jit, specs, and golden-data save/replay (pypto-lib `golden/`; golden/harness.py, spec.py)."""

import pytest
import torch

import pto.language as pl
from pto.errors import BindError, GoldenDataError, GoldenError, UndefinedOutputError
from pto.golden import ScalarSpec, TensorSpec, exact, load_golden_data, ratio_allclose, run_jit

R, C = 16, 8


@pl.jit
def axpy(x: pl.Tensor[[R, C], pl.FP32], y: pl.InOut[pl.Tensor[[R, C], pl.FP32]],
         z: pl.Out[pl.Tensor[[R, C], pl.FP32]], idx: pl.Out[pl.Tensor[[R, C], pl.INT32]], a: pl.Scalar[pl.FP32]):
    for b in pl.spmd(2, name_hint="axpy"):
        r = b * 8
        y[r:r + 8, :] = x[r:r + 8, :] * a + y[r:r + 8, :]
        z[r:r + 8, :] = x[r:r + 8, :] * 2.0
        idx[r:r + 8, :] = pl.cast(x[r:r + 8, :], pl.INT32, mode="floor")
    return z


def axpy_golden(v):
    v["y"][:] = v["x"] * v["a"] + v["y"]
    v["z"][:] = v["x"] * 2
    v["idx"][:] = torch.floor(v["x"]).to(torch.int32)


def specs(y_init=1.5):
    return [TensorSpec("x", [R, C], torch.float32, init_value=torch.randn),
            TensorSpec("y", [R, C], torch.float32, init_value=y_init, is_output=True),
            TensorSpec("z", [R, C], torch.float32, is_output=True),
            TensorSpec("idx", [R, C], pl.INT32, is_output=True),
            ScalarSpec("a", torch.float32, 0.5)]


def test_run_jit_passes_with_reports_and_statistics():
    res = run_jit(axpy, specs(), axpy_golden, {"z": ratio_allclose(atol=0, rtol=0, max_error_ratio=0)})
    assert res.passed and res.error is None and str(res).startswith("PASS")
    assert set(res.outputs) == {"y", "z", "idx"}
    assert res.outputs["idx"].label == "exact"
    assert res.outputs["y"].label == "allclose(atol=1e-05, rtol=1e-05)"
    assert res.outputs["z"].label.startswith("ratio_allclose(")
    assert res.max_abs_error == 0.0 and res.stats.tasks == 1 and res.stats.blocks == 2
    assert res.program.check  # check mode by default
    # the in/out tensor started from its init value in both the golden and the kernel
    assert torch.equal(res.expected["y"], res.actual["y"])


def test_run_jit_reports_a_mismatch_without_raising():
    def wrong(v):
        axpy_golden(v)
        v["idx"][3, 4] += 1

    res = run_jit(axpy, specs(), wrong)
    assert not res.passed and str(res).startswith("FAIL")
    assert "idx: 1/128 elements differ; first: [3, 4]" in res.error
    assert res.outputs["y"].passed and not res.outputs["idx"].passed


def test_golden_cannot_write_the_kernel_inputs():
    def vandal(v):
        axpy_golden(v)
        v["x"].fill_(1e6)  # a read-only input is shared with the kernel: writing it is caught

    with pytest.raises(GoldenError, match=r"wrote its read-only input\(s\) \['x'\] in place"):
        run_jit(axpy, specs(), vandal)


def test_run_jit_without_golden_runs_but_is_not_validated():
    res = run_jit(axpy, specs())
    assert not res.passed and not res.validated and res.outputs == {}
    assert res.error.startswith("no golden: outputs ['y', 'z', 'idx'] were not validated")
    assert str(res).startswith("NOT VALIDATED: no golden") and res.stats.tasks == 1


def test_seeded_inputs_are_reproducible():
    r1 = run_jit(axpy, specs(), axpy_golden)
    r2 = run_jit(axpy, specs(), axpy_golden)
    assert torch.equal(r1.actual["z"], r2.actual["z"])
    r3 = run_jit(axpy, specs(), axpy_golden, seed=1)
    assert not torch.equal(r1.actual["z"], r3.actual["z"])


def test_check_mode_errors_propagate_and_leave_the_caller_tensors_untouched():
    @pl.jit
    def leaky(y: pl.InOut[pl.Tensor[[R, C], pl.FP32]], z: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        s = pl.create_tensor([R, C], pl.FP32)  # never written: undefined
        with pl.at(name_hint="copy"):
            y[:, :] = pl.full([R, C], pl.FP32, 5.0)
            z[:, :] = s[:, :]
        return z

    y0 = torch.full((R, C), 2.0)
    sp = [TensorSpec("y", [R, C], torch.float32, init_value=y0, is_output=True),
          TensorSpec("z", [R, C], torch.float32, init_value=torch.full((R, C), 7.0), is_output=True)]
    with pytest.raises(UndefinedOutputError, match="'z'"):
        run_jit(leaky, sp, lambda v: None)
    with pytest.raises(UndefinedOutputError):
        leaky.run(y0, torch.full((R, C), 7.0), config=__import__("pto").RunConfig(check=True))
    assert (y0 == 2).all()


def test_golden_data_round_trip(tmp_path):
    d = tmp_path / "data"
    r1 = run_jit(axpy, specs(), axpy_golden, save_data=str(d), seed=3)
    assert r1.passed and (d / "in.safetensors").exists() and (d / "out.safetensors").exists()
    ins, outs = load_golden_data(str(d), specs())
    assert set(ins) == {"x", "y", "a"} and set(outs) == {"y", "z", "idx"}
    assert ins["a"].dim() == 0 and ins["a"].item() == 0.5
    # replay: inputs and expected outputs come from disk, no golden function, no seed
    r2 = run_jit(axpy, specs(), golden_data=str(d), seed=None)
    assert r2.passed, r2.error
    assert torch.equal(r2.actual["z"], r1.actual["z"])
    # a golden that no longer matches the kernel is caught on replay
    from safetensors.torch import save_file
    outs["z"][0, 0] += 1
    save_file(outs, str(d / "out.safetensors"))
    r3 = run_jit(axpy, specs(), golden_data=str(d))
    assert not r3.passed and "z:" in r3.error


def test_golden_data_missing_or_mismatched(tmp_path):
    with pytest.raises(GoldenDataError, match="missing files"):
        run_jit(axpy, specs(), golden_data=str(tmp_path / "nowhere"))
    d = tmp_path / "data"
    run_jit(axpy, specs(), axpy_golden, save_data=str(d))
    bad = specs()
    bad[0] = TensorSpec("x", [R, C + 1], torch.float32)
    with pytest.raises(GoldenDataError, match=r"'x' is \[16, 8\] torch.float32, spec says \[16, 9\]"):
        run_jit(axpy, bad, golden_data=str(d))
    renamed = specs() + [TensorSpec("extra", [2], torch.float32)]
    with pytest.raises(GoldenDataError, match="tensor 'extra' missing"):
        load_golden_data(str(d), renamed)
    (d / "in.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(GoldenDataError, match="unreadable"):
        load_golden_data(str(d), specs())


# ---- specs ----------------------------------------------------------------------------------------------

def test_tensor_spec_init_rules():
    assert torch.equal(TensorSpec("a", [2], torch.float32).create_tensor(), torch.zeros(2))
    assert torch.equal(TensorSpec("a", [2], pl.INT32, init_value=-1).create_tensor(),
                       torch.tensor([-1, -1], dtype=torch.int32))
    t = torch.tensor([1.5, 2.5])
    assert TensorSpec("a", [2], torch.bfloat16, init_value=t).create_tensor().dtype == torch.bfloat16
    torch.manual_seed(0)
    r1 = TensorSpec("a", [3], torch.float32, init_value=torch.randn).create_tensor()
    torch.manual_seed(0)
    assert torch.equal(r1, torch.randn(3))
    assert torch.equal(TensorSpec("a", [2], torch.float32, init_value=lambda: [3, 4]).create_tensor(),
                       torch.tensor([3.0, 4.0]))
    with pytest.raises(BindError, match="init tensor shape"):
        TensorSpec("a", [3], torch.float32, init_value=t).create_tensor()
    with pytest.raises(BindError, match="unsupported init_value"):
        TensorSpec("a", [3], torch.float32, init_value="zeros").create_tensor()
    assert TensorSpec("a", [1], torch.float32, is_output=True).is_pure_output
    assert not TensorSpec("a", [1], torch.float32, init_value=0, is_output=True).is_pure_output


@pytest.mark.parametrize("dtype, value, ok", [
    (torch.int32, 5, True), (torch.int32, 5.0, False), (torch.int32, True, False), (torch.int8, 200, False),
    (torch.float32, 1, True), (torch.float32, True, False), (torch.bool, True, True), (torch.bool, 1, False),
    (torch.bfloat16, 1.00390625, True),
])
def test_scalar_spec_validation(dtype, value, ok):
    if ok:
        s = ScalarSpec("s", dtype, value)
        assert s.value.dim() == 0 and s.value.dtype == dtype
    else:
        with pytest.raises(BindError):
            ScalarSpec("s", dtype, value)


def test_scalar_spec_rounds_to_device_precision():
    assert ScalarSpec("s", torch.bfloat16, 1.00390625).to_python() == 1.0  # below half a BF16 ulp
    assert ScalarSpec("s", torch.int32, torch.tensor(3, dtype=torch.int32)).to_python() == 3
    with pytest.raises(BindError):
        ScalarSpec("s", torch.int32, torch.tensor(3, dtype=torch.int64))


def test_exact_compare_is_the_default_for_integer_outputs():
    res = run_jit(axpy, specs(), axpy_golden, compare_fn={"idx": exact()})
    assert res.outputs["idx"].label == "exact" and res.passed
