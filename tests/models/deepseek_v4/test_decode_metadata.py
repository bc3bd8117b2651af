"""Decode metadata (decode_metadata.py) at the tiny preset: the in-kernel window and
compressed index tasks against the torch builders, and the builders against hand-computed
rows (start of a sequence, window boundary, positions crossing 127/128/255/256, inactive
requests, S = 1 and 2, per-request tables)."""

import pytest
import torch

import pto
from pto.errors import BindError
from pto.models.deepseek_v4.config import get_config
from pto.models.deepseek_v4.decode_metadata import (decode_block_tables, decode_cmp_slot_mapping,
                                                    decode_metadata_kernels, decode_positions,
                                                    golden_decode_cmp_indices, golden_decode_window_indices,
                                                    hca_cmp_cols, make_decode_metadata, page_rows)

TINY = get_config("tiny")
W, BS = TINY.sliding_window, TINY.block_size


def _kernel_windows(pos, table):
    out = torch.zeros(pos.shape[0], W, dtype=torch.int32)
    decode_metadata_kernels(TINY).decode_window_indices_test.run(pos, table, out, config=pto.RunConfig(check=True))
    return out


def _kernel_cmp(pos):
    k = decode_metadata_kernels(TINY)
    out = torch.zeros(pos.shape[0], k.n_cmp_cols, dtype=torch.int32)
    k.decode_cmp_indices_test.run(pos, out, config=pto.RunConfig(check=True))
    return out


def test_positions_token_major_with_inactive_request():
    assert decode_positions([5, -1, 0], 2).tolist() == [5, 6, -1, -1, 0, 1]
    assert decode_positions([7, 3], 1).tolist() == [7, 3]


@pytest.mark.parametrize("S", [1, 2])
def test_window_rows_hand_computed(S):
    start = [0, 1, 127, 300]
    tables = decode_block_tables(TINY, start, S)
    meta = make_decode_metadata(TINY, start, S, tables["block_table"])
    pos, win, slot = meta["position_ids"], meta["swa_indices"], meta["ori_slot_mapping"]
    tab = tables["block_table"].long()
    for t in range(len(start) * S):
        p, b = int(pos[t]), t // S
        lo = max(0, p - W + 1)
        want = [int(tab[b, k // BS]) * BS + k % BS for k in range(lo, p + 1)]
        assert win[t, :len(want)].tolist() == want, t
        assert (win[t, len(want):] == -1).all(), t  # window not yet full at the start
        assert int(win[t, len(want) - 1]) == int(slot[t])  # own key is the last valid column
    assert torch.equal(_kernel_windows(pos, tables["block_table"]), win)


def test_window_inactive_rows_and_missing_pages():
    start = [300, -1, 64, 3]
    tables = decode_block_tables(TINY, start, 2)
    table = tables["block_table"].clone()
    table[0, 300 // BS - 1] = -1  # page of keys 288..303 minus one: keys 272..287 evicted
    meta = make_decode_metadata(TINY, start, 2, table)
    win = meta["swa_indices"]
    assert (win[2:4] == -1).all() and (meta["ori_slot_mapping"][2:4] == -1).all()
    missing = win[0, :W] == -1
    assert int(missing.sum()) == 16 and (win[0, ~missing] >= 0).all()  # exactly the evicted page
    assert torch.equal(_kernel_windows(meta["position_ids"], table), win)


def test_cmp_indices_cross_window_boundaries():
    pos = torch.tensor([126, 127, 127, 128, 254, 255, 255, 256], dtype=torch.int32)
    idx = golden_decode_cmp_indices(pos, hca_cmp_cols(TINY))
    n_vis = (idx >= 0).sum(dim=1).tolist()
    assert n_vis == [0, 1, 1, 1, 1, 2, 2, 2]  # w < (p + 1) // 128, per token of an S = 2 step
    assert idx[5, :2].tolist() == [0, 1] and (idx[5, 2:] == -1).all()
    assert torch.equal(_kernel_cmp(pos), idx)
    inactive = torch.tensor([-1, -1, 383, 384], dtype=torch.int32)
    assert torch.equal(_kernel_cmp(inactive), golden_decode_cmp_indices(inactive, hca_cmp_cols(TINY)))
    assert (_kernel_cmp(inactive)[:2] == -1).all()


def test_cmp_slot_mapping_only_at_closing_tokens():
    start = [126, 127, 254, 0]
    tables = decode_block_tables(TINY, start, 2, reverse=True)
    pos = decode_positions(start, 2)
    slots = decode_cmp_slot_mapping(pos, tables["cmp_block_table"], TINY)
    ct = tables["cmp_block_table"].long()
    # positions 126,127 | 127,128 | 254,255 | 0,1: closing tokens are rows 1 (127), 2 (127), 5 (255)
    assert [i for i in range(8) if slots[i] >= 0] == [1, 2, 5]
    assert int(slots[1]) == int(ct[0, 0]) * BS + 0 and int(slots[2]) == int(ct[1, 0]) * BS
    assert int(slots[5]) == int(ct[2, 0]) * BS + 1


def test_state_rows_ring_per_request():
    start = [300, 8]
    tables = decode_block_tables(TINY, start, 2)
    meta = make_decode_metadata(TINY, start, 2, tables["block_table"], tables["cmp_block_table"],
                                tables["state_block_table"])
    page, n = TINY.hca_state_block_size, TINY.hca_state_block_num // 2
    want = [(b * n + (p // page) % n) * page + p % page for b, p in ((0, 300), (0, 301), (1, 8), (1, 9))]
    assert meta["state_slot_mapping"].tolist() == want


def test_errors():
    k = decode_metadata_kernels(TINY)
    table = decode_block_tables(TINY, [5, 6, 7], 1)["block_table"]
    with pytest.raises(BindError, match="multiple"):
        k.decode_window_indices_test.run(torch.tensor([5, 6, 7, 8], dtype=torch.int32), table,
                                         torch.zeros(4, W, dtype=torch.int32))
    with pytest.raises(BindError, match="needs page"):
        page_rows(torch.tensor([TINY.max_position_embeddings]), table[:1], BS, TINY.ori_kv_block_num)
    bad = table.clone()
    bad[0, 0] = TINY.ori_kv_block_num
    with pytest.raises(BindError, match="not a page"):
        k.decode_window_indices_test.run(torch.tensor([5, 6, 7], dtype=torch.int32), bad,
                                         torch.zeros(3, W, dtype=torch.int32))
    with pytest.raises(BindError):
        golden_decode_window_indices(torch.tensor([5, 6, 7, 8], dtype=torch.int32), table, TINY)
