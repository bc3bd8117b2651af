"""pto sim said allocation-time initialisation made qkv_proj_rope's decode 9% faster on a2a3;
the device says the opposite (pypto-lib PR #829): the AICPU fills an init_value buffer inline
while it submits tasks, so every later submission waits, while an on-core seed task overlaps.
The simulator charged the fill to a free-standing fill engine that only the buffer's first
user waited for."""

import pytest
import torch

import pto
import pto.models.deepseek_v4  # noqa: F401 - fills the registry
from pto.golden import ScalarSpec, get_case
from pto.runtime.simulate import get_machine, simulate


def _run(seed_scopes):
    cr = get_case("qkv_proj_rope").build("flash", "decode", seed_scopes=seed_scopes)
    torch.manual_seed(0)
    vals = [s.to_python() if isinstance(s, ScalarSpec) else s.create_tensor() for s in cr.specs]
    return cr.fn.run(*vals, config=pto.RunConfig())


def test_init_value_is_slower_than_seed_tasks_on_qkv_proj_rope_decode():
    m = get_machine("a2a3")
    seed, init = simulate(_run(True), m), simulate(_run(False), m)
    assert (seed.tasks, init.tasks, seed.fills, init.fills) == (9, 7, 0, 2)
    # the orchestration stream: 2 fewer submissions, 96 KiB more AICPU fill, nothing else
    assert init.orch_us - seed.orch_us == pytest.approx(m.fill_us(98304) - 2 * m.submit_us)
    # every task of the init variant is submitted after both fills (they come first in the program)
    first_submit = min(r.start_us for r in init.aicpu_runs if r.kind == "submit")
    assert first_submit == pytest.approx(m.fill_us(98304))
    assert init.effective_us > seed.effective_us + 0.5 * (init.orch_us - seed.orch_us)
