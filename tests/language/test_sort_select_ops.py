"""pl.sort32 / pl.mrgsort / pl.gather(mask_pattern=) / pl.cmp / pl.select against torch
(hw-native-sys/pypto `docs/en/user/`; docs/dsl.md "Sort, top-k, compare and select")."""

import pytest
import torch

import pto.language as pl
from pto.errors import DslError
from pto.language.tile_ops import Tile


def _indices(pairs: Tile) -> torch.Tensor:
    return pl.gather(pairs, mask_pattern=pl.MaskPattern.P1010, output_dtype=pl.INT32).data


def _values(pairs: Tile) -> torch.Tensor:
    return pl.gather(pairs, mask_pattern=pl.MaskPattern.P0101).data


def _full_sort(scores: torch.Tensor) -> Tile:
    """sort32 then 4-way merges until one run, as the indexers chain them."""
    n = scores.shape[1]
    pairs = pl.sort32(Tile(scores.clone()), pl.arange(0, [1, n], pl.UINT32))
    run = 64
    while run < 2 * n:
        pairs = pl.mrgsort(pairs, block_len=run)
        run *= 4
    return pairs


@pytest.mark.parametrize("n", [32, 128, 512, 2048])
def test_sort_chain_equals_torch_stable_descending_sort(n):
    gen = torch.Generator().manual_seed(n)
    scores = torch.randint(-20, 20, (3, n), generator=gen).float()  # many ties
    scores[0, ::7] = torch.finfo(torch.float32).min  # masked entries, as the indexer pads
    pairs = _full_sort(scores)
    want = torch.sort(scores, dim=1, descending=True, stable=True)
    assert torch.equal(_values(pairs), want.values)
    assert torch.equal(_indices(pairs), want.indices.to(torch.int32))


def test_sort32_sorts_each_run_of_32_and_keeps_ties_in_index_order():
    scores = torch.zeros(1, 64)
    scores[0, 40] = 1.0
    pairs = pl.sort32(Tile(scores), pl.arange(0, [1, 64], pl.UINT32))
    idx = _indices(pairs)[0]
    assert idx[:32].tolist() == list(range(32))  # all ties: input order
    assert idx[32:].tolist() == [40] + [i for i in range(32, 64) if i != 40]
    assert pairs.shape == (1, 128)


def test_sort32_carries_any_int32_payload_bits():
    vals = torch.tensor([[0.5, 2.0] + [0.0] * 30])
    payload = Tile(torch.tensor([[-1, 123456789] + list(range(30))], dtype=torch.int32))
    idx = _indices(pl.sort32(Tile(vals), payload))[0]
    assert idx[:2].tolist() == [123456789, -1]


def test_mrgsort_format2_merges_lists_earlier_argument_first_on_ties():
    a = pl.sort32(Tile(torch.tensor([[3.0, 1.0] + [0.0] * 30])), pl.arange(0, [1, 32], pl.UINT32))
    b = pl.sort32(Tile(torch.tensor([[1.0, 3.0] + [0.0] * 30])), pl.arange(100, [1, 32], pl.UINT32))
    merged = pl.mrgsort(a, b)
    idx = _indices(merged)[0]
    assert idx[:4].tolist() == [0, 101, 1, 100]
    assert torch.equal(_values(merged)[0], torch.sort(torch.cat([_values(a), _values(b)], 1)[0],
                                                      descending=True).values)


def test_mrgsort_partial_last_group():
    scores = torch.randn(1, 96)  # 3 runs of 32: one group of 3 runs at block_len=64
    merged = pl.mrgsort(pl.sort32(Tile(scores), pl.arange(0, [1, 96], pl.UINT32)), block_len=64)
    assert torch.equal(_indices(merged)[0], torch.sort(scores[0], descending=True, stable=True).indices.int())


def test_mrgsort_rejects_unsorted_runs_and_bad_arguments():
    x = Tile(torch.arange(8, dtype=torch.float32).reshape(1, 8))  # ascending values
    with pytest.raises(DslError, match="not sorted descending"):
        pl.mrgsort(x, block_len=4)
    ok = pl.sort32(Tile(torch.randn(1, 32)), pl.arange(0, [1, 32], pl.UINT32))
    with pytest.raises(DslError, match="block_len=6"):
        pl.mrgsort(ok, block_len=6)
    with pytest.raises(DslError, match="2 to 4"):
        pl.mrgsort(ok)
    with pytest.raises(DslError, match="FP32"):
        pl.mrgsort(Tile(torch.zeros(1, 64, dtype=torch.int32)), block_len=64)


def test_sort32_rejects_bad_shapes_and_dtypes():
    with pytest.raises(DslError, match="multiple of 32"):
        pl.sort32(Tile(torch.randn(1, 48)), pl.arange(0, [1, 48], pl.UINT32))
    with pytest.raises(DslError, match="FP32"):
        pl.sort32(Tile(torch.randn(1, 32).bfloat16()), pl.arange(0, [1, 32], pl.UINT32))
    with pytest.raises(DslError, match="idx"):
        pl.sort32(Tile(torch.randn(1, 32)), Tile(torch.zeros(1, 32)))


@pytest.mark.parametrize("pattern, start, period", [
    (pl.MaskPattern.P0101, 0, 2), (pl.MaskPattern.P1010, 1, 2), (pl.MaskPattern.P0001, 0, 4),
    (pl.MaskPattern.P0010, 1, 4), (pl.MaskPattern.P0100, 2, 4), (pl.MaskPattern.P1000, 3, 4),
    (pl.MaskPattern.P1111, 0, 1)])
def test_gather_mask_patterns_keep_their_lanes(pattern, start, period):
    x = torch.arange(32, dtype=torch.float32).reshape(2, 16)
    assert torch.equal(pl.gather(Tile(x), mask_pattern=pattern).data, x[:, start::period])


def test_gather_mask_pattern_errors():
    with pytest.raises(DslError, match="unknown mask_pattern"):
        pl.gather(Tile(torch.zeros(1, 8)), mask_pattern=9)
    with pytest.raises(DslError, match="does not divide"):
        pl.gather(Tile(torch.zeros(1, 6)), mask_pattern=pl.MaskPattern.P0001)
    with pytest.raises(DslError, match="32-bit"):
        pl.gather(Tile(torch.zeros(1, 8).bfloat16()), mask_pattern=pl.MaskPattern.P1010, output_dtype=pl.INT32)
    with pytest.raises(DslError, match="not both"):
        pl.gather(Tile(torch.zeros(1, 8)), index=Tile(torch.zeros(1, 2, dtype=torch.int32)),
                  mask_pattern=pl.MaskPattern.P1010)


@pytest.mark.parametrize("mode, ref", [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt),
                                       ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)])
def test_cmp_matches_torch(mode, ref):
    a = torch.tensor([[1.0, 2.0, float("nan"), -3.0]])
    b = torch.tensor([[1.0, 3.0, float("nan"), -4.0]])
    assert torch.equal(pl.cmp(Tile(a), Tile(b), mode).data, ref(a, b))
    assert torch.equal(pl.cmp(Tile(a), 1.0, mode).data, ref(a, 1.0))
    ai = torch.tensor([[1, 5, -2]], dtype=torch.int32)
    assert torch.equal(pl.cmp(Tile(ai), 1, mode).data, ref(ai, 1))


def test_select_matches_torch_where_and_moves_definedness():
    a = torch.tensor([[1.0, 2.0, 3.0]])
    m = pl.cmp(Tile(a), 2.0, "ge")
    assert torch.equal(pl.select(m, Tile(a), -1.0).data, torch.tensor([[-1.0, 2.0, 3.0]]))
    undef = Tile(a.clone(), torch.tensor([[0, 0, 7]], dtype=torch.int32))  # element 2 undefined
    out = pl.select(pl.cmp(Tile(a), 3.0, "lt"), undef, Tile(torch.zeros(1, 3)))
    assert out.mask.tolist() == [[0, 0, 0]]  # the undefined element was not chosen
    out = pl.select(pl.cmp(Tile(a), 0.0, "gt"), undef, 0.0)
    assert out.mask.tolist() == [[0, 0, 7]]


def test_cmp_select_errors():
    with pytest.raises(DslError, match="cmp_mode"):
        pl.cmp(Tile(torch.zeros(1, 2)), 0.0, "less")
    with pytest.raises(DslError, match="BOOL"):
        pl.select(Tile(torch.zeros(1, 2)), Tile(torch.zeros(1, 2)), 0.0)
    with pytest.raises(DslError, match="fractional"):
        pl.select(Tile(torch.ones(1, 2, dtype=torch.bool)), Tile(torch.zeros(1, 2, dtype=torch.int32)), 0.5)


def test_sort_moves_definedness_with_the_pairs():
    vals = torch.tensor([[1.0, 5.0] + [0.0] * 30])
    src = Tile(vals, torch.tensor([[0, 9] + [0] * 30], dtype=torch.int32))
    pairs = pl.sort32(src, pl.arange(0, [1, 32], pl.UINT32))
    assert pairs.mask[0, :2].tolist() == [9, 9]  # the undefined value (5.0) sorted first, with its index
    assert int(pairs.mask[0, 2:].max()) == 0
