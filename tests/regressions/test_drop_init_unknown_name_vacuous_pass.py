"""Regression: ``RunConfig(drop_init=("typo",))`` naming an allocation the program never made
(or one without an init_value) dropped nothing and the run passed, so a typo turned the mutation
test into a vacuous pass (breaker finding M7). It is now a ConfigError at program end listing the
names that matched nothing and the allocations that exist. (The ``drop_init_values`` context
manager may span several programs and is not checked per program.)
"""

import pytest
import torch

import pto.language as pl
from pto.errors import ConfigError, UndefinedOutputError
from pto.runtime import RunConfig, drop_init_values


@pl.jit
def k(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]]):
    acc = pl.create_tensor([4, 8], pl.FP32, init_value=0)
    pl.create_tensor([4, 8], pl.FP32, name="scratch_no_init")
    with pl.at(name_hint="add"):
        y[:, :] = acc[:, :] + x[:, :]


@pytest.mark.parametrize("check", [False, True])
def test_unknown_drop_init_name_is_a_config_error(check):
    y = torch.zeros(4, 8)
    with pytest.raises(ConfigError, match=r"kernel k: RunConfig.drop_init names \['no_such_alloc'\] matched no "
                                          r"allocation with an init_value in this run.*\(allocations with an "
                                          r"init_value: acc; without: scratch_no_init\)"):
        k.run(torch.randn(4, 8), y, config=RunConfig(check=check, drop_init=("acc", "no_such_alloc")))
    assert not y.any()  # the failed program left the caller's output untouched


def test_drop_init_name_of_an_allocation_without_init_value_is_a_config_error():
    with pytest.raises(ConfigError, match=r"names \['scratch_no_init'\] matched no allocation with an init_value"):
        k.run(torch.randn(4, 8), torch.zeros(4, 8), config=RunConfig(drop_init=("scratch_no_init",)))


def test_matching_drop_init_name_still_works():
    with pytest.raises(UndefinedOutputError, match="allocation 'acc'"):
        k.run(torch.randn(4, 8), torch.zeros(4, 8), config=RunConfig(check=True, drop_init=("acc",)))
    p = k.run(torch.randn(4, 8), torch.zeros(4, 8), config=RunConfig(drop_init=("acc",)))
    assert p.dropped_init == ["acc"]
    with drop_init_values("not_in_this_kernel"):  # the context manager is not checked per program
        assert k.run(torch.randn(4, 8), torch.zeros(4, 8)).dropped_init == []
