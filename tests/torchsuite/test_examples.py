"""The example programs (tests/torchsuite/examples/programs.py) on mpicomm give torch Gloo's
results, at 2 and 3 ranks; the tutorial's MPI recipe on mpicomm gives the tutorial's Gloo results."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torchsuite import suite

EXAMPLES = Path(__file__).resolve().parent / "examples"
PROGRAMS = ["detectron2", "torchmetrics", "tutorial", "c10d"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(impl: str, ranks: int, names: list[str]) -> dict[str, list[Any]]:
    with tempfile.TemporaryDirectory(prefix="examples-") as tmp:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))
        }
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        cmd = [str(suite.MPIEXEC), *suite._flags(), "-n", str(ranks), sys.executable, "-m", "mpi4py"]
        done = subprocess.run(
            [*cmd, str(EXAMPLES / "run_examples.py"), impl, tmp, *names],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {
            n: [json.loads((Path(tmp) / f"{n}-rank{r}.json").read_text()) for r in range(ranks)]
            for n in names
        }


def _same(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (floats within 1e-12 relative: MPI and Gloo sum in other orders)."""
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} entries != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _same(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_example_programs_give_torch_gloos_results(ranks: int) -> None:
    reference = _run("torch", ranks, PROGRAMS)
    ours = _run("mpicomm", ranks, [*PROGRAMS, "tutorial-mpi"])
    differences = []
    for name in PROGRAMS:
        differences += _same(ours[name], reference[name], name)
    differences += _same(ours["tutorial-mpi"], reference["tutorial"], "tutorial-mpi")
    assert not differences, "\n".join(differences)
    assert reference["tutorial"][0]["all_reduce"] == ranks and len(reference["tutorial"][0]["losses"]) == 3
