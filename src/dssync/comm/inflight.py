"""What a dssync process must let go of before the interpreter finalizes: no abort at exit.

The abort ("terminate called without an active exception", SIGABRT) came from gloo's worker
threads. A collective runs on a ``pt_gloo_runloop`` thread; the thread marks the work complete
(``work.wait()`` returns in Python) and only then drops its own references to the work, whose
tensors it frees. Since PyTorch keeps a tensor's Python object alive while C++ holds the tensor
(``c10/util/intrusive_ptr.h``, "PyObject preservation"), the C++ reference count going from 2 to 1
decrefs the Python object, which takes the GIL, whatever Python itself still holds. When that
happens after the main thread began finalizing (a script that ends right after
``average_all()``, on a busy machine where the gloo thread runs late), taking the GIL ends the
thread by unwinding it, through a ``noexcept`` destructor: ``std::terminate``. Holding the
tensors (or the works) longer in Python does not help: the gloo thread's drop still crosses
from 2 to 1.

So dssync waits, once, at exit (an ``atexit`` hook: the interpreter is still whole, and the
wait releases the GIL so the gloo threads can finish):

* :func:`lend` is called with the tensors of every collective dssync starts, just before; it
  records each tensor's C++ use count. At exit every lent tensor's count must be back to what it
  was (the work that held it is destroyed, so no gloo thread will touch it again). A tensor
  whose count is back is forgotten at the next :func:`lend`, so only the last collectives stay
  recorded.
* :func:`close_at_exit` registers an object whose ``close()`` stops a background thread of
  dssync's (a :class:`~dssync.comm.lane.Lane`'s worker): closed first, as it may start more.

Point-to-point operations (``isend``/``irecv``) are not run by the worker threads and need none
of this, nor do tensors something else keeps holding after the collective (DDP's gradient
buckets, held by its reducer: the gloo thread's drop is never the one from 2 to 1; lending them
would make every exit wait the full bound). The wait is bounded (:data:`DRAIN_S`); it usually
takes a millisecond or none.

Example::

    lend([signed, *buffers])                        # just before the all_reduce calls
    works = [dist.all_reduce(b, async_op=True) for b in buffers]
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Iterable

import torch

DRAIN_S = 2.0  # the longest the exit waits for gloo's threads to let go of dssync's tensors

_lent: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (tensor, use count before it was lent)
_closers: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()  # a lane's worker lends from its own thread


def lend(tensors: Iterable[torch.Tensor]) -> None:
    """Record ``tensors`` as about to be handed to a collective (call just before issuing it)."""
    with _lock:
        for key in [k for k, (t, base) in _lent.items() if t._use_count() <= base]:
            del _lent[key]  # let go of by every work that held it
        for t in tensors:
            if id(t) not in _lent:
                _lent[id(t)] = (t, t._use_count())


def close_at_exit(obj: object) -> None:
    """Call ``obj.close()`` at exit, before the drain (held weakly: a closed lane can go)."""
    _closers.add(obj)


def held() -> list[torch.Tensor]:
    """Lent tensors that some work (a gloo thread, or a pending wait) still holds."""
    with _lock:
        return [t for t, base in _lent.values() if t._use_count() > base]


def drain(timeout_s: float = DRAIN_S) -> bool:
    """Close what :func:`close_at_exit` registered, then wait (GIL released) until no work holds
    a lent tensor, at most ``timeout_s``; forget them. True when nothing was left held."""
    for obj in list(_closers):
        try:
            obj.close()
        except Exception:  # exiting anyway; a failed close must not stop the drain
            pass
    end = time.monotonic() + timeout_s
    while held() and time.monotonic() < end:
        time.sleep(0.001)
    clear = not held()
    with _lock:
        _lent.clear()
    return clear


atexit.register(drain)
