"""Every cupy/cupyx name mpicomm uses exists in the real cupy, and takes the call mpicomm makes.

cupy imports without a CUDA driver, so this runs on any machine: ``make test-cupy-names`` makes a venv
of its own with the cupy-cuda12x wheel (``CUPY_WHEEL``) and runs it there, with
``MPICOMM_CUPY_NAMES=1`` so that a cupy that does not import fails instead of skipping. The main venv
has no real cupy (a real cupy without a driver would change what the GPU tests skip).
"""

from __future__ import annotations

import os

import pytest

from cupynames import uses


@pytest.fixture(scope="module")
def cupy() -> object:
    try:
        import cupy
    except ImportError as exc:
        if os.environ.get("MPICOMM_CUPY_NAMES") == "1":
            raise
        pytest.skip(f"the real cupy is not installed here ({exc}); make test-cupy-names runs this")
    assert not getattr(cupy, "IS_FAKE", False), "this must check the real cupy, not tests/fakecupy"
    return cupy


def test_every_name_mpicomm_uses_is_in_the_real_cupy_with_the_signature_used(cupy: object) -> None:
    assert uses.problems() == []


def test_the_list_holds_every_name_mpicomm_uses(cupy: object) -> None:
    listed = {*uses.CALLS, *uses.NAMES, *uses.ATTRS}
    assert uses.scan() <= listed, sorted(uses.scan() - listed)
