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
