"""Planning: predicted iteration time and steps to consensus of each method on a cluster.

Pure: no process group, no network; numbers come from the cluster's link rates.
"""
