"""What a benchmark measures: the timed loop a benchmark worker runs (``cluster_worker``), the cost
of one averaging step (``sync_cost``), what per-rank timings say (``timings``) and the link-rate
lower bounds they are held against (``bounds``). Building clusters and starting workers is
:mod:`dssync.lab.experiments`; tables and plots are :mod:`dssync.lab.report`.
"""
