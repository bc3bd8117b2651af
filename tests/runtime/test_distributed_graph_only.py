"""pld programs in graph-only mode (RunConfig(execute=False)), ranks as threads: shape-only
window parameters find their windows, shape-only stores travel as records; the expert-parallel
MoE and head have the tasks and edges of a real run (tiny, 2 ranks, hash routing balanced over
the ranks' experts)."""

import torch

import pto
import pto.models.deepseek_v4.graph_only  # noqa: F401 - the balanced-routing assumption
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.gate import make_gate_inputs
from pto.models.deepseek_v4.moe_ep import EPWindows, lm_head_ep_kernels, moe_ep_kernels
from pto.runtime import distributed as dist


def _counts(execute: bool, ep: int = 2, T: int = 8):
    cfg = get_config("tiny")
    D, F, E, HC, V, K = (cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.hc_mult,
                         cfg.vocab_size, cfg.num_experts_per_tok)
    EL = E // ep
    dev = "cpu" if execute else "meta"
    g = make_gate_inputs(cfg, T, seed=1)
    j = torch.arange(V)[:, None] * K + torch.arange(K)[None, :]
    tid2eid = (j * E // (ep * T * K) % E).to(torch.int32)  # route j of the run -> expert j*E/routes

    def z(*shape, dt=torch.float32):
        return torch.zeros(*shape, dtype=dt, device=dev)

    moe, head = moe_ep_kernels(cfg, ep).moe_ep_test, lm_head_ep_kernels(cfg, ep).lm_head_ep_test
    config = pto.RunConfig(heap_bytes=64 << 20, execute=execute)

    def rank(r):
        win = EPWindows(cfg)
        x = z(T, HC, D)
        w13, w2 = z(EL, F, D, dt=torch.int8), z(EL, D, F, dt=torch.int8)
        args = [z(cfg.mix_hc, HC * D), z(3), z(cfg.mix_hc), g["norm_w"], g["gate_w"], g["gate_bias"], tid2eid,
                torch.arange(r * T, (r + 1) * T), w13, z(EL, F), w13, z(EL, F), w2, z(EL, D),
                w13[0].contiguous(), z(F), w13[0].contiguous(), z(F), w2[0].contiguous(), z(D)]
        p1 = dist.run(moe, x, *args, *win.moe_args(), z(T, HC, D), 0, T, win.moe_epoch, config=config)
        p2 = dist.run(head, x, z(HC, HC * D), z(1), z(HC), g["norm_w"], z(V // ep, D, dt=torch.bfloat16),
                      *win.head_args(), z(T * ep, V), [T] * ep, win.head_epoch, config=config)
        return [(p.stats.tasks, p.stats.edges, p.stats.blocks) for p in (p1, p2)]

    return dist.run_threads(rank, ep, timeout_s=60)


def test_moe_ep_and_head_graph_only_match_a_real_run():
    real, graph = _counts(True), _counts(False)
    assert graph == real
    # 21 MoE tasks before f93f303 split expert_routed into 2 groups x (expert_gate_up, expert_down)
    assert [r[0][0] for r in graph] == [24, 24] and [r[1][0] for r in graph] == [11, 11]
