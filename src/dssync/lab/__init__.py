"""The laboratory: the ``dssync`` command, its training loop, workloads, baselines, the emulated
cluster, benchmarks, the planner and reports (``pip install 'dssync[lab]'``).

Nothing in the library (``import dssync``: schedules, the averaging core, ``DSSync``,
``AsyncDSSync``, topology detection, errors and the doors) imports from here; this package
builds on the library.
"""
