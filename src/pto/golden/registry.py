"""The kernel registry: every kernel module registers a :class:`KernelCase`;
the CLI, the tests, the demo and the benchmarks iterate it (docs/dsl.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pto.errors import ConfigError

__all__ = ["KernelCase", "CaseRun", "register", "get_case", "all_cases", "load_examples", "REGISTRY"]


@dataclass
class CaseRun:
    """Everything :func:`pto.golden.run_jit` needs for one (preset, mode) run.

    Attributes:
        fn: the ``@pl.jit`` entry; specs: arguments in order; golden: golden
        function over the value dict; compare: {output: compare function};
        rtol / atol: run tolerances; label: e.g. ``"prefill T=128"``.
    """

    fn: object
    specs: list
    golden: Callable
    compare: dict = field(default_factory=dict)
    rtol: float = 1e-3
    atol: float = 1e-3
    label: str = ""


@dataclass
class KernelCase:
    """A registered kernel.

    Attributes:
        name: CLI name (``hc_pre``).
        build: ``build(preset, mode, **options) -> CaseRun``; options include
            ``seed_scopes`` for kernels that keep a seed variant.
        modes: the modes ``build`` accepts (``"decode"``, ``"prefill"``, ...).
        seed_variant: True when ``seed_scopes=True`` is supported.
        description: one line for tables.
        max_preset: the largest model preset ``pto demo`` and the kernel benchmarks run the
            case at (a larger ``--preset`` falls back to it); None: no cap.
        takes_preset: False for a case whose ``build`` ignores its ``preset`` (its sizes are
            its own options, as the examples'): the CLI refuses an explicit ``--preset``.
    """

    name: str
    build: Callable
    modes: tuple = ("prefill",)
    seed_variant: bool = False
    description: str = ""
    group: str = "model"
    max_preset: str | None = None
    takes_preset: bool = True


REGISTRY: dict[str, KernelCase] = {}


def register(case: KernelCase) -> KernelCase:
    """Add ``case`` to the registry (re-registering a name replaces it)."""
    REGISTRY[case.name] = case
    return case


def default_examples_dir() -> Path:
    """``examples/`` at the root of the source tree (``src/pto/golden`` -> repo root)."""
    return Path(__file__).resolve().parents[3] / "examples"


def import_file(path, module_name: str):
    """Import the Python file ``path`` as module ``module_name`` (registered in
    ``sys.modules`` so its kernels can be found again); on any exception the half-made
    module is removed and the exception propagates unchanged."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_examples(directory: str | Path | None = None) -> list[str]:
    """Import every ``*_example.py`` in ``directory`` so that its ``KernelCase`` registers.

    Args:
        directory: folder of example modules; default :func:`default_examples_dir`.
            A missing folder (e.g. an installed, non-editable package) loads nothing.

    Returns:
        The module names now loaded (a module pytest already imported is reused).

    Raises:
        ConfigError: an example module that fails to import, naming the file.
    """
    import sys
    folder = Path(directory) if directory is not None else default_examples_dir()
    if not folder.is_dir():
        return []
    names = []
    for path in sorted(folder.glob("*_example.py")):
        resolved = str(path.resolve())
        known = next((m for m in list(sys.modules.values())
                      if getattr(m, "__file__", None) and str(Path(m.__file__).resolve()) == resolved), None)
        if known is not None:
            names.append(known.__name__)
            continue
        mod_name = f"pto_examples.{path.stem}"
        try:
            import_file(path, mod_name)
        except Exception as e:  # noqa: BLE001 - user example code
            raise ConfigError(f"example {path} failed to import: {type(e).__name__}: {e}") from e
        names.append(mod_name)
    return names


def all_cases(group: str | None = None) -> list[KernelCase]:
    """Every registered case, optionally one group. The golden layer imports no kernel
    module: whoever needs the model kernels imports ``pto.models.deepseek_v4`` first (the CLI,
    the tests' conftest and the benchmarks do), examples come from :func:`load_examples`."""
    return [c for c in REGISTRY.values() if group is None or c.group == group]


def get_case(name: str) -> KernelCase:
    """The case called ``name``.

    Raises:
        ConfigError: an unknown name, with the closest known names and all of them (only
            cases already registered: see :func:`all_cases`).
    """
    try:
        return REGISTRY[name]
    except KeyError:
        import difflib
        close = difflib.get_close_matches(str(name), list(REGISTRY), n=3)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ConfigError(f"unknown kernel {name!r}{hint}; known kernels: {sorted(REGISTRY)}") from None
