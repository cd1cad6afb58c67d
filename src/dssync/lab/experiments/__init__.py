"""What runs experiments: training runs per method and seed, locally or on the emulated cluster,
and the benchmarks that build clusters and start measured workers.

``bench/`` holds what is measured inside a worker and the bounds it is compared with;
``report/`` turns the results into tables, plots and files.
"""
