"""The list of cupy names mpicomm uses is complete, the fake cupy has them all, and the check can fail.

The same check runs against the real cupy in its own venv (tests/cupynames, ``make test-cupy-names``).
"""

from __future__ import annotations

import fakecupy
import pytest
from cupynames import uses


def test_the_list_holds_every_cupy_name_in_mpicomms_code() -> None:
    found = uses.scan()
    listed = {*uses.CALLS, *uses.NAMES, *uses.ATTRS}
    assert "cupy.cuda.runtime.memcpyAsync" in found and "cupy.cuda.PinnedMemory" in found
    assert found <= listed, sorted(found - listed)


def test_the_fake_cupy_has_every_name_with_the_signature_used() -> None:
    with fakecupy.active():
        assert uses.problems() == []


def test_the_check_reports_a_missing_name_and_a_call_that_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fakecupy.active() as cp:
        monkeypatch.delattr(cp, "ascontiguousarray")
        monkeypatch.setattr(cp.cuda.runtime, "memcpyAsync", lambda dst, src, size, kind: None)
        found = uses.problems()
        monkeypatch.undo()
    assert any(p.startswith("cupy.ascontiguousarray: missing") for p in found), found
    assert any(p.startswith("cupy.cuda.runtime.memcpyAsync") and "5 positional" in p for p in found), found


def test_a_cython_signature_is_read_from_the_docstring() -> None:
    class Builtin:  # an instance is no callable inspect can read: as a Cython builtin without a signature
        """memcpyAsync(intptr_t dst, intptr_t src, size_t size, int kind, intptr_t stream)"""

    sig = uses.signature(Builtin())
    assert list(sig.parameters) == ["dst", "src", "size", "kind", "stream"]
