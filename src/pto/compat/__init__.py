"""Run pypto-lib scripts as they are on pto (docs/porting.md).

``pto pypto FILE.py [ARGS...]`` or ``python -m pto.compat FILE.py [ARGS...]`` runs a
script written for pypto and the reference golden harness: ``pypto.language`` is
served by ``pto.language`` (:mod:`pto.compat.imports`), ``golden`` by
:mod:`pto.compat.golden`, the ``with pl.spmd(n):`` body form is rewritten before the
script's modules run (:mod:`pto.compat.transform`) and kernels run in check mode.
"""

from pto.compat.runner import run_file

__all__ = ["run_file"]
