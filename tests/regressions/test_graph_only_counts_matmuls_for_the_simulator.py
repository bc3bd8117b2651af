"""Graph-only mode counted no matmuls (``Block.mm`` stayed 0 in the shape-only matmul), so the
simulator charged no cube-op latency to graph-only programs (the MoE block and the decode step
of bench_sim_device): every block counter must equal a real run's."""

import torch

import pto
import pto.models.deepseek_v4  # noqa: F401 - fills the registry
from pto.golden import ScalarSpec, get_case
from pto.runtime.simulate import simulate


def _shape_only(v):
    keep = not isinstance(v, torch.Tensor) or (not v.dtype.is_floating_point and v.dtype not in (torch.int8, torch.uint8))
    return v if keep else torch.empty(v.shape, dtype=v.dtype, device="meta")


def test_graph_only_block_counters_equal_a_real_run():
    cr = get_case("hc_pre").build("tiny", "decode")
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    real = cr.fn.run(*vals, config=pto.RunConfig())
    go = cr.fn.run(*[_shape_only(v) for v in vals], config=pto.RunConfig(execute=False))

    def counts(p):
        return [(t.name, b.idx, b.ops, b.ld, b.st, b.mm, b.vk, b.cube) for t in p.graph.tasks for b in t.blocks]

    assert counts(go) == counts(real)
    assert sum(b.mm for t in go.graph.tasks for b in t.blocks) > 0
    assert simulate(go, "a2a3").effective_us == simulate(real, "a2a3").effective_us
