"""Task graphs of the decode blocks, the decode cores and prefill_attention_hca at the tiny
preset: exact task and edge counts of both variants (seed_scopes adds hc_pre's and
qkv_proj_rope's zero-fill tasks, and the compressor's in prefill), and the orderings the
blocks rely on: the new token's cache row and the compressed row written in this step are
written before the attention gathers them."""

import functools

import pytest
import torch

import pto
from pto.golden import ScalarSpec, get_case

# (kernel, mode, seed_scopes): (tasks, edges)
EXPECTED = {
    ("decode_sparse_attn_swa", "decode", False): (17, 19),
    ("decode_sparse_attn_hca", "decode", False): (17, 19),
    ("decode_compressor_ratio128", "decode", False): (3, 2),
    ("decode_attention_swa", "decode", False): (34, 46),
    ("decode_attention_swa", "decode", True): (37, 53),
    ("decode_attention_hca", "decode", False): (38, 53),
    ("decode_attention_hca", "decode", True): (41, 60),
    ("prefill_attention_hca", "prefill", False): (67, 147),
    ("prefill_attention_hca", "prefill", True): (71, 156),
}


@functools.lru_cache(maxsize=None)
def _program(name, mode, seed_scopes):
    cr = get_case(name).build("tiny", mode, **({"seed_scopes": True} if seed_scopes else {}))
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    return cr.fn.run(*vals, config=pto.RunConfig())


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_task_and_edge_counts(key):
    prog = _program(*key)
    assert (prog.stats.tasks, prog.stats.edges) == EXPECTED[key]


def _task(prog, name):
    (t,) = [t for t in prog.graph.tasks if t.name == name]
    return t


def _reaches(prog, src, dst) -> bool:
    """A path src -> dst in the recorded graph (predecessor walk from dst)."""
    by_id = {t.id: t for t in prog.graph.tasks}
    todo, seen = [dst.id], set()
    while todo:
        tid = todo.pop()
        if tid == src.id:
            return True
        if tid not in seen:
            seen.add(tid)
            todo.extend(by_id[tid].preds)
    return False


@pytest.mark.parametrize("name", ["decode_attention_swa", "decode_attention_hca"])
def test_cache_and_compressed_writes_precede_the_gather(name):
    prog = _program(name, "decode", False)
    gather = _task(prog, "decode_gather_kv")
    assert _reaches(prog, _task(prog, "decode_cache_write"), gather)
    assert _reaches(prog, _task(prog, "decode_window_indices"), gather)
    if name.endswith("hca"):
        assert _reaches(prog, _task(prog, "decode_hca_c128_rmsnorm_rope_cache_write"), gather)
        assert _reaches(prog, _task(prog, "decode_cmp_indices"), _task(prog, "decode_build_bias"))
    seeds = [t.name for t in _program(name, "decode", True).graph.tasks if t.name.endswith("_seed")]
    assert seeds == ["hc_pre_seed", "qr_proj_seed", "kv_proj_seed"]
