"""Where each rank was when a multi-rank test run timed out, read from the run's log.

pytest-timeout (``--timeout-method thread``) dumps every thread's stack on each rank that times
out, 60-odd lines a rank, so in a CI log that shows only its tail the rank that was stuck is
usually off screen. This prints one line a rank: the innermost frames of its main thread, test
function first, and the innermost frame of each other thread. ``.ci/run`` prints it when a run
fails.

Usage: ``python scripts/where-ranks-were.py LOG`` (lines of ranks other than 0 carry the
``[rank N]`` prefix that tests/mpi/conftest.py gives them; unprefixed lines are rank 0's).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# rank 0's unfinished pytest progress line ("tests/mpi/test_x.py ..F") may come before another rank's
# prefix; nothing else may (rank 0's own lines can quote a prefixed line, e.g. in an assertion)
PREFIX = re.compile(r"^(?:\S+\.py [.sxXfFE]*)?\[rank (\d+)\] ?(.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIMEOUT = re.compile(r"^(?:\S+\.py [.sxXfFE]*)?\+{5,} Timeout \+{5,}\s*$")  # a whole line, as pytest-timeout
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
STACK = re.compile(r"Stack of (.+?) \(\d+\)")
KEEP = 4  # innermost frames shown below the test function


def _short(path: str) -> str:
    for anchor in ("/mpicomm/", "/tests/", "/site-packages/"):
        if anchor in path:
            return path.split(anchor, 1)[1]
    return path.rsplit("/", 1)[-1]


def _summary(stacks: dict[str, list[tuple[str, str, str]]]) -> str:
    parts = []
    for thread, frames in stacks.items():
        if not frames:
            continue
        if thread == "MainThread":
            tests = [i for i, f in enumerate(frames) if f[2].startswith("test_")]
            shown = frames[tests[-1] :] if tests else frames
            shown = shown[:1] + shown[1:][-KEEP:] if len(shown) > KEEP + 1 else shown
            parts.append(" > ".join(f"{_short(p)}:{n} {fn}" for p, n, fn in shown))
        elif thread not in ("pytest_timeout",):
            p, n, fn = frames[-1]
            parts.append(f"[{thread}: {_short(p)}:{n} {fn}]")
    return " ".join(parts) if parts else "(no stack)"


RANKS = re.compile(r"^== .* on (\d+) ranks")


def where(lines: list[str]) -> dict[int, str]:
    """Rank -> one line of where its threads were at its last timeout dump.

    When the log names the run's size (the Makefile prints ``== ... on N ranks ...`` before each
    multi-rank run) and some rank printed no dump while others did, that rank is listed too: a
    process that never got to dump (its timeout thread never got the interpreter lock) is the
    likeliest one to be stuck.
    """
    size = 0
    dumps: dict[int, dict[str, list[tuple[str, str, str]]]] = {}
    inside: dict[int, bool] = {}
    thread: dict[int, str] = {}
    for raw in lines:
        raw = ANSI.sub("", raw)  # Open MPI's launcher gives pytest a terminal: colours
        m = PREFIX.match(raw)
        rank, text = (int(m.group(1)), m.group(2)) if m else (0, raw)
        header = RANKS.match(text)
        if header:
            size, dumps, inside, thread = int(header.group(1)), {}, {}, {}  # a new run: forget the last
            continue
        if TIMEOUT.match(text):
            inside[rank] = not inside.get(rank, False)
            if inside[rank]:
                dumps[rank] = {}
            continue
        if not inside.get(rank):
            continue
        s = STACK.search(text)
        if s:
            thread[rank] = s.group(1)
            dumps[rank][thread[rank]] = []
            continue
        f = FRAME.match(text)
        if f and rank in thread:
            dumps[rank][thread[rank]].append((f.group(1), f.group(2), f.group(3)))
    found = {r: _summary(d) for r, d in sorted(dumps.items())}
    if found:
        silent = "no stack dump: frozen before its timeout thread could run (the likeliest one stuck)"
        found.update({r: silent for r in range(size) if r not in found})
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    """Print the summary of the log named in ``argv[1]``; 2 on a wrong command line."""
    if len(argv) != 2:
        sys.stderr.write("usage: where-ranks-were.py LOG\n")
        return 2
    found = where(Path(argv[1]).read_text(errors="replace").splitlines())
    if not found:
        print("where-ranks-were: no timeout dump in the log")
        return 0
    print(f"where-ranks-were: {len(found)} rank(s); innermost frames of each, test first:")
    for rank, line in found.items():
        print(f"  rank {rank}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
