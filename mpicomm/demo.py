"""``python -m mpicomm.demo``: the entry point; the program lives in :mod:`mpicomm.apps.demo`."""

from __future__ import annotations

import sys

from .apps.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
