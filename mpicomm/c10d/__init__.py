"""The torch room: everything that speaks torch.distributed's c10d, and nothing else in mpicomm does.

- ``startup``: torch.distributed's set-up names for ``import mpicomm as dist`` (``init_process_group``,
  ``group.WORLD``, ``new_subgroups``, ``split_group``, ``get_backend``, ...).
- ``backend_names``: torch's backend names (``Backend``, the deprecated ``reduce_op``); the name check
  itself is ``mpicomm.core.labels``'s, which ``new_group`` calls.
- ``launch``: torchrun's variables from an MPI launcher's, and the refusal of launches MPI did not make.
- ``options``: c10d's options (reductions, roots, timeouts) in mpicomm's terms, for both adapters.
- ``device_mesh``: ``DeviceMesh`` and ``init_device_mesh`` on mpicomm's own groups.
- ``pg_methods``: torch's ``ProcessGroup`` methods (``pg.allreduce([t])``, ...), attached to
  :class:`~mpicomm.ProcessGroup` when :mod:`mpicomm` is imported.
- ``registered``: ``MpicommProcessGroup``, the ``torch.distributed.ProcessGroup`` subclass torch builds
  for ``backend="mpicomm"``: c10d's methods, old and new names, on an mpicomm group (imports torch).
- ``registration``: the backend's registration (``import mpicomm.torch``), its creator, and the MPI
  rendezvous behind ``env://`` and ``mpicomm://`` (rank 0's TCPStore, its port sent over MPI).
- ``torch_objects``: torch's object collectives on this backend unpickle in safe mode when it is on.
- ``work``: the completed and pending ``Work`` handles that group returns.

May import: the front door (``mpicomm.front``), the dense data path (``mpicomm.dense``), the object
collectives' pickling (``mpicomm.objects``: safe mode for torch's object collectives),
``mpicomm.core``, ``mpicomm.errors``, and torch (lazily, in the modules that need it: importing
:mod:`mpicomm` imports neither torch nor cupy). Nothing below it imports it: only
``mpicomm/__init__.py``, :mod:`mpicomm.torch` and the programs in ``mpicomm.apps``.
"""
