"""``python -m pto ...``: the ``pto`` command (so ``torchrun --nproc-per-node N -m pto generate ...``
starts N ranks of it)."""

import sys

from pto.cli import main

if __name__ == "__main__":
    sys.exit(main())
