"""GPUs: whether the MPI takes device memory (CUDA-awareness), the pinned staging pool, device binding.

- ``cuda_aware``: the direct-or-staged decision (``MPICOMM_CUDA_AWARE``, the MPI's own query, hints).
- ``staging``: the reusable pinned host pool and the chunk plans that stage device data through it.
- ``device``: binding each rank to a GPU by its node-local rank.

May import: ``mpicomm.core``, ``mpicomm.errors``, ``mpicomm._mpi``; cupy only lazily, where a GPU is used.
"""
