"""One rank of the example programs: ``mpiexec -n N python -m mpi4py run_examples.py IMPL OUT PROGRAM...``.

``IMPL`` is ``mpicomm`` or ``torch`` (torch.distributed on Gloo, the reference). Each program's
results on this rank go to ``OUT/<program>-rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))

import programs


def main() -> None:
    impl, out, names = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    import torch

    torch.set_num_threads(1)
    if impl == "torch":
        import torch.distributed as dist
    else:
        import mpicomm as dist
    for name in names:
        os.environ["EXAMPLE_INIT"] = f"file://{out}/{name}-init"
        result = programs.run(dist, name, rank, size)
        (out / f"{name}-rank{rank}.json").write_text(json.dumps(result, sort_keys=True))
        MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    main()
