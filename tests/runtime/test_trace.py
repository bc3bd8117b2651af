"""Trace export: the JSON follows the Trace Event Format (complete, metadata and
flow events), tracks are monotonic, core tracks never overlap, only tracks that
ran something are named, and the flow events are the task graph's edges."""

import json

import torch

import pto.language as pl
from pto.runtime import RunConfig
from pto.runtime.simulate import simulate
from pto.runtime.trace import cpu_trace, sim_trace, write_trace

_NUM = (int, float)
_EPS = 1e-6  # µs


def validate_trace(obj, core_tracks=True):
    """Check ``obj`` against the Trace Event Format (JSON object form):
    required keys and types per phase, named processes and threads, per-track
    monotonic timestamps and, on core tracks, no overlapping spans."""
    assert isinstance(obj, dict) and isinstance(obj["traceEvents"], list)
    assert obj.get("displayTimeUnit", "ms") in ("ms", "ns")
    procs, threads, tracks = set(), set(), {}
    for ev in obj["traceEvents"]:
        assert isinstance(ev, dict)
        assert isinstance(ev["ph"], str) and isinstance(ev["name"], str) and isinstance(ev["pid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "thread_sort_index", "process_sort_index")
            assert isinstance(ev["args"], dict)
            if ev["name"].endswith("_name"):
                assert isinstance(ev["args"]["name"], str)
            else:
                assert isinstance(ev["args"]["sort_index"], int)
            if ev["name"].startswith("thread"):
                assert isinstance(ev["tid"], int)
                threads.add((ev["pid"], ev["tid"]))
            else:
                procs.add(ev["pid"])
        elif ev["ph"] == "X":
            assert isinstance(ev["tid"], int)
            assert isinstance(ev["ts"], _NUM) and not isinstance(ev["ts"], bool) and ev["ts"] >= 0
            assert isinstance(ev["dur"], _NUM) and not isinstance(ev["dur"], bool) and ev["dur"] >= 0
            assert isinstance(ev.get("cat", ""), str)
            assert isinstance(ev.get("args", {}), dict)
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["dur"]))
        elif ev["ph"] in ("s", "f"):  # flow events: one start and one finish per id
            assert isinstance(ev["id"], int) and isinstance(ev["ts"], _NUM) and isinstance(ev["tid"], int)
            assert ev["cat"] == "dep" and (ev["ph"] == "s" or ev["bp"] == "e")
        else:
            raise AssertionError(f"unexpected phase {ev['ph']!r}")
    assert threads == set(tracks), "a named track without spans, or spans on an unnamed track"
    flows = [ev for ev in obj["traceEvents"] if ev["ph"] in ("s", "f")]
    for ev in flows:  # every flow end lies on a track, at the start of one of its spans
        assert (ev["pid"], ev["tid"]) in tracks and any(t0 == ev["ts"] for t0, _ in tracks[(ev["pid"], ev["tid"])])
    for key, spans in tracks.items():
        assert key[0] in procs, f"process {key[0]} has no process_name"
        assert key in threads, f"track {key} has no thread_name"
        for (t0, d0), (t1, _) in zip(spans, spans[1:]):
            assert t1 >= t0, f"track {key} not monotonic"
            if core_tracks:
                assert t1 >= t0 + d0 - _EPS, f"track {key}: spans overlap"
    assert json.loads(json.dumps(obj)) == obj
    return tracks


@pl.jit
def _kernel(x: pl.Tensor[[32, 64], pl.BF16], w: pl.Tensor[[64, 64], pl.BF16],
            y: pl.Out[pl.Tensor[[240, 64], pl.FP32]]):
    acc = pl.create_tensor([32, 64], pl.FP32, init_value=0)
    for k in pl.spmd(2, name_hint="partial"):
        part = pl.matmul(x[0:32, k * 32:(k + 1) * 32], w[k * 32:(k + 1) * 32, 0:64])
        pl.assemble(acc, part, [0, 0], atomic=pl.AtomicType.Add)
    for i in pl.range(3):
        for b in pl.spmd(30, name_hint="epilogue"):
            r = b % 4
            y[b * 8:(b + 1) * 8, 0:64] = pl.exp(acc[r * 8:(r + 1) * 8, 0:64])
    return y


def _program(keep=True, check=False):
    return _kernel.run(torch.randn(32, 64).bfloat16(), torch.randn(64, 64).bfloat16(), torch.zeros(240, 64),
                       config=RunConfig(keep_footprints=keep, check=check))


def test_cpu_trace(tmp_path):
    p = _program()
    tr = cpu_trace(p)
    tracks = validate_trace(tr)
    assert len(tracks) == 1
    spans = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["partial", "epilogue", "epilogue", "epilogue"]
    assert [e["args"]["task_id"] for e in spans] == [0, 1, 2, 3]
    assert spans[0]["args"]["footprints"] == ["read x[0:32, 0:64]", "read w[0:64, 0:64]",
                                              "atomic_add acc[0:32, 0:64]"]
    assert spans[0]["dur"] == p.graph.tasks[0].wall_ns / 1e3
    out = tmp_path / "cpu.json"
    write_trace(tr, str(out))
    assert json.loads(out.read_text()) == tr


def test_sim_trace_one_track_per_core():
    p = _program()
    r = simulate(p, "a2a3")
    tr = sim_trace(r, p)
    tracks = validate_trace(tr)
    names = {e["tid"]: e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "thread_name"}
    used = {(r.core_type, r.core) for r in r.runs}
    assert len(names) == len(used) + 2  # only the cores that ran a block, and the two AICPU streams
    assert names[0] == "AIC 00" and names[24] == "AIV 00"
    assert names[72] == "AICPU orchestrator (submit, init_value fill)" and names[73] == "AICPU scheduler (dispatch)"
    spans = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    # blocks, one fill, and a submission and a dispatch per task
    assert len(spans) == len(r.runs) + len(r.fill_runs) + len(r.aicpu_runs) == 2 + 90 + 1 + 2 * 4
    assert [e["name"] for e in spans if e["tid"] == 73] == ["dispatch partial"] + ["dispatch epilogue"] * 3
    assert [e["name"] for e in spans if e["tid"] == 72] == ["fill acc", "submit partial"] + ["submit epilogue"] * 3
    assert {e["tid"] for e in spans if e["name"] == "partial"} <= set(range(24))
    assert {e["tid"] for e in spans if e["name"] == "epilogue"} <= set(range(24, 72))
    # 30 blocks on 48 vector cores: 30 tracks, one block per task each
    assert sum(1 for (pid, tid) in tracks if 24 <= tid < 72) == 30
    blk = next(e for e in spans if e["name"] == "epilogue" and e["args"]["block"] == 5)
    assert blk["args"]["footprints"] == ["read acc[8:16, 0:64]", "write y[40:48, 0:64]"]
    assert blk["args"]["buffers"] == {"acc": {"read": 8 * 64 * 4}, "y": {"write": 8 * 64 * 4}}
    assert blk["args"]["footprint_scope"] == "block"
    fill = next(e for e in spans if e["cat"] == "init")
    assert fill["name"] == "fill acc" and fill["args"]["bytes"] == 32 * 64 * 4


def test_sim_trace_falls_back_to_task_footprints():
    p = _program(keep=False)
    tr = sim_trace(simulate(p, "a5"), p)
    validate_trace(tr)
    blk = next(e for e in tr["traceEvents"] if e["ph"] == "X" and e["name"] == "epilogue")
    assert blk["args"]["footprint_scope"] == "task"
    assert blk["args"]["footprints"] == ["read acc[0:32, 0:64]", "write y[0:240, 0:64]"]
    assert blk["args"]["buffers"] == {"acc": {"read": 32 * 64 * 4}, "y": {"write": 240 * 64 * 4}}


def test_traces_of_a_check_mode_run():
    p = _program(keep=False, check=True)  # check mode keeps block footprints and proves the kernel race-free
    validate_trace(cpu_trace(p))
    tr = sim_trace(simulate(p, "a2a3"), p)
    validate_trace(tr)
    assert all(e["args"]["footprint_scope"] == "block" for e in tr["traceEvents"]
               if e["ph"] == "X" and e["cat"] in ("cube", "vector"))


def test_cli_trace_and_sim(tmp_path, capsys):
    from pto.cli import main
    out = tmp_path / "sim.json"
    assert main(["trace", "example_splitk_matmul", "--out", str(out), "--simulate", "a2a3"]) == 0
    tr = json.loads(out.read_text())
    validate_trace(tr)
    assert tr["otherData"]["machine"] == "a2a3"
    out2 = tmp_path / "cpu.json"
    assert main(["trace", "example_splitk_matmul", "--out", str(out2)]) == 0
    validate_trace(json.loads(out2.read_text()))
    assert main(["sim", "example_splitk_matmul", "--machine", "a5"]) == 0
    assert "critical path: fill acc -> submit splitk_mm -> splitk_mm -> copy_out" in capsys.readouterr().out
    assert main(["sim", "example_splitk_matmul", "--machine", "z9"]) == 2
    assert "unknown machine 'z9'" in capsys.readouterr().err


def _flow_edges(tr) -> dict:
    """{(from, to): name} of the flow events, checking that each id has one start and one finish."""
    starts = {e["id"]: e for e in tr["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in tr["traceEvents"] if e["ph"] == "f"}
    assert set(starts) == set(ends)
    assert len(starts) == sum(1 for e in tr["traceEvents"] if e["ph"] == "s")
    out = {}
    for i, s in starts.items():
        assert (s["args"], s["name"]) == (ends[i]["args"], ends[i]["name"])
        out[(s["args"]["from"], s["args"]["to"])] = s["name"]
    return out


@pl.jit
def _joined(x: pl.Tensor[[32, 64], pl.FP32], y: pl.Out[pl.Tensor[[32, 64], pl.FP32]]):
    with pl.at(name_hint="top") as a:
        y[0:16, :] = x[0:16, :]
    s = pl.spmd(2, name_hint="bottom")
    for b in s:
        y[16 + 8 * b:24 + 8 * b, :] = x[16 + 8 * b:24 + 8 * b, :]
    j = pl.system.task_dummy(deps=[a, s.tid])
    with pl.at(name_hint="after", deps=[j]):
        y[:, :] = y[:, :] + 1.0
    return y


def test_flow_events_are_the_graph_edges():
    for prog in (_program(), _joined.run(torch.randn(32, 64), torch.zeros(32, 64),
                                         config=RunConfig(keep_footprints=True))):
        kinds = prog.graph.edge_kinds()
        want = {e: ",".join(k) for e, k in kinds.items()}
        assert len(want) == prog.stats.edges
        for tr in (cpu_trace(prog), sim_trace(simulate(prog, "a2a3"), prog)):
            validate_trace(tr)
            assert _flow_edges(tr) == want
    tr = sim_trace(simulate(prog, "a2a3"), prog)
    names = {e["tid"]: e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "thread_name"}
    assert "join nodes (task_dummy)" in names.values()
    assert want == {(0, 2): "explicit,join", (1, 2): "explicit,join", (2, 3): "explicit,join", (0, 3): "RAW,WAW",
                    (1, 3): "RAW,WAW"}
