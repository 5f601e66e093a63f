"""Which tests of torch's ``DistributedTest._DistTestBase`` the harness runs, and why the others are out.

``OUT_OF_SCOPE`` holds name patterns (regular expressions, searched in the test name) with the reason;
the first pattern that matches decides. ``KNOWN_DIFFERENCES`` holds the tests that pass on torch's
Gloo and are allowed to fail on mpicomm, each with its reason (docs/torch.rst says the same).
"""

from __future__ import annotations

import re

__all__ = ["KNOWN_DIFFERENCES", "KNOWN_HANGS", "OUT_OF_SCOPE", "not_meaningful_here", "out_of_scope"]

_DDP = "DistributedDataParallel and its Reducer: torch machinery (autograd hooks, buckets), not communication"

OUT_OF_SCOPE: list[tuple[str, str]] = [
    (r"cuda|gpu|nccl", "CUDA/NCCL only: no GPU on this machine"),
    (r"ddp|DDP|data_parallel|DistributedDataParallel", _DDP),
    (r"accumulate_gradients|static_graph|no_sync|bucket|verify_model|output_unused|undefined_grad", _DDP),
    (r"different_graph|unused_parameters|grads_same|gradient_as_bucket|join|uneven|sync_bn_logged", _DDP),
    (r"sync_batch|batch_norm|batchnorm|SyncBatchNorm", "SyncBatchNorm: a torch module, not communication"),
    (r"average|localSGD|local_sgd|hierarchical|periodic", "model averaging: torch.distributed.algorithms"),
    (r"profil", "the torch profiler's records of c10d calls"),
    (r"sampler", "DistributedSampler: torch.utils.data, not communication"),
    (r"dump_DDP|detect_ddp|logger|logging", _DDP),
]


def out_of_scope(name: str) -> str | None:
    """The reason ``name`` is out of scope, or None.

    Example:
        >>> out_of_scope("test_ddp_hook_parity_allreduce") is not None
        True
        >>> out_of_scope("test_all_reduce_sum") is None
        True
    """
    for pattern, reason in OUT_OF_SCOPE:
        if re.search(pattern, name):
            return reason
    return None


#: Tests that pass on torch's Gloo and may fail on mpicomm, with the reason (docs/torch.rst).
KNOWN_DIFFERENCES: dict[str, str] = {
    "test_all_reduce_complex_unsupported_ops": (
        "mpicomm multiplies complex numbers (PRODUCT: MPI_PROD is defined on complex types); torch "
        "refuses PRODUCT on complex tensors because it reduces their view_as_real pairs, where an "
        "element-wise product would be wrong. MAX, MIN and the bitwise ops raise ValueError as in torch"
    ),
}

#: Known differences that hang on mpicomm: not run there (each would cost a watchdog period).
KNOWN_HANGS: frozenset[str] = frozenset()


def not_meaningful_here(name: str, source: str, label: str, ranks: int) -> str | None:
    """Why ``name`` cannot pass at ``ranks`` ranks under ``label`` whatever the backend, or None.

    torch's ``skip_if_small_worldsize`` skips the tests on group ``[1, 2]`` at 2 ranks for every
    backend but ``mpi`` (torch's MPI CI runs more ranks); at 2 ranks there is no world rank 2, and
    ``new_group([1, 2])`` raises on torch's MPI backend as on mpicomm.

    Args:
        name: The test name.
        source: The test method's source.
        label: The backend label.
        ranks: The number of ranks.

    Returns:
        The reason, or None.
    """
    if label == "mpi" and ranks < 3 and "self._init_group_test(" in source:
        return "group [1, 2] needs 3 ranks (torch's skip_if_small_worldsize does not skip it for mpi)"
    return None
