"""decode_step_graph(ep=N, rank=r): one expert-parallel rank's decode step in graph-only mode
through EPModel's own step (ranks as threads) has the tasks and edges per program of a real EP2
decode step of the kernel model (seeded tiny checkpoint)."""

import pytest
import torch

from pto.errors import ConfigError
from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
from pto.models.deepseek_v4.config import get_deployment
from pto.models.deepseek_v4.graph_only import balanced_routes, decode_step_graph, spread_hash_table
from pto.models.deepseek_v4.weights import open_checkpoint
from pto.runtime import distributed as dist


def _per_program(g) -> dict:
    """Stage figures of an EP rank's step summed per program name, as KernelStats counts them."""
    out = {}
    for s in g.stages:
        if s.name == "embedding":
            name = "lookup_embedding"
        elif s.name in ("hc_head", "lm_head"):
            name = "lm_head_ep"
        elif s.name.endswith(" moe"):
            name = "moe_ep"
        else:
            name = "decode_attention_" + s.name.rsplit(" ", 1)[1]
        t, e = out.get(name, (0, 0))
        out[name] = (t + s.tasks, e + s.edges)
    return out


def test_ep2_rank_graphs_match_a_real_ep2_decode_step(tmp_path):
    from pto.models.deepseek_v4.ep_model import EPModel

    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=6)
    dep = get_deployment("tiny").replace(max_context=64, rope_max_pos=64)

    def rank(r):
        model = EPModel(open_checkpoint(ck, "int8"), dep)
        states = [model.new_state() for _ in range(4)]  # round robin: 2 requests per rank
        for i, st in enumerate(states):
            model.forward(list(range(5 + i, 25 + i)), st)  # 20 tokens of context each
        before = (dict(model.stats.tasks), dict(model.stats.edges))
        model.decode([3, 4, 5, 6], states)
        return {k: (model.stats.tasks[k] - before[0].get(k, 0), model.stats.edges[k] - before[1].get(k, 0))
                for k in model.stats.tasks if model.stats.tasks[k] != before[0].get(k, 0)}

    real = dist.run_threads(rank, 2, timeout_s=600)
    cfg = open_checkpoint(ck, "int8").config
    for r in range(2):
        g = decode_step_graph(cfg, dep, ep=2, rank=r, batch=2, seq=1, context=20)
        assert (g.ep, g.rank, g.tokens, g.program) == (2, r, 2, None)
        assert _per_program(g) == real[r]
        assert g.stats.tasks == sum(t for t, _e in real[r].values())
        # every layer's moe_ep with the exchange (every rank's experts receive routes): 24 tasks
        # (expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block)
        assert [s.tasks for s in g.stages if s.name.endswith(" moe")] == [24] * cfg.num_hidden_layers


def test_ep_routes_spread_over_every_rank():
    # FLASH EP2: 8 rows x 6 routes per rank, 96 routes over 256 experts: rank 1's land on 128..255
    assert balanced_routes(8, 6, 256, rank=1, ranks=2).min() >= 128
    assert balanced_routes(8, 6, 256, rank=0, ranks=2).max() < 128
    # more routes than experts: consecutive, mod E (a row's experts distinct)
    r = balanced_routes(8, 6, 16, rank=1, ranks=2)
    assert r[0].tolist() == [0, 1, 2, 3, 4, 5] and all(len(set(x)) == 6 for x in r.tolist())
    assert torch.equal(balanced_routes(8, 6, 256), balanced_routes(8, 6, 256, rank=0, ranks=1))
    t = spread_hash_table(32, 4, 16, routes=16)
    assert t[:4].flatten().tolist() == list(range(16))


def test_ep_rank_errors():
    with pytest.raises(ConfigError, match=r"rank must be an int from 0 to 1, got 2"):
        decode_step_graph("tiny", ep=2, rank=2)
    with pytest.raises(Exception, match="ep"):
        decode_step_graph("tiny", ep=3)


def test_cli_model_graph_ep(capsys):
    import json

    from pto import cli
    assert cli.main(["graph", "--model", "tiny", "--ep", "2", "--rank", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ep"], doc["rank"], doc["tokens"]) == (2, 1, 8)
    # 386 before expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block
    assert doc["stats"]["tasks"] == sum(s["tasks"] for s in doc["stages"]) == 404
    assert cli.main(["graph", "--model", "tiny", "--stage", "prefill", "--ep", "2"]) == 2
    assert "only with --stage decode" in capsys.readouterr().err


@pytest.mark.slow
def test_flash_ep2_rank_step():
    g = decode_step_graph("flash", ep=2, rank=1)
    by = {k.name: k for k in g.by_kind()}
    # 3351 / 43 * 21 before expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block
    assert g.stats.tasks == 3351 + 43 * 3 and by["moe"].tasks == 43 * 24 and by["lm_head"].tasks + by["hc_head"].tasks == 11
    assert sum(k.tasks for n, k in by.items() if n.startswith("attention")) == 2436
