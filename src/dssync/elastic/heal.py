"""Healing that waits for the healed: torchft's HTTP checkpoint transport, held open until fetched.

torchft heals a replica that is behind (a newcomer, or one whose commit failed) from a live one:
the source serves its state over HTTP from the quorum until its own ``should_commit``, where
torchft's ``disallow_checkpoint`` stops serving. A replica that fetches later blocks on the
closed checkpoint until the transport's timeout, and every replica waits for it at the next
quorum: measured here under load, a 20 s stall (``timeout_s=20``) at the first step, the
newcomers' fetch having come 50 ms too late (``tests/elastic/test_chaos.py``, 2 failures in
4 runs on a loaded machine). :class:`HealTransport` is the same transport, except that a source
stops serving only after each replica it was told to heal has started its fetch, or after
``wait_s``: a fetch that started holds the serving open by itself (a read lock).

Example::

    transport = HealTransport(timedelta(seconds=60))
    Manager(..., checkpoint_transport=transport)   # ReplicaManager passes one
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from torchft.checkpointing.http_transport import HTTPTransport

log = logging.getLogger(__name__)


class HealTransport(HTTPTransport):
    """torchft's HTTP transport whose ``disallow_checkpoint`` first waits, at most ``wait_s``
    (default: ``timeout``), until as many fetches started as the last ``send_checkpoint`` had
    replicas to heal. :attr:`late` records each wait that ran out: ``(step, owed, fetched)``.
    ``host`` is the address the others fetch from (torchft's: this machine's host name, which
    an emulated host's namespace does not resolve)."""

    def __init__(
        self, timeout: timedelta, wait_s: float | None = None, host: str | None = None
    ) -> None:
        self.host = host
        self._served = threading.Condition()
        self._owed = 0  # fetches the last send_checkpoint is owed
        self._fetches = 0  # fetches started since then
        self._step = -1
        self.wait_s = timeout.total_seconds() if wait_s is None else float(wait_s)
        self.late: list[tuple[int, int, int]] = []
        super().__init__(timeout=timeout, num_chunks=0)
        lock = self._checkpoint_lock
        acquire = lock.r_acquire

        def counted() -> None:  # every GET reads under this lock once serving is allowed
            acquire()
            with self._served:
                self._fetches += 1
                self._served.notify_all()

        lock.r_acquire = counted

    def address(self) -> str:
        if self.host is None:
            return super().address()
        port = self._server.socket.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"http://{host}:{port}/checkpoint/"

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        with self._served:
            self._owed, self._fetches = len(dst_ranks), 0
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)

    def disallow_checkpoint(self) -> None:
        with self._served:
            owed = self._owed
            if owed:
                start = time.monotonic()
                came = self._served.wait_for(lambda: self._fetches >= owed, self.wait_s)
                if not came:
                    self.late.append((self._step, owed, self._fetches))
                    log.warning(
                        "healing at step %d: %d of %d replicas fetched the state within %.1f s; "
                        "serving it stops (they retry at the next quorum)",
                        self._step,
                        self._fetches,
                        owed,
                        time.monotonic() - start,
                    )
                self._owed = 0
        super().disallow_checkpoint()
