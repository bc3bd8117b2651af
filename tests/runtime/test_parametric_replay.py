"""Parametric recordings of the program cache (runtime/replay.py, runtime/symbolic.py).

* a value read from data that only feeds offsets, footprints and torch arguments replays with
  another value: bit-identical outputs, the graph of a plain run (re-derived from the replay's
  own footprints);
* every way a read value steers Python is a guard that diverges to a plain run: a comparison
  (its outcome), a Python list index, a loop count, a float scalar operand (its exact value,
  ``-0.0`` not ``0.0``);
* the registered decode sparse-attention cores replay decode steps at successive positions;
  two prefill chunks of a prefill kernel give the plain results either way;
* ``generate`` with parametric recordings on gives the tokens, logits and caches of a run with
  the program cache off (20 decode steps; a chunked prefill).
"""

import math
import struct

import numpy
import pytest
import torch

import pto.language as pl
from pto.golden import get_case
from pto.golden.harness import resolve_outputs
from pto.golden import TensorSpec
from pto.runtime import cache_info, parametric_replay, parametric_replay_enabled, set_program_cache
from pto.runtime.symbolic import Sym, evaluate

from test_program_cache import graph_record

pytestmark = pytest.mark.usefixtures("fresh_program_cache")


@pl.jit
def picked(sel: pl.Tensor[[1, 4], pl.INT32], x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="pick"):
        s = pl.read(sel, [0, 0])  # a row offset: symbolic (footprint, view offset)
        k = pl.read(sel, [0, 1])  # an index into a Python list: guarded by its value
        n = pl.read(sel, [0, 2])  # a loop count: guarded by its value
        rows = [0, 4, 8, 12][k]
        t = x[s:s + 1, 0:16]
        for _ in range(n):
            t = t + t
        y[rows:rows + 1, 0:16] = t
        if s > 8:  # a comparison: guarded by its outcome
            y[15:16, 0:16] = x[0:1, 0:16]
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="after"):
        y[s + 1:s + 2, 0:16] = x[s + 1:s + 2, 0:16] * 2.0  # reads the row the first task may have written
    return y


def _picked_ref(sel, x):
    s, k, n = sel
    y = torch.zeros(16, 16)
    t = x[s].clone()
    for _ in range(n):
        t = t + t
    y[[0, 4, 8, 12][k]] = t
    if s > 8:
        y[15] = x[0]
    y[s + 1] = x[s + 1] * 2.0
    return y


def _sel(s, k, n):
    return torch.tensor([[s, k, n, 0]], dtype=torch.int32)


def test_reads_that_feed_offsets_replay_and_reads_that_steer_python_diverge():
    x = torch.randn(16, 16)
    calls = [((3, 1, 2), True), ((5, 1, 2), True), ((0, 1, 2), True),  # other offsets: replays
             ((9, 1, 2), False), ((7, 1, 2), True),  # ``s > 8`` flips
             ((5, 2, 2), False), ((6, 1, 2), True),  # another list index
             ((5, 1, 3), False), ((2, 1, 2), True)]  # another loop count
    set_program_cache(False)
    plain = [graph_record(picked.run(_sel(*sel), x, torch.zeros(16, 16))) for sel, _ in calls]
    set_program_cache(True)
    with parametric_replay():
        for _ in range(2):  # a first call, then the recording
            picked.run(_sel(3, 1, 2), x, torch.zeros(16, 16))
        for (sel, replays), rec in zip(calls, plain):
            y = torch.zeros(16, 16)
            prog = picked.run(_sel(*sel), x, y)
            assert torch.equal(y, _picked_ref(sel, x)), sel
            assert prog.replayed == replays, sel
            assert graph_record(prog) == rec, sel  # edges re-derived from this call's footprints
    info = cache_info()
    assert (info["recorded"], info["replayed"], info["diverged"], info["errors"]) == (1, 6, 3, 0)


@pl.jit
def filled_by_read(pos: pl.Tensor[[1, 4], pl.INT32], out: pl.Out[pl.Tensor[[2, 8], pl.INT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="fill"):
        p = pl.read(pos, [0, 0])
        t = pl.full([2, 8], pl.INT32, p + 1)  # a fill value read from data
        pl.write(t, [1, 3], p * 2)  # an element written from a read value
        out[0:2, 0:8] = t
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="write"):
        pl.write(out, [0, 7], p - 1)
    return out


def test_fill_values_and_written_elements_read_from_data_replay():
    with parametric_replay():
        for p in (5, 5, 9, 100, -3):
            out = torch.zeros(2, 8, dtype=torch.int32)
            prog = filled_by_read.run(torch.tensor([[p, 0, 0, 0]], dtype=torch.int32), out)
            ref = torch.full((2, 8), p + 1, dtype=torch.int32)
            ref[1, 3], ref[0, 7] = p * 2, p - 1
            assert torch.equal(out, ref), p
        assert prog.replayed and cache_info()["replayed"] == 3 and cache_info()["diverged"] == 0


@pl.jit
def tiled_by_read(n_t: pl.Tensor[[1, 4], pl.INT32], x: pl.Tensor[[32, 8], pl.FP32],
                  out: pl.Out[pl.Tensor[[32, 8], pl.FP32]]):
    from pto.models.deepseek_v4.tiling import expect_tensor, round_up
    expect_tensor("tiled_by_read", "x", x, [32, 8], pl.FP32)  # model code outside the trusted dirs
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="tiled"):
        n = pl.read(n_t, [0, 0])
        m = min(16, round_up(n, 16))  # a count read from data: symbolic, min guards its outcome
        out[0:m, 0:8] = x[0:m, 0:8] * 2.0
    return out


def test_model_tiling_helpers_keep_a_read_count_symbolic():
    # tiling.expect_tensor compared dtypes with ``is not`` (the identity watch stopped every
    # parametric recording of a model program there) and round_up took int() of a read count
    # (an exact guard: another count, another path)
    x = torch.randn(32, 8)
    with parametric_replay():
        for n in (3, 3, 9, 16, 1):
            out = torch.zeros(32, 8)
            prog = tiled_by_read.run(torch.tensor([[n, 0, 0, 0]], dtype=torch.int32), x, out)
            ref = torch.zeros(32, 8)
            ref[0:16] = x[0:16] * 2.0
            assert torch.equal(out, ref), n
            assert prog.replayed == (n != 3), n
    info = cache_info()
    assert (info["recorded"], info["replayed"], info["diverged"], info["uncacheable"]) == (1, 3, 0, 0), info


@pl.jit
def counted_positive(v: pl.Tensor[[1, 32], pl.INT32], out: pl.Out[pl.Tensor[[1, 8], pl.INT32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="count"):
        row = v[0:1, 0:32]
        n = 0
        for j in range(32):
            if pl.read(row, [0, j]) > 0:  # one outcome guard per element
                n += 1
        out[0:1, 0:8] = pl.full([1, 8], pl.INT32, n)
    return out


def test_a_recording_past_its_guard_budget_gives_up_and_the_call_runs_plain(monkeypatch):
    import pto.runtime.replay as replay
    monkeypatch.setattr(replay, "_GUARD_BUDGET", 10)
    torch.manual_seed(0)
    with parametric_replay():
        for k in range(4):
            v = torch.randint(-5, 5, (1, 32), dtype=torch.int32)
            out = torch.zeros(1, 8, dtype=torch.int32)
            prog = counted_positive.run(v, out)
            assert torch.equal(out, torch.full((1, 8), int((v > 0).sum()), dtype=torch.int32)), k
            assert not prog.replayed
    # call 2 gave up (uncacheable): the key went back to exact keys, where every call is a first one
    info = cache_info()
    assert (info["uncacheable"], info["recorded"], info["replayed"], info["plain"]) == (1, 0, 0, 3)


def test_replay_debug_keeps_why_a_recording_gave_up_and_its_guards_by_site(monkeypatch):
    import pto.runtime.replay as replay
    monkeypatch.setattr(replay, "_GUARD_BUDGET", 10)
    monkeypatch.setattr(replay, "_DEBUG", True)
    monkeypatch.setattr(replay, "_DIVERGED_AT", [])
    monkeypatch.setattr(replay, "_GUARD_SITES", {})
    v = torch.arange(-16, 16, dtype=torch.int32).reshape(1, 32)
    with parametric_replay():
        for _ in range(2):  # a first call, then the recording that gives up at its 11th guard
            counted_positive.run(v, torch.zeros(1, 8, dtype=torch.int32))
    assert ("counted_positive", "gave up: more than 10 guards on values read from data") in replay._DIVERGED_AT
    sites = replay._GUARD_SITES["counted_positive"]
    assert sum(sites.values()) == 10  # the guards taken before it gave up
    assert [kind for kind, _ in sites] == ["outcome"] and "test_parametric_replay.py" in next(iter(sites))[1]


@pl.jit
def scaled_by_read(v: pl.Tensor[[1, 8], pl.FP32], x: pl.Tensor[[8, 16], pl.FP32],
                   y: pl.Out[pl.Tensor[[8, 16], pl.FP32]]):
    with pl.at(level=pl.Level.CORE_GROUP, name_hint="scale"):
        a = pl.read(v, [0, 0])
        y[0:8, 0:16] = x[0:8, 0:16] * a  # a float scalar operand: guarded by its exact value
    return y


def test_a_float_read_is_guarded_by_its_exact_value_and_sign():
    x = torch.rand(8, 16) + 0.5
    with parametric_replay():
        for v, replays in ((0.0, False), (0.0, False), (0.0, True), (-0.0, False), (2.5, False)):
            y = torch.zeros(8, 16)
            prog = scaled_by_read.run(torch.full((1, 8), v), x, y)
            assert torch.equal(y.view(torch.int32), (x * v).view(torch.int32)), v  # -0.0 * x is -0.0
            assert prog.replayed == replays, v


def test_symbols_stay_symbolic_in_arithmetic_and_guard_where_they_leave():
    class Rec:
        active, quiet = True, 0

        def __init__(self):
            self.guards = []

        def guard_outcome(self, node, out):
            self.guards.append(("outcome", node, out))

        def guard_exact(self, node, v):
            self.guards.append(("exact", node, v))

        def pending_index(self, node, v, frame, lasti):
            self.guards.append(("exact", node, v))

    rec = Rec()
    p = Sym(37, ("R", 0), rec)
    q = Sym(5, ("R", 1), rec)
    w = (p + 4) * 2 - q // 3
    assert type(w) is Sym and w.v == 81 and evaluate(w.n, {0: 100, 1: 9}) == 205 and rec.guards == []
    assert (p + 4) - p == 4 and type((p + 4) - p) is int  # a window extent is a plain number
    assert (p < q) is False and rec.guards[-1] == ("outcome", ("<", ("R", 0), ("R", 1)), False)
    assert [10, 20, 30, 40, 50, 60][q] == 60 and rec.guards[-1] == ("exact", ("R", 1), 5)
    assert len(range(q)) == 5 and int(p) == 37 and hash(p) == hash(37) and f"{p}" == "37"
    assert [g[0] for g in rec.guards[-5:]] == ["exact"] * 5
    for use in (lambda: struct.pack("i", q), lambda: [0] * q, lambda: "abcdef"[q], lambda: math.log2(q),
                lambda: numpy.array([q]).dtype == numpy.array([5]).dtype, lambda: "%d" % q, lambda: {5: 1}[q]):
        n = len(rec.guards)
        assert use()  # C code and libraries get the number, and the recording a guard on it
        assert ("exact", ("R", 1), 5) in rec.guards[n:]  # a dict lookup also guards ``q == 5``
    rec.active = False
    n = len(rec.guards)
    assert p > 3 and int(p) == 37 and rec.guards[n:] == []  # a finished recording's symbols are numbers


def _case_runs(name: str, mode: str, starts: list) -> list:
    """``(case run, argument values, output indices)`` of kernel ``name`` at each start_pos."""
    runs = []
    for sp in starts:
        cr = get_case(name).build("tiny", mode, start_pos=sp)
        torch.manual_seed(0)
        specs = resolve_outputs(cr.fn, cr.specs)
        vals = [s.create_tensor() if isinstance(s, TensorSpec) else s.to_python() for s in specs]
        outs = [i for i, s in enumerate(specs) if isinstance(s, TensorSpec) and s.is_output]
        runs.append((cr, vals, outs))
    return runs


def _plain_then_parametric(runs: list) -> list:
    """Run ``runs`` with the cache off, then in order with parametric recordings on; asserts
    the outputs and graphs agree and returns which calls replayed."""
    set_program_cache(False)
    ref = []
    for cr, vals, outs in runs:
        args = [v.clone() if isinstance(v, torch.Tensor) else v for v in vals]
        prog = cr.fn.run(*args)
        ref.append(([args[i] for i in outs], graph_record(prog)))
    set_program_cache(True)
    replayed = []
    with parametric_replay():
        for step, ((cr, vals, outs), (ref_out, ref_graph)) in enumerate(zip(runs, ref)):
            args = [v.clone() if isinstance(v, torch.Tensor) else v for v in vals]
            prog = cr.fn.run(*args)
            assert all(_same(args[i], r) for i, r in zip(outs, ref_out)), f"{cr.label} call {step}"
            assert graph_record(prog) == ref_graph, f"{cr.label} call {step}"  # re-derived from its footprints
            replayed.append(prog.replayed)
    return replayed


def _same(a, b) -> bool:
    return torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(a.isnan(), b.isnan())
                                 and torch.equal(a.nan_to_num(), b.nan_to_num()))


@pytest.mark.parametrize("name,base", [("decode_sparse_attn_swa", (300, 200, 150, 140)),
                                       ("decode_sparse_attn_csa", (122, 110, 100, 90))])
def test_decode_steps_at_successive_positions_replay_with_the_plain_graph(name, base):
    starts = [tuple(p + k if p >= 0 else p for p in base) for k in range(5)]
    replayed = _plain_then_parametric(_case_runs(name, "decode", starts))
    assert replayed == [False, False, True, True, True], cache_info()  # a first call, the recording, replays
    assert cache_info()["recorded"] == 1 and cache_info()["replayed"] == 3


def test_two_prefill_chunks_give_the_plain_results():
    # the chunks' positions steer the kernel's Python (page dicts, int() of positions): the
    # recording gives up and the chunks run plain, with the plain results and graphs
    replayed = _plain_then_parametric(_case_runs("prefill_compressor_ratio128", "prefill", [128, 256, 384]))
    assert replayed == [False, False, False]
    assert cache_info()["uncacheable"] == 1 and cache_info()["errors"] == 0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint
    ckpt = write_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny") / "ckpt"), seed=0)
    return KernelModel(open_checkpoint(str(ckpt), "int8"), get_deployment("tiny"))


def _generate(model, prompt, new, chunk):
    from pto.models.deepseek_v4.generate import generate
    res = generate(model, [prompt], max_new_tokens=new, chunk=chunk, eos_token_id=None, keep_logits=True)
    return res.tokens[0], torch.cat(res.prompt_logits), torch.stack(res.step_logits[0])


# (6, 21, 128): decode_fwd's second step is recorded (tiling.expect_tensor's ``is not`` made the
# identity watch stop it before), the next step diverges (its window rows and routing differ) and
# the key goes back to exact keys; (40, 2, 16): prefill_fwd's recording passes the guard budget
@pytest.mark.parametrize("prompt_len,new,chunk,recorded", [(6, 21, 128, 1), (40, 2, 16, 0)])
def test_generate_with_parametric_recordings_equals_the_cache_off(tiny_model, prompt_len, new, chunk, recorded):
    prompt = torch.randint(0, 512, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    set_program_cache(False)
    ref = _generate(tiny_model, prompt, new, chunk)
    set_program_cache(True)
    with parametric_replay():
        got = _generate(tiny_model, prompt, new, chunk)
    assert not parametric_replay_enabled()
    assert got[0] == ref[0]
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    assert cache_info()["errors"] == 0 and cache_info()["recorded"] == recorded, cache_info()
