"""Regression (breaker findings L9, L10, L11):

* ``RunConfig(check="no")`` was truthy and turned check mode on; ``check`` and
  ``keep_footprints`` must now be bools (ConfigError).
* ``ProgramStats.task_names`` was always ``{}`` (removed); ``Program`` had no useful repr.
* ``run_jit``: specs were not checked against the kernel's parameter names (swapped specs of
  equal shapes gave a confusing mismatch), unknown ``compare_fn`` keys were ignored, an
  exception in the golden propagated raw, and a run without a golden passed vacuously.
"""

import dataclasses

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import BindError, ConfigError, GoldenError, PtoError
from pto.golden import ScalarSpec, TensorSpec, exact, run_jit
from pto.runtime import ProgramStats, RunConfig


@pl.jit
def scale(x: pl.Tensor[[4, 8], pl.FP32], w: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]],
          a: pl.Scalar[pl.FP32]):
    with pl.at(name_hint="scale"):
        y[:, :] = x[:, :] * a + w[:, :]


def _specs(order=("x", "w", "y", "a")):
    made = {"x": TensorSpec("x", [4, 8], torch.float32, init_value=torch.randn),
            "w": TensorSpec("w", [4, 8], torch.float32, init_value=torch.randn),
            "y": TensorSpec("y", [4, 8], torch.float32, is_output=True),
            "a": ScalarSpec("a", torch.float32, 2.0)}
    return [made[n] for n in order]


def golden(v):
    v["y"][:] = v["x"] * v["a"] + v["w"]


@pytest.mark.parametrize("field,value", [("check", "no"), ("check", 1), ("keep_footprints", None)])
def test_run_config_flags_must_be_bools(field, value):
    with pytest.raises(ConfigError, match=rf"RunConfig.{field} must be True or False, got"):
        scale.run(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), 1.0, config=RunConfig(**{field: value}))


def test_program_stats_has_no_task_names_and_program_has_a_repr():
    assert "task_names" not in {f.name for f in dataclasses.fields(ProgramStats)}
    p = scale.run(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), 1.0, config=RunConfig(check=True))
    r = repr(p)
    assert r.startswith("<pto Program scale (check mode): 1 tasks, 1 blocks, 0 edges, heap peak 0 B, ")
    assert r.endswith(" ms>")
    assert repr(pto.Program(scale)) == "<pto Program scale: not run>"


def test_spec_names_must_follow_the_parameters():
    with pytest.raises(BindError, match=r"run_jit scale: spec 0 is named 'w' but parameter 0 is 'x'; specs must "
                                        r"follow the parameters in order \['x', 'w', 'y', 'a'\]"):
        run_jit(scale, _specs(("w", "x", "y", "a")), golden)
    extra = _specs() + [ScalarSpec("b", torch.float32, 1.0)]
    with pytest.raises(BindError, match=r"5 specs for 4 parameters .* spec 'b' \(position 4\) has no parameter"):
        run_jit(scale, extra, golden)


def test_compare_fn_keys_must_be_output_specs():
    with pytest.raises(ConfigError, match=r"run_jit scale: compare_fn keys \['yy', 'x'\] are not output specs "
                                          r"\(outputs: y\)"):
        run_jit(scale, _specs(), golden, compare_fn={"yy": exact(), "x": exact(), "y": exact()})


def test_golden_exception_is_a_golden_error_naming_the_golden():
    def broken_golden(v):
        v["y"][:] = v["nope"]

    with pytest.raises(GoldenError, match=r"run_jit scale: the golden .*broken_golden raised KeyError: 'nope'") as e:
        run_jit(scale, _specs(), broken_golden)
    assert isinstance(e.value, PtoError) and isinstance(e.value.__cause__, KeyError)

    def pto_error_golden(v):
        raise BindError("golden: bad input")

    with pytest.raises(BindError, match="golden: bad input"):  # already a PtoError: kept
        run_jit(scale, _specs(), pto_error_golden)


def test_run_without_golden_is_not_validated():
    res = run_jit(scale, _specs())
    assert not res.passed and not res.validated
    assert res.error.startswith("no golden: outputs ['y'] were not validated")
    res = run_jit(scale, _specs(), golden)
    assert res.passed and res.validated and res.error is None
