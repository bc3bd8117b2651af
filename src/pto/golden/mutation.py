"""Mutation sweep over allocation-time initialisation (``pto check KERNEL --drop-init all``).

Each ``init_value`` of a run is dropped in turn (``RunConfig(drop_init=(name,))``) and the
kernel is run again in check mode: an initialisation is load-bearing when dropping it is
caught, by a check-mode error (UndefinedOutputError, UndefinedValueError, RaceError) or by
the golden comparison; one that is not caught either is never read undefined or only
feeds values that are discarded (e.g. a zero table that is never dereferenced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pto.errors import PtoError
from pto.golden.harness import RunResult
from pto.runtime import Program, RunConfig

__all__ = ["DropInitOutcome", "init_allocations", "drop_init_sweep"]


@dataclass
class DropInitOutcome:
    """What dropping the ``init_value`` of one allocation name did.

    Attributes:
        name: allocation name (``create_tensor``'s ``name=`` or its assignment target);
        site: ``file:line`` of its first allocation; init_value: the value dropped;
        count: allocations of that name with an init_value in the run (loops allocate again);
        caught: the run failed; by: the error class, or ``"golden mismatch"``;
        detail: the first line of the error or of the mismatch ("" when not caught); a
            message of several problems says how many there are and that this is the first.
    """

    name: str
    site: str
    init_value: object
    count: int
    caught: bool
    by: str
    detail: str


def init_allocations(program: Program) -> list[tuple]:
    """The allocation names of ``program`` that had an ``init_value`` (dropped ones too), in
    order of first allocation: ``(name, site of the first, init_value, count)``."""
    seen: dict = {}
    for buf in program.allocations():
        if buf.init_value is None and not buf.init_dropped:
            continue
        hit = seen.get(buf.name)
        if hit is None:
            seen[buf.name] = [buf.name, buf.site, buf.init_value, 1]
        else:
            hit[3] += 1
    return [tuple(v) for v in seen.values()]


# the count a message of several problems tags its first line with (sanitizer._join): the other
# problems follow on later lines, which a one-line detail leaves out
_SEVERAL = re.compile(r" \[(\d+) ([^\]]+?) in all; every one below\]")


def _first_line(text: str, limit: int = 200) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    line = _SEVERAL.sub(r" [the first of \1 \2]", line)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def drop_init_sweep(run, baseline: Program) -> list[DropInitOutcome]:
    """Run once per allocation name of ``baseline`` that has an ``init_value``, with it dropped.

    Args:
        run: ``run(config: RunConfig) -> RunResult | Program``: one check-mode run of the
            kernel under ``config`` (``pto.golden.run_jit`` with the golden, or ``fn.run`` on
            fresh arguments); a RunResult that did not pass counts as caught by the golden.
        baseline: a passing run of the same kernel (its allocations are the ones dropped).

    Returns:
        One DropInitOutcome per allocation name, in order of first allocation.
    """
    out = []
    for name, site, init_value, count in init_allocations(baseline):
        caught, by, detail = False, "", ""
        try:
            res = run(RunConfig(check=True, drop_init=(name,)))
            if isinstance(res, RunResult) and not res.passed:
                caught, by, detail = True, "golden mismatch", _first_line(res.error)
        except PtoError as e:
            caught, by, detail = True, type(e).__name__, _first_line(e)
        except Exception as e:  # noqa: BLE001 - the garbage reached torch or kernel code: caught, but say how
            caught, by, detail = True, type(e).__name__, _first_line(e)
        out.append(DropInitOutcome(name, site, init_value, count, caught, by, detail))
    return out
