"""What a kernel author sees, as data: the documents behind the CLI's tables and
their machine-readable forms (``pto ... --json``), the task graph as Graphviz DOT,
and the per-task table of a simulated schedule.

Every ``*_doc`` function returns a JSON-serialisable dict whose keys are stable and
documented in docs/cli.md; the CLI prints its tables from the same dict, so a table
and its ``--json`` document always carry the same figures. Times are in µs
(``*_us``) or ms (``*_ms``), sizes in bytes (``*_bytes``). A non-finite float
(an infinite error after a NaN output) is written as the string ``"inf"``,
``"-inf"`` or ``"nan"`` (JSON has no such numbers).
"""

from __future__ import annotations

import json
import math

__all__ = ["to_json", "core_type", "stats_doc", "graph_doc", "graph_dot", "sim_doc", "sim_task_rows"]


def _clean(x):
    """``x`` with non-finite floats as strings and tuples as lists (recursively)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def to_json(doc: dict) -> str:
    """``doc`` as one strict JSON document (2-space indent; see the module docstring for
    non-finite floats)."""
    return json.dumps(_clean(doc), indent=2, allow_nan=False)


def core_type(task) -> str:
    """The cores a task's blocks run on: ``"AIC"`` (every block issued a matmul),
    ``"AIV"`` (none did), ``"AIC+AIV"`` (some did), ``"-"`` (a join node or a task
    without blocks)."""
    kinds = {b.cube for b in task.blocks}
    if not kinds:
        return "-"
    return "AIC+AIV" if len(kinds) == 2 else ("AIC" if True in kinds else "AIV")


def stats_doc(stats) -> dict:
    """The figures of ``pto run`` from a ProgramStats: counts, ``gm_bytes`` (GM bytes
    moved), ``flops``, ``heap_peak_bytes``, ``scratch_tensors`` / ``scratch_bytes``
    (allocations of the run) and ``wall_ms`` (CPU wall time of the run); a graph-only run adds
    ``graph_only`` and ``assumed_reads`` / ``assumed_footprints`` / ``assumed_sorts``."""
    return {"tasks": stats.tasks, "join_nodes": stats.dummies, "blocks": stats.blocks, "edges": stats.edges,
            "tile_ops": stats.tile_ops, "gm_bytes": stats.bytes, "flops": stats.flops,
            "heap_peak_bytes": stats.heap_peak_bytes, "scratch_tensors": stats.scratch_tensors,
            "scratch_bytes": stats.scratch_bytes, "wall_ms": round(stats.wall_us / 1e3, 3),
            **({"graph_only": True, "assumed_reads": stats.assumed_reads,
                "assumed_footprints": stats.assumed_footprints, "assumed_sorts": stats.assumed_sorts}
               if getattr(stats, "graph_only", False) else {})}


def _footprint_doc(f) -> dict:
    r0, r1, c0, c1 = f.box
    return {"buffer": f.buffer, "kind": f.kind, "rows": [r0, r1], "cols": [c0, c1]}


def graph_doc(program, title: str, footprints: bool = False, buffer: str | None = None,
              task: str | None = None) -> dict:
    """The task graph of a finished Program.

    Keys: ``kernel``, ``tasks`` / ``join_nodes`` / ``edges`` (counts of the whole graph),
    ``nodes`` (per task: ``id``, ``name``, ``kind`` spmd/at/dummy, ``blocks``, ``core``
    (:func:`core_type`), ``preds`` (ids), ``site`` (file:line); with ``footprints`` also
    ``footprints``: ``[{buffer, kind, rows: [r0, r1], cols: [c0, c1]}]``, half-open boxes
    in the root buffer's 2-D coordinates) and ``edge_list`` (``{from, to, kinds}``,
    kinds from :meth:`pto.runtime.graph.TaskGraph.edge_kinds`).

    ``buffer`` keeps only the footprints on that buffer and the tasks that have some;
    ``task`` (a name_hint, or an id) keeps only the matching tasks; either implies
    ``footprints``. ``edge_list`` always covers the whole graph.

    Raises:
        pto.errors.ConfigError: a ``buffer`` no task touched or a ``task`` that matches
            no task, naming the known ones.
    """
    from pto.errors import ConfigError
    g = program.graph
    footprints = footprints or buffer is not None or task is not None
    tasks = list(g)
    if task is not None:
        sel = [t for t in tasks if t.name == task or str(t.id) == task.lstrip("#")]
        if not sel:
            names = sorted({t.name for t in tasks})
            raise ConfigError(f"--task {task!r}: no task of {title} has that name or id; its tasks: "
                              f"{', '.join(names)}")
        tasks = sel
    fps = {t.id: program.footprints(t) for t in tasks} if footprints else {}
    if buffer is not None:
        known = sorted({f.buffer for t in g for f in program.footprints(t)})
        if buffer not in known:
            raise ConfigError(f"--buffer {buffer!r}: no task of {title} touched a buffer of that name; "
                              f"buffers: {', '.join(known)}")
        fps = {tid: [f for f in fs if f.buffer == buffer] for tid, fs in fps.items()}
        tasks = [t for t in tasks if fps[t.id]]
    nodes = []
    for t in tasks:
        n = {"id": t.id, "name": t.name, "kind": t.kind, "blocks": len({b.idx for b in t.blocks}),
             "core": core_type(t), "preds": sorted(t.preds), "site": t.site.rsplit("/", 1)[-1]}
        if footprints:
            n["footprints"] = [_footprint_doc(f) for f in fps[t.id]]
        nodes.append(n)
    kinds = g.edge_kinds()
    edges = [{"from": p, "to": s, "kinds": list(kinds[(p, s)])} for p, s in sorted(kinds, key=lambda e: (e[1], e[0]))]
    st = program.stats
    return {"kernel": title, "tasks": st.tasks, "join_nodes": st.dummies, "edges": st.edges, "nodes": nodes,
            "edge_list": edges}


def _dot_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# DOT edge style per kind: explicit deps dashed, join-node edges dotted, atomic-vs-plain blue
_EDGE_STYLE = {"explicit": 'style="dashed"', "join": 'style="dotted"', "atomic": 'color="blue"'}


def graph_dot(program, title: str) -> str:
    """The task graph of a finished Program in Graphviz DOT (``dot -Tsvg``): one node per
    task (``t<id>``, labelled with id, name_hint, blocks and core type; join nodes are
    diamonds) and one edge per dependency, labelled with its kinds (RAW, WAW, atomic,
    explicit, join)."""
    g = program.graph
    lines = [f"digraph {_dot_str(program.name)} {{", f"  label={_dot_str(title)};", "  labelloc=t;",
             "  rankdir=TB;"]
    for t in g:
        if t.kind == "dummy":
            lines.append(f"  t{t.id} [label={_dot_str(f'#{t.id} join')}, shape=diamond];")
            continue
        nb = len({b.idx for b in t.blocks})
        label = _dot_str(f"#{t.id} {t.name}")[:-1] + f"\\n{nb} block{'s' if nb != 1 else ''}, {core_type(t)}\""
        lines.append(f"  t{t.id} [label={label}, shape=box];")
    kinds = g.edge_kinds()
    for (p, s) in sorted(kinds, key=lambda e: (e[1], e[0])):
        ks = kinds[(p, s)]
        attrs = [f"label={_dot_str(','.join(ks))}"] + [_EDGE_STYLE[k] for k in ks if k in _EDGE_STYLE][:1]
        lines.append(f"  t{p} -> t{s} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def sim_doc(sim, title: str) -> dict:
    """The figures of ``pto sim`` from a SimResult: ``kernel``, ``machine``, ``n_aic`` /
    ``n_aiv``, graph counts, ``fills`` / ``fill_bytes`` / ``fill_us`` (allocation-time
    fills on the AICPU), the AICPU windows ``orch_us`` / ``sched_us`` / ``effective_us``,
    ``makespan_us`` (last block on a core), ``critical_path`` (``tasks``, ``us``, ``ids``:
    task ids on it, ``names``: every node on it, fills as ``"fill <buffer>"`` and a binding
    submission as ``"submit <task>"``) and ``utilisation`` (``aic`` / ``aiv``, busy
    fraction of the effective window)."""
    m = sim.machine
    return {"kernel": title, "machine": m.name, "n_aic": m.n_aic, "n_aiv": m.n_aiv, "tasks": sim.tasks,
            "join_nodes": sim.dummies, "edges": sim.edges, "blocks": sim.blocks, "fills": sim.fills,
            "fill_bytes": sim.fill_bytes, "fill_us": sim.fill_us, "orch_us": sim.orch_us, "sched_us": sim.sched_us,
            "effective_us": sim.effective_us, "makespan_us": sim.makespan_us,
            "critical_path": {"tasks": sim.critical_path_tasks, "us": sim.critical_path_us,
                              "ids": list(sim.critical_path_ids), "names": list(sim.critical_path)},
            "utilisation": {"aic": sim.utilisation.get("aic", 0.0), "aiv": sim.utilisation.get("aiv", 0.0)}}


def sim_task_rows(sim, program) -> list[dict]:
    """Per task of a simulated schedule, by id: ``id``, ``name``, ``core`` (the core
    types its blocks ran on: ``"AIC"``, ``"AIV"``, ``"AIC+AIV"``, ``"-"`` for a join node
    or an empty task), ``ready_us`` (submitted, predecessors done, buffers available),
    ``start_us`` (first block), ``end_us`` (last block), ``slack_us`` and
    ``critical`` (on the critical path).

    Slack is how much later the task could end without moving the end of the schedule
    (``sched_us``), holding every other task's ready-to-end time fixed (its dispatch and
    any wait for a core included) and ignoring core contention: a backward pass over the
    graph, latest end = min over successors of (their latest end - (their end - their
    ready)), ``sched_us`` for a task without successors; slack = latest end - end (>= 0).
    The successors are the graph's and the tasks that waited for ring-heap bytes the task
    released (``sim.reuse_succs``), so a task on the critical path has no slack."""
    tasks = program.graph.tasks
    spans = sim.task_spans
    cores: dict = {}
    for r in sim.runs:
        cores.setdefault(r.task, set()).add(r.core_type.upper())
    succs = program.graph.succs()
    reuse = sim.reuse_succs
    latest: dict = {}
    for t in reversed(tasks):
        ready, start, end = spans[t.id]
        le = sim.sched_us
        for s in (succs[t.id] if t.id not in reuse else set(succs[t.id]) | set(reuse[t.id])):
            s_ready, _, s_end = spans[s]
            le = min(le, latest[s] - (s_end - s_ready))
        latest[t.id] = max(le, end)
    on_path = set(sim.critical_path_ids)
    rows = []
    for t in tasks:
        ready, start, end = spans[t.id]
        c = cores.get(t.id)
        rows.append({"id": t.id, "name": t.name, "core": "+".join(sorted(c)) if c else "-", "ready_us": ready,
                     "start_us": start, "end_us": end, "slack_us": latest[t.id] - end, "critical": t.id in on_path})
    return rows
