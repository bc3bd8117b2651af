"""The DSL's fast paths (issue 17) give what the general paths give: tile subscript keys,
element reads of a tile (cached as a Python list from the second read on, dropped when the
tile changes in place), padded loads (one ``constant_pad_nd``) and positional binding."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import BindError, DslError
from pto.language.dtypes import from_torch
from pto.language.tile_ops import Tile, tile_key


@pytest.mark.parametrize("key, want", [
    ((1, slice(0, 3)), (1, slice(0, 3))),
    ((slice(None), 2), (slice(0, 4), 2)),
    ((slice(2, None),), (slice(2, 4),)),
    (3, (3,)),
    ((Ellipsis, 1), (slice(0, 4), 1)),  # the general loop
    ((torch.tensor(2), slice(1, 2)), (2, slice(1, 2))),  # __index__, the general loop
])
def test_tile_key_fast_and_general_agree(key, want):
    assert tile_key((4, 5), key, "t") == want


@pytest.mark.parametrize("key, match", [
    ((4, 0), "index 4 out of bounds of dim 0"),
    ((-1, 0), "index -1 out of bounds"),
    ((slice(0, 6), 0), r"window \[0, 6\) out of bounds of dim 0"),
    ((slice(0, 4, 2), 0), "strided slices"),
    ((True, 0), "must be an int"),
    ((0, 0, 0), "3 indices for a rank-2 tile"),
])
def test_tile_key_errors_unchanged(key, match):
    with pytest.raises(DslError, match=match):
        tile_key((4, 5), key, "t")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32, torch.int8, torch.bool])
def test_tile_reads_equal_item_and_follow_in_place_writes(dtype):
    data = (torch.arange(12).reshape(3, 4) * 0.37 - 1).to(dtype)
    t = Tile(data.clone())
    got = [[pl.read(t, [i, j]) for j in range(4)] for i in range(3)]  # second read on: the list
    assert got == [[data[i, j].item() for j in range(4)] for i in range(3)]
    assert pl.read(t, [2, 3]) == data[2, 3].item()
    t[1:2, 0:4] = Tile(torch.ones(1, 4, dtype=dtype))  # in place: the cached values are stale
    assert pl.read(t, [1, 2]) == torch.ones((), dtype=dtype).item()
    pl.write(t, [0, 1], 0)
    assert pl.read(t, [0, 1]) == 0 and pl.read(t, [0, 0]) == data[0, 0].item()
    t.data = torch.full((3, 4), 5).to(dtype)  # new storage
    assert pl.read(t, [2, 2]) == t.data[2, 2].item()


def test_tile_reads_rank1_rank3_and_errors():
    t1 = Tile(torch.tensor([3, 1, 4], dtype=torch.int32))
    assert [pl.read(t1, i) for i in range(3)] * 2 == [3, 1, 4] * 2
    t3 = Tile(torch.arange(8, dtype=torch.int32).reshape(2, 2, 2))
    assert [pl.read(t3, [1, 0, k]) for k in range(2)] * 2 == [4, 5] * 2  # rank 3: item every time
    with pytest.raises(DslError, match="out of bounds"):
        pl.read(t1, [3])
    with pytest.raises(DslError, match="2 indices for a tile of rank 1"):
        pl.read(t1, [0, 0])


def test_tile_reads_under_inference_mode():
    with torch.inference_mode():
        t = Tile(torch.tensor([[1.5, 2.5]]))
        assert [pl.read(t, [0, j]) for j in (0, 1, 1)] == [1.5, 2.5, 2.5]


@pytest.mark.parametrize("pad, dtype", [(None, torch.float32), (pl.PadValue.min, torch.bfloat16),
                                        (pl.PadValue.max, torch.float32), (pl.PadValue.min, torch.int32),
                                        (pl.PadValue.max, torch.int8)])
def test_padded_load_equals_full_then_copy(pad, dtype):
    x = (torch.arange(6 * 16).reshape(6, 16) % 100).to(dtype)
    seen = {}

    @pl.jit
    def k(a: pl.Tensor[[6, 16], from_torch(dtype)]):
        with pl.at(name_hint="load"):
            seen["t"] = pl.slice(a, [4, 16], [3, 0], valid_shape=[3, 10], pad_value=pad)

    k.run(x)
    t = seen["t"]
    if pad is None:
        fill = 0
    elif dtype.is_floating_point:
        fill = torch.finfo(dtype).min if pad == pl.PadValue.min else torch.finfo(dtype).max
    else:
        fill = torch.iinfo(dtype).min if pad == pl.PadValue.min else torch.iinfo(dtype).max
    want = torch.full((4, 16), fill, dtype=dtype)
    want[0:3, 0:10] = x[3:6, 0:10]
    assert t.data.dtype == dtype and torch.equal(t.data, want) and t.valid == (3, 10)


def test_padded_load_of_an_empty_valid_region_and_rank3():
    seen = {}

    @pl.jit
    def k(a: pl.Tensor[[2, 4, 8], pl.FP32]):
        with pl.at(name_hint="load"):
            seen["empty"] = pl.slice(a, [1, 2, 8], [0, 0, 0], valid_shape=[1, 0, 8])
            seen["r3"] = pl.slice(a, [2, 4, 8], [0, 0, 0], valid_shape=[1, 3, 5], pad_value=pl.PadValue.max)

    x = torch.randn(2, 4, 8)
    k.run(x)
    assert torch.equal(seen["empty"].data, torch.zeros(1, 2, 8))
    want = torch.full((2, 4, 8), torch.finfo(torch.float32).max)
    want[0, 0:3, 0:5] = x[0, 0:3, 0:5]
    assert torch.equal(seen["r3"].data, want)


def test_positional_binding_applies_defaults_and_keeps_errors():
    got = {}

    @pl.jit
    def k(x: pl.Tensor[[2, 16], pl.FP32], n: pl.Scalar[pl.INT32] = 7, tag=None):
        got["n"], got["tag"] = n, tag

    x = torch.zeros(2, 16)
    k.run(x)
    assert got == {"n": 7, "tag": None}
    k.run(x, 3, "a")
    assert got == {"n": 3, "tag": "a"}
    k.run(x, tag="b")  # keywords: inspect's binding
    assert got == {"n": 7, "tag": "b"}
    with pytest.raises(BindError, match="too many positional arguments"):
        k.run(x, 1, 2, 3)
    with pytest.raises(BindError, match="missing a required argument"):
        k.run()
    with pytest.raises(BindError, match="expects an int"):
        k.run(x, 1.5)
