"""The programs users run: ``demo``, ``info``, the ``plan`` CLI and the ``bench`` harness.

Each is reached as ``python -m mpicomm.demo``, ``python -m mpicomm.plan``, ``python -m mpicomm.bench``
(thin entry modules) or ``python -m mpicomm info``.

May import: everything in mpicomm (the public API first); nothing in mpicomm imports apps.
"""
