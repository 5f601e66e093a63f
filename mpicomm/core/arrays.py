"""``Array``: the static type of every array argument of mpicomm's public calls.

The front door (:mod:`mpicomm.front`) takes numpy arrays, torch tensors (CPU and CUDA), cupy
arrays and any object with ``__dlpack__``, ``__cuda_array_interface__`` or
``__array_interface__``, and checks the kind at run time with an error that names the call and
the argument. No one static type names all of them without importing torch and cupy (which
mpicomm never does unless the caller did), so for a type checker ``Array`` is ``Any``: any of those
kinds fits, as the calls take them, and the signatures still tell a reader which arguments are
arrays. Inside the data paths the front door has already turned every argument into a numpy or
cupy array.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Array"]

if TYPE_CHECKING:
    Array = Any
else:

    class Array:
        """Any array a public call takes: numpy, torch (CPU or CUDA), cupy, DLPack, array interface.

        A name for signatures only (a type checker reads it as ``Any``): not a class to build or to
        test with ``isinstance``.
        """

        __slots__ = ()
        __module__ = "mpicomm"  # documented, and cross-referenced, as mpicomm.Array

        def __new__(cls) -> Array:
            """Refuse: ``Array`` is a name for signatures, with no instances."""
            raise TypeError("mpicomm.Array names the array arguments in signatures; it has no instances")
