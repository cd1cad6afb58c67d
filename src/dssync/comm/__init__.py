"""What moves bytes: process-group cache, flat buckets, consensus measurement."""

from dssync.comm.buckets import DEFAULT_BUCKET_BYTES, FlatBuckets, average_tensors, plan_buckets
from dssync.comm.consensus import consensus_distance, fingerprint_check
from dssync.comm.groups import GroupCache

__all__ = [
    "DEFAULT_BUCKET_BYTES", "FlatBuckets", "GroupCache", "average_tensors", "consensus_distance",
    "fingerprint_check", "plan_buckets",
]
