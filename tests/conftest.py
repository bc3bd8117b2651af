"""Shared pytest setup: make ``src/`` importable when the package is not
installed, and run torch single-threaded: the tests are many small ops, for
which intra-op threads on this 2-core machine only add contention."""

import sys
from pathlib import Path

import torch

_SRC = Path(__file__).resolve().parent.parent / "src"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

torch.set_num_threads(1)

import pto.models.deepseek_v4  # noqa: E402,F401 - fills the kernel registry (the golden layer does not import it)


import pytest  # noqa: E402


@pytest.fixture
def fresh_program_cache():
    """The program cache on, empty and at its default bound before and after the test
    (tests that count recordings and replays: ``pytestmark = pytest.mark.usefixtures(...)``)."""
    from pto.runtime import clear_program_cache, set_program_cache, set_program_cache_size
    set_program_cache(True)
    set_program_cache_size(256)
    clear_program_cache()
    yield
    set_program_cache(True)
    set_program_cache_size(256)
    clear_program_cache()


@pytest.fixture
def replays_match(fresh_program_cache):
    """``check(parametric, cases, run_one)``: calls ``run_one(case)`` for every case in order with
    the program cache on and empty and parametric recordings on or off (``run_one`` asserts the
    call's result), then asserts that at least one of the calls was a replay."""
    from pto.runtime import cache_info, parametric_replay

    def check(parametric: bool, cases, run_one) -> None:
        with parametric_replay(parametric):
            for case in cases:
                run_one(case)
        assert cache_info()["replayed"] >= 1

    return check


@pytest.fixture
def plain_run():
    """``plain_run(fn)``: ``fn()``'s result with the program cache off (a plain run, never a
    recording or a replay), the cache's on/off state restored afterwards."""
    from pto.runtime import program_cache_enabled, set_program_cache

    def call(fn):
        was = program_cache_enabled()
        set_program_cache(False)
        try:
            return fn()
        finally:
            set_program_cache(was)

    return call


@pytest.fixture
def templated_runs_match(monkeypatch):
    """``check(run, want)``: ``run()`` (a fresh output tensor each call) equals ``want`` exactly in a
    plain run, in the block-template recording and in the templated (batched) run after it, with
    runs of 4 blocks already templated (``blocks.MIN_BLOCKS``); the templates are forgotten before
    and after."""
    from pto.runtime import blocks, block_templates

    monkeypatch.setattr(blocks, "MIN_BLOCKS", 4)
    blocks.reset_templates()

    def check(run, want) -> None:
        for templates in (False, True, True):
            with block_templates(templates):
                got = run()
            torch.testing.assert_close(got, want, rtol=0, atol=0)

    yield check
    blocks.reset_templates()
