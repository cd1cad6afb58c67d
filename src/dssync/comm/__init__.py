"""What moves bytes: the averaging core, the one transport, flat buckets, tags, agreement."""

from dssync.comm.buckets import (
    DEFAULT_BUCKET_BYTES,
    FlatBuckets,
    pack,
    plan_buckets,
    unpack,
)
from dssync.comm.consensus import consensus_distance, fingerprint_check
from dssync.comm.groups import GroupCache
from dssync.comm.transport import average_tensors

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "FlatBuckets",
    "GroupAverager",
    "GroupCache",
    "Router",
    "average_tensors",
    "consensus_distance",
    "fingerprint_check",
    "pack",
    "plan_buckets",
    "unpack",
]

from dssync.comm.averager import GroupAverager, Router  # noqa: E402  (needs dssync.schedules)
