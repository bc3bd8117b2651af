"""What a kernel author sees (pto.views and the CLI): Graphviz DOT parsed with a real
parser, JSON documents that round-trip and carry the table's figures, the per-task
table of a simulated schedule, footprint filters."""

import json
import re
from pathlib import Path

import pytest

from pto import cli

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pydot on newer pyparsing

EDGE_KINDS_KERNEL = f"{Path(__file__).resolve().parent / 'runtime' / 'test_edge_kinds.py'}:every_kind"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def program(spec, *opts):
    t = cli.resolve_target(spec, "tiny" if ":" not in spec else None, None, cli.parse_options(opts))
    return t.run_program(check=False)


def table_rows(out: str) -> list[list[str]]:
    """The cells of every body row of a rich box table."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in out.splitlines()
            if line.startswith("│")]


@pytest.mark.parametrize("spec", ["prefill_attention_swa", EDGE_KINDS_KERNEL])
def test_dot_parses_and_has_the_graph_nodes_and_edges(capsys, spec):
    pydot = pytest.importorskip("pydot")
    args = [spec] + (["--preset", "tiny"] if ":" not in spec else [])
    code, out, _ = run_cli(capsys, "graph", *args, "--dot")
    assert code == 0
    (g,) = pydot.graph_from_dot_data(out)
    prog = program(spec)
    nodes = [n for n in g.get_nodes() if n.get_name() not in ("node", "edge", "graph")]
    assert len(nodes) == len(prog.graph.tasks) == prog.stats.tasks + prog.stats.dummies
    edges = g.get_edges()
    assert len(edges) == prog.stats.edges
    kinds = prog.graph.edge_kinds()
    got = {(int(e.get_source()[1:]), int(e.get_destination()[1:])): e.get_label().strip('"') for e in edges}
    assert got == {k: ",".join(v) for k, v in kinds.items()}
    for n in nodes:
        t = prog.graph[int(n.get_name()[1:])]
        label = n.get_label().strip('"')
        assert label.startswith(f"#{t.id} ") and (t.kind == "dummy" or t.name in label)


def test_dot_of_every_edge_kind(capsys):
    code, out, _ = run_cli(capsys, "graph", EDGE_KINDS_KERNEL, "--dot")
    assert code == 0
    assert 't5 -> t6 [label="explicit,join", style="dashed"];' in out
    assert 't0 -> t1 [label="atomic", color="blue"];' in out
    assert "shape=diamond" in out


def test_graph_json_round_trips_and_matches_the_table(capsys):
    code, out, _ = run_cli(capsys, "graph", "prefill_attention_swa", "--preset", "tiny", "--json")
    assert code == 0
    doc = json.loads(out)
    assert json.loads(json.dumps(doc)) == doc
    prog = program("prefill_attention_swa")
    assert (doc["tasks"], doc["join_nodes"], doc["edges"]) == (prog.stats.tasks, prog.stats.dummies,
                                                               prog.stats.edges)
    assert len(doc["nodes"]) == len(prog.graph.tasks) and len(doc["edge_list"]) == prog.stats.edges
    code, table, _ = run_cli(capsys, "graph", "prefill_attention_swa", "--preset", "tiny")
    assert f"{doc['tasks']} tasks, {doc['join_nodes']} join node, {doc['edges']} edges" in table  # 1 join node
    rows = [r for r in table_rows(table) if r[0]]
    assert [int(r[0]) for r in rows] == [n["id"] for n in doc["nodes"]]
    for r, n in zip(rows, doc["nodes"]):
        assert r[1:5] == [n["name"], n["kind"], str(n["blocks"]), n["core"]]


def test_footprints_filtered_by_buffer_and_task(capsys):
    code, out, _ = run_cli(capsys, "graph", "example_splitk_matmul", "--buffer", "acc", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["nodes"] and all(f["buffer"] == "acc" for n in doc["nodes"] for f in n["footprints"])
    assert {n["name"] for n in doc["nodes"]} == {"splitk_mm", "copy_out"}
    kinds = {(n["name"], f["kind"]) for n in doc["nodes"] for f in n["footprints"]}
    assert kinds == {("splitk_mm", "atomic_add"), ("copy_out", "read")}
    code, out, _ = run_cli(capsys, "graph", "example_splitk_matmul", "--task", "copy_out")
    assert code == 0 and "copy_out" in out and "splitk_mm" not in out.split("copy_out", 1)[0].split("┩")[-1]
    assert len([r for r in table_rows(out) if r[0]]) == 1
    code, _, err = run_cli(capsys, "graph", "example_splitk_matmul", "--buffer", "nope")
    assert code == 2 and "--buffer 'nope'" in err and "acc" in err
    code, _, err = run_cli(capsys, "graph", "example_splitk_matmul", "--task", "nope")
    assert code == 2 and "splitk_mm" in err


def test_run_json_matches_the_table(capsys):
    code, out, _ = run_cli(capsys, "run", "example_splitk_matmul", "--json")
    assert code == 0
    doc = json.loads(out)
    s = doc["stats"]
    assert doc["kernel"] == "example_splitk_matmul default"
    assert (s["tasks"], s["edges"], s["heap_peak_bytes"]) == (2, 1, 16384)
    code, table, _ = run_cli(capsys, "run", "example_splitk_matmul")
    rows = dict(r[:2] for r in table_rows(table))
    assert rows["tasks"] == str(s["tasks"]) and rows["edges"] == str(s["edges"])
    assert rows["blocks"] == str(s["blocks"]) and rows["tile ops"] == str(s["tile_ops"])
    assert rows["heap peak"] == cli.fmt_bytes(s["heap_peak_bytes"]) and rows["flops"] == f"{s['flops']:,}"
    assert rows["GM bytes moved"] == cli.fmt_bytes(s["gm_bytes"])


def test_sim_tasks_table_and_json(capsys):
    code, out, _ = run_cli(capsys, "sim", "hc_pre", "--preset", "tiny", "--tasks", "--json")
    assert code == 0
    doc = json.loads(out)
    prog = program("hc_pre")
    tt = doc["task_table"]
    assert [r["id"] for r in tt] == [t.id for t in prog.graph]
    for r in tt:
        assert r["ready_us"] <= r["start_us"] <= r["end_us"] and r["slack_us"] >= 0
        t = prog.graph[r["id"]]
        assert r["core"] == ("AIC" if t.cube else "AIV")
    on_path = [r["id"] for r in tt if r["critical"]]
    assert on_path == doc["critical_path"]["ids"] and on_path
    assert tt[-1]["slack_us"] == 0 or any(r["end_us"] == doc["sched_us"] for r in tt if r["slack_us"] == 0)
    for r in tt:  # a predecessor never ends after its successor's latest start
        for s in tt:
            if r["id"] in prog.graph[s["id"]].preds:
                assert r["end_us"] + r["slack_us"] <= s["end_us"] + s["slack_us"] - (s["end_us"] - s["ready_us"]) + 1e-9
    # the critical path is the longest chain with unlimited cores and an idle scheduler (simulate.py); slack is
    # measured against the schedule's end, which dispatch and core waits can push past that chain's length
    cp_us = doc["critical_path"]["us"]
    assert cp_us <= doc["sched_us"] + 1e-9
    last = max(tt, key=lambda r: r["end_us"])
    assert last["end_us"] == pytest.approx(doc["sched_us"]) and last["slack_us"] < 1e-9
    if cp_us == pytest.approx(doc["sched_us"]):  # the chain sets the end: none of its tasks has slack
        assert all(r["slack_us"] < 1e-9 for r in tt if r["critical"])
    code, table, _ = run_cli(capsys, "sim", "hc_pre", "--preset", "tiny", "--tasks")
    rows = [r for r in table_rows(table) if len(r) == 8]
    assert len(rows) == len(tt)
    for r, d in zip(rows, tt):
        assert r == [str(d["id"]), d["name"], d["core"], f"{d['ready_us']:.2f}", f"{d['start_us']:.2f}",
                     f"{d['end_us']:.2f}", f"{d['slack_us']:.2f}", "*" if d["critical"] else ""]
    names = {t.id: t.name for t in prog.graph}
    assert "critical path (ids): " + " -> ".join(f"#{i} {names[i]}" for i in doc["critical_path"]["ids"]) in table
    assert "critical path: " + " -> ".join(doc["critical_path"]["names"]) in table
    stats = dict(r[:2] for r in table_rows(table) if len(r) == 2)
    assert stats["effective (union)"] == f"{doc['effective_us']:.2f} us"
    assert stats["AIV utilisation"] == f"{doc['utilisation']['aiv']:.1%}"


def test_check_json_matches_the_pass_line(capsys):
    code, out, _ = run_cli(capsys, "check", "gate", "--preset", "tiny", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] and doc["golden"] and doc["error"] is None
    assert [o["name"] for o in doc["outputs"]] == ["x_norm_i8", "x_norm_scale", "indices", "weights"]
    x = doc["outputs"][0]
    assert x["metric"] == "fraction outside atol + rtol*|e| / max_error_ratio" and x["margin"] == 0.0
    code, line, _ = run_cli(capsys, "check", "gate", "--preset", "tiny")
    assert line.startswith(f"PASS gate decode: max error {cli.fmt_err(doc['max_abs_error'])}, {doc['tasks']} "
                           f"tasks, {doc['edges']} edges, heap peak {cli.fmt_bytes(doc['heap_peak_bytes'])}")



def test_check_json_of_the_drop_init_sweep_and_the_block_order_check(capsys):
    code, out, _ = run_cli(capsys, "check", "example_splitk_matmul", "--drop-init", "all", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["passed"], doc["caught"], doc["total"]) == (True, 1, 1)
    (a,) = doc["allocations"]
    assert (a["name"], a["init_value"], a["caught"], a["by"]) == ("acc", 0, True, "UndefinedOutputError")
    code, table, _ = run_cli(capsys, "check", "example_splitk_matmul", "--drop-init", "all")
    assert f"{doc['caught']} of {doc['total']} init_value(s) load-bearing" in table
    assert [r[:5] for r in table_rows(table)] == [[a["name"], a["site"], "0", "yes", a["by"]]]
    code, out, _ = run_cli(capsys, "check", "example_splitk_matmul", "--block-order", "reverse", "--json")
    assert code == 0
    doc = json.loads(out)
    (o,) = doc["outputs"]
    assert (doc["order"], doc["stable"], o["name"], o["identical"]) == ("reverse", False, "c", False)
    code, table, _ = run_cli(capsys, "check", "example_splitk_matmul", "--block-order", "reverse")
    assert table_rows(table)[0][:5] == ["c", "no", f"{o['differing']}/{o['numel']}", cli.fmt_err(o["max_abs"]),
                                        str(o["max_ulps"])]


def test_demo_json_matches_the_table(capsys):
    code, out, err = run_cli(capsys, "demo", "--preset", "tiny", "--only", "hc_pre", "--only", "example_add",
                             "--json")
    assert code == 0 and err == ""  # no progress display with --json
    doc = json.loads(out)
    assert (doc["passed"], doc["total"]) == (3, 3)
    r = doc["rows"][0]
    assert (r["kernel"], r["status"], r["tasks"], r["edges"]) == ("hc_pre", "PASS", 5, 5)
    assert r["golden_ms"] >= 0 and r["kernel_ms"] > 0
    assert [o["name"] for o in r["outputs"]] == ["x_mixed", "post", "comb"]
    assert all(o["margin"] is not None and o["margin"] <= 1 for o in r["outputs"])
    code, table, _ = run_cli(capsys, "demo", "--preset", "tiny", "--only", "hc_pre", "--only", "example_add")
    lines = [ln for ln in table.splitlines() if ln.startswith(" hc_pre") or "└" in ln]
    assert re.split(r"\s{2,}", lines[0].strip())[:5] == ["hc_pre", "decode T=8", "5", "5",
                                                       cli.fmt_bytes(r["heap_peak_bytes"])]
    sub = [re.split(r"\s+", ln.strip()) for ln in lines[1:4]]
    for cells, o in zip(sub, r["outputs"]):
        assert cells[:5] == ["└", o["name"], cli.fmt_err(o["error"]), cli.fmt_err(o["tolerance"]),
                             f"{o['margin']:.2f}"]
    assert "3/3 passed" in table


def test_json_writes_non_finite_numbers_as_strings():
    from pto.views import to_json
    assert json.loads(to_json({"a": float("inf"), "b": [float("nan")], "c": (1, 2)})) == {"a": "inf", "b": ["nan"],
                                                                                      "c": [1, 2]}


def test_demo_shows_live_progress_on_a_terminal():
    import os
    import subprocess
    import sys
    env = dict(os.environ, FORCE_COLOR="1", PTO_THREADS="1")  # rich treats stderr as a terminal
    out = subprocess.run([sys.executable, "-m", "pto.cli", "demo", "--group", "example"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0
    # a bar redrawn in place ("\x1b[2K": erase the line) from 0 of 5 runs to 5 of 5
    assert "\x1b[2K" in out.stderr and "0/5" in out.stderr and "5/5" in out.stderr
    assert "passed in" in out.stdout


def test_diff_json_matches_the_table(capsys):
    args = ("diff", "example_splitk_matmul", "--opt", "seed_scopes=True")
    code, out, _ = run_cli(capsys, *args, "--json")
    assert code == 0
    doc = json.loads(out)
    f = doc["figures"]
    assert doc["variants"] == ["base", "seed_scopes=True"] and f["tasks"] == [2, 3] and doc["outputs"] == {"c": True}
    (fs,) = doc["fill_vs_seed"]
    assert fs["buffer"] == "acc" and fs["bytes"] == 16384
    code, table, _ = run_cli(capsys, *args)
    rows = {r[0]: r[1:3] for r in table_rows(table)}
    assert rows["tasks"] == [str(v) for v in f["tasks"]] and rows["edges"] == [str(v) for v in f["edges"]]
    assert rows["effective (union)"] == [f"{v:.2f} us" for v in f["effective_us"]]
    assert rows["heap peak"] == [cli.fmt_bytes(v) for v in f["heap_peak_bytes"]]
