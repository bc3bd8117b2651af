"""A peer's store that arrived before this rank had registered the window broke the receiver
thread (IndexError on the window id, seen as 'rank 1 died' when rank 1 started its first MoE
program while rank 0 was still loading weights). Such messages, and every later one from the
same source, now wait until the window is registered, in arrival order."""

import torch

from pto.runtime import distributed as dist


def test_early_store_and_notify_apply_in_order_after_registration():
    w = dist.World(2, 0, timeout_s=1.0)
    data = torch.full((1, 4), 7.0)
    w.receive(1, dist._PUT, (0, [1, 0], False, "send", 0, 0, 0), data)  # window 0 not registered yet
    w.receive(1, dist._NOTIFY, (1, (0, 0), 1, False, 1), None)  # queued behind it (same source)
    win = w.register_window("recv", torch.zeros(2, 4))
    assert torch.equal(win, torch.tensor([[0.0] * 4, [7.0] * 4]))
    flag = w.register_window("flag", torch.zeros(1, 1, dtype=torch.int32))
    assert int(flag[0, 0]) == 1 and w.notifies[(1, (0, 0))] == {1: 1}
    w.receive(1, dist._PUT, (0, [0, 0], True, "send", 0, 1, 0), data)  # registered: applied at once
    assert torch.equal(win[0], data[0])
