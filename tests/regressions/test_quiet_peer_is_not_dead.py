"""The gloo group's timeout (set to the wait timeout) bounded each blocking recv of the
receiver threads, so a peer that sent nothing for longer than that -- loading weights, a long
local program -- was reported dead and the next exchange failed. Only the rendezvous is bounded
by the wait timeout now."""

import os

import torch

from pto.runtime import distributed as dist

KERNELS = os.path.join(os.path.dirname(__file__), os.pardir, "runtime", "dist_kernels.py")


def test_ranks_idle_for_twice_the_timeout_then_exchange(tmp_path):
    assert dist.spawn(["quiet", str(tmp_path)], 2, script=KERNELS, timeout_s=2, grace_s=5) == 0
    want = torch.tensor([[[10.0 * p + e] * 4 for p in (0, 1)] for e in (1, 2)])
    for r in (0, 1):
        assert torch.equal(torch.load(tmp_path / f"rank{r}.pt"), want)
