"""Planning: predicted iteration time and steps to consensus of each method on a cluster.

Pure: no process group, no network; numbers come from the cluster's link rates. The one exception
is ``local.py`` (``dssync plan --measure-local N``), which runs ``dssync bench-sync`` and
``dssync train`` with N local ranks as subprocesses to set a measured run against the model.
"""
