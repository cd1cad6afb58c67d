"""dssync's own exceptions: bad input, ranks out of step, lost peers.

* :class:`UsageError` is the user's input (a flag, a file, an argument): the CLI prints its one
  line and exits 2. It subclasses ``ValueError`` so ``except ValueError`` keeps working.
* :class:`SyncError` is a run that cannot go on safely: ranks that disagree on the step or the
  bucket layout, or a collective that timed out. It names the step, the group and the ranks.
  :class:`PeerLost` is the case where a peer never came (timed out or its connection closed).
* Any other exception is a bug in dssync: the CLI shows its traceback and exits 1.
"""

from __future__ import annotations


class DSSyncError(Exception):
    """Base class of every error dssync raises on purpose."""


class UsageError(DSSyncError, ValueError):
    """Bad input: the message names the problem and the fix."""


class SyncError(DSSyncError, RuntimeError):
    """Ranks fell out of step; continuing would mix different steps or layouts.

    ``step`` is this rank's step, ``group`` the ranks that were averaging, ``ranks`` the ranks at
    fault where they are known (empty otherwise).
    """

    def __init__(
        self,
        message: str,
        step: int | None = None,
        group: list[int] | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.group = list(group or [])
        self.ranks = list(ranks or [])


class PeerLost(SyncError):
    """A peer never answered within the timeout, or its connection closed."""
