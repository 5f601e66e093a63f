"""Activation of the numpy-backed fake cupy in ``tests/fakecupy/cupy`` (and ``cupyx``).

In one process: ``with fakecupy.active() as cupy: ...`` (or the ``fake_cupy`` fixture of a test
module: ``yield from fakecupy.fixture()``), which puts this folder first on ``sys.path``, imports the
fake afresh and makes mpicomm's GPU backend use it; everything is undone after.

Under MPI (every rank its own process): ``PYTHONPATH=tests/fakecupy`` (the variable :data:`ENV`
holds the line), so ``import cupy`` finds the fake in every rank; the real cupy must not be
installed in that environment.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The folder to put on ``sys.path`` / ``PYTHONPATH``.
PATH = str(Path(__file__).resolve().parent)

#: The environment line that activates the fake in MPI runs started from the repository root.
ENV = "PYTHONPATH=tests/fakecupy"


def _forget() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupyx")]:
        del sys.modules[name]


def _reset_mpicomm() -> None:
    from mpicomm.gpu import backend, staged

    backend.set_backend(None)
    staged.reset_pool()


def is_active() -> bool:
    """Whether ``import cupy`` gives the fake in this process."""
    cupy = sys.modules.get("cupy")
    return bool(getattr(cupy, "IS_FAKE", False))


@contextmanager
def active() -> Iterator[Any]:
    """Make ``import cupy`` give the fake for the ``with`` block; yield the fake ``cupy`` module."""
    added = PATH not in sys.path
    if added:
        sys.path.insert(0, PATH)
    _forget()
    _reset_mpicomm()
    try:
        import cupy

        if not getattr(cupy, "IS_FAKE", False):
            raise RuntimeError(f"fakecupy: import cupy gave {cupy.__file__}, not the fake in {PATH}")
        yield cupy
        cupy._fake.drain()
    finally:
        if added:
            sys.path.remove(PATH)
        _forget()
        _reset_mpicomm()


def fixture() -> Iterator[Any]:
    """The body of a pytest fixture: ``yield from fakecupy.fixture()``."""
    with active() as cupy:
        yield cupy
