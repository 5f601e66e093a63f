"""``python -m mpicomm.plan``: the entry point; the program lives in :mod:`mpicomm.apps.plan`."""

from __future__ import annotations

import sys

from .apps.plan import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
