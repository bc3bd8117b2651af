"""Run a pypto script as ``__main__`` on pto: ``pto pypto FILE.py [ARGS...]``.

The script runs with ``sys.argv = [FILE.py, *ARGS]`` and its directory first on
``sys.path`` (as ``python FILE.py`` would), the import aliases of
:mod:`pto.compat.imports` installed, its source (and that of every module it imports
from its own checkout) rewritten for the ``with pl.spmd(n)`` body form,
``compat_ops.mode.pypto`` on, and every kernel the script calls directly (``kernel(x, y)``,
not through the harness) run in check mode, as the harness runs it. Everything is
restored afterwards, including the user modules it imported (so two scripts with sibling
modules of the same name can run in one process).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import types
import warnings

from pto.errors import ConfigError, PtoError

__all__ = ["run_file", "project_root"]

_MARKERS = ("golden", ".git", "pyproject.toml", "setup.py")


def project_root(script_dir: str) -> str:
    """The nearest ancestor of ``script_dir`` that looks like a checkout root (has ``golden/``,
    ``.git``, ``pyproject.toml`` or ``setup.py``); ``script_dir`` itself when none does."""
    d = os.path.realpath(script_dir)
    while True:
        if any(os.path.exists(os.path.join(d, m)) for m in _MARKERS):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return os.path.realpath(script_dir)
        d = parent


def _shown(text: str) -> str:
    """``text`` with every absolute path under the current directory written relative to it
    (``/home/u/lib/k.py:8`` -> ``lib/k.py:8`` when run from ``/home/u``); other paths as they are."""
    cwd = os.getcwd()
    if cwd == os.sep:
        return text
    return re.sub(rf"(?<![\w.~/-]){re.escape(cwd + os.sep)}", "", text)


def _user_line(tb, roots) -> str:
    """``file:line`` of the innermost traceback frame in the user's files ("" if none)."""
    site = ""
    for fr in traceback.extract_tb(tb):
        path = os.path.realpath(fr.filename)
        if any(path.startswith(r + os.sep) for r in roots):
            site = f"{fr.filename}:{fr.lineno}"
    return site


_KEYWORD = re.compile(r"^(\w+)\(\) got an unexpected keyword argument '(\w+)'$")


def _unsupported_keyword(e: TypeError, roots) -> str | None:
    """The ``error:`` line for a pypto keyword argument that pto's DSL function does not take
    (``pl.load(..., transpose=True)``: Python's TypeError, raised at the user's call), or None
    when ``e`` is another TypeError or the function is not one of ``pto.language``'s."""
    m = _KEYWORD.match(str(e))
    if m is None:
        return None
    import pto.language as pl
    name, kw = m.groups()
    fn = getattr(pl, name, None) or getattr(getattr(pl, "tile", None), name, None)
    if fn is None or getattr(fn, "__name__", None) != name:
        return None
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame  # the call site (the callee never started): a name of the user's own is theirs
    own = frame.f_locals.get(name, frame.f_globals.get(name))
    if own is not None and getattr(own, "__module__", "").split(".")[0] != "pto":
        return None
    site = _user_line(e.__traceback__, roots)
    at = f" at {site}" if site else ""
    return (f"error: UnsupportedConstructError: pl.{name}({kw}=...): this pypto keyword is not supported by "
            f"pto{at}")


def run_file(path: str, argv=(), stderr=None) -> int:
    """Run the pypto script ``path`` with arguments ``argv``; returns its exit code.

    A pto error stops the script with one ``error:`` line on ``stderr`` naming the error, the
    construct and the user's line (exit 1; ``PTO_DEBUG=1`` re-raises for the traceback). Paths
    under the current directory are shown relative to it (:func:`_shown`).

    Raises:
        ConfigError: ``path`` is not a readable ``.py`` file.
    """
    from pto.compat.imports import Aliases
    from pto.compat.transform import compile_pypto
    from pto.language import _ctx, compat_ops
    from pto.runtime import RunConfig

    stderr = stderr or sys.stderr
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"pto pypto: no such file {_shown(path)!r}")
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(_shown(f"pto pypto: cannot read {path!r}: {e}")) from None
    script_dir = os.path.dirname(path)
    roots = sorted({os.path.realpath(script_dir), project_root(script_dir)})
    saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules.get("__main__")
    before = set(sys.modules)
    mode_was = compat_ops.mode.pypto
    factory_was = _ctx.state.program_factory

    def checked(jf, args, kwargs, config):  # a kernel called directly runs in check mode too
        return factory_was(jf, args, kwargs, RunConfig(check=True) if config is None else config)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    code = 0
    try:
        with Aliases(roots), warnings.catch_warnings():
            warnings.simplefilter("always")
            sys.argv = [path, *argv]
            sys.path.insert(0, script_dir)
            sys.modules["__main__"] = main
            compat_ops.mode.pypto = True
            _ctx.state.program_factory = checked
            try:
                exec(compile_pypto(source, path), main.__dict__)  # noqa: S102 - running the user's script is the point
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=stderr)
            except TypeError as e:
                text = _unsupported_keyword(e, roots)
                if text is None or os.environ.get("PTO_DEBUG"):
                    raise
                print(_shown(text), file=stderr)
                code = 1
            except PtoError as e:
                if os.environ.get("PTO_DEBUG"):
                    raise
                site = _user_line(e.__traceback__, roots)
                msg = str(e)
                where = f" [{site}]" if site and site not in msg else ""
                print(_shown(f"error: {type(e).__name__}: {msg}{where}"), file=stderr)
                code = 1
    finally:
        compat_ops.mode.pypto = mode_was
        _ctx.state.program_factory = factory_was
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            origin = os.path.realpath(getattr(mod, "__file__", None) or "")
            if any(origin.startswith(r + os.sep) for r in roots):
                del sys.modules[name]
    return code
