"""The hook between the DSL surface and whatever executes it.

The language layer never imports the runtime (import direction language ->
runtime -> golden -> models -> cli). The runtime installs itself here: while a
program runs, ``state.program`` is the executing ``pto.runtime.Program`` and
``state.block`` the block whose body is running (None in orchestration).

``state`` is per thread: programs started in different threads run side by side,
each seeing only its own program and block.
"""

from __future__ import annotations

import os
import sys
import threading

from pto.errors import DslError

default_factory = None  # installed by pto.runtime; each thread's state starts with it
# installed by pto.runtime (runtime/blocks.py): block_runner(program, task, n) -> an iterator of the
# block indices pl.spmd's loop body runs, or None (every block plain)
block_runner = None


class _State(threading.local):
    def __init__(self):
        self.program = None
        self.block = None
        self.program_factory = default_factory
        self.check = False  # definedness tracking on for the running program
        # syncall() calls in the running step of a phased (generator) spmd body; None when the
        # running block is not such a step (syncall() is then an error, see pl.system.syncall)
        self.syncalls = None


state = _State()


def program(what: str):
    """The running program, or DslError naming the construct used outside one."""
    prog = state.program
    if prog is None:
        raise DslError(f"{what} used outside a running @pl.jit program")
    return prog


def in_block() -> bool:
    """True while a task block body is running."""
    return state.block is not None


def rel_path(path: str) -> str:
    """``path`` relative to the current directory when it lies below it, else unchanged
    (error messages and origins name kernel source this way)."""
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was removed
        return path
    cwd += os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def frame_site(f) -> str:
    """``file:line`` of frame ``f`` (path relative to the current directory; see :func:`rel_path`)."""
    return f"{rel_path(f.f_code.co_filename)}:{f.f_lineno}"


def user_site() -> str:
    """`` at file:line`` of the kernel line running now (:func:`user_frame`), for the end of an
    error message; empty outside user code."""
    f = user_frame(2)
    return f" at {frame_site(f)}" if f is not None else ""


def caller_site(depth: int = 2) -> str:
    """``file:line`` of the frame ``depth`` levels up (for error messages and origins)."""
    return frame_site(sys._getframe(depth))


_IN_LANGUAGE: dict = {}  # source file name -> inside the pto.language package
# this package's directory (a user file whose path merely contains /pto/language/ is not in it)
_LANGUAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_frame(depth: int = 1):
    """First frame outside the pto.language package (the kernel source line),
    starting ``depth`` frames above the caller of this function (1: the caller)."""
    f = sys._getframe(depth)
    while f is not None:
        fname = f.f_code.co_filename
        inside = _IN_LANGUAGE.get(fname)
        if inside is None:
            inside = _IN_LANGUAGE[fname] = fname.startswith(_LANGUAGE_DIR)
        if not inside:
            return f
        f = f.f_back
    return f
