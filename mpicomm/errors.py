"""The one exception hierarchy of mpicomm.

Every class derives from :class:`MpicommError` and also from the built-in exception a Python user would
catch for that kind of mistake, so ``except ValueError`` keeps working around mpicomm calls.

Messages share one shape: ``"<function>: <argument> <what came>; expected <what was expected>"``.
"""

from __future__ import annotations

import pickle

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CommunicationError",
    "CrossRankMismatchError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "DtypeMismatchError",
    "GroupError",
    "MPIUnavailableError",
    "MpicommError",
    "ReductionTypeError",
]
# BackendArgumentError is raised as an ArgumentError and caught as one (or as torch's RuntimeError).
# ObjectCollectiveError and UnpicklingRefusedError live here too (so that the safe unpickler needs no
# import of the object collectives), but belong to mpicomm.objects' public names.


class MpicommError(Exception):
    """Base class of every error raised by mpicomm."""


class ArgumentError(MpicommError, ValueError):
    """An argument has the right type but a wrong value (size, range, length, sum)."""


class ArgumentTypeError(MpicommError, TypeError):
    """An argument has the wrong type or dtype."""


class BackendArgumentError(ArgumentError, RuntimeError):
    """A wrong value that torch's backends refuse with a ``RuntimeError`` (split sizes, a root rank).

    torch checks these in C++ (``TORCH_CHECK``), which raises ``RuntimeError``; mpicomm checks them
    before any MPI call. Also an :class:`ArgumentError`, so a ``ValueError``: ``except`` clauses
    written for either keep working.
    """


class ReductionTypeError(ArgumentTypeError, ValueError):
    """A reduction was asked for on a dtype that it is not defined for (e.g. BAND on floats).

    Also a ``ValueError``, the type torch.distributed raises for MAX, MIN, PRODUCT and the bitwise
    operators on complex tensors.
    """


class DtypeMismatchError(ArgumentTypeError, ValueError):
    """Arrays of one call have different dtypes (an input and its output, or the entries of a list).

    Both a ``TypeError`` and a ``ValueError``: torch raises TypeError for an output whose type is
    not its input's (``all_gather_into_tensor``) and ValueError for a list of mixed dtypes
    (``all_gather``, ``all_reduce_coalesced``).
    """


class CrossRankMismatchError(MpicommError, ValueError):
    """Ranks disagree about a call (op, dtype, shape, splits); raised on every rank by validation mode."""


class GroupError(MpicommError, RuntimeError):
    """A process group is used in a state that does not allow it (destroyed, not initialised)."""


class DistError(MpicommError, RuntimeError):
    """torch.distributed's ``DistError``: the base of the errors a running collective raises.

    torch's names are here so that ``except dist.DistBackendError`` in a torch program catches
    mpicomm's errors too; mpicomm raises :class:`CommunicationError`, a :class:`DistBackendError`.
    """


class DistBackendError(DistError):
    """torch's ``DistBackendError``: the transport failed or timed out (mpicomm's is MPI)."""


class DistNetworkError(DistError):
    """torch's ``DistNetworkError``, for ``except`` clauses; mpicomm never raises one.

    mpicomm has no network layer of its own: MPI's launcher connected the ranks.
    """


class DistStoreError(DistError):
    """torch's ``DistStoreError``, for ``except`` clauses; mpicomm never raises one (it has no store)."""


class CommunicationError(DistBackendError):
    """MPI reported an error while carrying out a call, or a call did not finish within its timeout.

    A :class:`DistBackendError` (so a ``DistError`` and a ``RuntimeError``), as torch's are.
    """


class MPIUnavailableError(MpicommError, RuntimeError):
    """No MPI library could be loaded, or mpi4py is missing; the message says what was tried and the fix."""


class ObjectCollectiveError(MpicommError, RuntimeError):
    """An object could not be pickled on its sender or unpickled on a receiver.

    The object collectives raise it on every rank of the call with the same message, which names the
    element, the rank where it failed and the cause.
    """


class UnpicklingRefusedError(ObjectCollectiveError, pickle.UnpicklingError):
    """Safe mode refused a stream: a name off the allow-list (see :func:`~mpicomm.allow_unpickle`).

    Also a call or state that could run code, or a claim of more memory than the stream carries.
    """
