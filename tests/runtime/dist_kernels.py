"""Multi-rank test kernels run as ranks by tests/runtime/test_distributed.py (one process per
rank through ``pto.runtime.distributed.spawn``): ``python dist_kernels.py SCENARIO OUT_DIR``.

Scenarios: ``exchange`` (twice through ``@pl.jit.host`` with ``device=r`` calls, then
twice through ``pto.runtime.distributed.run``; every rank stores a row into every peer's window, notifies, waits,
reads; the received rows go to ``OUT_DIR/rank{r}.pt``), ``never_notified`` (rank 1 skips its
notify: rank 0's wait must time out), ``die`` (rank 1 stores, skips its notify and exits: rank 0's
wait must fail on the dead peer), ``race`` (check mode; the reader reads the window without depending on
the wait: RaceError naming both ranks and tasks), ``hang`` (rank 1 sleeps in its wait task:
rank 0 times out, the launcher kills rank 1), ``quiet`` (both ranks idle for twice the wait
timeout before the exchange: not a dead peer).
"""

import os
import sys
import time

import torch

import pto  # noqa: F401 - installs the runtime
import pto.language as pl
import pto.language.distributed as pld
from pto.runtime import RunConfig
from pto.runtime import distributed as dist


def make(world: int, scenario: str):
    @pl.jit
    def exchange(recv: pld.DistributedTensor[[world, 4], pl.FP32],
                 flag: pl.InOut[pld.DistributedTensor[[1, 1], pl.INT32]],
                 out: pl.Out[pl.Tensor[[world, 4], pl.FP32]],
                 epoch: pl.Scalar[pl.INT32]):
        me = pld.rank()
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="send_rows"):
            row = pl.full([1, 4], pl.FP32, float(10 * me + epoch))
            for p in range(pld.world_size()):
                pld.tile.remote_store(row, recv, p, [me, 0])
                if not (scenario in ("never_notified", "die", "hang") and me == 1):
                    pld.system.notify(flag, p, [0, 0], 1, pld.NotifyOp.AtomicAdd)
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="wait_rows") as wt:
            if scenario == "die" and me == 1:  # a rank that dies while its peer waits for it
                time.sleep(1.0)
                os._exit(3)
            if scenario == "hang" and me == 1:  # a rank stuck in a kernel
                time.sleep(600)
            pld.system.wait(flag, [0, 0], world * epoch, pld.WaitCmp.Ge)
        deps = [] if scenario == "race" else [wt]
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="read_rows", deps=deps):
            out[0:world, 0:4] = recv[0:world, 0:4]
        return out

    return exchange


def main() -> int:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    w = dist.init()
    recv_buf = pld.alloc_window_buffer([w.size, 4], pl.FP32)
    recv = pld.window(recv_buf, [w.size, 4], pl.FP32)
    flag_buf = pld.alloc_window_buffer([1, 1], pl.INT32)
    flag = pld.window(flag_buf, [1, 1], pl.INT32)
    kernel = make(w.size, scenario)
    if scenario == "quiet":  # no traffic for longer than the wait timeout, then a normal exchange
        time.sleep(2 * w.timeout_s)
    host_outs = []
    if scenario == "exchange":  # the reference's L3 form: one host function, a chip program per device
        @pl.jit.host
        def l3_exchange(epochs):
            outs = []
            for epoch in epochs:
                for r in range(pld.world_size()):
                    out = torch.empty(w.size, 4)
                    # check mode: the end-of-program exchange orders the window's reuse by the
                    # next call (this kernel has no notify / wait chain of its own for that)
                    if kernel.run(recv, flag, out, epoch, device=r, config=RunConfig(check=True)).result is not None:
                        outs.append(out)
            return outs

        host_outs = l3_exchange([1, 2])
    outs = []
    for epoch in (1, 2) if scenario != "exchange" else (3, 4):
        out = torch.empty(w.size, 4)
        dist.run(kernel, recv, flag, out, epoch, config=RunConfig(check=True))
        outs.append(out)
    torch.save(torch.stack(host_outs + outs), os.path.join(out_dir, f"rank{w.rank}.pt"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pto.PtoError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
