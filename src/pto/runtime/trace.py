"""Chrome / Perfetto trace JSON of a real CPU run or a simulated run
(docs/performance.md).

The output is the Trace Event Format's JSON object form:
``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``.
Spans are complete events (``"ph": "X"``) with ``ts`` and ``dur`` in µs;
processes and threads are named by metadata events (``"ph": "M"``,
``process_name`` / ``thread_name`` / ``thread_sort_index``). Open the file in
https://ui.perfetto.dev or chrome://tracing.

* :func:`cpu_trace`: one process, one track; one span per real task with its
  measured CPU wall time (the eager runtime runs tasks one after another), and a
  zero-length span per join node where it was submitted.
* :func:`sim_trace`: one process per simulated machine, one track per core that
  ran a block (``AIC 00`` ..., ``AIV 00`` ...), one for the AICPU orchestrator
  (submissions and ``init_value`` fills), one for the AICPU scheduler
  (dispatches) and one for join nodes (zero-length spans where each completed),
  each only when it has a span; one span per scheduled block and per AICPU step.

Dependency arrows: one flow (a ``"ph": "s"`` event at the start of the
predecessor's last-ending span, a ``"ph": "f"`` event with ``"bp": "e"`` at the
start of the successor's first span, both with the edge's id and ``cat``
``"dep"``) per edge of the task graph, named by the edge's kinds
(``TaskGraph.edge_kinds``: RAW, WAW, atomic, explicit, join).

Span arguments: task id and name, block index, phase, flops, bytes, the
footprints (``"read x[0:16, 0:64]"``) and ``buffers``: per buffer name, per
access kind, the bytes of its footprint boxes (``{"x": {"read": 4096}}``); per
block when the run kept block footprints (``RunConfig(keep_footprints=True)`` or
check mode), else the task's coalesced footprints.
"""

from __future__ import annotations

import json

from pto.runtime.graph import KIND_NAMES

__all__ = ["cpu_trace", "sim_trace", "write_trace"]

_PID_CPU = 1
_PID_SIM = 2


def _meta(pid: int, tid: int | None, name: str, value) -> dict:
    ev = {"ph": "M", "pid": pid, "name": name, "args": {"name": value} if name.endswith("_name")
          else {"sort_index": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _fp_strings(program, task) -> list:
    return [str(f) for f in program.footprints(task)] if task.footprints else []


def _box_bytes(box, itemsize: int) -> int:
    r0, r1, c0, c1 = box
    return (r1 - r0) * (c1 - c0) * itemsize


def _task_buffers(program, task) -> dict:
    """{buffer name: {access kind: bytes}} of a task's coalesced footprints."""
    size = {b.id: b.dtype.itemsize for b in program.buffers}
    out: dict = {}
    for f in (program.footprints(task) if task.footprints else ()):
        kinds = out.setdefault(f.buffer, {})
        kinds[f.kind] = kinds.get(f.kind, 0) + _box_bytes(f.box, size.get(f.buffer_id, 0))
    return out


def _block_buffers(records) -> dict | None:
    """{buffer name: {access kind: bytes}} of the block records of one (block, phase), or
    None when the run dropped block footprints."""
    out: dict = {}
    for blk in records:
        if blk.fp is None:
            return None
        for buf, box, kind in blk.fp:
            kinds = out.setdefault(buf.name, {})
            k = KIND_NAMES[kind]
            kinds[k] = kinds.get(k, 0) + _box_bytes(box, buf.dtype.itemsize)
    return out


def _flows(graph, first: dict, last: dict) -> list:
    """Flow events of every edge ``(p, s)`` whose ends both have a span: ``first`` /
    ``last`` map a task id to ``(pid, tid, ts)`` of its first-starting / last-ending span."""
    events = []
    kinds = graph.edge_kinds()
    for n, (p, s) in enumerate(sorted(kinds, key=lambda e: (e[1], e[0]))):
        if p not in last or s not in first:
            continue
        name = ",".join(kinds[(p, s)]) or "dep"
        (pp, pt, pts), (sp, st, sts) = last[p], first[s]
        events.append({"ph": "s", "id": n, "name": name, "cat": "dep", "pid": pp, "tid": pt, "ts": pts,
                       "args": {"from": p, "to": s}})
        events.append({"ph": "f", "bp": "e", "id": n, "name": name, "cat": "dep", "pid": sp, "tid": st, "ts": sts,
                       "args": {"from": p, "to": s}})
    return events


def _block_fp(records) -> list | None:
    """Footprint strings of the block records of one (block, phase), or None
    when the run dropped block footprints."""
    out = []
    for blk in records:
        if blk.fp is None:
            return None
        for buf, box, kind in blk.fp:
            r0, r1, c0, c1 = box
            s = f"{KIND_NAMES[kind]} {buf.name}[{r0}:{r1}, {c0}:{c1}]"
            if s not in out:
                out.append(s)
    return out


def cpu_trace(program) -> dict:
    """Trace of the real CPU run of ``program`` (a finished Program): one
    track, one complete event per real task at its measured start and wall
    time (µs since the program started).

    Returns:
        The trace as a JSON-serialisable dict.

    Raises:
        ConfigError: ``program`` is a replay of the program cache (``program.replayed``): its
            tasks carry the recording's times, not this call's (trace a plain run: the first
            call of a key, or with ``pto.runtime.set_program_cache(False)``).
    """
    if getattr(program, "replayed", False):
        from pto.errors import ConfigError
        raise ConfigError(f"cpu_trace: {program.name} is a replay of the program cache, whose tasks carry the "
                          f"recording's times, not this call's; trace a plain run (pto.runtime.set_program_cache"
                          f"(False), or the first call after pto.runtime.clear_program_cache())")
    events = [_meta(_PID_CPU, None, "process_name", f"CPU run: {program.name}"),
              _meta(_PID_CPU, 1, "thread_name", "tasks (eager, program order)"),
              _meta(_PID_CPU, 1, "thread_sort_index", 0)]
    t_base = program._t0
    span: dict = {}  # task id -> (pid, tid, ts) of its span
    now_us = 0.0  # a join node sits where it was submitted: after the task before it
    for t in program.graph.tasks:
        if t.kind == "dummy":
            events.append({"ph": "X", "pid": _PID_CPU, "tid": 1, "name": f"join #{t.id}", "cat": "join",
                           "ts": now_us, "dur": 0.0, "args": {"task_id": t.id, "preds": sorted(t.preds)}})
            span[t.id] = (_PID_CPU, 1, now_us)
            continue
        start_us = max(0, t.t0 - t_base) / 1e3
        events.append({
            "ph": "X", "pid": _PID_CPU, "tid": 1, "name": t.name, "cat": t.kind,
            "ts": start_us, "dur": t.wall_ns / 1e3,
            "args": {"task_id": t.id, "blocks": t.n_blocks, "preds": sorted(t.preds), "site": t.site,
                     "flops": t.flops, "bytes": t.bytes, "footprints": _fp_strings(program, t),
                     "buffers": _task_buffers(program, t)},
        })
        span[t.id] = (_PID_CPU, 1, start_us)
        now_us = max(now_us, start_us + t.wall_ns / 1e3)
    events += _flows(program.graph, span, span)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"program": program.name, "kind": "cpu", "tasks": program.stats.tasks,
                          "edges": program.stats.edges, "wall_us": program.stats.wall_us}}


def sim_trace(sim, program) -> dict:
    """Trace of a simulated run: ``sim`` is the SimResult of
    ``pto.runtime.simulate.simulate(program, ...)``. One track per core, one
    for the AICPU orchestrator (submissions, fills) and one for the AICPU
    scheduler (dispatches); one complete event per block, fill, submission
    and dispatch; a join node or a task without blocks is a zero-length event
    on a track of its own, so every dependency edge is a flow arrow.

    Returns:
        The trace as a JSON-serialisable dict.
    """
    m = sim.machine
    tid_of = {("aic", i): i for i in range(m.n_aic)}
    tid_of.update({("aiv", i): m.n_aic + i for i in range(m.n_aiv)})
    orch_tid, sched_tid, join_tid = m.n_aic + m.n_aiv, m.n_aic + m.n_aiv + 1, m.n_aic + m.n_aiv + 2
    events = [_meta(_PID_SIM, None, "process_name", f"simulated {m.name}: {program.name}")]
    used = {(r.core_type, r.core) for r in sim.runs}
    for (ct, i), tid in tid_of.items():
        if (ct, i) in used:  # only tracks that ran something
            events.append(_meta(_PID_SIM, tid, "thread_name", f"{ct.upper()} {i:02d}"))
            events.append(_meta(_PID_SIM, tid, "thread_sort_index", tid))
    dummies = [t for t in program.graph.tasks if t.kind == "dummy"]
    ran = {r.task for r in sim.runs}
    empty = [t for t in program.graph.tasks if t.kind != "dummy" and t.id not in ran]  # no block (pl.spmd(0))
    for tid, name, has in ((orch_tid, "AICPU orchestrator (submit, init_value fill)",
                            sim.fill_runs or any(a.kind == "submit" for a in sim.aicpu_runs)),
                           (sched_tid, "AICPU scheduler (dispatch)", any(a.kind != "submit" for a in sim.aicpu_runs)),
                           (join_tid, " and ".join(w for w, got in (("join nodes (task_dummy)", dummies),
                                                                  ("tasks without blocks", empty)) if got),
                            dummies or empty)):
        if has:
            events.append(_meta(_PID_SIM, tid, "thread_name", name))
            events.append(_meta(_PID_SIM, tid, "thread_sort_index", tid))

    tasks = program.graph.tasks
    records: dict = {}
    for t in tasks:
        for blk in t.blocks:
            records.setdefault((t.id, blk.idx, blk.phase), []).append(blk)
    task_fp: dict = {}
    first: dict = {}  # task id -> (pid, tid, ts) of its first-starting / last-ending span
    last: dict = {}
    for r in sim.runs:
        rec = records.get((r.task, r.block, r.phase), [])
        fps, bufs = _block_fp(rec), _block_buffers(rec)
        scope = "block"
        if fps is None:
            if r.task not in task_fp:
                task_fp[r.task] = (_fp_strings(program, tasks[r.task]), _task_buffers(program, tasks[r.task]))
            (fps, bufs), scope = task_fp[r.task], "task"
        tid = tid_of[(r.core_type, r.core)]
        events.append({
            "ph": "X", "pid": _PID_SIM, "tid": tid, "name": r.name,
            "cat": "cube" if r.core_type == "aic" else "vector",
            "ts": r.start_us, "dur": r.end_us - r.start_us,
            "args": {"task_id": r.task, "block": r.block, "phase": r.phase, "flops": r.flops, "bytes": r.bytes,
                     "footprints": fps, "buffers": bufs, "footprint_scope": scope},
        })
        if r.task not in first or r.start_us < first[r.task][2]:
            first[r.task] = (_PID_SIM, tid, r.start_us)
        if r.task not in last or r.end_us > last[r.task][3]:
            last[r.task] = (_PID_SIM, tid, r.start_us, r.end_us)
    last = {k: v[:3] for k, v in last.items()}
    for t in sorted(dummies, key=lambda t: sim.task_spans[t.id][2]):
        end = sim.task_spans[t.id][2]
        events.append({"ph": "X", "pid": _PID_SIM, "tid": join_tid, "name": f"join #{t.id}", "cat": "join",
                       "ts": end, "dur": 0.0, "args": {"task_id": t.id, "preds": sorted(t.preds)}})
        first[t.id] = last[t.id] = (_PID_SIM, join_tid, end)
    for t in empty:  # a zero-length mark where it completed, so its dependency arrows have both ends
        end = sim.task_spans[t.id][2]
        events.append({"ph": "X", "pid": _PID_SIM, "tid": join_tid, "name": t.name, "cat": "empty",
                       "ts": end, "dur": 0.0, "args": {"task_id": t.id, "blocks": 0, "preds": sorted(t.preds)}})
        first[t.id] = last[t.id] = (_PID_SIM, join_tid, end)
    for f in sim.fill_runs:
        events.append({"ph": "X", "pid": _PID_SIM, "tid": orch_tid, "name": f"fill {f.name}", "cat": "init",
                       "ts": f.start_us, "dur": f.end_us - f.start_us,
                       "args": {"buffer_id": f.buffer, "bytes": f.nbytes}})
    for a in sim.aicpu_runs:
        events.append({"ph": "X", "pid": _PID_SIM, "tid": orch_tid if a.kind == "submit" else sched_tid,
                       "name": f"{a.kind} {a.name}", "cat": a.kind, "ts": a.start_us, "dur": a.end_us - a.start_us,
                       "args": {"task_id": a.task}})
    events += _flows(program.graph, first, last)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"program": program.name, "kind": "simulated", "machine": m.name,
                          "orch_us": sim.orch_us, "sched_us": sim.sched_us, "effective_us": sim.effective_us,
                          "makespan_us": sim.makespan_us, "critical_path": sim.critical_path,
                          "tasks": sim.tasks, "edges": sim.edges}}


def write_trace(trace: dict, path: str) -> None:
    """Write ``trace`` (from :func:`cpu_trace` / :func:`sim_trace`) as JSON to ``path``.

    A regular file (or a new one) is written atomically: into a temporary file beside it,
    renamed over it once complete, so a failure (a value JSON cannot hold, a full disk, an
    interrupt) leaves no partial file and an existing ``path`` untouched; an existing file keeps
    its permission bits. A symbolic link is followed (the file it names is written; the link
    stays). Anything else that exists (a device such as ``/dev/null``, a FIFO) is written to
    directly, as ``open(path, "w")`` would, never replaced.

    Raises:
        OSError: ``path`` is empty or cannot be written (its directory is missing or
            read-only, it is a directory, the device refuses the bytes).
        TypeError / ValueError: ``trace`` holds a value JSON cannot encode.
    """
    import os
    import stat
    import tempfile
    if not path:
        raise FileNotFoundError(2, "an empty path", path)
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "Is a directory", path)
    if mode is not None and not stat.S_ISREG(mode):  # a device or FIFO: write it, do not replace it
        with open(target, "w", encoding="utf-8") as f:
            json.dump(trace, f)
        return
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(trace, f)
        if mode is None:  # as open(path, "w") would have made it (mkstemp makes 0600)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        else:
            os.chmod(tmp, stat.S_IMODE(mode))
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
