"""The driver of torch-suite runs: start ``runner.py`` under mpiexec, restart it after a hang, read the logs.

``run(impl, label, ranks, names)`` returns ``{test name: (status, detail)}`` with status one of
``pass``, ``fail``, ``skip``, ``hang`` (the watchdog fired, or the job died inside the test).
``python tests/torchsuite/suite.py IMPL LABEL RANKS [NAME...]`` prints one line per test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
#: Seconds one test may take (with the harness's barrier after it) before the watchdog ends the job.
TEST_TIMEOUT = float(os.environ.get("TORCHSUITE_TIMEOUT", "30"))

Outcome = tuple[str, str]


def _flags() -> list[str]:
    """Open MPI refuses more ranks than cores unless told; MPICH needs nothing."""
    version = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, check=False)
    return ["--oversubscribe"] if "open" in (version.stdout + version.stderr).lower() else []


def source_of(name: str) -> str:
    """The source of test ``name`` of ``_DistTestBase`` (for scope decisions)."""
    import inspect

    from torch.testing._internal.distributed import distributed_test as dt

    method = getattr(dt.DistributedTest._DistTestBase, name)
    return inspect.getsource(inspect.unwrap(method))


def all_tests() -> list[str]:
    """Every ``test_*`` method of torch's ``DistributedTest._DistTestBase``, in source order."""
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    from torch.testing._internal.distributed import distributed_test as dt

    base = dt.DistributedTest._DistTestBase
    return [n for n in vars(base) if n.startswith("test_") and callable(getattr(base, n))]


def _read(out: Path, ranks: int) -> tuple[dict[str, Outcome], list[str], bool]:
    """Outcomes of the ended tests, the tests started, and whether every rank finished."""
    ends: dict[str, list[Outcome]] = {}
    started: list[str] = []
    hung: dict[str, str] = {}
    done = 0
    for r in range(ranks):
        path = out / f"rank{r}.log"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            word, _, rest = line.partition(" ")
            name, _, tail = rest.partition(" ")
            if word == "START" and name not in started:
                started.append(name)
            elif word == "END":
                status, _, detail = tail.partition(" ")
                ends.setdefault(name, []).append((status, f"rank {r}: {detail}" if detail else ""))
            elif word == "HANG":
                hung[name] = tail
            elif word == "DONE":
                done += 1
    outcomes: dict[str, Outcome] = {}
    for name, each in ends.items():
        if len(each) < ranks or name in hung:
            continue
        statuses = {s for s, _ in each}
        detail = next((d for s, d in each if s == "fail"), each[0][1])
        status = "fail" if "fail" in statuses else "skip" if "skip" in statuses else "pass"
        outcomes[name] = (status, detail)
    for name, why in hung.items():
        outcomes[name] = ("hang", why)
    return outcomes, started, done == ranks


def run(impl: str, label: str, ranks: int, names: list[str]) -> dict[str, Outcome]:
    """Run ``names`` on ``ranks`` ranks with ``dist`` routed to ``impl``, restarting after each hang."""
    results: dict[str, Outcome] = {}
    todo = list(names)
    while todo:
        with tempfile.TemporaryDirectory(prefix="torchsuite-") as tmp:
            temp = Path(tmp)
            for sub in ("barrier", "test_dir", "init_dir", "out"):
                (temp / sub).mkdir()
            listing = temp / "tests.txt"
            listing.write_text("\n".join(todo) + "\n")
            clean = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))
            }
            env = dict(
                clean,
                TEMP_DIR=str(temp),
                INIT_METHOD=f"file://{temp}/init_dir/shared_init_file",
                TORCHSUITE_TIMEOUT=str(TEST_TIMEOUT),
                OMP_NUM_THREADS="1",
                MPICOMM_ABORT_ON_EXCEPTION="0",
                PYTORCH_PRINT_REPRO_ON_FAILURE="0",
            )
            cmd = [
                str(MPIEXEC),
                *_flags(),
                "-n",
                str(ranks),
                sys.executable,
                "-m",
                "mpi4py",
                str(HERE / "runner.py"),
            ]
            proc = subprocess.run(
                [*cmd, impl, label, str(temp / "out"), str(listing)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60 + len(todo) * TEST_TIMEOUT,
                check=False,
            )
            outcomes, started, finished = _read(temp / "out", ranks)
        results.update(outcomes)
        if finished:
            break
        # the job ended early: the first test started and not ended on every rank hung or crashed
        stuck = next((n for n in started if n not in outcomes), None)
        if stuck is not None:
            why = f"the job ended inside it (exit {proc.returncode}): {proc.stderr[-300:]}"
            results[stuck] = ("hang", why)
        if stuck is None and not any(n in outcomes for n in todo):
            why = f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
            raise RuntimeError(f"torch suite: the job ran no test ({why})")
        todo = [n for n in todo if n not in results]
    return results


if __name__ == "__main__":
    impl, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    chosen = sys.argv[4:] or all_tests()
    for name, (status, detail) in run(impl, label, n, chosen).items():
        print(f"{status:5} {name} {detail}")
