"""The indexer key compressors (prefill and decode) against their goldens (tiny; FLASH slow).

Compare functions are the module's TOLERANCES (pypto-lib `models/deepseek/v4-flash/prefill_indexer_compressor.py`; the pypto-lib tests' tolerances): idx_kv_cache
ratio_allclose(1, 0, 0.01), idx_kv_scale (1e-4, 1/128, 0.01), compress_state (1e-3, 1e-3, 0).
"""

import pytest
import torch

import pto
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.prefill_compressor_ratio4 import golden_ratio4_compress
from pto.models.deepseek_v4.prefill_indexer_compressor import (
    _ARG_ORDER as ARGS,
    golden_prefill_indexer_compressor,
    make_prefill_indexer_compressor_inputs,
    prefill_indexer_compressor_entry,
)

from dsv4_checks import compressor_chunk

TINY = get_config("tiny")


def inputs(T, start_pos=0, num_tokens=None, state_pages=65):
    d = make_prefill_indexer_compressor_inputs(TINY, T, start_pos, T if num_tokens is None else num_tokens, 0,
                                               state_pages)
    return {k: d[k] for k in ARGS}


def run(d, *, check=True, max_cmp_writes=None):
    entry = prefill_indexer_compressor_entry(TINY, max_cmp_writes)
    args = [d[k].clone() if isinstance(d[k], torch.Tensor) else d[k] for k in ARGS]
    prog = entry.run(*args, config=pto.RunConfig(check=check))
    return tuple(args[ARGS.index(k)] for k in ("idx_kv_cache", "idx_kv_scale", "compress_state")) + (prog,)


def chunk(d, lo, hi, prev=None):
    out = compressor_chunk({k: v for k, v in d.items()}, lo, hi)
    for k in ("idx_slot_mapping",):
        out[k] = d[k][lo:hi]
    if prev is not None:
        out["idx_kv_cache"], out["idx_kv_scale"], out["compress_state"] = prev
    return out


@pytest.mark.parametrize("case, mode, opts", [
    ("prefill_indexer_compressor", "prefill", {}),
    ("prefill_indexer_compressor", "prefill", {"start_pos": 6, "T": 37}),
    ("prefill_indexer_compressor", "prefill", {"start_pos": 3, "num_tokens": 50}),
    ("decode_indexer_compressor", "decode", {}),
    ("decode_indexer_compressor", "decode", {"num_tokens": 3}),
])
def test_registry_cases_match_golden(case, mode, opts):
    cr = get_case(case).build("tiny", mode, **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=True)
    assert res.passed, res


def test_keys_dequantise_to_the_rotated_entries():
    """Golden keys times scales reproduce ``bf16(entry) @ hadamard`` within half an INT8 step."""
    d = inputs(20, start_pos=2)
    cache, scale, _ = golden_prefill_indexer_compressor(**d, cfg=TINY)
    entries, dst, _ = golden_ratio4_compress(*[d[k] for k in ARGS if k not in ("hadamard", "idx_kv_cache",
                                                                                "idx_kv_scale")],
                                             cfg=TINY, fn="t")
    want = entries.to(torch.bfloat16).double() @ d["hadamard"].double()
    got = cache.view(-1, TINY.index_head_dim)[dst].double() * scale.view(-1, 1)[dst].double()
    step = want.abs().amax(dim=1, keepdim=True) / 127
    assert bool(((got - want).abs() <= 0.5 * step + 1e-2 * want.abs()).all())


def test_float32_mode_with_an_orthonormal_hadamard_keeps_dot_products():
    d = inputs(16)
    H = torch.linalg.qr(torch.randn(TINY.index_head_dim, TINY.index_head_dim, dtype=torch.float64))[0]
    d = dict(d, hadamard=H.float(), idx_kv_cache=d["idx_kv_cache"].float())
    cache, scale, _ = golden_prefill_indexer_compressor(**d, cfg=TINY, float32=True)
    d_id = dict(d, hadamard=torch.eye(TINY.index_head_dim))
    plain, _, _ = golden_prefill_indexer_compressor(**d_id, cfg=TINY, float32=True)
    dst = d["idx_slot_mapping"][d["idx_slot_mapping"] >= 0]
    k_rot, k = cache.view(-1, TINY.index_head_dim)[dst].double(), plain.view(-1, TINY.index_head_dim)[dst].double()
    assert torch.allclose(k_rot @ k_rot.T, k @ k.T, rtol=1e-5, atol=1e-5)
    assert bool((scale.view(-1)[dst] == 1).all())


def test_split_100_156_equals_one_call_bit_for_bit():
    d = inputs(256, state_pages=80)
    one = run(d, check=False, max_cmp_writes=64)[:3]
    a = run(chunk(d, 0, 100), check=False, max_cmp_writes=64)[:3]
    b = run(chunk(d, 100, 256, a), check=False, max_cmp_writes=64)[:3]
    assert all(torch.equal(x, y) for x, y in zip(one, b))


def test_task_names_and_no_initialised_scratch():
    *_, prog = run(inputs(24, start_pos=5))
    assert [t.name for t in prog.graph.tasks] == [
        "prefill_idx_c4_write_map", "prefill_idx_c4_kv_score_proj", "prefill_idx_c4_state_scatter",
        "prefill_idx_c4_softmax_pool", "prefill_idx_c4_rmsnorm_rope", "prefill_idx_c4_kv_hadamard",
        "prefill_idx_c4_cache_write"]
    assert prog.stats.init_bytes == 0


@pytest.mark.slow
@pytest.mark.parametrize("case, mode", [("prefill_indexer_compressor", "prefill"),
                                        ("decode_indexer_compressor", "decode")])
def test_flash_matches_golden(case, mode):
    cr = get_case(case).build("flash", mode)
    res = run_jit(cr.fn, cr.specs, cr.golden, compare_fn=cr.compare, check=False)
    assert res.passed, res
