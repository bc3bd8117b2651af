"""pto demo at a preset above the MoE kernels' max_preset (FLASH: 256 experts, 6 GiB of INT8
weights) adds the MoE block at that preset in graph-only mode as a row of its own: tasks, edges,
heap peak, no golden, not counted in the passed / total figures."""

import json

from pto import cli


def test_demo_shows_the_flash_moe_block_graph_only(capsys):
    assert cli.main(["demo", "--only", "moe", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    graph = [r for r in doc["rows"] if r["status"] == "GRAPH"]
    assert len(graph) == 1 and (doc["passed"], doc["total"], len(doc["rows"])) == (2, 2, 3)
    g = graph[0]
    assert g["mode"] == "decode T=8 layer=3 (learned) (flash preset, graph-only)"
    # (15, 20) before f93f303 split expert_routed into 2 groups x (expert_gate_up, expert_down)
    assert (g["tasks"], g["edges"], g["golden_ms"]) == (18, 26, None) and g["heap_peak_bytes"] > 0
    assert cli.main(["demo", "--only", "moe"]) == 0
    out = capsys.readouterr().out
    assert "graph-only" in out and " graph " in out and "graph: a graph-only row" in out and "2/2 passed" in out


def test_demo_at_the_cap_has_no_graph_row(capsys):
    assert cli.main(["demo", "--preset", "tiny", "--only", "moe", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(r["status"] == "PASS" for r in doc["rows"]) and doc["total"] == len(doc["rows"])
