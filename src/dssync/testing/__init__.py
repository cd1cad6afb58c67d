"""Test helpers that stand in for what this machine lacks; not imported by ``import dssync``.

Importing :mod:`dssync.testing` registers the ``nccl_like`` process-group backend
(:mod:`dssync.testing.nccl_like`): gloo underneath, NCCL's rules on top.

Example::

    import dssync.testing
    dist.init_process_group("nccl_like", ...)
"""

from __future__ import annotations

from dssync.testing import nccl_like
from dssync.testing.nccl_like import (
    Aborted,
    RuleBroken,
    forget_peers,
    peers,
    use_nccl_like_world,
)
from dssync.testing.ranks import one_rank

nccl_like.register()

__all__ = [
    "Aborted",
    "RuleBroken",
    "forget_peers",
    "nccl_like",
    "one_rank",
    "peers",
    "use_nccl_like_world",
]
