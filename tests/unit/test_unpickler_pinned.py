"""Pin the behaviour of CPython's private ``pickle._Unpickler``, which the safe unpickler subclasses.

The safe unpickler overrides every opcode that calls code, sets state, fills an object or allocates
from a claimed size; it inherits the rest. A Python release that adds an opcode, or changes one of
the inherited methods, could open a gap without any test of ours failing. So:

* every opcode of the running interpreter is either overridden, resolved through ``find_class``, or
  on the list of opcodes reviewed as data-only; anything else fails;
* the source of the inherited methods is hashed and compared with the hash reviewed for this
  Python version; an unknown version, or a changed source, fails loudly with what to do.

Run ``python tests/unit/test_unpickler_pinned.py`` under a new interpreter to print its hash (after
reviewing ``pickle.py``'s changes against ``mpicomm/objects/unpickler.py``, add it to ``REVIEWED``).
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import sys
from typing import Any

#: Opcodes that only push, pop or move data (reviewed in 3.10-3.13's pickle.py): no call, no state,
#: no attribute access, no allocation beyond the bytes the stream carries.
DATA_ONLY = {
    "BINFLOAT", "BININT", "BININT1", "BININT2", "BINSTRING", "BINUNICODE", "BINUNICODE8",
    "BINBYTES", "BINBYTES8", "SHORT_BINBYTES", "SHORT_BINSTRING", "SHORT_BINUNICODE", "STRING",
    "UNICODE", "FLOAT", "LONG1", "LONG4", "NONE", "NEWTRUE", "NEWFALSE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_TUPLE", "LIST", "DICT", "FROZENSET", "POP", "POP_MARK", "DUP", "GET", "BINGET",
    "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "PROTO", "STOP", "NEXT_BUFFER",
    "READONLY_BUFFER",
}  # fmt: skip
#: Opcodes that resolve a name: they must go through ``find_class`` (the allow-list).
NAMES = {"GLOBAL", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4"}
#: Opcodes that raise in the parent unless ``persistent_load`` is defined (the safe unpickler does not).
PERSISTENT = {"PERSID", "BINPERSID"}

#: sha256 (first 16 hex digits) of the inherited methods' source, per reviewed Python version.
#: 3.13's differs from 3.10-3.12's by a sentinel (``_NoValue``) in load_build and get_extension only.
REVIEWED: dict[tuple[int, int], set[str]] = {
    (3, 10): {"c4acc14f251fe56d"},
    (3, 11): {"c4acc14f251fe56d"},
    (3, 12): {"c4acc14f251fe56d"},
    (3, 13): {"9165332126a9847e"},
}


def opcode_names() -> dict[int, str]:
    """Opcode byte -> name, for every opcode the running interpreter's pure-Python unpickler knows."""
    ops = {n: getattr(pickle, n) for n in dir(pickle) if n.isupper()}
    by_byte = {v[0]: n for n, v in ops.items() if isinstance(v, bytes) and len(v) == 1}
    table: dict[int, Any] = pickle._Unpickler.dispatch  # type: ignore[attr-defined]
    return {b: by_byte.get(b, f"0x{b:02x}") for b in table}


#: Overridden opcodes whose override checks, then calls the parent's method: their source counts too.
DELEGATED = {"BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "MARK"}


def inherited_hash(overridden: set[str]) -> str:
    """Hash of the source of every dispatch method the safe unpickler inherits or calls, and the machinery."""
    parent: Any = pickle._Unpickler  # type: ignore[attr-defined]
    parts = []
    for byte, name in sorted(opcode_names().items()):
        if name not in overridden or name in DELEGATED:
            parts.append(inspect.getsource(parent.dispatch[byte]))
    for attr in ("__init__", "load", "pop_mark", "find_class", "persistent_load"):
        parts.append(inspect.getsource(getattr(parent, attr)))
    parts.append(inspect.getsource(pickle._Unframer))  # type: ignore[attr-defined]
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


def overridden_names() -> set[str]:
    from mpicomm.objects.unpickler import _SafeUnpickler

    parent: Any = pickle._Unpickler  # type: ignore[attr-defined]
    names = opcode_names()
    return {names[b] for b, f in _SafeUnpickler.dispatch.items() if parent.dispatch.get(b) is not f}


#: The opcodes the safe unpickler must override (found by reading pickle.py: they call, set state,
#: fill objects, or allocate from a claim).
MUST_OVERRIDE = {
    "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "APPEND", "APPENDS", "SETITEM",
    "SETITEMS", "ADDITEMS", "BYTEARRAY8", "FRAME", "MARK", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET",
    "INT", "LONG",
}  # fmt: skip


def test_this_python_version_was_reviewed() -> None:
    import pytest

    version = sys.version_info[:2]
    if version not in REVIEWED:
        pytest.fail(
            f"Python {version[0]}.{version[1]} is not a reviewed version of pickle._Unpickler: review "
            "its pickle.py against mpicomm/objects/unpickler.py, then add the hash that "
            "`python tests/unit/test_unpickler_pinned.py` prints to REVIEWED"
        )


def test_every_opcode_is_overridden_named_or_data_only() -> None:
    unknown = set(opcode_names().values()) - overridden_names() - NAMES - PERSISTENT - DATA_ONLY
    assert not unknown, f"opcodes nobody reviewed for safe mode: {sorted(unknown)}"


def test_the_opcodes_that_run_code_or_allocate_are_overridden() -> None:
    missing = MUST_OVERRIDE - overridden_names()
    assert not missing, f"the safe unpickler inherits {sorted(missing)}"


def test_the_inherited_methods_are_the_reviewed_ones() -> None:
    import pytest

    version = sys.version_info[:2]
    got = inherited_hash(MUST_OVERRIDE)
    if got not in REVIEWED.get(version, set()):
        pytest.fail(
            f"pickle._Unpickler of Python {sys.version.split()[0]} has inherited methods of hash {got}, "
            f"not a reviewed one ({sorted(REVIEWED.get(version, set()))}): review the change in "
            "pickle.py against mpicomm/objects/unpickler.py, then add the hash to REVIEWED"
        )


def test_names_resolve_only_through_find_class() -> None:
    import copyreg

    import pytest

    import mpicomm
    from mpicomm.objects.pickling import loads

    code = 0x7FFF0
    copyreg.add_extension("os", "system", code)
    copyreg.clear_extension_cache()
    try:
        streams = [
            b"cos\nsystem\n.",
            pickle.PROTO + b"\x05" + pickle.SHORT_BINUNICODE + b"\x02os" + pickle.SHORT_BINUNICODE
            + b"\x06system" + pickle.STACK_GLOBAL + pickle.STOP,
            pickle.PROTO + b"\x02" + pickle.EXT4 + code.to_bytes(4, "little") + pickle.STOP,
        ]  # fmt: skip
        for stream in streams:
            with pytest.raises(mpicomm.UnpicklingRefusedError, match=r"(os|posix)\.system"):
                loads(stream, [], safe=True)
        pickle.loads(streams[2])  # a trusted load puts os.system in copyreg's cache of extensions...
        with pytest.raises(mpicomm.UnpicklingRefusedError, match=r"(os|posix)\.system"):
            loads(streams[2], [], safe=True)  # ...which safe mode must not use
    finally:
        copyreg.remove_extension("os", "system", code)
        copyreg.clear_extension_cache()


def test_persistent_ids_are_refused() -> None:
    import pytest

    import mpicomm
    from mpicomm.objects.pickling import loads

    with pytest.raises(mpicomm.UnpicklingRefusedError, match="persistent"):
        loads(b"P1\n.", [], safe=True)


if __name__ == "__main__":
    print(sys.version_info[:2], inherited_hash(MUST_OVERRIDE))
