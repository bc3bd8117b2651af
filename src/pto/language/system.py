"""System constructs: join nodes, barriers and the block index (hw-native-sys/pypto `docs/en/user/`)."""

from __future__ import annotations

from pto.errors import DslError
from pto.language import _ctx
from pto.language.control import _SYNCALL, _deps_list

__all__ = ["task_dummy", "syncall", "get_block_idx", "INVALID_TASK_ID"]

INVALID_TASK_ID = -1


def task_dummy(deps=None) -> int:
    """A submit-free join node that completes when all ``deps`` complete.

    Returns its task id, or ``INVALID_TASK_ID`` (-1) without adding a node
    when every dep is invalid (``task_dummy(deps=[])``).

    Raises:
        DslError: inside a task or outside a program.
    """
    prog = _ctx.program("pl.system.task_dummy")
    if _ctx.state.block is not None:
        raise DslError("pl.system.task_dummy is orchestration-only")
    deps = [d for d in _deps_list(deps) if d >= 0]
    if not deps:
        return INVALID_TASK_ID
    return prog.add_dummy(deps, _ctx.user_frame())


def syncall(core_type: str = "mix", mode: str = "hard"):
    """All-block barrier of the enclosing SPMD task. Write it as
    ``yield pl.system.syncall()`` in a generator body run with the decorator
    form ``@pl.spmd(n)``.

    On the CPU the barrier is the phased run of such a body (every block runs up to its
    ``yield`` before any block goes on), so the call is only meaningful there.

    Raises:
        DslError: outside a task block, or in a block that is not a step of a generator body
            run by the decorator form (a ``for b in pl.spmd(n)`` loop, ``pl.at``, a plain
            function body), where it could not be a barrier.
    """
    st = _ctx.state
    blk = st.block
    if blk is None:
        raise DslError("pl.system.syncall must be used inside an spmd block body")
    if st.syncalls is None:
        f = _ctx.user_frame()
        site = f" at {_ctx.frame_site(f)}" if f is not None else ""
        raise DslError(f"pl.system.syncall(){site} (task {blk.task.name!r} block {blk.idx}) is not a barrier here: "
                       "it only works as `yield pl.system.syncall()` inside a generator body run with the "
                       "decorator form `@pl.spmd(n)` over `def body(b): ...`, where every block runs up to the "
                       "yield before any block goes on")
    st.syncalls += 1
    return _SYNCALL


def get_block_idx() -> int:
    """This block's index inside its SPMD task (0 for a ``pl.at`` task).

    Raises:
        DslError: outside a task block.
    """
    blk = _ctx.state.block
    if blk is None:
        raise DslError("pl.tile.get_block_idx() used outside a task block")
    return blk.idx
