"""decode_compressor_ratio128 scattered every token of a step before pooling: with S = 2 at
positions 127, 128 and a state ring of exactly one window per request, position 128's row
landed on the ring page of positions 0..7 and the pool of window 0..127 read it (kernel and
golden alike). The step now scatters and pools in token order."""

import torch

import pto
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_compressor_ratio128 import (COMPRESSOR_ARGS, decode_compressor_ratio128_kernels,
                                                               golden_decode_compressor_ratio128,
                                                               make_decode_compressor_inputs)
from pto.models.deepseek_v4.prefill_compressor_ratio128 import golden_prefill_compressor_ratio128

TINY = get_config("tiny")


def _run(d):
    v = {n: d[n].clone() for n in ("kv", "compress_state", "cmp_kv")}
    decode_compressor_ratio128_kernels(TINY).decode_compressor_ratio128_test.run(
        *[v.get(n, d[n]) for n in COMPRESSOR_ARGS], config=pto.RunConfig(check=True))
    return v["kv"], v["cmp_kv"], v["compress_state"]


def test_next_window_row_on_the_same_ring_page_is_not_pooled():
    """Kernel, decode golden and the prefill golden (window from the input state) agree on the
    entry of window 0..127 although position 128's row overwrites positions 0..7's ring page."""
    d = make_decode_compressor_inputs(TINY, (127, 5, 300, 0), 2, seed=21)
    st = d["state_block_table"]
    assert int(st[0, 128 // TINY.hca_state_block_size]) == int(st[0, 0])  # the ring wraps onto page 0
    kv, cmp_kv, state = _run(d)
    g_kv, g_cmp, g_state = golden_decode_compressor_ratio128(*(d[n] for n in COMPRESSOR_ARGS), TINY)
    p_cmp, _ = golden_prefill_compressor_ratio128(
        d["x"][:2], d["compress_state"], st[0], d["wkv"], d["wgate"], d["ape"], d["norm_w"], d["cos_table"],
        d["sin_table"], d["cmp_kv"], d["position_ids"][:2], 2, d["cmp_slot_mapping"][:2], d["state_slot_mapping"][:2],
        TINY)
    row = int(d["cmp_slot_mapping"][0])
    flat = lambda t: t.reshape(-1, TINY.head_dim)  # noqa: E731
    assert (flat(g_cmp)[row].float() - flat(p_cmp)[row].float()).abs().max() <= 2 ** -8
    assert (flat(cmp_kv)[row].float() - flat(g_cmp)[row].float()).abs().max() <= 2 ** -8
    assert torch.equal((kv != -7.0).any(dim=1), torch.tensor([True] + [False] * 7))
    assert (state - g_state).abs().max() < 1e-3
