"""Check mode and Out arguments: undefined elements read as the poison pattern without the
whole private copy being filled first (``Buffer.lazy_poison``), and reads of In arguments
kept out of the race checker's history (they cannot conflict).

What a kernel sees must be what eagerly poisoned storage gave: NaN (floats), True (BOOL) or
bytes 0xAB (integers) for every element not yet written, the written values for the others,
through a tile load and through ``pl.gather_rows``, and an undefined value from a scalar read.
"""

import pytest
import torch

import pto.language as pl
from pto import RunConfig, UndefinedOutputError
from pto.runtime.program import poisoned

CHECK = RunConfig(check=True)


def _kernel(dtype, cap):
    @pl.jit
    def k(x: pl.Tensor[[8, 16], dtype], y: pl.Out[pl.Tensor[[8, 16], dtype]]):
        with pl.at(name_hint="half"):  # rows 0..3 written, 4..7 not yet
            y[0:4, :] = x[0:4, :]
        with pl.at(name_hint="look"):
            cap["tile"] = y[2:6, :]  # two written rows, two undefined ones
            cap["rows"] = pl.gather_rows(y, [5, 1, 7])
            cap["value"] = pl.read(y, [6, 3])
            y[4:8, :] = x[4:8, :]
    return k


@pytest.mark.parametrize("dtype, check_pattern", [
    (pl.FP32, lambda t: bool(torch.isnan(t).all())),
    (pl.BF16, lambda t: bool(torch.isnan(t.float()).all())),
    (pl.INT32, lambda t: bool((t.view(torch.uint8) == 0xAB).all())),
    (pl.INT8, lambda t: bool((t.view(torch.uint8) == 0xAB).all())),
])
def test_undefined_out_elements_read_as_the_poison_pattern(dtype, check_pattern):
    cap = {}
    x = (torch.arange(128).reshape(8, 16) % 100).to(dtype.torch)
    y = torch.full((8, 16), 7, dtype=dtype.torch)  # the caller's old values never show through
    _kernel(dtype, cap).run(x, y, config=CHECK)
    assert torch.equal(y, x)  # every element written: the result reaches the caller
    t = cap["tile"]
    assert torch.equal(t.data[0:2], x[2:4]) and check_pattern(t.data[2:4])
    assert bool((t.mask[0:2] == 0).all()) and bool((t.mask[2:4] != 0).all())
    g = cap["rows"]
    assert torch.equal(g.data[1], x[1]) and check_pattern(g.data[0]) and check_pattern(g.data[2])
    assert not cap["value"].defined


def test_poisoned_matches_eager_poison_and_leaves_data_alone():
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16, torch.int8, torch.bool):
        d = torch.zeros(3, 4, dtype=dt)
        m = torch.tensor([[0, 1, 0, 2]] * 3, dtype=torch.int32)
        out = poisoned(d, m)
        assert out.dtype == dt and bool((d == 0).all())  # a new tensor
        raw = out.view(torch.uint8).view(3, 4, -1) if dt != torch.bool else out
        if dt.is_floating_point:
            assert bool(torch.isnan(out[:, [1, 3]].float()).all()) and bool((out[:, [0, 2]] == 0).all())
        elif dt == torch.bool:
            assert bool(out[:, [1, 3]].all()) and not bool(out[:, [0, 2]].any())
        else:
            assert bool((raw[:, [1, 3]] == 0xAB).all()) and bool((raw[:, [0, 2]] == 0).all())


def test_a_failing_check_leaves_the_callers_out_tensor_alone():
    @pl.jit
    def k(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
        with pl.at(name_hint="half"):
            y[0:4, :] = x[0:4, :]  # rows 4..7 never written

    y = torch.full((8, 16), 3.0)
    with pytest.raises(UndefinedOutputError, match="output 'y'"):
        k.run(torch.randn(8, 16), y, config=CHECK)
    assert bool((y == 3.0).all())


def test_in_argument_reads_stay_out_of_the_race_history():
    @pl.jit
    def k(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
        s = pl.create_tensor([8, 16], pl.FP32)
        for b in pl.spmd(2, name_hint="a"):
            s[b * 4:b * 4 + 4, :] = x[b * 4:b * 4 + 4, :]
        for b in pl.spmd(2, name_hint="b"):
            y[b * 4:b * 4 + 4, :] = s[b * 4:b * 4 + 4, :] + x[b * 4:b * 4 + 4, :]

    x = torch.randn(8, 16)
    y = torch.empty(8, 16)
    prog = k.run(x, y, config=CHECK)
    assert torch.equal(y, x + x)
    names = {b.id: b.name for b in prog.buffers}
    assert sorted(names[i] for i in prog.races.history) == ["s", "y"]  # x (In) is not kept
