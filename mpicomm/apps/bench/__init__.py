"""The benchmark: mpicomm against the raw mpi4py calls it wraps, timed interleaved in the same processes.

- ``harness``: environment, shared buffers, points, the quiet gate, calibration and timing.
- ``dense``, ``jagged``, ``objects``: the comparisons and reports of each data path.
- ``report``: result tables and target verdicts.
- ``run``: the command line, the sweep and ``main`` (``python -m mpicomm.bench``).
"""
