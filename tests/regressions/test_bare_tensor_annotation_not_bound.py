"""A bare ``pl.Tensor`` annotation was not recognised as a tensor parameter:
the kernel received the caller's raw torch tensor instead of a GM tensor."""

import torch

import pto.language as pl
from pto.language.tensor_ops import GMTensor


def test_bare_tensor_parameter_is_a_gm_tensor():
    seen = []

    @pl.jit
    def k(x: pl.Tensor):
        seen.append(type(x))

    k.run(torch.zeros(3))
    assert seen == [GMTensor]
