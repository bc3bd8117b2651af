"""Regression: the first program of a process called ``gc.freeze()`` to keep later collections
from rescanning the imported modules, which also froze that program's own arguments: an input
in a reference cycle was never collected after it died (``pto demo`` kept its first row's
inputs, about 0.36 GiB). The CLI now freezes after loading the kernel modules, before any input
exists (``pto.runtime.program.freeze_imports``), and ``import pto`` freezes once instead of the
first program, so a library caller's first program freezes nothing either.
"""

import subprocess
import sys

_SCRIPT = r"""
import gc, weakref, torch
import pto.language as pl
from pto import cli

@pl.jit
def copy(x: pl.Tensor[[16, 16], pl.FP32], y: pl.Out[pl.Tensor[[16, 16], pl.FP32]]):
    with pl.at(name_hint="copy"):
        y[0:16, 0:16] = x[0:16, 0:16]
    return y

if FREEZE_FIRST:
    cli.load_kernels()

class Holder:
    pass

h = Holder()
h.self = h  # a reference cycle: only the cyclic collector frees it
h.x = torch.randn(16, 16)
ref = weakref.ref(h)
copy(h.x, torch.zeros(16, 16))
del h
gc.collect()
print("collected" if ref() is None else "leaked")
"""


def _run(freeze_first: bool) -> str:
    code = _SCRIPT.replace("FREEZE_FIRST", str(freeze_first))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_an_input_created_after_the_cli_loaded_its_kernels_is_collected():
    assert _run(True) == "collected"


def test_the_first_program_of_a_library_caller_freezes_nothing():
    assert _run(False) == "collected"

