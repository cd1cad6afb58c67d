"""A heal source keeps serving its state until the replica it heals has fetched it.

torchft's own transport stops serving at the source's commit: a fetch that comes later waits
on the closed checkpoint until its timeout, and the run stalls that long (seen at 20 s in
``test_chaos.py`` on a loaded machine).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
from torchft.checkpointing.http_transport import HTTPTransport

from dssync.elastic.heal import HealTransport

pytestmark = pytest.mark.timeout(60)
STATE = {"w": torch.arange(4.0)}


def _late_fetch(transport, delay_s: float, got: list, timeout_s: float) -> threading.Thread:
    """A healing replica that asks for step 3's state ``delay_s`` after it was offered."""

    def fetch() -> None:
        time.sleep(delay_s)
        start = time.monotonic()
        try:
            state = transport.recv_checkpoint(
                0, transport.metadata(), 3, timedelta(seconds=timeout_s)
            )
            got.append(("ok", state, time.monotonic() - start))
        except Exception as e:  # noqa: BLE001 - the test reports how it failed
            got.append(("failed", e, time.monotonic() - start))

    t = threading.Thread(target=fetch, daemon=True)
    t.start()
    return t


def test_the_source_stops_serving_only_after_the_healed_replica_fetched():
    transport = HealTransport(timedelta(seconds=10))
    try:
        got: list = []
        transport.send_checkpoint([1], 3, STATE, timedelta(seconds=10))
        fetcher = _late_fetch(transport, 0.5, got, 10)
        start = time.monotonic()
        transport.disallow_checkpoint()  # the source's commit, right after its step
        waited = time.monotonic() - start
        fetcher.join(15)
        assert got and got[0][0] == "ok", got
        assert torch.equal(got[0][1]["w"], STATE["w"])
        assert got[0][2] < 5, f"the fetch took {got[0][2]:.1f} s"
        assert 0.3 < waited < 9, f"the source waited {waited:.2f} s"
        assert transport.late == []
    finally:
        transport.shutdown()


def test_a_replica_that_never_fetches_holds_the_source_only_wait_s():
    transport = HealTransport(timedelta(seconds=10), wait_s=0.5)
    try:
        transport.send_checkpoint([1, 2], 3, STATE, timedelta(seconds=10))
        start = time.monotonic()
        transport.disallow_checkpoint()
        assert 0.4 < time.monotonic() - start < 5
        assert transport.late == [(3, 2, 0)]
        # with nothing to heal, the commit does not wait
        transport.send_checkpoint([], 4, STATE, timedelta(seconds=10))
        start = time.monotonic()
        transport.disallow_checkpoint()
        assert time.monotonic() - start < 0.2
    finally:
        transport.shutdown()


def test_torchfts_own_transport_fails_a_fetch_that_comes_after_the_commit():
    """The stall this module removes, with torchft's transport as it is (2 s timeout)."""
    transport = HTTPTransport(timeout=timedelta(seconds=2), num_chunks=0)
    try:
        got: list = []
        transport.send_checkpoint([1], 3, STATE, timedelta(seconds=2))
        fetcher = _late_fetch(transport, 0.5, got, 2)
        transport.disallow_checkpoint()
        fetcher.join(15)
        assert got and got[0][0] == "failed", got
        assert got[0][2] > 1.5, f"it failed after {got[0][2]:.1f} s, not at the timeout"
    finally:
        transport.shutdown()


def test_the_source_advertises_the_host_it_is_given_and_serves_there():
    """On an emulated host (a network namespace) the machine's host name resolves to nothing:
    the replica's own address goes to the others instead, and a fetch from it works."""
    transport = HealTransport(timedelta(seconds=10), host="127.0.0.1")
    try:
        assert transport.metadata().startswith("http://127.0.0.1:")
        got: list = []
        transport.send_checkpoint([1], 3, STATE, timedelta(seconds=10))
        fetcher = _late_fetch(transport, 0.0, got, 10)
        fetcher.join(15)
        transport.disallow_checkpoint()
        assert got and got[0][0] == "ok", got
        assert torch.equal(got[0][1]["w"], STATE["w"])
    finally:
        transport.shutdown()
