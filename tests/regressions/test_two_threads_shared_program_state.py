"""Regression: two programs in two threads could not run at the same time.

The running program and block lived in one process-wide object, and every program of a
given heap size carved its scratch out of one shared backing buffer: a second thread's
program failed with "started while another program is running" (or, with the state
merely swapped, would have recorded footprints into the other program's block and
overwritten its scratch). Now the DSL state is per thread and a running program owns its
heap buffer.

The test forces the interleaving: each kernel stops inside a block and again in
orchestration (between the task that fills its scratch and the task that reads it) until
the other thread's program has reached the same point.
"""

import threading

import torch

import pto
import pto.language as pl

R, C = 16, 32


def _kernel():
    @pl.jit
    def staged(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]], meet):
        s = pl.create_tensor([R, C], pl.FP32)  # scratch: same heap offset in both programs
        for b in pl.spmd(2, name_hint="fill"):
            t = x[b * 8:(b + 1) * 8, :] * 2.0
            meet("in_block")  # both programs are inside a block now
            s[b * 8:(b + 1) * 8, :] = t
        meet("between_tasks")  # both scratch tensors are live now
        for b in pl.spmd(2, name_hint="finish", deps=None):
            y[b * 8:(b + 1) * 8, :] = s[b * 8:(b + 1) * 8, :] + 1.0
    return staged


def test_two_programs_in_two_threads_run_concurrently_and_correctly():
    staged = _kernel()
    barriers = {k: threading.Barrier(2, timeout=20) for k in ("in_block", "between_tasks")}
    seen = {}

    def meet(point):
        if point not in seen.setdefault(threading.get_ident(), set()):  # once per point per thread
            seen[threading.get_ident()].add(point)
            barriers[point].wait()

    xs = [torch.randn(R, C), torch.randn(R, C)]
    ys = [torch.zeros(R, C), torch.zeros(R, C)]
    staged.run(xs[0], ys[0], lambda point: None)  # leaves an idle heap buffer behind, as any earlier run
    progs, errors = [None, None], []

    def work(i):
        try:
            progs[i] = staged.run(xs[i], ys[i], meet, config=pto.RunConfig(check=i == 1))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            for b in barriers.values():
                b.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i in range(2):
        assert torch.equal(ys[i], xs[i] * 2.0 + 1.0)
        g = progs[i].graph
        assert [t.name for t in g] == ["fill", "finish"] and g.named_edges() == {("fill", "finish")}
        fp = {(f.buffer, f.kind, f.box) for f in progs[i].footprints(g[0])}  # only this program's accesses
        assert fp == {("x", "read", (0, 16, 0, C)), ("s", "write", (0, 16, 0, C))}
    assert progs[1].sanitizer is not None and progs[0].sanitizer is None
