"""63-bit fingerprints of text: what ranks compare to agree on settings, layouts and schedules.

Example::

    >>> fingerprint("Shuffle(group_size=2, seed=0)") == fingerprint("Shuffle(group_size=2, seed=0)")
    True
"""

from __future__ import annotations

import hashlib


def fingerprint(text: str) -> int:
    """The first 8 bytes of sha256(text), shifted into a non-negative int64."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
