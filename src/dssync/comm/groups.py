"""Process groups for the groups a schedule names: created once, reused, bounded in number."""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

import torch.distributed as dist

from dssync.schedules import Partition


class GroupCache:
    """Maps a group of ranks (ranks of ``process_group``) to a torch.distributed process group.

    Every rank must call :meth:`prepare` with the same partition at the same point: groups are
    created with ``dist.new_group``, which all ranks call in the same order. Because every rank
    sees the same sequence of partitions, every rank's cache holds the same groups; when it holds
    more than ``max_groups`` the least recently used is destroyed on every rank, so a schedule
    that never repeats still keeps a bounded number of groups (and sockets).

    When ``process_group`` is a strict subset of the world, ranks outside it cannot join in
    creating groups, so each rank creates only its own groups (``use_local_synchronization``);
    such groups cannot be safely re-created, so the cache then never evicts and refuses to grow
    past ``max_groups`` (use a schedule that repeats).

    Example::

        cache = GroupCache()
        cache.prepare([[0, 1], [2, 3]])
        pg = cache.get([0, 1])       # on ranks 0 and 1
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        max_groups: int = 128,
        timeout: timedelta | None = None,
    ) -> None:
        if max_groups < 1:
            raise ValueError(f"max_groups={max_groups} must be >= 1")
        self.parent = process_group or dist.group.WORLD
        self.size = dist.get_world_size(self.parent)
        self.rank = dist.get_rank(self.parent)
        self.max_groups = max_groups
        self.timeout = timeout
        self.local = self.size != dist.get_world_size()
        self._groups: OrderedDict[tuple[int, ...], dist.ProcessGroup | None] = OrderedDict()
        self.created = 0
        self.destroyed = 0

    def __len__(self) -> int:
        return len(self._groups)

    def prepare(self, partition: Partition) -> None:
        """Make sure every group of ``partition`` exists; all ranks call this alike."""
        needed = [tuple(g) for g in partition if 1 < len(g) < self.size]
        for key in needed:
            if key in self._groups:
                self._groups.move_to_end(key)
        for key in needed:
            if key not in self._groups and (not self.local or self.rank in key):
                self._evict(keep=set(needed))
                self._groups[key] = self._create(key)

    def get(self, group: list[int]) -> dist.ProcessGroup | None:
        """The process group for ``group``; None for a group of one (nothing to do)."""
        key = tuple(group)
        if len(key) <= 1:
            return None
        if len(key) == self.size:
            return self.parent
        try:
            return self._groups[key]
        except KeyError:
            raise RuntimeError(
                f"group {list(key)} was not prepared; call prepare(partition) first"
            ) from None

    def clear(self) -> None:
        """Destroy every cached group (all ranks call this alike)."""
        while self._groups:
            self._destroy(self._groups.popitem(last=False)[1])

    def _create(self, key: tuple[int, ...]) -> dist.ProcessGroup | None:
        ranks = [dist.get_global_rank(self.parent, r) for r in key] if self.local else list(key)
        pg = dist.new_group(ranks, timeout=self.timeout, use_local_synchronization=self.local)
        self.created += 1
        return pg if self.rank in key else None

    def _evict(self, keep: set[tuple[int, ...]]) -> None:
        if self.local and len(self._groups) >= self.max_groups:
            raise RuntimeError(
                f"more than max_groups={self.max_groups} distinct groups inside a process group that is "
                "not the whole world; use a schedule that repeats, e.g. Shuffle(k, repeat=8), or raise max_groups"
            )
        while len(self._groups) >= self.max_groups:
            victim = next((k for k in self._groups if k not in keep), None)
            if victim is None:
                return
            self._destroy(self._groups.pop(victim))

    def _destroy(self, pg: dist.ProcessGroup | None) -> None:
        self.destroyed += 1
        if pg is not None:
            dist.destroy_process_group(pg)
