"""Out/InOut arguments written in place with an undo log (runtime/program.py, heap.Buffer.save_view).

A plain run writes Out/InOut arguments straight into the caller's tensors and saves every
window a store is about to overwrite; a program that raises gets them back, newest first, so
the caller's tensors are exactly as before the call. Aliased arguments, check mode,
graph-only mode and block_order runs keep private copies. Every test compares with the
values before the call bit for bit (``torch.equal``) and, for runs that succeed, with the
same kernel under private copies (check mode) or a hand-computed result.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pto
import pto.language as pl
from pto.errors import DslError


def _fresh():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g))


@pl.jit
def _stores_then_fails(x: pl.Tensor[[8, 16], pl.FP32], y: pl.Out[pl.Tensor[[8, 16], pl.FP32]],
                       z: pl.InOut[pl.Tensor[[8, 16], pl.FP32]], fail: pl.Scalar[pl.INT32]):
    # every store path: subscript fast path, pl.assemble (row fast path, padded tile, atomic add),
    # pl.store at a column offset, pl.write; z is read before and after it is written
    with pl.at(name_hint="rows"):
        y[0:2, 0:16] = x[0:2, 0:16]
        z[0:2, 0:16] = z[0:2, 0:16] + x[0:2, 0:16]
    for b in pl.spmd(2, name_hint="blocks"):
        t = pl.slice(z, [2, 16], [2 + 2 * b, 0])
        pl.assemble(y, t, [2 + 2 * b, 0])
        pl.assemble(z, x[2 + 2 * b:4 + 2 * b, 0:16], [2 + 2 * b, 0], atomic=pl.AtomicType.Add)
    with pl.at(name_hint="partial"):
        t = pl.slice(x, [4, 16], [4, 0], valid_shape=[3, 8])
        pl.assemble(y, t, [5, 4])
        pl.store(x[0:1, 0:4], [7, 12], z)
        pl.write(y, [7, 0], 5.0)
        pl.write(z, [7, 1], pl.read(z, [0, 0]))
    if fail == 1:
        with pl.at(name_hint="fails"):
            x[0:9, 0:16]  # out of bounds: a DslError after all the stores above
    if fail == 2:
        raise ZeroDivisionError("kernel Python fails after the stores")
    return y


@pytest.mark.parametrize("fail", [1, 2])
def test_error_after_stores_leaves_out_and_inout_exactly_as_before(fail):
    x, y, z = _fresh()
    x0, y0, z0 = x.clone(), y.clone(), z.clone()
    with pytest.raises(DslError if fail == 1 else ZeroDivisionError):
        _stores_then_fails.run(x, y, z, fail)
    assert torch.equal(x, x0) and torch.equal(y, y0) and torch.equal(z, z0)


def test_successful_run_in_place_equals_private_copies_bit_for_bit(monkeypatch):
    x, y, z = _fresh()
    prog = _stores_then_fails.run(x, y, z, 0)
    assert prog.args[1][2].data is y and prog.args[2][2].data is z  # written in place
    assert prog.undo == []  # the log is dropped at the end
    x2, y2, z2 = _fresh()
    monkeypatch.setattr(pto.runtime.program.Program, "_writes_in_place", lambda self, params: False)
    prog2 = _stores_then_fails.run(x2, y2, z2, 0)
    assert prog2.args[1][2].data is not y2  # the reference run works on private copies
    assert torch.equal(y, y2) and torch.equal(z, z2) and torch.equal(x, x2)
    assert prog.stats.as_row() | {"wall_us": 0} == prog2.stats.as_row() | {"wall_us": 0}


def test_whole_buffer_saved_once_many_stores_restored():
    @pl.jit
    def many(x: pl.Tensor[[64, 16], pl.FP32], y: pl.InOut[pl.Tensor[[64, 16], pl.FP32]]):
        for i in range(64):
            with pl.at(name_hint="row"):
                y[i:i + 1, 0:16] = y[i:i + 1, 0:16] + x[i:i + 1, 0:16]
        with pl.at(name_hint="fails"):
            x[0:65, 0:16]

    x, y = torch.randn(64, 16), torch.randn(64, 16)
    y0 = y.clone()
    with pytest.raises(DslError):
        many.run(x, y)
    assert torch.equal(y, y0)


def undo_saves(call) -> list[int]:
    """Elements of each window the undo log saved and restored while ``call()`` raised its
    ValueError (the test kernels raise one after their stores)."""
    saved = []
    orig = pto.runtime.program.Program._undo_stores

    def spy(self):
        saved.extend(s.numel() for _, s in self.undo)
        orig(self)
    pto.runtime.program.Program._undo_stores = spy
    try:
        with pytest.raises(ValueError):
            call()
    finally:
        pto.runtime.program.Program._undo_stores = orig
    return saved


def test_window_saves_of_a_large_inout_stay_small():
    @pl.jit
    def one_row(x: pl.Tensor[[1, 256], pl.FP32], cache: pl.InOut[pl.Tensor[[4096, 256], pl.FP32]],
                row: pl.Scalar[pl.INT32]):
        with pl.at(name_hint="put"):
            cache[row:row + 1, 0:256] = x[0:1, 0:256]
        with pl.at(name_hint="put2"):
            cache[row + 1:row + 2, 0:256] = x[0:1, 0:256]
        if row == 7:
            raise ValueError("fail")

    x, cache = torch.randn(1, 256), torch.randn(4096, 256)
    c0 = cache.clone()
    saved = undo_saves(lambda: one_row.run(x, cache, 7))
    assert saved == [256, 256]  # two row windows, not the 4 MiB cache
    assert torch.equal(cache, c0)
    one_row.run(x, cache, 3)
    assert torch.equal(cache[3], x[0]) and torch.equal(cache[4], x[0]) and torch.equal(cache[5:], c0[5:])


def test_windows_covering_an_output_once_save_each_window_not_the_whole_again():
    # 8 row blocks, each an eighth of the output: every window saved once (the buffer's size in
    # all), not 7 windows and then the whole buffer at the last one
    @pl.jit
    def blocks(x: pl.Tensor[[64, 256], pl.FP32], y: pl.Out[pl.Tensor[[64, 256], pl.FP32]],
               fail: pl.Scalar[pl.INT32]):
        for b in pl.spmd(8, name_hint="blk"):
            y[8 * b:8 * b + 8, 0:256] = x[8 * b:8 * b + 8, 0:256]
        if fail:
            raise ValueError("fail")

    x, y = torch.randn(64, 256), torch.randn(64, 256)
    y0 = y.clone()
    assert undo_saves(lambda: blocks.run(x, y, 1)) == [8 * 256] * 8
    assert torch.equal(y, y0)
    blocks.run(x, y, 0)
    assert torch.equal(y, x)


def test_aliased_arguments_keep_private_copy_semantics():
    @pl.jit
    def alias(x: pl.Tensor[[4, 8], pl.FP32], y: pl.Out[pl.Tensor[[4, 8], pl.FP32]], fail: pl.Scalar[pl.INT32]):
        with pl.at(name_hint="a"):
            y[0:1, 0:8] = x[0:1, 0:8] + x[0:1, 0:8]
        with pl.at(name_hint="b"):
            y[1:2, 0:8] = x[0:1, 0:8]  # x is not y during the run: the caller's row 0
        if fail:
            raise ValueError("fail")

    t = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    t0 = t.clone()
    with pytest.raises(ValueError):
        alias.run(t, t, 1)
    assert torch.equal(t, t0)
    prog = alias.run(t, t, 0)
    assert prog.args[1][2].data is not t  # a private copy
    assert torch.equal(t[0], 2 * t0[0]) and torch.equal(t[1], t0[0]) and torch.equal(t[2:], t0[2:])
    # an Out that overlaps another argument's bytes (a view of the same storage) also gets a copy
    base = torch.arange(64, dtype=torch.float32)
    xv, yv = base[0:32].view(4, 8), base[16:48].view(4, 8)
    b0 = base.clone()
    with pytest.raises(ValueError):
        alias.run(xv, yv, 1)
    assert torch.equal(base, b0)
    prog = alias.run(base[0:32].view(4, 8), base[32:64].view(4, 8), 0)  # disjoint bytes: in place
    assert prog.args[1][2].data.data_ptr() == base[32:].data_ptr()
    assert torch.equal(base[32:40], 2 * b0[0:8]) and torch.equal(base[40:48], b0[0:8])


def test_program_cache_recording_and_replay_match_plain_runs():
    @pl.jit
    def step(x: pl.Tensor[[4, 8], pl.FP32], acc: pl.InOut[pl.Tensor[[4, 8], pl.FP32]]):
        for b in pl.spmd(4, name_hint="acc"):
            acc[b:b + 1, 0:8] = acc[b:b + 1, 0:8] + x[b:b + 1, 0:8]

    was = pto.runtime.program_cache_enabled()
    pto.runtime.set_program_cache(True)
    pto.runtime.clear_program_cache()
    try:
        x = torch.randn(4, 8)
        acc, ref = torch.zeros(4, 8), torch.zeros(4, 8)
        for k in range(4):  # plain, recorded, replayed, replayed
            p = step.run(x, acc)
            ref += x
            assert torch.equal(acc, ref), k
        assert p.replayed
    finally:
        pto.runtime.clear_program_cache()
        pto.runtime.set_program_cache(was)


@pytest.mark.parametrize("templates", [False, True])
def test_error_after_many_block_stores_restores_with_block_templates(templates):
    from pto.runtime import block_templates
    from pto.runtime.blocks import MIN_BLOCKS, reset_templates, template_info

    n = max(32, MIN_BLOCKS + 8)  # enough blocks for a block template

    @pl.jit
    def rows(x: pl.Tensor[[n, 16], pl.FP32], acc: pl.InOut[pl.Tensor[[n, 16], pl.FP32]],
             y: pl.Out[pl.Tensor[[n, 16], pl.FP32]]):
        for b in pl.spmd(n, name_hint="rows"):
            t = acc[b:b + 1, 0:16] + x[b:b + 1, 0:16]
            acc[b:b + 1, 0:16] = t
            y[b:b + 1, 0:16] = t
        with pl.at(name_hint="fails"):
            x[0:n + 1, 0:16]

    x, acc, y = torch.randn(n, 16), torch.randn(n, 16), torch.randn(n, 16)
    acc0, y0 = acc.clone(), y.clone()
    reset_templates()
    with block_templates(templates):
        with pytest.raises(DslError):
            rows.run(x, acc, y)
    assert torch.equal(acc, acc0) and torch.equal(y, y0)
    info = template_info()
    # with templates on, the middle blocks really ran from the template (else the test proves nothing)
    assert (info["tasks"], info["templated"] >= n - 3) == ((1, True) if templates else (0, False))


def _overlap_pairwise(spans) -> bool:
    """The definition: some written span shares a byte with another span (both nonempty)."""
    return any(w and wn and sn and s0 < w0 + wn and w0 < s0 + sn
               for i, (w0, wn, w) in enumerate(spans) for j, (s0, sn, _) in enumerate(spans) if i != j)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.booleans()), max_size=8))
def test_written_overlap_equals_the_pairwise_definition(spans):
    """program.written_overlap (the in-place decision of a plain run and of a replay) sweeps the
    spans in order of first byte; it must answer as the pairwise test over every two spans."""
    from pto.runtime.program import written_overlap
    assert written_overlap(spans) == _overlap_pairwise(spans)


def test_written_overlap_cases():
    from pto.runtime.program import written_overlap
    assert not written_overlap([(0, 8, True), (8, 8, False), (16, 8, True)])  # adjacent, disjoint
    assert written_overlap([(0, 8, False), (4, 8, True)])  # a written span inside a read one's bytes
    assert written_overlap([(4, 8, True), (0, 16, False)])
    assert not written_overlap([(0, 8, False), (0, 8, False)])  # the same In tensor twice
    assert written_overlap([(0, 8, True), (0, 8, False)])  # an Out aliasing an In
    assert not written_overlap([(0, 0, True), (0, 8, False)])  # an empty tensor shares no byte
