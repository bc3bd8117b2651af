"""Check mode's deferred shadows (``Sanitizer.pending``, runtime/sanitizer.py).

A buffer born all undefined (a ``pl.Out`` argument, a scratch tensor without
``init_value``) gets its shadow storage unfilled; its stores of defined tiles only record
their windows. The first access that needs the shadow either finds the recorded windows
covering the whole buffer (it becomes clean, its shadow never filled) or fills the shadow as
the stores would have left it. Each kernel here runs in check mode with deferral on and
off (``sanitizer.DEFER``), and both runs must end the same: same error type and message
(or none), same output values. The kernels move undefined elements through loads, stores,
atomic adds, scalar reads and writes, gathers, reshaped and strided views, and leave part of
an output unwritten.
"""

import itertools
import random
import sys
from pathlib import Path

import pytest
import torch

import pto.language as pl
from pto.runtime import sanitizer as _san

sys.path.insert(0, str(Path(__file__).parent))
from _sanitizer_compare import run_checked  # noqa: E402


def _run(kernel, make_args, defer: bool):
    """(error type or None, message, outputs, sanitizer) of one check-mode run."""
    orig = _san.DEFER
    _san.DEFER = defer
    try:
        return run_checked(kernel, make_args)
    finally:
        _san.DEFER = orig


def _same(kernel, make_args):
    """Run with deferral on and off; assert the same outcome; return the deferred run."""
    fast = _run(kernel, make_args, defer=True)
    slow = _run(kernel, make_args, defer=False)
    assert fast[0] is slow[0] and fast[1] == slow[1]
    for a, b in zip(fast[2], slow[2]):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
    assert not slow[3].pending and not slow[3].stale
    return fast


def _args():
    return [torch.arange(128, dtype=torch.float32).reshape(8, 16), torch.zeros(8, 16)]


@pl.jit
def _rows_then_read(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    for r in pl.spmd(8, name_hint="fill"):  # eight row windows: the whole scratch
        s[r:r + 1, :] = x[r:r + 1, :]
    for r in pl.spmd(2, name_hint="copy"):
        y[r * 4:r * 4 + 4, :] = s[r * 4:r * 4 + 4, :] + 1.0


def test_written_in_full_becomes_clean_without_a_shadow_fill():
    err, _msg, outs, san = _same(_rows_then_read, _args)
    assert err is None and torch.equal(outs[1], _args()[0] + 1.0)
    assert san.stale == {2, 3} and not san.pending  # s (id 3) at its first load, y (id 2) at the output check


@pl.jit
def _half_then_read(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="fill"):
        s[0:8, 0:8] = x[0:8, 0:8]
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :]


def test_partly_written_scratch_fills_its_shadow_at_the_first_load():
    err, msg, _outs, san = _same(_half_then_read, _args)
    assert "64 undefined written element(s) in box [0:8, 8:16]" in msg and "'s'" in msg
    assert san.stale == set()


@pl.jit
def _partial_out(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    for r in pl.spmd(7, name_hint="w"):  # row 7 never written
        y[r:r + 1, :] = x[r:r + 1, :]


@pl.jit
def _partial_out_ok(x: pl.Tensor[[8, 16], pl.FP32], y: pl.PartialOut[pl.Tensor[[8, 16], pl.FP32]]):
    for r in pl.spmd(7, name_hint="w"):
        y[r:r + 1, :] = x[r:r + 1, :]


def test_unwritten_out_rows_and_partial_out():
    err, msg, _o, _s = _same(_partial_out, _args)
    assert "16 element(s) the program never wrote, in box [7:8, 0:16]" in msg
    err, msg, outs, _s = _same(_partial_out_ok, _args)
    assert err is None and bool((outs[1][7] == 0).all())


@pl.jit
def _clean_then_poisoned(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="fill"):
        s[0:8, :] = x[0:8, :]
    with pl.at(name_hint="use") as use:
        y[0:8, :] = s[0:8, :]  # s clean, its shadow never filled
    with pl.at(name_hint="poison", deps=[use]):  # the write-after-read edge
        s[2:3, 4:6] = junk[0:1, 0:2]  # leaves clean: the shadow is zeroed before the mask goes in
    with pl.at(name_hint="again"):
        y[0:8, :] = s[0:8, :]


def test_undefined_store_into_a_never_filled_clean_buffer():
    err, msg, _o, _s = _same(_clean_then_poisoned, _args)
    assert err.__name__ == "UndefinedOutputError" and "2 undefined written element(s) in box [2:3, 4:6]" in msg and "'junk'" in msg


@pl.jit
def _atomic_onto_pending(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="fill"):
        s[0:6, :] = x[0:6, :]
    with pl.at(name_hint="add"):  # rows 6..7 of s are undefined: the sum stays undefined
        pl.assemble(s, x[0:8, :], [0, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :]


@pl.jit
def _scalar_paths(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    junk = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="w"):
        y[0:8, :] = x[0:8, :]
        pl.write(s, [1, 2], pl.read(x, [0, 3]))  # a defined scalar write: a deferred window
        pl.write(s, [1, 3], pl.read(junk, [0, 0]))  # an undefined one fills the shadow
    with pl.at(name_hint="r"):
        pl.write(y, [4, 4], pl.read(s, [1, 2]))
        pl.write(y, [5, 5], pl.read(s, [1, 3]))


@pl.jit
def _view_writes(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    flat = pl.reshape(s, [4, 32])
    with pl.at(name_hint="w"):
        flat[0:4, 0:16] = x[0:4, :]  # even rows of s through the view
        flat[0:4, 16:32] = x[4:8, :]  # odd rows
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :]


@pl.jit
def _strided_columns(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    s3 = pl.reshape(s, [8, 8, 2])
    with pl.at(name_hint="w"):
        s3[0:8, 0:8, 0:1] = pl.reshape(x[0:8, 0:8], [8, 8, 1])  # even columns only: a box of every column
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :]


@pl.jit
def _overlapping_writes(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="a"):
        s[0:5, 0:10] = x[0:5, 0:10]
        s[3:8, 6:16] = x[3:8, 6:16]
        s[0:4, 8:16] = x[0:4, 8:16]
    with pl.at(name_hint="b"):
        s[4:8, 0:7] = x[4:8, 0:7]  # with these the union is all of s, the areas sum past it
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :] * 2.0


@pl.jit
def _overlap_with_a_hole(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="a"):  # areas sum past s (150 > 128), yet row 4 columns 10..15 stay unwritten
        s[0:8, 0:10] = x[0:8, 0:10]
        s[0:4, 6:16] = x[0:4, 6:16]
        s[5:8, 6:16] = x[5:8, 6:16]
    with pl.at(name_hint="copy"):
        y[0:8, :] = s[0:8, :]


@pl.jit
def _assembled(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    acc = pl.create_tensor([8, 16], pl.FP32, init_value=0)
    for b in pl.spmd(4, name_hint="w"):  # 2-D assembles (the GM store fast path) into a deferred buffer
        pl.assemble(s, x[b * 2:b * 2 + 2, :], [b * 2, 0])
        pl.assemble(acc, x[b * 2:b * 2 + 2, :], [b * 2, 0], atomic=pl.AtomicType.Add)  # into a clean one
    for b in pl.spmd(2, name_hint="copy"):
        pl.assemble(y, s[b * 4:b * 4 + 4, :] + acc[b * 4:b * 4 + 4, :], [b * 4, 0])


@pl.jit
def _gathered(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([8, 16], pl.FP32)
    with pl.at(name_hint="w"):
        s[0:7, :] = x[0:7, :]
    with pl.at(name_hint="g"):
        y[0:4, :] = pl.gather_rows(s, [6, 0, 2, 4])  # defined rows
        y[4:8, :] = pl.gather_rows(s, [1, 7, 3, 5])  # row 7 undefined


@pl.jit
def _stream_out(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[4, 2, 16], pl.FP32]]):
    for h in pl.spmd(2, name_hint="stream"):  # each stream over every token: a list of row boxes
        pl.assemble(y, pl.reshape(x[h * 4:h * 4 + 4, :], [4, 1, 16]), [0, h, 0])


def _stream_args():
    return [torch.arange(128, dtype=torch.float32).reshape(8, 16), torch.zeros(4, 2, 16)]


@pytest.mark.parametrize("kernel, text, origin", [
    (_atomic_onto_pending, "32 undefined written element(s) in box [6:8, 0:16]", "'s'"),
    (_scalar_paths, "1 undefined written element(s) in box [5:6, 5:6]", "'junk'"),
    (_view_writes, None, None),
    (_strided_columns, "64 undefined written element(s) in box [0:8, 1:16]", "'s'"),
    (_overlapping_writes, None, None),
    (_assembled, None, None),
    (_overlap_with_a_hole, "6 undefined written element(s) in box [4:5, 10:16]", "'s'"),
    (_gathered, "16 undefined written element(s) in box [5:6, 0:16]", "'s'"),
])
def test_deferred_matches_filled(kernel, text, origin):
    err, msg, _o, san = _same(kernel, _args)
    if text is None:
        assert err is None, msg
        assert {2, 3} <= san.stale  # y and s written in full: neither shadow ever filled
    else:
        assert text in msg and origin in msg, msg


def test_stream_writes_cover_the_output():
    err, msg, outs, san = _same(_stream_out, _stream_args)
    x = _stream_args()[0]
    assert err is None and torch.equal(outs[1], torch.stack([x[0:4], x[4:8]], dim=1))
    assert san.stale == {2}


def test_races_between_blocks_still_reported():
    @pl.jit
    def racy(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
        for b in pl.spmd(2, name_hint="w"):
            y[0:8, :] = x[0:8, :]  # both blocks write all of y

    err, msg, _o, _s = _same(racy, _args)
    assert err is not None and err.__name__ == "RaceError" and "blocks 0 and 1 of task 'w'" in msg


def _brute_covers(boxes, rows, cols):
    seen = set()
    for r0, r1, c0, c1 in boxes:
        seen.update(itertools.product(range(r0, r1), range(c0, c1)))
    return len(seen) == rows * cols


def test_union_covers_matches_brute_force():
    rng = random.Random(7)
    hits = 0
    for _ in range(3000):
        rows, cols = rng.randint(1, 6), rng.randint(1, 6)
        boxes = []
        for _ in range(rng.randint(1, 7)):
            r0, c0 = rng.randrange(rows), rng.randrange(cols)
            boxes.append((r0, rng.randint(r0 + 1, rows), c0, rng.randint(c0 + 1, cols)))
        want = _brute_covers(boxes, rows, cols)
        hits += want
        assert _san._union_covers(boxes, rows, cols) == want, (boxes, rows, cols)
    assert hits > 100  # both outcomes exercised


def test_injective_matches_brute_force():
    rng = random.Random(3)
    for _ in range(2000):
        rank = rng.randint(1, 3)
        shape = [rng.randint(1, 4) for _ in range(rank)]
        strides = [rng.randint(0, 9) for _ in range(rank)]
        offs = [sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*map(range, shape))]
        if _san._injective(shape, strides):  # sufficient: never claims a view with repeats
            assert len(set(offs)) == len(offs), (shape, strides)
    assert _san._injective([4, 8], [8, 1]) and _san._injective([3, 2], [32, 2]) and not _san._injective([2, 2], [1, 1])


@pl.jit
def _read_inside_writes(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([16, 16], pl.FP32)  # rows 8..15 never written, never read
    with pl.at(name_hint="w"):
        s[0:4, :] = x[0:4, :]
        s[4:8, 0:8] = x[4:8, 0:8]
        s[4:8, 8:16] = x[4:8, 8:16]
    with pl.at(name_hint="r"):
        y[0:2, :] = s[0:2, :]  # inside one written box
        y[2:8, :] = s[2:8, :]  # inside the union of three
        pl.write(y, [0, 0], pl.read(s, [5, 9]) + 1.0)  # a defined scalar of a deferred buffer


@pl.jit
def _read_past_writes(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([16, 16], pl.FP32)
    with pl.at(name_hint="w"):
        s[0:8, 0:8] = x[0:8, 0:8]
        s[0:7, 8:16] = x[0:7, 8:16]  # s[7, 8:16] never written
    with pl.at(name_hint="r"):
        y[0:4, :] = s[0:4, :]  # defined: s stays deferred
        y[4:8, :] = s[4:8, :]  # takes the hole: the shadow is filled here


@pl.jit
def _index_from_hole(x: pl.Tensor[[8, 16], pl.FP32], idx: pl.Tensor[[4, 4], pl.INT32],
                     y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([4, 4], pl.INT32)
    with pl.at(name_hint="w"):
        s[0:2, :] = idx[0:2, :]
        y[0:8, :] = x[0:8, :]
    with pl.at(name_hint="r"):
        i = pl.read(s, [1, 1])  # written: a plain int
        y[i:i + 1, :] = x[0:1, :]
        j = pl.read(s, [3, 0])  # never written: undefined, raises as an index
        y[j:j + 1, :] = x[0:1, :]


def test_reads_inside_the_written_windows_keep_the_shadow_deferred():
    err, msg, outs, san = _same(_read_inside_writes, _args)
    x = _args()[0]
    assert err is None, msg
    want = x.clone()
    want[0, 0] = x[5, 9] + 1.0
    assert torch.equal(outs[1], want)
    assert 3 in san.pending and 3 not in san.stale  # s: never filled, never clean


def test_a_read_past_the_written_windows_fills_the_shadow():
    err, msg, _o, san = _same(_read_past_writes, _args)
    assert "8 undefined written element(s) in box [7:8, 8:16]" in msg and "'s'" in msg and "task 'r'" in msg
    assert 3 not in san.pending


def test_undefined_scalar_of_a_deferred_buffer_raises_as_index():
    def args():
        return [torch.arange(128, dtype=torch.float32).reshape(8, 16), torch.full((4, 4), 2, dtype=torch.int32),
                torch.zeros(8, 16)]
    err, msg, _o, _s = _same(_index_from_hole, args)
    assert err.__name__ == "UndefinedValueError" and "'s'" in msg


def test_boxes_inside_matches_brute_force():
    rng = random.Random(11)
    hits = 0
    for _ in range(2000):
        rows, cols = 6, 6
        boxes = []
        for _ in range(rng.randint(1, 6)):
            r0, c0 = rng.randrange(rows), rng.randrange(cols)
            boxes.append((r0, rng.randint(r0 + 1, rows), c0, rng.randint(c0 + 1, cols)))
        bs = sorted(boxes)
        idx = (len(bs), bs, [b[0] for b in bs], max(b[1] - b[0] for b in bs), None)
        cells = set()
        for r0, r1, c0, c1 in boxes:
            cells.update(itertools.product(range(r0, r1), range(c0, c1)))
        qs = []
        for _ in range(rng.randint(1, 2)):
            r0, c0 = rng.randrange(rows), rng.randrange(cols)
            qs.append((r0, rng.randint(r0 + 1, rows), c0, rng.randint(c0 + 1, cols)))
        want = all(set(itertools.product(range(q[0], q[1]), range(q[2], q[3]))) <= cells for q in qs)
        hits += want
        assert _san._boxes_inside(qs if len(qs) > 1 else qs[0], idx) == want, (boxes, qs)
    assert hits > 100


@pl.jit
def _head_rows(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([4, 32], pl.FP32)
    heads = pl.reshape(s, [16, 8])  # rows narrower than a root row (o_packed's head rows)
    for b in pl.spmd(4, name_hint="w"):  # columns 0..5, then 5..8 of every head row: strided windows
        pl.assemble(heads, pl.reshape(x[b * 2:b * 2 + 2, 0:12], [4, 6]), [b * 4, 0])
        pl.assemble(heads, pl.reshape(x[b * 2:b * 2 + 2, 4:10], [4, 3]), [b * 4, 5])
    with pl.at(name_hint="copy"):
        y[0:4, :] = pl.reshape(s[0:2, :], [4, 16])
        y[4:8, :] = pl.reshape(s[2:4, :], [4, 16])


def test_strided_view_windows_recorded_by_their_row_segments():
    err, msg, _o, san = _same(_head_rows, _args)
    assert err is None, msg
    assert 3 in san.stale  # s covered by the exact segments of its strided windows: never filled


@pl.jit
def _interleaved(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    s = pl.create_tensor([80, 16], pl.FP32)
    for i in pl.range(80):  # write a row, read it back: the index of written boxes is rebuilt each time
        with pl.at(name_hint="w"):
            s[i:i + 1, :] = x[i % 8:i % 8 + 1, :]
        with pl.at(name_hint="r"):
            y[i % 8:i % 8 + 1, :] = s[i:i + 1, :] * 2.0
    with pl.at(name_hint="hole"):
        y[0:8, :] = s[72:80, :] + s[0:8, :]


def test_interleaved_writes_and_reads_give_up_deferral():
    err, msg, outs, san = _same(_interleaved, _args)
    assert err is None, msg
    assert torch.equal(outs[1], _args()[0] * 2.0)
    assert 3 not in san.pending and 3 not in san.stale  # filled after 64 index rebuilds
