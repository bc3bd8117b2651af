"""Regression: a list of mistakes raised raw Python / torch exceptions (IndexError,
RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError, FileExistsError)
instead of a PtoError naming what was wrong (breaker finding M8). Each is now a DslError,
BindError, ConfigError or GoldenDataError.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import BindError, ConfigError, DslError, GoldenDataError
from pto.golden import TensorSpec, save_golden_data


def _in_task(f):
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
        with pl.at(name_hint="t"):
            f(x, y)
    return k


@pl.jit
def _noop(x: pl.Tensor[[64, 128], pl.FP32], y: pl.Out[pl.Tensor[[64, 128], pl.FP32]]):
    pass


def _args():
    return torch.randn(64, 128), torch.zeros(64, 128)


@pytest.mark.parametrize("f,msg", [
    (lambda x, y: pl.assemble(x[0:16, :], x[0:8, :], [12, 0]),
     r"pl.assemble: source tile \[8, 128\] at offset 12 of dim 0 spans \[12, 20\), out of bounds of the target "
     r"tile's extent 16"),
    (lambda x, y: pl.assemble(x[0:16, :], x[0:8, :], [-4, 0]), r"pl.assemble: .* spans \[-4, 4\), out of bounds"),
    (lambda x, y: pl.assemble(x[0:16, :], x[0:8, :], [0]), r"pl.assemble: rank mismatch"),
    (lambda x, y: pl.matmul(pl.reshape(x[0:1, :], [128]), pl.reshape(x[0:1, :], [128])),
     r"pl.matmul: operands must both be rank 2 .* got \[128\] and \[128\]"),
    (lambda x, y: pl.matmul(pl.reshape(x[0:16, :], [2, 8, 128]),
                            pl.reshape(pl.full([48, 128], pl.FP32, 0.0), [3, 128, 16])),
     r"pl.matmul: batch mismatch, a is \[2, 8, 128\] and b is \[3, 128, 16\]"),
    (lambda x, y: pl.transpose(x[0:16, :], 0, 5), r"pl.transpose: axis 5 out of range for a rank-2 tile"),
    (lambda x, y: pl.full([4, 4], pl.INT8, 300), r"pl.full: value 300 out of range of pl.INT8 \[-128, 127\]"),
    (lambda x, y: pl.full([4, 4], pl.INT8, -129.0), r"pl.full: value -129.0 out of range of pl.INT8"),
    (lambda x, y: pl.tensor.dim(x, 5), r"pl.tensor.dim: axis 5 out of range for x of rank 2"),
    (lambda x, y: pl.max(x[0:16, :], x[0:16, :]), r"pl.max: takes two scalars, got a tile; for tiles use "
                                                  r"pl.maximum \(elementwise\) or pl.row_max"),
    (lambda x, y: pl.min(1, x[0:16, :]), r"pl.min: takes two scalars, got a tile; .*pl.minimum"),
    (lambda x, y: pl.store(pl.reshape(x[0:1, :], [128]), [0, 0], y),
     r"y: storing a rank-1 tile \[128\] at 2 offsets of a rank-2 tensor"),
    (lambda x, y: y.__setitem__((None, slice(0, 1)), x[0:1, :]), r"y: new axes \(None\) in a subscript"),
])
def test_bad_tile_and_tensor_ops_are_dsl_errors(f, msg):
    with pytest.raises(DslError, match=msg):
        _in_task(f)(*_args())


def test_ellipsis_subscripts_on_gm_tensors_work():
    x, y = _args()
    _in_task(lambda x, y: y.__setitem__(Ellipsis, x[...]))(x, y)
    assert torch.equal(x, y)
    y = torch.zeros(64, 128)
    _in_task(lambda x, y: y.__setitem__((slice(0, 4), Ellipsis), x[4:8, ...]))(x, y)
    assert torch.equal(y[0:4], x[4:8]) and not y[4:].any()


def test_scalar_max_min_still_work():
    assert (pl.max(3, 5), pl.min(3, 5), pl.max(2.5, 1), pl.min(-1, 0.5)) == (5, 3, 2.5, -1)


def test_deps_that_are_not_task_ids():
    @pl.jit
    def k(x: pl.Tensor[[64, 128], pl.FP32]):
        with pl.at(deps=["a"]):
            pass

    with pytest.raises(DslError, match=r"deps=: expected task ids .* got 'a'"):
        k(torch.zeros(64, 128))


def test_out_argument_requiring_grad_and_non_cpu_argument_are_bind_errors():
    x, y = _args()
    y.requires_grad_(True)
    with pytest.raises(BindError, match=r"kernel _noop: parameter 'y' \(pl.Out\[.*\]\) requires grad"):
        _noop(x, y)
    x.requires_grad_(True)  # an In argument may require grad: it is only read
    _noop(x, torch.zeros(64, 128))
    with pytest.raises(BindError, match=r"parameter 'x' is a shape-only \(meta\) tensor; only graph-only mode \(RunConfig\(execute=False\)\) runs on those"):
        _noop(torch.zeros(64, 128, device="meta"), torch.zeros(64, 128))


def test_bad_run_configs_are_config_errors():
    with pytest.raises(ConfigError, match=r"kernel _noop: config= must be a pto.RunConfig, got dict"):
        _noop.run(*_args(), config={"check": True})
    with pytest.raises(ConfigError, match=r"RunConfig.heap_bytes=35184372088832: cannot reserve that many bytes "
                                          r"of host memory for the ring heap"):
        _noop.run(*_args(), config=pto.RunConfig(heap_bytes=1 << 45))


def test_tensor_spec_bad_shape_and_random_factory_on_int_dtype_are_bind_errors():
    with pytest.raises(BindError, match=r"TensorSpec 'a': init_value torch.randn needs a float dtype, got torch.int32"):
        TensorSpec("a", [4], torch.int32, init_value=torch.randn).create_tensor()
    with pytest.raises(BindError, match=r"TensorSpec 'a': dim 0 of shape \[-4\] must be a non-negative int"):
        TensorSpec("a", [-4], pl.FP32)
    assert TensorSpec("a", [4], torch.int32, init_value=torch.zeros).create_tensor().dtype == torch.int32


def test_save_data_onto_a_file_is_a_golden_data_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(GoldenDataError, match=r"save_data .*afile.*: cannot write the golden data there"):
        save_golden_data(str(f), {"a": torch.zeros(2)}, {})
