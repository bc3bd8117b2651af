"""Graph-only mode (RunConfig(execute=False)): the graph, footprints, edges and heap of a real
run without computing float data; known index data computed for real; a value read from
shape-only data raises GraphOnlyError where it would decide a footprint."""

import pytest
import torch

import pto
import pto.golden as G
import pto.language as pl
from pto.errors import BindError, ConfigError, GraphOnlyError
from pto.golden.registry import get_case
from pto.runtime import RunConfig
from pto.runtime.graph_only import assumptions, register_assumption


def _run(case: str, mode: str, execute: bool):
    cr = get_case(case).build("tiny", mode)
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, G.ScalarSpec) else s.create_tensor() for s in cr.specs]
    return cr.fn.run(*vals, config=RunConfig(execute=execute, keep_footprints=True))


def _graph(prog):
    """Everything the graph and the heap plan record, per task: name, blocks, predecessors and
    the coalesced footprints (buffer id, kind, box)."""
    return [(t.name, t.kind, len(t.blocks), sorted(t.preds), sorted((b.id, k, box) for b, k, box in t.footprints))
            for t in prog.graph.tasks]


def _stats(prog):
    s = prog.stats
    return (s.tasks, s.dummies, s.edges, s.blocks, s.heap_peak_bytes, s.scratch_bytes, s.init_bytes, s.tile_ops,
            s.bytes, s.flops)


# kernels whose footprints follow from index inputs only: graph-only equals a real run exactly
EXACT = [("hc_pre", "decode"), ("qkv_proj_rope", "prefill"), ("decode_attention_swa", "decode"),
         ("decode_attention_hca", "decode"), ("prefill_compressor_ratio4", "prefill"),
         ("decode_indexer_compressor", "decode"), ("gate", "decode"), ("expert_routed", "prefill"),
         ("moe", "decode"), ("prefill_attention_swa", "prefill"), ("hc_head", "decode"), ("lm_head", "prefill")]


@pytest.mark.parametrize("case, mode", EXACT)
def test_graph_only_equals_a_real_run(case, mode):
    real, graph = _run(case, mode, True), _run(case, mode, False)
    assert _stats(graph) == _stats(real)
    assert _graph(graph) == _graph(real)
    assert graph.stats.graph_only and not real.stats.graph_only
    assert graph.stats.tasks > 0


def test_data_dependent_kernels_keep_the_task_structure():
    """MoE learned routing (balanced by assumption) and the CSA top-k (first visible entries):
    the same tasks, edges and blocks; what differs is the work the routes and selections carry."""
    real, graph = _run("moe", "prefill", True), _run("moe", "prefill", False)
    assert (graph.stats.tasks, graph.stats.edges, graph.stats.blocks) == (real.stats.tasks, real.stats.edges,
                                                                          real.stats.blocks) == (18, 26, 62)
    # (15, 20, 46) before expert_routed's expert_ffn task became 2 groups x (expert_gate_up, expert_down): 3 more tasks per MoE block (16 more blocks: each expert's down)
    assert graph.stats.assumed_reads > 0 and graph.stats.assumed_footprints > 0
    # the expert tasks compute their valid rows only, so the total work (a sum over routed rows) is the same;
    # what the balanced assumption changes is which rows each expert group reads and writes
    assert (graph.stats.flops, graph.stats.bytes) == (real.stats.flops, real.stats.bytes)
    differ = [a[0] for a, b in zip(_graph(real), _graph(graph)) if a != b]
    assert differ == ["expert_gate_up", "expert_down"] * 2
    real, graph = _run("decode_attention_csa", "decode", True), _run("decode_attention_csa", "decode", False)
    assert (graph.stats.tasks, graph.stats.edges, graph.stats.blocks) == (real.stats.tasks, real.stats.edges,
                                                                          real.stats.blocks)
    assert graph.stats.assumed_sorts == 6  # one top-k per token row


N = 64


@pl.jit
def _branchy(x: pl.Tensor[[N, N], pl.FP32], idx: pl.Tensor[[4], pl.INT32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]],
             cnt: pl.Out[pl.Tensor[[1, 4], pl.INT32]]):
    tmp = pl.create_tensor([N, N], pl.FP32)
    rows = pl.create_tensor([1, 4], pl.INT32)
    for b in pl.spmd(4, name_hint="scale"):
        t = x[b * 16:(b + 1) * 16, 0:N]
        tmp[b * 16:(b + 1) * 16, 0:N] = pl.exp(t) * pl.read(x, [0, 0])  # a float scalar in tile math: fine
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="rows"):
        r = pl.add(idx[0:4], 16)  # known integer math on an index input
        rows[0:1, 0:4] = pl.reshape(r, [1, 4])
    for b in pl.spmd(4, name_hint="gather"):
        r0 = pl.read(rows, [0, b]) - 16  # computed for real in graph-only mode
        y[b * 16:(b + 1) * 16, 0:N] = tmp[r0:r0 + 16, 0:N]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="count"):
        cnt[0:1, 0:4] = pl.reshape(pl.add(idx[0:4], 1), [1, 4])
    return y


def _branchy_args():
    return torch.randn(N, N), torch.tensor([48, 0, 16, 32], dtype=torch.int32), torch.zeros(N, N), \
        torch.zeros(1, 4, dtype=torch.int32)


def test_index_data_is_computed_and_outputs_are_not_written():
    x, idx, y, cnt = _branchy_args()
    real = _branchy.run(x, idx, y.clone(), cnt.clone(), config=RunConfig(keep_footprints=True))
    graph = _branchy.run(x, idx, y, cnt, config=RunConfig(execute=False, keep_footprints=True))
    assert _graph(graph) == _graph(real) and _stats(graph) == _stats(real)
    assert [t.name for t in graph.graph.tasks] == ["scale", "rows", "gather", "count"]
    # gather block 0 read tmp rows 48..63 (idx[0] = 48 through the known rows tensor)
    blk0 = graph.graph.tasks[2].blocks[0]
    assert [(b.name, box) for b, box, kind in blk0.fp if kind == 0 and b.name == "tmp"] == [("tmp", (48, 64, 0, N))]
    assert torch.equal(y, torch.zeros(N, N)) and torch.equal(cnt, torch.zeros(1, 4, dtype=torch.int32))


@pl.jit
def _reads_a_float(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    for b in pl.spmd(2, name_hint="pick"):
        v = pl.read(x, [b, 0])
        if v > 0:  # a branch on float data: graph-only mode cannot decide it
            y[0:16, 0:N] = x[0:16, 0:N]
    return y


def test_a_float_value_used_as_a_branch_raises_naming_kernel_and_sites():
    x = torch.ones(N, N)
    _reads_a_float.run(x, torch.zeros(N, N))  # a real run decides it
    with pytest.raises(GraphOnlyError) as ei:
        _reads_a_float.run(x, torch.zeros(N, N), config=RunConfig(execute=False))
    msg = str(ei.value)
    assert isinstance(ei.value, pto.PtoError)
    assert "kernel _reads_a_float" in msg and "branch condition" in msg and "task 'pick' block 0" in msg
    assert "x[0, 0] (read at tests/runtime/test_graph_only.py:" in msg and "register_assumption" in msg


@pl.jit
def _routes(x: pl.Tensor[[N, N], pl.FP32], y: pl.Out[pl.Tensor[[N, N], pl.FP32]]):
    picked = pl.create_tensor([1, 4], pl.INT32, name="go_test_picked")
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="score"):
        s = pl.cast(pl.row_max(pl.transpose(x[0:N, 0:4])), pl.INT32, mode="trunc")  # data-dependent ints
        picked[0:1, 0:4] = pl.reshape(s, [1, 4])
    for b in pl.spmd(4, name_hint="use"):
        r = pl.read(picked, [0, b])
        y[r:r + 1, 0:N] = x[b:b + 1, 0:N]
    return y


def test_an_allocation_assumption_supplies_the_values_and_is_counted():
    x = torch.zeros(N, N)
    x[:4, :4] = torch.tensor([[3.0, 9, 1, 20]] * 4)
    with pytest.raises(GraphOnlyError, match="go_test_picked"):
        _routes.run(x, torch.zeros(N, N), config=RunConfig(execute=False))
    register_assumption("go_test_picked", "test_graph_only.py",
                        lambda shape, dtype, prog: torch.tensor([[3, 9, 1, 20]], dtype=dtype), "test rows")
    try:
        real = _routes.run(x, torch.zeros(N, N), config=RunConfig(keep_footprints=True))
        graph = _routes.run(x, torch.zeros(N, N), config=RunConfig(execute=False, keep_footprints=True))
        assert _graph(graph) == _graph(real)
        assert graph.stats.assumed_reads == 4  # one scalar read per block
        assert graph.stats.assumed_footprints == 12  # 4 blocks x (picked, x, y)
        assert any(a.name == "go_test_picked" for a in assumptions())
    finally:
        from pto.runtime import graph_only
        graph_only._ASSUMPTIONS.pop(("go_test_picked", "test_graph_only.py"))


def test_sort_ties_keep_index_order():
    """sort32 / mrgsort of shape-only values: the index lanes in input order (known), counted."""
    @pl.jit
    def topk(x: pl.Tensor[[1, 64], pl.FP32], out: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="topk"):
            pairs = pl.mrgsort(pl.sort32(x[0:1, 0:64], pl.arange(0, [1, 64], pl.UINT32)), block_len=64)
            idx = pl.gather(pl.slice(pairs, [1, 16], [0, 0]), mask_pattern=pl.MaskPattern.P1010,
                            output_dtype=pl.INT32)
            out[0:1, 0:8] = idx
            pl.write(out, [0, 0], pl.read(idx, [0, 7]))  # known: a scalar of the index lanes
        return out
    prog = topk.run(torch.randn(1, 64), torch.zeros(1, 8, dtype=torch.int32), config=RunConfig(execute=False))
    assert prog.stats.assumed_sorts == 1 and prog.stats.tasks == 1


def test_graph_only_config_checks():
    with pytest.raises(ConfigError, match="execute"):
        RunConfig(execute=False, check=True).validate()
    with pytest.raises(ConfigError, match="execute"):
        RunConfig(execute="no").validate()
    x, idx, y, cnt = _branchy_args()
    with pytest.raises(BindError, match="shape-only"):
        _branchy.run(torch.empty(N, N, device="meta"), idx, y, cnt)
    graph = _branchy.run(torch.empty(N, N, device="meta"), idx, y, cnt, config=RunConfig(execute=False))
    assert graph.stats.tasks == 4
