"""The core every data path stands on: process groups, buffers, async handles, validation, failure, ReduceOp.

- ``groups``: MPI start-up, the world and sub-groups (each owns a ``Dup`` of its communicator).
- ``buffers``: the one place that knows array kinds: argument checks, dtype -> MPI datatype, layouts.
- ``layouts``: MPI derived datatypes built from a strided view's strides (cached, freed), for ``buffers``.
- ``work``: ``Work``, the handle ``async_op=True`` returns.
- ``validation``: the cross-rank agreement checks of validation mode (``MPICOMM_VALIDATE=1``).
- ``control``: control messages (error reports, validation records) as int64 words and bounded
  text, never pickle.
- ``calls``: ``@collective``: one-rank failures into the validation exchange, MPI errors as
  ``CommunicationError``, bool flags.
- ``failure``: the hook that aborts the whole job when one rank dies of an exception.
- ``reduce_op``: ``ReduceOp`` and the local arithmetic of AVG and PREMUL_SUM.
- ``fast``: the cheap tests that let a common call skip the general checks.
- ``cmpi``: the common calls' MPI calls made from C (``_cmpi.c``, ``_cmpi_lists.c``), bound to the
  MPI that mpi4py loaded; mpi4py's path where the extension is not built or ``MPICOMM_C=0``.

May import: ``mpicomm.errors``, ``mpicomm._mpi``, numpy. Nothing else in mpicomm. Knows nothing of torch:
torch's names and torch.distributed's process-group interface live in ``mpicomm.c10d``.
"""
