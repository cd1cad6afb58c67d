"""A process group of one rank in this process, for examples and single-process tests.

Example::

    >>> import torch
    >>> from dssync import DSSync, Global
    >>> from dssync.testing import one_rank
    >>> with one_rank():
    ...     sync = DSSync(torch.nn.Linear(2, 1), Global(), every=2)
    ...     for _ in range(4):
    ...         sync.step()
    ...     sync.steps, sync.averagings
    (4, 2)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def one_rank(backend: str = "gloo") -> Iterator[None]:
    """The default process group as one rank on an in-memory store, destroyed on leaving;
    refused when a default group exists already (this process is part of a real run)."""
    if dist.is_initialized():
        raise RuntimeError(
            "one_rank() makes the default process group, but one exists already; call it "
            "outside a distributed run (or destroy_process_group() first)"
        )
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
