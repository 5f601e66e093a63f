"""One rank of a torch-suite run: ``mpiexec -n N python -m mpi4py runner.py IMPL LABEL OUT LIST``.

Runs the tests named in the file ``LIST`` (one per line) of torch's
``DistributedTest._DistTestBase`` in this process, with ``dist`` in torch's test module routed to
``IMPL``: ``mpicomm`` (every ``dist.*`` name is mpicomm's; a name mpicomm lacks fails the test),
``torch`` (torch.distributed itself, on Gloo, the reference) or ``backend`` (torch.distributed itself
on mpicomm's registered backend, ``import mpicomm.torch``). ``LABEL`` is the backend name the tests
see (``BACKEND``: ``gloo``, ``mpi`` or, for ``backend``, ``mpicomm``); each implementation starts one
process group with it.

Each rank appends ``START name`` and ``END name status detail`` lines to ``OUT/rank<r>.log``. A
watchdog per test: a test (with the harness's barrier after it) that runs past ``TORCHSUITE_TIMEOUT``
seconds writes ``HANG name`` and ends the process, and so the job; the driver
(``test_torchsuite.py``) then starts a new job for the tests after it.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
import types
import unittest
from typing import Any, TextIO

from mpi4py import MPI


class _Log:
    def __init__(self, path: str) -> None:
        self.file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the run

    def line(self, text: str) -> None:
        self.file.write(text.replace("\n", " ") + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def _routed(impl: str) -> Any:
    """The ``dist`` the tests call: mpicomm (names it lacks raise AttributeError) or torch.distributed."""
    if impl == "torch":
        import torch.distributed

        return torch.distributed
    if impl == "backend":  # torch.distributed itself, on the registered backend (label "mpicomm")
        import torch.distributed

        import mpicomm.torch  # registers "mpicomm"

        return torch.distributed
    import mpicomm

    class _Dist(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            try:
                return getattr(mpicomm, name)
            except AttributeError:
                raise AttributeError(f"mpicomm has no attribute {name!r} (torch.distributed has)") from None

    return _Dist("mpicomm_as_dist")


def _init(dist: Any, label: str, rank: int, size: int, serial: list[int]) -> Any:
    serial[0] += 1
    method = f"file://{os.environ['TEMP_DIR']}/harness_init_{serial[0]}"
    dist.init_process_group(
        backend=label,
        init_method=method,
        world_size=size,
        rank=rank,
        timeout=datetime.timedelta(seconds=60),
    )
    return dist.group.WORLD


def _outcome(result: unittest.TestResult, skips: dict[int, str]) -> tuple[str, str]:
    if result.skipped:
        return "skip", result.skipped[0][1]
    problems = result.errors + result.failures
    if not problems:
        return "pass", ""
    text = problems[0][1]
    if "SystemExit" in text:  # torch's skip decorators exit the process with a code
        for code, message in skips.items():
            if f"SystemExit: {code}" in text:
                return "skip", message
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "fail", lines[-1][:400] if lines else "?"


def main() -> None:
    impl, label, out, listing = sys.argv[1:5]
    comm = MPI.COMM_WORLD.Dup()  # the harness's own messages never meet the tests'
    rank, size = comm.Get_rank(), comm.Get_size()
    os.environ["BACKEND"] = label
    os.environ["WORLD_SIZE"] = str(size)
    os.environ["RANK"] = str(rank)
    with open(listing) as f:
        names = [n.strip() for n in f if n.strip()]
    timeout = float(os.environ.get("TORCHSUITE_TIMEOUT", "30"))
    log = _Log(os.path.join(out, f"rank{rank}.log"))

    import torch

    torch.set_num_threads(1)
    from torch.testing._internal import common_distributed, common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.distributed import distributed_test as dt

    dist = _routed(impl)
    # torch's tests reach dist through three names: the module, common_distributed's c10d (the debug
    # level decorator) and two functions imported from distributed_c10d
    dt.dist = common_distributed.c10d = dist
    dt.get_world_size = dist.get_world_size
    dt._get_default_group = lambda: dist.group.WORLD
    if impl == "mpicomm":
        # torch's autograd-profiler records of c10d calls are out of scope (scope.py): the checks of
        # those records inside the collective tests are switched off, as torch does for backends
        # without them; the data checks stay
        for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS"):
            setattr(dt, name, [])
        dt.SEND_RECV_PROFILING_SUPPORTED_BACKENDS = []
    skips = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    tests_comm = [comm]
    serial = [0]
    world = [_init(dist, label, rank, size, serial)]

    class Suite(dt.DistributedTest._DistTestBase, common_utils.TestCase):  # type: ignore[name-defined,misc]
        world_size = str(size)
        file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "test_file")

        @property
        def init_method(self) -> str:
            return f"file://{self.file_name}"

        def _barrier(self, *args: Any, timeout: float = 10, **kwargs: Any) -> None:
            # torch's file barrier: a RuntimeError after ``timeout`` s, never a hang; its own
            # communicator per test, so that a failed test leaves no barrier behind for the next
            request = tests_comm[0].Ibarrier()
            deadline = time.monotonic() + timeout
            while not request.Test():
                if time.monotonic() > deadline:
                    raise RuntimeError("barrier timeout")
                time.sleep(0.001)

    for name in names:
        log.line(f"START {name}")

        def hang(name: str = name) -> None:
            log.line(f"HANG {name} no answer within {timeout:g} s (rank {rank})")
            os._exit(3)

        watchdog = threading.Timer(timeout, hang)
        watchdog.daemon = True
        watchdog.start()
        tests_comm[0] = comm.Dup()
        case = Suite(name)
        case.rank = rank
        result = unittest.TestResult()
        case.run(result)
        status, detail = _outcome(result, skips)
        if not dist.is_initialized() or dist.group.WORLD is not world[0]:
            # the test destroyed or replaced the default group (a 1 s timeout): a fresh one, as torch's
            # harness starts a fresh process per test
            if dist.is_initialized():
                dist.destroy_process_group()
            world[0] = _init(dist, label, rank, size, serial)
        comm.Barrier()
        watchdog.cancel()
        log.line(f"END {name} {status} {detail}")
    comm.Barrier()
    log.line("DONE")
    os._exit(0)  # skip interpreter teardown: torch's and MPI's finalizers are not under test


if __name__ == "__main__":
    main()
