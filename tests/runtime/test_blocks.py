"""Block templates (runtime/blocks.py): the same outputs, graph, statistics and errors as plain blocks."""

import sys
from pathlib import Path

import pytest
import torch

import pto
import pto.language as pl
import pto.runtime as rt
from pto.errors import DslError, PtoError
from pto.golden import REGISTRY
from pto.runtime import Program, RunConfig
from pto.runtime import blocks as B

sys.path.insert(0, str(Path(__file__).parent))
import _blocks_compare as C  # noqa: E402
from _blocks_compare import small_tasks  # noqa: E402,F401 - the fixture, used by every test here

pytestmark = pytest.mark.usefixtures("small_tasks")

import pto.models.deepseek_v4  # noqa: E402,F401 - fills the registry


CASES = [(name, mode) for name, case in sorted(REGISTRY.items()) if case.group == "model" for mode in case.modes]


@pytest.mark.parametrize("name, mode", CASES)
def test_registered_case_same_with_templates(name, mode):
    run = REGISTRY[name].build("tiny", mode)
    C.compare(run.fn, C.case_values(run))


def test_templates_run_most_blocks_of_prefill_sparse_attn():
    run = REGISTRY["prefill_sparse_attn"].build("tiny", "prefill")
    info = C.compare(run.fn, C.case_values(run))
    assert info["restarts"] == 0 and info["templated"] > 200  # qk_pv / merge_norm: 128 blocks each


@pl.jit
def partial_rows(x: pl.Tensor[[30, 8], pl.FP32], y: pl.Out[pl.Tensor[[30, 8], pl.FP32]]):
    for b in pl.spmd(8, name_hint="rows"):
        n = min(4, 30 - b * 4)
        t = pl.slice(x, [4, 8], [b * 4, 0], valid_shape=[n, 8])
        pl.assemble(y, pl.exp(t), [b * 4, 0])
    return y


def test_last_partial_block_runs_plainly():
    info, _ = C.both(partial_rows, lambda: (torch.randn(30, 8), torch.zeros(30, 8)))
    assert info["templated"] == 6 and info["restarts"] == 0  # blocks 1..6; 0 recorded, 7 plain


@pl.jit
def branchy(x: pl.Tensor[[64, 8], pl.FP32], flags: pl.Tensor[[16, 1], pl.INT32],
            y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="branch"):
        y[b * 4:(b + 1) * 4, 0:8] = x[b * 4:(b + 1) * 4, 0:8]  # a store before the data-dependent guard
        if pl.read(flags, [b, 0]) > 0:
            y[b * 4:(b + 1) * 4, 0:8] = pl.mul(x[b * 4:(b + 1) * 4, 0:8], 2.0)
        else:
            y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[b * 4:(b + 1) * 4, 0:8])
    return y


def test_data_dependent_branch_undoes_and_records_a_variant():
    flags = torch.tensor([[1], [1], [0], [1], [0], [0], [1], [1], [0], [1], [1], [1], [0], [1], [0], [1]],
                         dtype=torch.int32)
    info, _ = C.both(branchy, lambda: (torch.randn(64, 8), flags.clone(), torch.zeros(64, 8)))
    assert info["recorded"] == 2 and info["diverged"] == 1 and info["restarts"] == 0
    assert info["templated"] == 13


@pl.jit
def overlapping(x: pl.Tensor[[40, 8], pl.FP32], y: pl.Out[pl.Tensor[[40, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="overlap"):  # block b writes rows 2b .. 2b+8: later blocks overwrite
        pl.assemble(y, pl.add(x[b * 2:b * 2 + 8, 0:8], float(1)), [b * 2, 0])
    return y


def test_stores_to_overlapping_windows_keep_program_order():
    info, _ = C.both(overlapping, lambda: (torch.randn(40, 8), torch.zeros(40, 8)))
    assert info["templated"] == 14 and info["batched"] == 0  # block by block: the windows overlap


@pl.jit
def uniform(x: pl.Tensor[[256, 16], pl.FP32], w: pl.Tensor[[16, 16], pl.BF16],
            y: pl.Out[pl.Tensor[[256, 16], pl.FP32]], s: pl.Out[pl.Tensor[[256, 1], pl.FP32]]):
    for b in pl.spmd(32, name_hint="uniform"):  # loads, elementwise, a row reduction, a matmul, stores
        t = x[b * 8:(b + 1) * 8, 0:16]
        m = pl.row_max(t)
        e = pl.exp(pl.row_expand_sub(t, m))
        y[b * 8:(b + 1) * 8, 0:16] = pl.matmul(pl.cast(e, pl.BF16, mode="rint"), w[0:16, 0:16])
        s[b * 8:(b + 1) * 8, 0:1] = pl.row_sum(e)
    return y


def test_uniform_blocks_run_batched_bit_identical():
    info, _ = C.both(uniform, lambda: (torch.randn(256, 16), torch.randn(16, 16).to(torch.bfloat16),
                                      torch.zeros(256, 16), torch.zeros(256, 1)))
    assert info["batched"] == 30 and info["restarts"] == 0  # blocks 1..30 at once


@pl.jit
def fails_in_block(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="bounds"):
        r = b * 4 if b != 9 else 62  # block 9 reads past the last row
        y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[r:r + 4, 0:8])
    return y


def test_error_in_block_k_is_the_plain_error():
    msgs = []
    for on in (False, True):
        y = torch.full((64, 8), 7.0)
        with pytest.raises(PtoError) as e:
            C.run_args(fails_in_block, torch.randn(64, 8), y, templates=on)
        msgs.append((type(e.value), str(e.value)))
        assert torch.equal(y, torch.full((64, 8), 7.0))  # nothing half-written
    assert msgs[0] == msgs[1] and "block 9" in msgs[0][1]


@pl.jit
def raise_later(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="fill"):
        y[b * 4:(b + 1) * 4, 0:8] = pl.exp(x[b * 4:(b + 1) * 4, 0:8])
    with pl.at(name_hint="bad"):
        y[60:68, 0:8] = x[0:8, 0:8]  # out of bounds: the program fails after the templated stores
    return y


def test_program_failing_after_templated_stores_leaves_caller_tensors():
    y = torch.full((64, 8), 3.0)
    with pytest.raises(DslError):
        C.run_args(raise_later, torch.randn(64, 8), y)
    assert torch.equal(y, torch.full((64, 8), 3.0))


@pl.jit
def identity_test(x: pl.Tensor[[64, 8], pl.FP32], y: pl.Out[pl.Tensor[[64, 8], pl.FP32]]):
    for b in pl.spmd(16, name_hint="typed"):
        k = _kind(b)
        y[b * 4:(b + 1) * 4, 0:8] = pl.add(x[b * 4:(b + 1) * 4, 0:8], float(k))
    return y


def _kind(v):
    return 1 if type(v) is int else 2  # tells a symbol from an int: the recording cannot go on


def test_recording_that_cannot_go_on_reruns_the_program_plainly():
    info, _ = C.both(identity_test, lambda: (torch.randn(64, 8), torch.zeros(64, 8)))
    assert info["restarts"] == 1
    B.reset_templates()


def test_switches():
    with pytest.raises(TypeError):
        rt.set_block_templates(1)
    with pytest.raises(TypeError):
        rt.block_templates("yes")
    before = rt.block_templates_enabled()
    with rt.block_templates(not before):
        assert rt.block_templates_enabled() is (not before)
    assert rt.block_templates_enabled() is before


def test_check_mode_and_graph_only_run_plain_blocks():
    B.reset_templates()
    x, y = torch.randn(64, 8), torch.zeros(64, 8)
    with rt.block_templates(True):
        Program(identity_test, RunConfig(check=True)).execute((x, y), {})
        Program(identity_test, RunConfig(execute=False)).execute((x, y), {})
    assert B.template_info()["tasks"] == 0


def test_generate_same_tokens_with_templates(tmp_path):
    from pto.models.deepseek_v4.checkpoint import write_tiny_checkpoint
    from pto.models.deepseek_v4.config import get_deployment
    from pto.models.deepseek_v4.generate import generate
    from pto.models.deepseek_v4.layer import KernelModel
    from pto.models.deepseek_v4.weights import open_checkpoint
    ck = write_tiny_checkpoint(tmp_path / "tiny", seed=3)
    dep = get_deployment("tiny").replace(max_context=64, rope_max_pos=64)
    out = []
    for on in (False, True):
        rt.clear_program_cache()
        with rt.block_templates(on):
            km = KernelModel(open_checkpoint(ck, "int8"), dep)
            out.append(generate(km, [list(range(3, 40))], max_new_tokens=3, eos_token_id=None, keep_logits=True))
    assert out[0].tokens == out[1].tokens
    assert B.template_info()["templated"] > 100
    assert all(torch.equal(a, b) for a, b in zip(out[0].prompt_logits, out[1].prompt_logits))
    assert all(torch.equal(a, b) for x, y in zip(out[0].step_logits, out[1].step_logits) for a, b in zip(x, y))


@pl.jit
def skip_masked(x: pl.Tensor[[128, 8], pl.FP32], flags: pl.Tensor[[32, 1], pl.INT32],
                y: pl.Out[pl.Tensor[[128, 8], pl.FP32]]):
    for b in pl.spmd(32, name_hint="skip"):  # a store, then a path chosen by a value read from data
        t = x[b * 4:(b + 1) * 4, 0:8]
        y[b * 4:(b + 1) * 4, 0:8] = t
        if pl.read(flags, [b, 0]) > 0:
            y[b * 4:(b + 1) * 4, 0:8] = pl.exp(t)
    return y


def test_batch_with_data_guards_undoes_the_blocks_that_took_another_path():
    flags = torch.ones(32, 1, dtype=torch.int32)
    flags[[3, 4, 17, 30]] = 0
    info, _ = C.both(skip_masked, lambda: (torch.randn(128, 8), flags.clone(), torch.zeros(128, 8)))
    assert info["batched"] == 26 and info["restarts"] == 0  # blocks 1..30 at once, but 3, 4, 17 and 30
