"""Seed task vs allocation-time initialisation, on the recorded graphs at the
tiny preset: exact task and edge counts of each variant, and the initialised
variant has no fill task (its zero-fill is part of the allocation)."""

import functools

import pytest
import torch

import pto
from pto.golden import ScalarSpec, all_cases
from pto.runtime.simulate import simulate

# (kernel, mode): ((tasks, edges) with seed_scopes=True, (tasks, edges) with init_value, seed task names)
EXPECTED = {
    ("hc_pre", "decode"): ((6, 8), (5, 5), ["hc_pre_seed"]),
    ("hc_pre", "prefill"): ((6, 8), (5, 5), ["hc_pre_seed"]),
    ("qkv_proj_rope", "decode"): ((9, 11), (7, 7), ["qr_proj_seed", "kv_proj_seed"]),
    ("qkv_proj_rope", "prefill"): ((9, 11), (7, 7), ["qr_proj_seed", "kv_proj_seed"]),
    ("prefill_attention_swa", "prefill"): ((62, 138), (60, 136),
                                           ["prefill_swa_dummy_cmp_table", "prefill_swa_empty_cmp_meta"]),
    ("prefill_compressor_ratio128", "prefill"): ((7, 9), (6, 7), ["prefill_hca_c128_norm_pad_init"]),
}

SEED_CASES = [(c.name, m) for c in all_cases("model") if c.seed_variant for m in c.modes]


@functools.lru_cache(maxsize=None)
def _run(name, mode, seed_scopes):
    case = next(c for c in all_cases("model") if c.name == name)
    cr = case.build("tiny", mode, seed_scopes=seed_scopes)
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    return cr.fn.run(*vals, config=pto.RunConfig())


def _fill_tasks(prog):
    """Tasks that only write scratch buffers and read nothing: explicit fills."""
    return [t.name for t in prog.graph.tasks
            if t.kind != "dummy" and t.footprints and all(k == 1 and b.kind == "scratch" for b, k, _ in t.footprints)]


@pytest.mark.parametrize("name,mode", sorted(EXPECTED))
def test_seed_and_init_graph_counts(name, mode):
    if (name, mode) not in SEED_CASES:
        pytest.skip(f"{name} is not registered with a seed variant")
    (s_tasks, s_edges), (i_tasks, i_edges), seed_tasks = EXPECTED[(name, mode)]
    seeded, init = _run(name, mode, True), _run(name, mode, False)
    assert (seeded.stats.tasks, seeded.stats.edges) == (s_tasks, s_edges)
    assert (init.stats.tasks, init.stats.edges) == (i_tasks, i_edges)
    assert _fill_tasks(seeded) == seed_tasks
    assert _fill_tasks(init) == []
    assert [t.name for t in seeded.graph.tasks if t.name not in seed_tasks] == [t.name for t in init.graph.tasks]


@pytest.mark.parametrize("name,mode", SEED_CASES)
def test_every_seed_kernel_replaces_fill_tasks_by_allocation_fills(name, mode):
    """Holds for every registered seed kernel, also those not yet in EXPECTED."""
    ps, pi = _run(name, mode, True), _run(name, mode, False)
    fills = _fill_tasks(ps)
    assert fills and _fill_tasks(pi) == []
    assert pi.stats.tasks == ps.stats.tasks - len(fills)
    assert pi.stats.edges < ps.stats.edges
    seeded, init = simulate(ps, "a2a3"), simulate(pi, "a2a3")
    assert init.fills > seeded.fills
