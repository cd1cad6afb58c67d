"""Who is in this averaging: torchft's quorum, read where torchft hands it to the process group.

torchft's :class:`~torchft.manager.Manager` asks the Lighthouse for a quorum (the live replicas)
and, when the membership changed, reconfigures its process group with this replica's rank, the
world size and the quorum's replicas (``configure(..., global_ranks=...)``); it does not expose
the members otherwise. :class:`QuorumGloo` is torchft's reconfigurable gloo group that keeps
what ``configure`` was given, so :class:`~dssync.elastic.ElasticDSSync` can partition the
quorum. :class:`ReplicaManager` is a Manager with it, for one process per replica.

A replica's number is the digits its ``replica_id`` ends with (torchft's own rule for global
ranks): ``"replica_3"`` is replica 3. Numbers must be unique among live replicas; a replica
restarted under its old number is a new member (torchft adds a fresh uuid to its id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed import TCPStore
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.elastic.heal import HealTransport
from dssync.errors import UsageError


@dataclass(frozen=True)
class Members:
    """One quorum as the process group was configured for it.

    ``ranks[i]`` is the replica number of the group's rank ``i`` (torchft orders members by
    replica id); ``rank`` is this replica's rank in the group.
    """

    quorum_id: int
    rank: int
    ranks: tuple[int, ...]

    @property
    def replicas(self) -> list[int]:
        """The replica numbers, sorted: what the schedule's indices stand for."""
        return sorted(self.ranks)

    def rank_of(self, replica: int) -> int:
        """The process group rank of replica number ``replica``."""
        return self.ranks.index(replica)


class QuorumGloo(ProcessGroupGloo):
    """torchft's reconfigurable gloo process group that remembers each quorum's members."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self.members: Members | None = None

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: int | None = None,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        global_ranks: list[int] | None = None,
    ) -> None:
        self.members = None  # a configure that fails leaves no members to average with
        super().configure(
            store_addr,
            replica_id,
            rank,
            world_size,
            quorum_id,
            group_rank,
            group_world_size,
            global_ranks,
        )
        ranks = tuple(global_ranks or ())
        if len(ranks) != world_size or len(set(ranks)) != world_size:
            raise UsageError(
                f"the quorum's replica numbers {list(ranks)} are not {world_size} distinct "
                "numbers; give every replica a replica_id ending in its own number "
                "(replica_0, replica_1, ...)"
            )
        self.members = Members(int(quorum_id or 0), rank, ranks)


def replica_number(replica_id: str) -> int:
    """The digits ``replica_id`` ends with (torchft's rule), or a UsageError naming the fix."""
    found = re.search(r"(\d+)$", replica_id)
    if not found:
        raise UsageError(
            f"replica_id={replica_id!r} does not end in a number; name replicas replica_0, "
            "replica_1, ... (the number is the replica's place in the schedule)"
        )
    return int(found.group(1))


class ReplicaManager(Manager):
    """torchft's Manager for one process per replica, as :class:`ElasticDSSync` needs it.

    It starts this replica's TCPStore (torchft's process groups meet there), uses
    :class:`QuorumGloo` (:attr:`pg`, whose :attr:`QuorumGloo.members` is the current quorum),
    and asks for the quorum synchronously, so a joining replica is healed before its first
    averaging; a replica it heals from keeps serving until the fetch started
    (:class:`~dssync.elastic.heal.HealTransport`). ``lighthouse`` is the Lighthouse's address (``http://host:port``);
    ``min_replicas`` is torchft's ``min_replica_size``: no averaging counts with fewer live
    replicas. ``timeout_s`` bounds every transfer (averaging, healing); ``quorum_timeout_s``
    how long a quorum may take to form. ``host`` is the address the other replicas reach this
    one at (its store, its manager, its healing server): ``127.0.0.1`` for replicas on one
    machine, the host's own address across machines.

    Example::

        manager = ReplicaManager("replica_0", "http://127.0.0.1:29510", min_replicas=2)
    """

    def __init__(
        self,
        replica_id: str,
        lighthouse: str,
        min_replicas: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        quorum_timeout_s: float = DEFAULT_TIMEOUT_S,
        host: str = "127.0.0.1",
    ) -> None:
        self.replica = replica_number(replica_id)
        if not isinstance(min_replicas, int) or isinstance(min_replicas, bool) or min_replicas < 1:
            raise UsageError(f"min_replicas={min_replicas!r} must be an integer >= 1")
        if not timeout_s > 0 or not quorum_timeout_s > 0:
            raise UsageError(
                f"timeout_s={timeout_s!r} and quorum_timeout_s={quorum_timeout_s!r} must be "
                "positive numbers of seconds"
            )
        timeout = timedelta(seconds=timeout_s)
        self.timeout_s = float(timeout_s)
        self.store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        self.pg = QuorumGloo(timeout=timeout)
        super().__init__(
            pg=self.pg,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=min_replicas,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=quorum_timeout_s),
            connect_timeout=timeout,
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=self.store.port,
            lighthouse_addr=lighthouse,
            replica_id=replica_id,
            hostname=host,
            checkpoint_transport=HealTransport(timeout, host=host),
        )
        self.min_replicas = min_replicas
