"""Run inside a two-node allocation: start ``jobs/demo.sbatch`` (launcher ``auto``) again and again with
``MPICOMM_PAD`` of several lengths, and report the longest PMI-1 request of each start (PMI_DEBUG=1).

Used by test_launcher.py's regression test of the start-up hang. The wheel's PMI-1 ``put`` requests carry
4096 heap bytes in 511-byte segments whose hex length depends on the heap layout, which the environment
moves chaotically; ASLR adds about 15 bytes of noise from start to start. The first pass tries every
padding once; then the paddings whose requests came longest are tried again, until WANT starts crossed
1024 bytes or the time budget is spent, and at least LEAST starts are made however long they take (the
test asks for that many). Starting inside one allocation costs ~1.8 s a start instead of ~3.5 s a job.

    python tests/slurm/pad_sweep.py OUT_DIR [SECONDS]

For each start it prints ``start <i> padding <n> rc <code> longest <bytes>`` and leaves its output in
``OUT_DIR/start-<i>.out``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

#: MPICOMM_PAD lengths at which the demo's longest request came within ~25 bytes of 1024 in a test job's
#: environment on the CI machine (a 16-byte sweep of 560-1200 under sbatch: 912, 1200 gave 1023 bytes).
PADDINGS = (912, 1200, 1040, 848, 752, 960, 672, 784)
WANT = 3
LEAST = 5
CLIFF = 1024
_PUT = re.compile(r"send to fd=\d+ pmi: (cmd=put .*)")


def longest_put(text: str) -> int:
    """The longest PMI-1 ``put`` request (with its newline) that PMI_DEBUG=1 printed."""
    return max((len(m.group(1)) + 1 for m in _PUT.finditer(text)), default=0)


def main(out_dir: Path, seconds: float) -> int:
    base = {**os.environ, "PMI_DEBUG": "1"}
    script = Path(__file__).resolve().parents[2] / "jobs" / "demo.sbatch"
    deadline = time.monotonic() + seconds
    seen: dict[int, list[int]] = {}
    crossed = 0
    start = 0

    def order() -> list[int]:
        untried = [p for p in PADDINGS if p not in seen]
        return untried or sorted(seen, key=lambda p: -max(seen[p]))[:3]

    def more() -> bool:
        return start < LEAST or (crossed < WANT and time.monotonic() < deadline)

    while more():
        for padding in order():
            if not more():
                break
            env = {**base, "MPICOMM_PAD": "X" * padding}
            out = out_dir / f"start-{start}.out"
            with out.open("w") as sink:
                rc = subprocess.run(
                    ["bash", str(script)], env=env, stdout=sink, stderr=subprocess.STDOUT
                ).returncode
            longest = longest_put(out.read_text(errors="replace"))
            seen.setdefault(padding, []).append(longest)
            crossed += longest > CLIFF
            print(f"start {start} padding {padding} rc {rc} longest {longest}", flush=True)
            start += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 45.0))
