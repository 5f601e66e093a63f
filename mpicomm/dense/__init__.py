"""Dense collectives with torch.distributed's names: reductions, gathers, all-to-alls and point-to-point.

- ``reductions``: ``all_reduce``, ``reduce``, ``broadcast``, ``reduce_scatter(_tensor)``.
- ``gathers``: ``all_gather(_into_tensor)``, ``gather``, ``scatter`` (uneven sizes without padding).
- ``alltoall``: ``all_to_all`` and ``all_to_all_single`` with split sizes.
- ``exchange``: the pairwise v-exchange that the list forms share.
- ``p2p``: ``send``, ``recv``, ``isend``, ``irecv``, ``sendrecv``.
- ``batch``: ``P2POp`` and ``batch_isend_irecv``.
- ``sync``: ``barrier``, ``monitored_barrier`` and the timed wait behind ``barrier(timeout=)``.
- ``half``: float16/bfloat16 reductions, carried out in float32.

May import: ``mpicomm.core``, ``mpicomm.errors``, ``mpicomm._mpi``.
"""
