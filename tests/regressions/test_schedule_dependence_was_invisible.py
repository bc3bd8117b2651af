"""Regression: nothing showed whether a kernel's result depends on the schedule.

The CPU runs one valid schedule (blocks in index order, atomic adds as issued), so a
kernel whose split-K atomic accumulation order changes its rounding looked exactly as
stable as one that reduces its partials in a fixed order; the reference library's long
decode drift came from such an order. Now ``RunConfig(block_order="reverse" |
"shuffle", block_order_seed=k)`` runs the blocks of every SPMD task in another order and
applies the atomic adds of tasks the graph leaves unordered in another order, and
``pto.golden.schedule.schedule_sensitivity`` / ``pto check KERNEL --block-order shuffle``
compare every output bit for bit with program order, naming the outputs that depend on
the schedule, by how much (max abs, ulps) and through which atomic-add task.
"""

import pytest
import torch

import pto
import pto.language as pl
from pto.cli import main
from pto.errors import ConfigError
from pto.golden import get_case
from pto.golden.schedule import schedule_sensitivity, ulp_distance

KB = 8  # K blocks


@pl.jit
def splitk_atomic(x: pl.Tensor[[16, 32 * KB], pl.FP32], w: pl.Tensor[[32 * KB, 32], pl.FP32],
                  y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    acc = pl.create_tensor([16, 32], pl.FP32, init_value=0)
    for kb in pl.spmd(KB, name_hint="splitk"):
        part = pl.matmul(x[0:16, kb * 32:kb * 32 + 32], w[kb * 32:kb * 32 + 32, :])
        pl.assemble(acc, part, [0, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="out"):
        y[0:16, :] = acc[0:16, :]


@pl.jit
def splitk_fixed_order(x: pl.Tensor[[16, 32 * KB], pl.FP32], w: pl.Tensor[[32 * KB, 32], pl.FP32],
                       y: pl.Out[pl.Tensor[[16, 32], pl.FP32]]):
    partials = pl.create_tensor([KB * 16, 32], pl.FP32)  # one slot per K block
    for kb in pl.spmd(KB, name_hint="splitk_partials"):
        partials[kb * 16:kb * 16 + 16, :] = pl.matmul(x[0:16, kb * 32:kb * 32 + 32], w[kb * 32:kb * 32 + 32, :])
    with pl.at(name_hint="reduce_in_k_order"):
        acc = partials[0:16, :]
        for kb in pl.range(1, KB):
            acc = acc + partials[kb * 16:kb * 16 + 16, :]
        y[0:16, :] = acc


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 32 * KB, generator=g) * 100, torch.randn(32 * KB, 32, generator=g), torch.zeros(16, 32)


@pytest.mark.parametrize("order", ["reverse", "shuffle"])
def test_split_k_atomics_depend_on_the_schedule_fixed_order_does_not(order):
    rep = schedule_sensitivity(splitk_atomic, list(_inputs()), order, seed=1)
    (y,) = rep.outputs
    assert not rep.stable and not y.identical and y.differing > 0 and 0 < y.max_abs < 1e-2 and y.max_ulps >= 1
    assert y.through == ["'splitk' (#0)"] and rep.reordered == ["'splitk' (#0)"]
    blocks = [b.idx for b in rep.reordered_program.graph[0].blocks]
    assert sorted(blocks) == list(range(KB)) and blocks != list(range(KB))
    rep = schedule_sensitivity(splitk_fixed_order, list(_inputs()), order, seed=1)
    assert rep.stable and rep.outputs[0].identical and rep.outputs[0].max_ulps == 0 and rep.reordered == []
    assert [b.idx for b in rep.reordered_program.graph[0].blocks] != list(range(KB))  # the blocks did move


def _three_adders(chain: bool):
    """Three one-block tasks atomically add +1, +1e8, -1e8 into one FP32 element: in
    program order (1 + 1e8) - 1e8 = 0 in FP32; applied in reverse, (-1e8 + 1e8) + 1 = 1."""
    @pl.jit
    def adders(y: pl.Out[pl.Tensor[[1, 16], pl.FP32]]):
        acc = pl.create_tensor([1, 16], pl.FP32, init_value=0)
        prev = None
        for v in (1.0, 1e8, -1e8):
            with pl.at(name_hint="add", deps=[prev] if chain and prev is not None else None) as tid:
                pl.assemble(acc, pl.full([1, 16], pl.FP32, v), [0, 0], atomic=pl.AtomicType.Add)
            prev = tid
        with pl.at(name_hint="read"):
            y[0:1, :] = acc[0:1, :]
    return adders


def test_unordered_atomic_tasks_are_applied_in_another_order_ordered_ones_are_not():
    y = torch.zeros(1, 16)
    _three_adders(False).run(y, config=pto.RunConfig(check=True))
    assert bool((y == 0).all())
    _three_adders(False).run(y, config=pto.RunConfig(check=True, block_order="reverse"))
    assert bool((y == 1).all())
    _three_adders(True).run(y, config=pto.RunConfig(check=True, block_order="reverse"))  # deps chain: kept
    assert bool((y == 0).all())


def test_ulp_distance_and_config_validation():
    a = torch.tensor([1.0, -0.0, -1.0], dtype=torch.float32)
    b = torch.nextafter(a, torch.tensor(2.0))
    assert ulp_distance(a, b).tolist() == [1, 1, 1]
    assert ulp_distance(torch.tensor([0.0]), torch.tensor([-0.0])).tolist() == [0]
    for bad in ({"block_order": "sideways"}, {"block_order_seed": 1.5}):
        with pytest.raises(ConfigError, match="block_order"):
            pto.RunConfig(**bad).validate()


def _case_args(name, mode):
    cr = get_case(name).build("tiny", mode)
    torch.manual_seed(0)
    return cr.fn, [s.to_python() if hasattr(s, "to_python") else s.create_tensor() for s in cr.specs]


def test_hc_pre_comb_depends_on_the_split_k_order():
    fn, args = _case_args("hc_pre", "decode")
    rep = schedule_sensitivity(fn, args, "shuffle", seed=0)
    comb = next(o for o in rep.outputs if o.name == "comb")
    assert not comb.identical and 0 < comb.max_abs < 1e-6 and comb.max_ulps >= 1
    assert comb.through == ["'hc_pre_linear' (#1)"]


def test_qkv_proj_rope_kv_depends_on_the_kv_proj_split_k_order():
    fn, args = _case_args("qkv_proj_rope", "prefill")
    rep = schedule_sensitivity(fn, args, "shuffle", seed=2)
    by = {o.name: o for o in rep.outputs}
    assert not by["kv"].identical and by["kv"].max_ulps >= 1 and by["kv"].through == ["'kv_proj_matmul' (#5)"]


def test_cli_block_order(capsys):
    assert main(["check", "hc_pre", "--preset", "tiny", "--mode", "decode", "--block-order", "shuffle"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "│ comb " in ln)
    assert " no " in row and "'hc_pre_linear' (#1)" in row
    assert "schedule-sensitive: comb depend(s) on the order of the atomic adds of 'hc_pre_linear' (#1)" in out
    assert main(["check", f"{__file__}:splitk_fixed_order", "--block-order", "reverse"]) == 0
    assert "bit-stable: every output is the same under block order reverse" in capsys.readouterr().out
