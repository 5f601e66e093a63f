"""mpicomm.core.chunks: the chunk setting read once, and the cheap bound the fast paths test first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mpicomm import ArgumentError
from mpicomm.core import chunks


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    yield monkeypatch
    monkeypatch.undo()
    chunks.reload()


@pytest.mark.parametrize("chunk", [1, 3, 8, 30, 64, 100, 4096])
def test_no_message_at_or_below_the_bound_is_ever_chunked(restore: pytest.MonkeyPatch, chunk: int) -> None:
    """The fast paths skip step() when nbytes <= Setting.least: that must never skip a chunked call."""
    restore.setenv(chunks.CHUNK_ENV_VAR, str(chunk))
    assert chunks.reload() == chunk
    for itemsize in (1, 2, 4, 8, 16):
        for parts in range(1, 10):
            for count in range(0, 2 * chunk // itemsize + 3 * parts + 2):
                nbytes = count * parts * itemsize
                if chunks.step(nbytes, itemsize, parts):
                    assert nbytes > chunks.Setting.least, (chunk, itemsize, parts, nbytes)


def test_the_setting_is_read_once_and_again_by_reload(restore: pytest.MonkeyPatch) -> None:
    restore.setenv(chunks.CHUNK_ENV_VAR, "8K")
    chunks.reload()
    restore.setenv(chunks.CHUNK_ENV_VAR, "4K")
    assert chunks.step(12 << 10, 8) == 8 << 10  # still 8 KiB until reload
    chunks.reload()
    assert chunks.step(12 << 10, 8) == 4 << 10


def test_an_invalid_setting_raises_at_the_first_call_that_could_chunk(restore: pytest.MonkeyPatch) -> None:
    restore.setenv(chunks.CHUNK_ENV_VAR, "lots")
    assert chunks.reload() == -1 and chunks.Setting.least == -1
    with pytest.raises(ArgumentError, match="MPICOMM_STAGING_CHUNK"):
        chunks.step(8, 8)


@pytest.mark.parametrize("chunk", ["1", "100", "4K", "4M", "lots"])
def test_an_array_of_at_most_few_elements_is_never_chunked(restore: pytest.MonkeyPatch, chunk: str) -> None:
    """all_reduce tests ``size <= Setting.few`` before ``nbytes``: true only where nbytes is in the bound."""
    import numpy as np

    from mpicomm import ReduceOp

    restore.setenv(chunks.CHUNK_ENV_VAR, chunk)
    chunks.reload()
    s = chunks.Setting
    assert s.few * chunks.WIDEST <= s.least if s.few >= 0 else s.least < chunks.WIDEST  # -1: nbytes decides
    # every dtype a reduction takes is at most WIDEST bytes an element
    for code in np.typecodes["All"]:
        dtype = np.dtype(code)
        try:
            ReduceOp.SUM.check(dtype, "all_reduce")
        except Exception:
            continue
        assert dtype.itemsize <= chunks.WIDEST, dtype
