"""Edge kinds (TaskGraph.edge_kinds): why each edge of the graph exists, from a replay of
the derivation through a fresh tracker that records kinds (deps.derive_kinds)."""

import pytest
import torch

import pto
import pto.language as pl
from pto.golden import ScalarSpec, get_case
from pto.runtime.deps import EDGE_KINDS, derive_kinds

R, C = 32, 16


def _named(p) -> dict:
    g = p.graph
    return {(g[a].name, g[b].name): ks for (a, b), ks in g.edge_kinds().items()}


@pl.jit
def every_kind(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
    acc = pl.create_tensor([R, C], pl.FP32)
    with pl.at(name_hint="seed"):
        acc[:, :] = pl.full([R, C], pl.FP32, 0.0)
    for b in pl.spmd(2, name_hint="add"):  # atomic adds after a plain writer
        pl.assemble(acc, x[:, :], [0, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="read_sum") as r:  # a plain read after atomic adds
        y[:, :] = acc[:, :]
    with pl.at(name_hint="overwrite"):  # a plain write after a plain write and atomic adds
        y[0:16, :] = x[0:16, :]
    with pl.at(name_hint="reader"):  # reads what read_sum and overwrite wrote
        t = y[:, :]
        acc[:, :] = t
    with pl.at(name_hint="side", deps=[r]) as s:
        pass
    j = pl.system.task_dummy(deps=[s])
    with pl.at(name_hint="last", deps=[j]):
        pass
    return y


def test_every_kind_of_edge():
    p = every_kind.run(torch.randn(R, C), torch.zeros(R, C))
    assert _named(p) == {
        ("seed", "add"): ("atomic",),
        ("add", "read_sum"): ("atomic",),
        ("seed", "read_sum"): ("RAW",),  # atomic adds do not replace the plain producer
        ("seed", "reader"): ("WAW",),
        ("read_sum", "overwrite"): ("WAW",),
        ("read_sum", "reader"): ("RAW",),
        ("overwrite", "reader"): ("RAW",),
        ("add", "reader"): ("atomic",),  # reader's plain write of acc waits for the atomic adders
        ("read_sum", "side"): ("explicit",),
        ("side", "task_dummy"): ("explicit", "join"),
        ("task_dummy", "last"): ("explicit", "join"),
    }
    assert set(ks for kinds in _named(p).values() for ks in kinds) <= set(EDGE_KINDS)


def test_an_edge_can_have_two_kinds():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.at(name_hint="w") as w:
            y[:, :] = x[:, :]
        with pl.at(name_hint="rw", deps=[w]):  # reads and rewrites y, and names w
            y[:, :] = y[:, :] + x[:, :]
        return y

    p = k.run(torch.randn(R, C), torch.zeros(R, C))
    assert _named(p) == {("w", "rw"): ("RAW", "WAW", "explicit")}


def test_manual_scope_edges_are_explicit_only():
    @pl.jit
    def k(x: pl.Tensor[[R, C], pl.FP32], y: pl.Out[pl.Tensor[[R, C], pl.FP32]]):
        with pl.manual_scope():
            with pl.at(name_hint="w") as w:
                y[:, :] = x[:, :]
            with pl.at(name_hint="r", deps=[w]):
                y[:, :] = y[:, :] + x[:, :]
        return y

    p = k.run(torch.randn(R, C), torch.zeros(R, C))
    assert _named(p) == {("w", "r"): ("explicit",)}


@pytest.mark.parametrize("name,mode", [("gate", "decode"), ("hc_pre", "prefill"), ("prefill_attention_swa", "prefill"),
                                       ("decode_compressor_ratio4", "decode")])
def test_replay_gives_the_derived_edges_of_a_real_kernel(name, mode):
    cr = get_case(name).build("tiny", mode)
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    p = cr.fn.run(*vals, config=pto.RunConfig())
    g = p.graph
    kinds = derive_kinds(g.tasks)
    for t in g:
        derived = t.preds - set(t.explicit) if t.kind != "dummy" else set()
        assert set(kinds.get(t.id, {})) >= derived, t
        assert set(kinds.get(t.id, {})) <= t.preds, t
    ek = g.edge_kinds()
    assert set(ek) == g.edges() and len(ek) == p.stats.edges
    assert all(ks for ks in ek.values())  # every edge has a reason
