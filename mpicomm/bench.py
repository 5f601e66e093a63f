"""``python -m mpicomm.bench``: the entry point; the program lives in :mod:`mpicomm.apps.bench.run`."""

from __future__ import annotations

import sys

from .apps.bench.run import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
