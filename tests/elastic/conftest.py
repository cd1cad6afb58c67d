"""Elastic tests need torchft (``pip install 'dssync[elastic]'``); without it they are skipped."""

import pytest

pytest.importorskip(
    "torchft", reason="torchft is not installed: pip install 'dssync[elastic]' (torchft==0.2.0)"
)


@pytest.fixture
def cluster(tmp_path):
    from local_replicas import Cluster

    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
