"""pld over torch.distributed (gloo): window stores, notify / wait, faults and the cross-rank
race check, each on 2 ranks spawned as processes (tests/runtime/dist_kernels.py)."""

import os
import subprocess
import sys
import time

import pytest
import torch

import pto
import pto.language as pl
import pto.language.distributed as pld
from pto.runtime import distributed as dist

KERNELS = os.path.join(os.path.dirname(__file__), "dist_kernels.py")


def _spawn(scenario, tmp_path, timeout_s, grace_s=15):
    t0 = time.monotonic()
    code = dist.spawn([scenario, str(tmp_path)], 2, script=KERNELS, timeout_s=timeout_s, grace_s=grace_s)
    wall = time.monotonic() - t0
    assert _ranks_alive(tmp_path) == []  # no orphan: every rank has exited
    return code, wall


def _ranks_alive(tmp_path) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if str(tmp_path).encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


def test_exchange_two_ranks_check_mode_and_host_function(tmp_path):
    code, _ = _spawn("exchange", tmp_path, 60)
    assert code == 0
    for r in (0, 1):
        got = torch.load(tmp_path / f"rank{r}.pt")
        # calls 1, 2 through @pl.jit.host (each rank runs its device=r program), then 3, 4 through
        # distributed.run; row p holds 10 * p + e, stored by rank p; every program in check mode
        want = torch.tensor([[[10.0 * p + e] * 4 for p in (0, 1)] for e in (1, 2, 3, 4)])
        assert torch.equal(got, want)


@pytest.mark.slow
def test_stuck_rank_is_killed_after_its_peer_times_out(tmp_path, capfd):
    code, wall = _spawn("hang", tmp_path, 3, grace_s=2)
    assert code == 1 and wall < 40
    assert ("rank 0: task 'wait_rows' waits on window 'flag' counter [0, 0] >= 2, value 1: not notified within "
            "3 s") in capfd.readouterr().err


def test_wait_never_notified_times_out_on_every_rank(tmp_path, capfd):
    code, wall = _spawn("never_notified", tmp_path, 3)
    err = capfd.readouterr().err
    assert code == 1
    assert wall < 40
    for r in (0, 1):  # both ranks wait for rank 1's missing notify
        assert (f"rank {r}: task 'wait_rows' waits on window 'flag' counter [0, 0] >= 2, value 1: "
                "not notified within 3 s") in err


def test_dead_rank_ends_the_waiting_rank(tmp_path, capfd):
    code, wall = _spawn("die", tmp_path, 60)  # the dead peer is seen at once, not after 60 s
    err = capfd.readouterr().err
    assert code == 3
    assert wall < 40
    assert "rank 0: task 'wait_rows' waits on window 'flag' counter [0, 0] >= 2, value 1: rank 1 died" in err


def test_cross_rank_race_names_both_ranks_and_tasks(tmp_path, capfd):
    code, _ = _spawn("race", tmp_path, 60)
    err = capfd.readouterr().err
    assert code == 1
    assert ("RaceError: program exchange: rank 0 task 'read_rows' (id 2) reads window 'recv'[1:2, 0:4] that "
            "rank 1 task 'send_rows' (id 0) wrote with remote_store/put, with no notify/wait ordering them") in err


def test_one_rank_world_and_errors():
    assert pld.world_size() == 1 and pld.rank() == 0
    buf = pld.alloc_window_buffer([2, 4], pl.FP32)
    win = pld.window(buf, [2, 4], pl.FP32)
    flag = pld.window(pld.alloc_window_buffer([1, 1], pl.INT32), [1, 1], pl.INT32)

    @pl.jit
    def k(w: pld.DistributedTensor[[2, 4], pl.FP32], f: pld.DistributedTensor[[1, 1], pl.INT32],
          out: pl.Out[pl.Tensor[[2, 4], pl.FP32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="self_store"):
            pld.tile.remote_store(pl.full([1, 4], pl.FP32, 3.0), w, 0, [1, 0])
            pld.system.notify(f, 0, [0, 0], 5, pld.NotifyOp.Set)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="wait_self") as wt:
            pld.system.wait(f, [0, 0], 5)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="read", deps=[wt]):
            out[0:2, 0:4] = w[0:2, 0:4]
        return out

    out = torch.empty(2, 4)
    prog = dist.run(k, win, flag, out, config=pto.RunConfig(check=True))
    assert torch.equal(out, torch.tensor([[0.0] * 4, [3.0] * 4]))
    assert (0, 2) in prog.graph.edges()  # the store into its own window is a RAW edge to the reader
    with pytest.raises(pto.DslError, match="peer 1 outside"):
        dist.run(pl.jit(_bad_peer), win)
    with pytest.raises(pto.errors.DistributedError, match="window 'flag' counter \\[0, 0\\] >= 6, value 5"):
        dist.run(pl.jit(_wait6), flag)


def _bad_peer(w: pld.DistributedTensor[[2, 4], pl.FP32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="bad"):
        pld.tile.remote_store(pl.full([1, 4], pl.FP32, 1.0), w, 1, [0, 0])


def _wait6(f: pld.DistributedTensor[[1, 1], pl.INT32]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="wait6"):
        pld.system.wait(f, [0, 0], 6)


def _thread_rank(scenario):
    import dist_kernels

    def rank(r):
        recv = pld.window(pld.alloc_window_buffer([2, 4], pl.FP32), [2, 4], pl.FP32)
        flag = pld.window(pld.alloc_window_buffer([1, 1], pl.INT32), [1, 1], pl.INT32)
        kernel = dist_kernels.make(2, scenario)
        outs = []
        for epoch in (1, 2):
            out = torch.empty(2, 4)
            dist.run(kernel, recv, flag, out, epoch, config=pto.RunConfig(check=True))
            outs.append(out)
        return torch.stack(outs)
    return rank


def test_ranks_as_threads(monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    want = torch.tensor([[[10.0 * p + e] * 4 for p in (0, 1)] for e in (1, 2)])
    for got in dist.run_threads(_thread_rank("exchange"), 2, timeout_s=20):
        assert torch.equal(got, want)
    with pytest.raises(pto.RaceError, match="rank 0 task 'read_rows' \\(id 2\\) reads window 'recv'\\[1:2, 0:4\\] "
                                            "that rank 1 task 'send_rows' \\(id 0\\) wrote"):
        dist.run_threads(_thread_rank("race"), 2, timeout_s=20)
    with pytest.raises(pto.errors.DistributedError, match="rank [01]: task 'wait_rows' waits on window 'flag' "
                                                          "counter \\[0, 0\\] >= 2, value 1: not notified within 0.5 s"):
        dist.run_threads(_thread_rank("never_notified"), 2, timeout_s=0.5)
    assert pld.world_size() == 1  # the calling thread keeps its own (one-rank) world
