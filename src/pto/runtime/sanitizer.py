"""Definedness sanitizer, end-of-program check (DESIGN section 5).

Shadow masks live on every root buffer (``Buffer.shadow``: INT32, 0 =
defined, k = undefined with origin allocation k) and on every tile
(``Tile.mask``); loads, stores and tile ops propagate them (tensor_ops.py,
tile_ops.py). Reading an undefined padding row whose results are later
discarded is legal and reports nothing: the check happens here, on what
reaches an output.
"""

from __future__ import annotations

import torch

from pto.errors import UndefinedOutputError
from pto.language.typing import INOUT, OUT

__all__ = ["check_outputs", "undefined_box"]


def undefined_box(bad: torch.Tensor) -> list[list[int]]:
    """Bounding box ``[[lo, hi), ...]`` per dim of the True elements of ``bad``."""
    idx = bad.nonzero()
    return [[int(idx[:, d].min()), int(idx[:, d].max()) + 1] for d in range(bad.dim())]


def check_outputs(program) -> None:
    """Every element of every Out/InOut argument that the program wrote must be defined.

    Raises:
        UndefinedOutputError: naming the output, the undefined box, the origin
            allocation (name, file:line) and the first task that consumed it
            undefined.
    """
    for p, _caller, g in program.args:
        buf = g.buf
        if buf.direction not in (OUT, INOUT) or buf.shadow is None:
            continue
        sh = buf.shadow
        bad = (sh != 0) & (sh != buf.id) if buf.direction == OUT else (sh != 0)
        if not bool(bad.any()):
            continue
        oids = torch.unique(sh[bad]).tolist()
        origin = program.buffers[oids[0] - 1]
        consumer = origin.first_undef_task
        cons = (f"; first consumed undefined by task {consumer[0]!r} block {consumer[1]} ({consumer[2]})"
                if consumer else "")
        more = f" (and {len(oids) - 1} more origins)" if len(oids) > 1 else ""
        raise UndefinedOutputError(
            f"kernel {program.name}: output {p.name!r} has {int(bad.sum())} undefined written elements in box "
            f"{undefined_box(bad)}; origin: allocation {origin.name!r} at {origin.site} "
            f"(no init_value and not fully written before it was read){more}{cons}")
