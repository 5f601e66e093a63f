"""GPUs: the device data paths and what they stand on (CUDA-awareness, pinned staging, device binding).

- ``backend``: the device-array protocol (cupy's, or a stand-in): allocation, copies, streams, events.
- ``cuda_aware``: the direct-or-staged decision (``MPICOMM_CUDA_AWARE``, the MPI's own query, hints).
- ``direct``: device memory handed to a CUDA-aware MPI, through the host path's own checks.
- ``staged``: device data staged through pinned host buffers around the host implementation,
  stream-ordered, with an asynchronous :class:`~mpicomm.Work` that uploads on completion.
- ``pipeline``: large ``all_reduce``, ``broadcast``, ``reduce`` and ``all_to_all_single`` in
  double-buffered chunks, each chunk the host implementation.
- ``posted``: the direct and pipelined paths' ``async_op=True`` calls, queued on the engine after
  an event on the caller's stream (:class:`~mpicomm.gpu.posted.DeviceWork`).
- ``staging``: the reusable pinned host pool and the chunk plans that stage device data through it.
- ``device``: binding each rank to a GPU by its node-local rank.

May import: ``mpicomm.dense`` (the host implementations the device paths wrap), ``mpicomm.core``,
``mpicomm.errors``, ``mpicomm._mpi``; cupy only lazily, where a GPU is used. Reached only through
the front door (``mpicomm.front``).
"""
