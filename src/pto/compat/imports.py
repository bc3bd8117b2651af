"""Import aliases for running pypto scripts: ``pypto.language`` served by ``pto.language``
(``pl.Out`` is ``pl.PartialOut`` there: pypto leaves unwritten output elements with the
caller's values, which the reference harness zero-fills and its goldens expect),
the reference harness's ``golden`` package served by :mod:`pto.compat.golden`, and the
script's own modules loaded with the ``with pl.spmd(n)`` body form rewritten
(:mod:`pto.compat.transform`).

A name pto does not have (``pl.something``, ``pl.tile.something``, ``import pypto.ir``)
raises :class:`UnsupportedConstructError` / :class:`UnsupportedModuleError` naming the
construct and the user's file and line, so a script stops at its first construct pto
cannot run with one clear message.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

from pto.errors import DslError

__all__ = ["UnsupportedConstructError", "UnsupportedModuleError", "Aliases", "SERVED"]


class UnsupportedConstructError(DslError, AttributeError):
    """A pypto construct (``pl.<name>``) that pto does not provide."""


class UnsupportedModuleError(DslError, ImportError):
    """A pypto module that pto does not serve (the compiler, IR, distributed DSL)."""


def _user_site(depth: int = 2) -> str:
    """`` at file:line`` of the first frame outside pto (the user's source line; pto's own code is
    told by its installed package directory, ``program._in_pto``, so a user checkout whose path
    merely contains ``/pto/`` is the user's)."""
    from pto.runtime.program import _in_pto
    f = sys._getframe(depth)
    while f is not None:
        fname = f.f_code.co_filename
        if not _in_pto(f) and not fname.startswith("<frozen"):
            return f" at {fname}:{f.f_lineno}"
        f = f.f_back
    return ""


class _Namespace:
    """A view of a pto namespace (``pl.tile``, ``pl.jit``, ...) whose missing names are
    UnsupportedConstructErrors naming ``path.name``; calls go to the wrapped object."""

    __slots__ = ("_obj", "_path")

    def __init__(self, obj, path: str):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name):
        try:
            value = getattr(self._obj, name)
        except AttributeError:
            if name.startswith("__"):
                raise
            raise UnsupportedConstructError(f"{self._path}.{name}: not supported by pto{_user_site()}") from None
        return _wrap(value, f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        return self._obj(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pto view of {self._path}: {self._obj!r}>"


def _wrap(value, path: str):
    if isinstance(value, (types.SimpleNamespace, types.ModuleType)) or type(value).__name__ == "_Jit":
        return _Namespace(value, path)
    return value


class _LanguageModule(types.ModuleType):
    """``pypto.language``: every attribute looked up in ``pto.language`` at use time (so DSL
    additions appear without a change here); a missing one is an UnsupportedConstructError."""

    def __getattr__(self, name):
        import pto.language as pl
        if name == "Out":
            # pypto's Out leaves unwritten elements with the caller's values (the reference
            # harness's zeros, which its goldens expect): that is pto's PartialOut
            self.Out = pl.PartialOut
            return pl.PartialOut
        try:
            value = getattr(pl, name)
        except AttributeError:
            if name.startswith("__"):
                raise
            raise UnsupportedConstructError(f"pl.{name}: not supported by pto{_user_site()}") from None
        value = _wrap(value, f"pl.{name}")
        setattr(self, name, value)  # found once: later lookups are plain attribute reads
        return value


class _PyptoModule(types.ModuleType):
    """``pypto``: only ``pypto.language`` is served."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedConstructError(f"pypto.{name}: not supported by pto (only pypto.language is served)"
                                        f"{_user_site()}")


def _make_language() -> types.ModuleType:
    mod = _LanguageModule("pypto.language", "pypto.language served by pto.language (pto.compat)")
    mod.__path__ = []  # a package: pypto.language.distributed is looked up below it
    return mod


def _make_distributed() -> types.ModuleType:
    try:
        import pto.language.distributed as dist  # noqa: F401 - present once the distributed DSL lands
    except ImportError:
        raise UnsupportedModuleError(f"pypto.language.distributed: the distributed DSL is not supported by pto"
                                     f"{_user_site(3)}") from None
    return dist


def _make_golden(name: str) -> types.ModuleType:
    """``golden`` (a package, so ``golden.validation`` etc. import) and its submodules: each a
    view of :mod:`pto.compat.golden`'s public names."""
    import pto.compat.golden as g
    mod = types.ModuleType(name, g.__doc__)
    mod.__dict__.update({k: getattr(g, k) for k in g.__all__})
    if name == "golden":
        mod.__path__ = []
    return mod


SERVED = ("pypto", "pypto.language", "pypto.language.distributed", "golden")
"""Module names the aliases serve."""


class _ServedLoader(importlib.abc.Loader):
    def __init__(self, name: str):
        self.name = name

    def create_module(self, spec):
        n = self.name
        if n == "pypto":
            mod = _PyptoModule("pypto", "pypto served by pto (pto.compat): only pypto.language")
            mod.__path__ = []
            return mod
        if n == "pypto.language":
            return _make_language()
        if n == "pypto.language.distributed":
            return _make_distributed()
        if n == "golden" or n.startswith("golden."):
            return _make_golden(n)
        raise UnsupportedModuleError(f"{n}: not served by pto (only pypto.language and golden){_user_site(3)}")

    def exec_module(self, module):
        return None


class _TransformingLoader(importlib.machinery.SourceFileLoader):
    """Loads a user module with the ``with pl.spmd(n)`` body form rewritten; no bytecode cache
    (a cached rewritten module must never be picked up by a plain Python import)."""

    def get_code(self, fullname):
        from pto.compat.transform import compile_pypto
        path = self.get_filename(fullname)
        data = self.get_data(path)
        return compile_pypto(importlib.util.decode_source(data), path)


class Aliases(importlib.abc.MetaPathFinder):
    """The meta-path finder installed while a pypto script runs.

    Args:
        roots: directories whose ``.py`` modules are the user's (loaded through the
            ``with pl.spmd`` rewrite); pto's own package is never among them.
    """

    def __init__(self, roots):
        self.roots = [os.path.realpath(r) + os.sep for r in roots]

    def find_spec(self, fullname, path=None, target=None):
        if fullname in SERVED or fullname.startswith(("pypto.", "golden.")):
            return importlib.machinery.ModuleSpec(fullname, _ServedLoader(fullname),
                                                  is_package=fullname in ("pypto", "pypto.language", "golden"))
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        origin = os.path.realpath(spec.origin)
        if not any(origin.startswith(r) for r in self.roots):
            return None
        spec.loader = _TransformingLoader(fullname, spec.origin)
        return spec

    # ---- install / uninstall -----------------------------------------------------------
    def __enter__(self):
        self._saved = {k: sys.modules.pop(k) for k in list(sys.modules)
                       if k in SERVED or k.startswith(("pypto.", "golden."))}
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for k in list(sys.modules):
            if k in SERVED or k.startswith(("pypto.", "golden.")):
                del sys.modules[k]
        sys.modules.update(self._saved)
        return False
