"""docs/dsl.md said read values used as valid lengths replay under parametric recordings, but a
``pl.slice(..., valid_shape=[n, c])`` with a read ``n`` loads a window of ``n`` rows: the shape of
that torch result is guarded, so every call with another ``n`` diverges (and runs plain, with the
right result). The docs now list valid extents with the tile shapes that pin a recording; this
test holds the behaviour and the docs to each other.
"""

import pathlib
import re

import pytest
import torch

import pto.language as pl
from pto.runtime import cache_info, parametric_replay, set_program_cache

pytestmark = pytest.mark.usefixtures("fresh_program_cache")

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dsl.md"


@pl.jit
def valid_rows(sel: pl.Tensor[[1, 4], pl.INT32], x: pl.Tensor[[8, 16], pl.FP32],
               y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="t"):
        n = pl.read(sel, [0, 0])
        y[0:8, 0:16] = pl.slice(x, [8, 16], [0, 0], valid_shape=[n, 16])  # n valid rows
    return y


def _call(n):
    y = torch.full((8, 16), -1.0)
    valid_rows.run(torch.tensor([[n, 0, 0, 0]], dtype=torch.int32), torch.arange(128.0).reshape(8, 16), y)
    return y


def test_a_read_valid_extent_pins_the_recording_and_the_docs_say_so():
    set_program_cache(True)
    with parametric_replay():
        got = [_call(n) for n in (3, 3, 5)]  # a first call, the recording, another n
    x = torch.arange(128.0).reshape(8, 16)
    for n, y in zip((3, 3, 5), got):
        want = torch.full((8, 16), -1.0)  # a store writes only the valid rows
        want[:n] = x[:n]
        assert torch.equal(y, want)
    info = cache_info()
    assert (info["recorded"], info["diverged"], info["replayed"]) == (1, 1, 0)  # n = 5 diverged (a shape guard)
    text = " ".join(DOCS.read_text().split())
    assert "valid lengths replay" not in text
    assert re.search(r"set tile shapes or valid extents .*valid_shape=\[n, c\]", text)
