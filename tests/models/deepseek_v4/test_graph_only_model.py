"""The whole forward step in graph-only mode (graph_only.py): per-stage figures that add up to
the program's, the same graph as layer_kernels' forward program and as a real decode step of
the kernel model, FLASH-size builds (slow), and the pto graph --model / --graph-only CLI."""

import json

import pytest
import torch

from pto import cli
from pto.errors import ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_config, get_deployment, kernel_config
from pto.models.deepseek_v4.graph_only import (REFERENCE_DECODE_TASKS, attention_weight_shapes, balanced_routes,
                                                decode_step_graph, moe_graph, prefill_graph)
from pto.models.deepseek_v4.layer import KernelModel
from pto.models.deepseek_v4.weights import attention_inputs, open_checkpoint


def _totals(g):
    st = g.stats
    return st.tasks, st.edges, st.blocks


def _check_stages(g):
    """The stages partition the program: tasks, edges and blocks add up, the heap peak is the
    stages' maximum, and the stage list follows the layer schedule."""
    s = g.stages
    assert (sum(x.tasks for x in s), sum(x.edges for x in s), sum(x.blocks for x in s)) == _totals(g)
    assert max(x.heap_peak_bytes for x in s) == g.stats.heap_peak_bytes
    fam = {0: "swa", 4: "csa", 128: "hca"}
    want = ["embedding"] + [n for i, r in enumerate(g.cfg.compress_ratios)
                            for n in (f"L{i} attention {fam[r]}", f"L{i} moe")] + ["hc_head", "lm_head"]
    assert [x.name for x in s] == want
    kinds = {k.name: k for k in g.by_kind()}
    assert sum(k.tasks for k in kinds.values()) == g.stats.tasks
    assert kinds["moe"].kernels["layers"] == g.cfg.num_hidden_layers


def test_balanced_routes():
    r = balanced_routes(8, 6, 256)
    assert r.dtype == torch.int32 and r.shape == (8, 6)
    assert len(set(r.flatten().tolist())) == 48  # 48 routes on 48 distinct experts
    counts = torch.bincount(balanced_routes(128, 4, 16).flatten(), minlength=16)
    assert counts.tolist() == [32] * 16
    assert all(len(set(row)) == 6 for row in balanced_routes(100, 6, 16).tolist())


def test_attention_weight_shapes_match_the_checkpoint_conversion(tmp_path):
    ck = open_checkpoint(write_tiny_checkpoint(tmp_path / "tiny", seed=1), "int8")
    cfg = ck.config
    for ratio in (0, 4, 128):
        w = attention_inputs(ck, list(cfg.compress_ratios).index(ratio))
        want = attention_weight_shapes(cfg, ratio)
        assert {k: (tuple(v.shape), v.dtype) for k, v in w.items()} == want


def test_tiny_decode_step_stages_and_the_plain_forward_program():
    g = decode_step_graph("tiny")
    assert (g.tokens, g.requests, g.context) == (8, 4, 512)
    _check_stages(g)
    plain = decode_step_graph("tiny", staged=False)
    assert _totals(plain) == _totals(g) and plain.stats.heap_peak_bytes == g.stats.heap_peak_bytes
    assert [t.name for t in plain.program.graph.tasks] == [t.name for t in g.program.graph.tasks]
    # the top-k of 2 CSA layers x 8 token rows and of the 3 learned-routing gates (one block each)
    assert g.stats.assumed_sorts == 2 * 8 + 3 and g.stats.assumed_reads > 0
    text = "\n".join(g.summary())
    assert "attention csa" in text and "total" in text and str(REFERENCE_DECODE_TASKS) not in text


def test_decode_step_graph_has_the_tasks_and_edges_of_a_real_decode_step(tmp_path):
    """A real KernelModel decode step (seeded tiny checkpoint, 2 requests after a 20-token
    prefill) and the graph-only build of the same geometry: identical tasks and edges."""
    dep = get_deployment("tiny").replace(max_context=128, rope_max_pos=128)
    km = KernelModel(open_checkpoint(write_tiny_checkpoint(tmp_path / "tiny", seed=2), "int8"), dep)
    st = [km.new_state(), km.new_state()]
    for s in st:
        km.forward(list(range(5, 25)), s)
    km.decode([3, 4], st)
    g = decode_step_graph(km.cfg, dep, batch=2, seq=1, context=20)
    assert g.stats.tasks == km.stats.tasks["decode_fwd"]
    assert g.stats.edges == km.stats.edges["decode_fwd"]
    assert g.stats.heap_peak_bytes == km.stats.heap_peak_bytes["decode_fwd"]


def test_moe_graph():
    g = moe_graph("tiny")
    # 15 and 3 before expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block
    assert g.stats.tasks == 18 and [s.name for s in g.stages] == ["L3 moe"]
    assert g.stages[0].kernels["expert_routed"] == 6
    ffn = [t for t in g.program.graph.tasks if t.name == "expert_down"]
    assert len(ffn) == 2 and sum(len(t.blocks) for t in ffn) == 16  # 8 rows x 4 routes on all 16 experts, 2 rows each
    assert g.stats.assumed_reads > 0


def test_step_builds_in_two_threads_keep_their_own_stages():
    import threading
    out = {}

    def build(k):
        out[k] = decode_step_graph("tiny", context=64 * (k + 1))

    ts = [threading.Thread(target=build, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g in out.values():
        _check_stages(g)
    assert out[0].context == 64 and out[1].context == 128


def test_tiny_prefill_graph():
    g = prefill_graph("tiny", tokens=64)
    assert (g.tokens, g.requests, g.context) == (64, 1, 0)
    _check_stages(g)


def test_decode_step_graph_errors():
    with pytest.raises(ConfigError, match=r"rank must be an int from 0 to 1, got 5"):
        decode_step_graph("tiny", ep=2, rank=5)
    with pytest.raises(Exception, match="max_context"):
        decode_step_graph("tiny", context=5000)


def test_cli_model_graph_and_graph_only(capsys):
    assert cli.main(["graph", "--model", "tiny", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stage"] == "decode" and doc["stats"]["graph_only"] is True
    assert sum(s["tasks"] for s in doc["stages"]) == doc["stats"]["tasks"]
    assert cli.main(["graph", "--model", "tiny", "--layers"]) == 0
    out = capsys.readouterr().out
    assert "L2 attention csa" in out and "L5 moe" in out and "assumptions:" in out
    assert cli.main(["graph", "--model", "tiny", "--stage", "prefill", "--tokens", "32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["stage"], doc["tokens"]) == ("prefill", 32) and "reference_tasks" not in doc
    assert cli.main(["graph", "--model", "tiny", "--stage", "moe"]) == 0
    assert "tiny MoE block, graph-only: 8 tokens, 16 experts" in capsys.readouterr().out
    assert cli.main(["graph", "--model", "tiny", "--dot"]) == 2
    assert "takes no kernel" in capsys.readouterr().err
    assert cli.main(["run", "hc_pre", "--preset", "tiny", "--graph-only", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stats"]["graph_only"] is True and doc["stats"]["tasks"] == 5
    assert cli.main(["graph", "hc_pre", "--preset", "tiny", "--graph-only"]) == 0
    assert "(graph-only)" in capsys.readouterr().out
    assert cli.main(["sim", "hc_pre", "--preset", "tiny", "--graph-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 5


@pytest.mark.slow
def test_flash_decode_step_builds():
    g = decode_step_graph("flash")
    cfg = kernel_config(get_config("flash"), get_deployment("flash"))
    assert g.cfg == cfg and (g.tokens, g.requests, g.context) == (8, 4, 4096)
    _check_stages(g)
    by_name = {s.name: s for s in g.stages}
    # every layer of one attention family has the same tasks; every MoE block too
    for fam in ("swa", "csa", "hca"):
        assert len({s.tasks for s in g.stages if s.name.endswith(f"attention {fam}")}) == 1
    assert len({s.tasks for s in g.stages if s.name.endswith(" moe")}) == 1
    # balanced routing: 48 routes on 48 distinct experts, per layer 4 expert_down blocks each (2 tasks)
    ffn = [t for t in g.program.graph.tasks if t.name == "expert_down"]
    assert len(ffn) == 2 * 43 and sum(len(t.blocks) for t in ffn) == 43 * 48 * 4
    assert by_name["L2 attention csa"].tasks > by_name["L3 attention hca"].tasks > 0
    assert g.stats.tasks < REFERENCE_DECODE_TASKS
    assert g.stats.assumed_sorts == 21 * 8 + 43 - cfg.num_hash_layers  # CSA top-k rows, learned gates


@pytest.mark.slow
def test_flash_moe_block_builds():
    g = moe_graph("flash")
    ffn = [t for t in g.program.graph.tasks if t.name == "expert_down"]
    assert g.stats.tasks == 18 and sum(len(t.blocks) for t in ffn) == 48 * 4  # 15 before the column split


@pytest.mark.slow
def test_flash_prefill_builds():
    g = prefill_graph("flash")
    assert (g.tokens, g.requests) == (128, 1)
    _check_stages(g)
    ffn = [t for t in g.program.graph.tasks if t.name == "expert_down"]
    assert len(ffn) == 2 * 43 and sum(len(t.blocks) for t in ffn) == 43 * 256 * 4  # 768 routes: 3 rows per expert
