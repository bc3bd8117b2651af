"""``python -m pto.compat FILE.py [ARGS...]``: run a pypto script on pto (see pto.compat)."""

import sys

from pto.cli import main

if __name__ == "__main__":
    sys.exit(main(["pypto", *sys.argv[1:]]))
