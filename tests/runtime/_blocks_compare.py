"""Run a registered kernel case plainly with block templates off and on and compare everything
(helper of tests/runtime/test_blocks.py and test_block_templates_batching.py)."""

import pytest
import torch

import pto
import pto.runtime as rt
from pto.runtime import blocks as B
from pto.golden import TensorSpec, ScalarSpec
from pto.runtime import Program, RunConfig


def case_values(run, seed: int = 0) -> list:
    """The kernel arguments of a CaseRun, built from its specs with ``seed``."""
    torch.manual_seed(seed)
    return [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in run.specs]


def run_once(fn, values, templates: bool, config=None):
    """One plain run (no program cache) on clones of ``values``; returns (program, arguments after)."""
    args = [v.clone() if isinstance(v, torch.Tensor) else v for v in values]
    with rt.block_templates(templates):
        prog = Program(fn, config or RunConfig(keep_footprints=True)).execute(tuple(args), {})
    return prog, args


def graph_view(prog) -> list:
    """Tasks with their blocks' counters, footprints and edges, comparable across programs."""
    out = []
    for t in prog.graph.tasks:
        blocks = [(b.idx, b.phase, b.ops, b.flops, b.bytes, b.ld, b.st, b.mm, b.vk, b.cube) for b in t.blocks]
        fps = [(buf.name, buf.id, k, tuple(box)) for buf, k, box in t.footprints]
        out.append((t.id, t.name, t.kind, t.site, t.n_blocks, sorted(t.preds), blocks, fps))
    return out


def stats_view(prog) -> dict:
    s = prog.stats
    return {k: getattr(s, k) for k in ("tasks", "dummies", "blocks", "tile_ops", "bytes", "flops", "heap_peak_bytes",
                                       "scratch_bytes", "scratch_tensors", "init_bytes", "edges")}


def compare(fn, values, config=None) -> dict:
    """Run off and on; assert bit-identical arguments, equal graph and stats; returns template_info."""
    return _compare(fn, values, config)[0]


def _compare(fn, values, config=None):
    rt._blocks.reset_templates()
    p0, a0 = run_once(fn, values, False, config)
    p1, a1 = run_once(fn, values, True, config)
    for x, y in zip(a0, a1):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
    assert graph_view(p0) == graph_view(p1)
    assert stats_view(p0) == stats_view(p1)
    return rt._blocks.template_info(), p1


def both(fn, make_args):
    """:func:`compare` on the arguments ``make_args()`` builds after ``torch.manual_seed(0)``;
    returns (template_info, the program run with templates)."""
    torch.manual_seed(0)
    return _compare(fn, make_args())


def run_args(fn, *args, templates=True):
    """One plain run of ``fn`` on ``args`` themselves (footprints kept), templates on or off."""
    with rt.block_templates(templates):
        return Program(fn, RunConfig(keep_footprints=True)).execute(args, {})


@pytest.fixture
def small_tasks(monkeypatch):
    """Templates for small test tasks too (by default only tasks of >= 24 blocks, and later tasks of a
    site only where the batches paid for the recordings: ``RECORD_BLOCKS``); a test module
    uses it with ``pytestmark = pytest.mark.usefixtures("small_tasks")`` after importing it."""
    monkeypatch.setattr(B, "MIN_BLOCKS", 4)
    monkeypatch.setattr(B, "RECORD_BLOCKS", 0)  # later tasks of a site keep their templates however small
    yield
    B.reset_templates()
