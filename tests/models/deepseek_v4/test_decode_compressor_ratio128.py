"""decode_compressor_ratio128 (pypto-lib `models/deepseek/v4-flash/decode_compressor_ratio128.py`) at the tiny preset.

The kernel against its golden in check mode over start sets crossing 127/128/255/256 with
S = 1 and 2 and an inactive request; a step at (start_pos + 1) % 128 == 0 writes exactly one
compressed row and one kv row, every other step none (sentinel-filled caches keep their
bits); the golden against the prefill compressor golden (a different code path: per-token
windows overlaid on the input state) on the same tokens; contract errors.
"""

import pytest
import torch

import pto
from pto.errors import BindError
from pto.golden import get_case, run_jit
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_compressor_ratio128 import (COMPRESSOR_ARGS, decode_compressor_ratio128_kernels,
                                                               golden_decode_compressor_ratio128,
                                                               make_decode_compressor_inputs)
from pto.models.deepseek_v4.prefill_compressor_ratio128 import golden_prefill_compressor_ratio128

TINY = get_config("tiny")


def _run(d, check=True):
    v = {n: d[n].clone() for n in ("kv", "compress_state", "cmp_kv")}
    decode_compressor_ratio128_kernels(TINY).decode_compressor_ratio128_test.run(
        *[v.get(n, d[n]) for n in COMPRESSOR_ARGS], config=pto.RunConfig(check=check))
    return v["kv"], v["cmp_kv"], v["compress_state"]


@pytest.mark.parametrize("opts", [{}, {"start_pos": (0, 1, 127, 300)}, {"start_pos": (126, -1, 255, 383)},
                                  {"start_pos": (127, 128, 255, 256), "S": 1},
                                  {"start_pos": (126, 254, 2, 382), "reverse_tables": True}])
def test_kernel_matches_golden(opts):
    cr = get_case("decode_compressor_ratio128").build("tiny", "decode", **opts)
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)  # check mode
    assert res.passed, res.error
    assert res.outputs["cmp_kv"].stats["max_abs"] <= 2 ** -8


@pytest.mark.parametrize("start,S,closing", [((126, 5, 40, -1), 2, [1]), ((127, 5, 40, 300), 1, [0]),
                                             ((5, 300, 128, 0), 2, []), ((254, 126, 0, -1), 2, [1, 3])])
def test_exactly_the_closing_tokens_write(start, S, closing):
    d = make_decode_compressor_inputs(TINY, start, S, seed=4)
    kv, cmp_kv, state = _run(d)
    rows_changed = (cmp_kv != d["cmp_kv"]).any(dim=-1).flatten().nonzero().flatten().tolist()
    want = sorted(int(d["cmp_slot_mapping"][t]) for t in closing)
    assert rows_changed == want
    assert [t for t in range(kv.shape[0]) if (kv[t] != -7.0).any()] == closing  # kv: partial output
    assert all((kv[t] == -7.0).all() for t in range(kv.shape[0]) if t not in closing)
    slots = d["state_slot_mapping"]
    changed = (state != d["compress_state"]).any(dim=-1).flatten().nonzero().flatten()
    assert set(changed.tolist()) <= set(slots[slots >= 0].tolist())


def test_golden_matches_prefill_compressor_golden():
    """One request, S = 2 crossing the window end at 127: the decode golden equals the prefill
    golden run on the same two tokens with the request's table row."""
    d = make_decode_compressor_inputs(TINY, (126,), 2, seed=9)
    kv, cmp_kv, state = golden_decode_compressor_ratio128(*(d[n] for n in COMPRESSOR_ARGS), TINY)
    p_cmp, p_state = golden_prefill_compressor_ratio128(
        d["x"], d["compress_state"], d["state_block_table"][0], d["wkv"], d["wgate"], d["ape"], d["norm_w"],
        d["cos_table"], d["sin_table"], d["cmp_kv"], d["position_ids"], 2, d["cmp_slot_mapping"],
        d["state_slot_mapping"], TINY)
    assert torch.equal(state, p_state)
    assert (cmp_kv.float() - p_cmp.float()).abs().max() <= 2 ** -8
    assert int((cmp_kv != d["cmp_kv"]).any(dim=-1).sum()) == 1


def test_contract_errors():
    d = make_decode_compressor_inputs(TINY, (5, 300, 128, 0), 2, seed=1)
    bad = dict(d, cmp_slot_mapping=d["cmp_slot_mapping"].clone())
    bad["cmp_slot_mapping"][0] = 3  # position 5 does not close a window
    with pytest.raises(BindError, match="does not close"):
        _run(bad)
    with pytest.raises(BindError, match="does not close"):
        golden_decode_compressor_ratio128(*(bad[n] for n in COMPRESSOR_ARGS), TINY)
    bad = dict(d, state_slot_mapping=d["state_slot_mapping"].clone())
    bad["state_slot_mapping"][2] += 1
    with pytest.raises(BindError, match="not the state row"):
        _run(bad)


@pytest.mark.slow
def test_flash():
    cr = get_case("decode_compressor_ratio128").build("flash", "decode", start_pos=(8190, 127, 128, 255))
    res = run_jit(cr.fn, cr.specs, cr.golden, cr.compare, cr.rtol, cr.atol)
    assert res.passed, res.error

