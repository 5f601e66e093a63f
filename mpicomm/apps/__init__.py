"""The programs users run: ``demo``, ``info``, the ``plan`` CLI and the ``bench`` harness.

Each is a command of one tree, ``python -m mpicomm {info,demo,plan,bench}`` (or the ``mpicomm``
script); ``python -m mpicomm.demo``, ``.plan`` and ``.bench`` (thin entry modules) still work. ``halo``
is the worked halo-exchange example the demo runs.

May import: everything in mpicomm (the public API first); nothing in mpicomm imports apps.
"""
