"""What every test session shares: each test starts with the garbage collected and the rest frozen."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _collected_and_frozen() -> None:
    """Collect what earlier tests left, then freeze what is alive (:func:`gc.freeze`) for this test.

    Every collection then walks only what this test made: a full one walks every object of the
    session (torch's, the test modules', pytest's reports), and the fake-GPU tests collect after
    each test so that a dropped Work cannot keep its staging buffers (tests/fakecupy/testing.py):
    0.1-0.4 s a test, most of the multi-rank suite's time. What a test leaves behind it still finds;
    an object alive here that only a later collection would free (a cycle) stays, a little memory.
    """
    gc.collect()
    gc.freeze()
