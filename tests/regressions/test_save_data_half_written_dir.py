"""``run_jit(save_data=DIR)`` wrote ``in.safetensors`` into ``DIR`` and then failed on the
golden outputs with a raw exception (a RuntimeError from safetensors for outputs sharing
memory, an AttributeError for a non-tensor), leaving a half-written directory that a later
replay would read. Saving is now atomic (temporary directory, then rename) and every
failure is a GoldenDataError that leaves nothing behind and the previous data untouched."""

import os

import pytest
import torch

import pto.language as pl
from pto.errors import GoldenDataError
from pto.golden import TensorSpec, load_golden_data, run_jit


@pl.jit
def two_copies(x: pl.Tensor[[4, 8], pl.FP32], a: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
               b: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="copy"):
        a[:, :] = x[:, :]
        b[:, :] = x[:, :]
    return a, b


SPECS = [TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
         TensorSpec("a", [4, 8], torch.float32, is_output=True),
         TensorSpec("b", [4, 8], torch.float32, is_output=True)]


def good(v):
    v["a"][:] = v["x"]
    v["b"][:] = v["x"]


def shared(v):  # both outputs one tensor: safetensors refuses to save shared memory
    v["a"] = v["b"] = v["x"].clone()


def not_a_tensor(v):
    v["a"][:] = v["x"]
    v["b"] = v["x"].tolist()


@pytest.mark.parametrize("golden", [shared, not_a_tensor])
def test_failed_save_leaves_nothing(tmp_path, golden):
    d = tmp_path / "data"
    with pytest.raises(GoldenDataError, match=r"save_data .*data.*: cannot save the golden data"):
        run_jit(two_copies, SPECS, golden, save_data=str(d))
    assert os.listdir(tmp_path) == []  # no directory, no temporary left over


@pytest.mark.parametrize("golden", [shared, not_a_tensor])
def test_failed_save_keeps_previous_data(tmp_path, golden):
    d = tmp_path / "data"
    first = run_jit(two_copies, SPECS, good, save_data=str(d), seed=1)
    assert first.passed
    with pytest.raises(GoldenDataError):
        run_jit(two_copies, SPECS, golden, save_data=str(d), seed=2)
    assert sorted(os.listdir(tmp_path)) == ["data"] and sorted(os.listdir(d)) == ["in.safetensors",
                                                                                  "out.safetensors"]
    ins, _ = load_golden_data(str(d), SPECS)
    assert torch.equal(ins["x"], first.actual["a"])  # still the first run's inputs


def test_successful_save_replaces_whole_directory(tmp_path):
    d = tmp_path / "data"
    run_jit(two_copies, SPECS, good, save_data=str(d), seed=1)
    (d / "stale.txt").write_text("left from before")
    second = run_jit(two_copies, SPECS, good, save_data=str(d), seed=2)
    assert sorted(os.listdir(d)) == ["in.safetensors", "out.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["data"]
    ins, _ = load_golden_data(str(d), SPECS)
    assert torch.equal(ins["x"], second.actual["a"])
