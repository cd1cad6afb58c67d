"""CIFAR-10 and CIFAR-100 from their python-pickle folders, as normalized float tensors.

Expected layouts (the folder itself or its parent may be given):

- CIFAR-10: ``cifar-10-batches-py/data_batch_1`` .. ``data_batch_5`` and ``test_batch``,
  each a pickled dict with ``b"data"`` (N x 3072 uint8) and ``b"labels"``.
- CIFAR-100: ``cifar-100-python/train`` and ``test`` with ``b"data"`` and ``b"fine_labels"``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

LAYOUTS = {
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        b"labels",
    ),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}
EXPECTED = (
    "expected cifar-10-batches-py/{data_batch_1..5,test_batch} or "
    "cifar-100-python/{train,test} (python-pickle CIFAR)"
)


def find_cifar(data_dir: str | Path, dataset: str | None = None) -> tuple[str, Path]:
    """Which CIFAR (``"cifar10"`` or ``"cifar100"``) lives in ``data_dir``, and its folder."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"CIFAR data_dir {str(root)!r} does not exist; {EXPECTED}")
    names = [dataset] if dataset else list(LAYOUTS)
    for name in names:
        if name not in LAYOUTS:
            raise ValueError(f"dataset={name!r} is not CIFAR; use cifar10 or cifar100")
        sub, train, test, _ = LAYOUTS[name]
        for folder in (root, root / sub):
            if all((folder / f).is_file() for f in train + test):
                return name, folder
    raise FileNotFoundError(f"no CIFAR files found in {str(root)!r}; {EXPECTED}")


def _read(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    if b"data" not in d or label_key not in d:
        raise ValueError(f"{path} lacks b'data' or {label_key!r}; {EXPECTED}")
    x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return x, np.asarray(d[label_key], dtype=np.int64)


def load_cifar(
    data_dir: str | Path, dataset: str | None = None
) -> tuple[TensorDataset, TensorDataset, int]:
    """(train, test, number of classes); images normalized by the training set's channel stats."""
    name, folder = find_cifar(data_dir, dataset)
    _, train_files, test_files, key = LAYOUTS[name]
    parts = [[_read(folder / f, key) for f in files] for files in (train_files, test_files)]
    (xtr, ytr), (xte, yte) = [tuple(np.concatenate(a) for a in zip(*p, strict=True)) for p in parts]
    xtr_t = torch.from_numpy(xtr).float().div_(255)
    mean = xtr_t.mean(dim=(0, 2, 3), keepdim=True)
    std = xtr_t.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    xte_t = (torch.from_numpy(xte).float().div_(255) - mean) / std
    xtr_t = (xtr_t - mean) / std
    classes = 10 if name == "cifar10" else 100
    return (
        TensorDataset(xtr_t, torch.from_numpy(ytr)),
        TensorDataset(xte_t, torch.from_numpy(yte)),
        classes,
    )
