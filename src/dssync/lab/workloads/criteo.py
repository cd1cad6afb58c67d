"""Categorical tabular data for CTR models: Criteo's TSV format and a bundled stand-in.

Every example becomes a row of field indices into one shared table: field ``f``'s values use
ids ``offsets[f] .. offsets[f] + sizes[f] - 1``, and each field's id 0 means missing or rare.

Criteo layout: ``data_dir/train.txt`` (and optionally ``test.txt``), tab-separated, one example
per line: a 0/1 label, 13 integer features, 26 hexadecimal categorical features; missing values
are empty. Integers ``v > 2`` become ``floor(log(v)^2)`` before indexing, as in the Kaggle
winners' preprocessing; every field is then indexed by frequency with a ``min_count``.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

N_INT, N_CAT = 13, 26
EXPECTED = (
    "expected data_dir/train.txt (and optional test.txt) in Criteo's tab-separated "
    "format: label, 13 integer and 26 categorical columns"
)


def read_criteo(
    path: str | Path, max_rows: int | None = None
) -> tuple[np.ndarray | None, list[list[str]]]:
    """Labels (None for an unlabelled file) and the 39 raw feature strings of each line."""
    labels: list[float] = []
    rows: list[list[str]] = []
    width = None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if max_rows is not None and n >= max_rows:
                break
            cols = line.rstrip("\r\n").split("\t")
            width = width or len(cols)
            if len(cols) != width or width not in (N_INT + N_CAT, 1 + N_INT + N_CAT):
                raise ValueError(f"{path}:{n + 1} has {len(cols)} columns; {EXPECTED}")
            if width == 1 + N_INT + N_CAT:
                labels.append(float(cols[0]))
                cols = cols[1:]
            rows.append([int_token(c) for c in cols[:N_INT]] + cols[N_INT:])
    if not rows:
        raise ValueError(f"{path} is empty; {EXPECTED}")
    return (np.asarray(labels, dtype=np.float32) if labels else None), rows


def int_token(value: str) -> str:
    """Criteo's integer features as categories: ``floor(log(v)^2)`` for v > 2, else v."""
    if value == "":
        return ""
    v = int(value)
    return str(int(math.log(v) ** 2)) if v > 2 else str(v)


def index_fields(
    train: list[list[str]], others: list[list[list[str]]], min_count: int
) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """Index each column by frequency in ``train``; values seen fewer than ``min_count`` times
    (and empty ones) map to the field's id 0. Returns global ids and each field's size."""
    fields = len(train[0])
    vocabs, sizes = [], []
    for f in range(fields):
        counts = Counter(row[f] for row in train)
        kept = sorted(
            (v for v, c in counts.items() if c >= min_count and v != ""),
            key=lambda v: (-counts[v], v),
        )
        vocabs.append({v: i + 1 for i, v in enumerate(kept)})
        sizes.append(len(kept) + 1)
    offsets = np.cumsum([0] + sizes[:-1])

    def encode(rows: list[list[str]]) -> np.ndarray:
        ids = np.array(
            [[vocabs[f].get(r[f], 0) for f in range(fields)] for r in rows], dtype=np.int64
        ).reshape(len(rows), fields)
        return ids + offsets

    return encode(train), [encode(rows) for rows in others], sizes


def _split(n: int, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(n * test_fraction))
    return order[n_test:], order[:n_test]


def _pair(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)))


def load_criteo(
    data_dir: str | Path,
    min_count: int = 10,
    max_rows: int | None = None,
    test_fraction: float = 0.1,
) -> tuple[TensorDataset, TensorDataset, list[int]]:
    """(train, test, field sizes) from a Criteo folder; without a labelled test.txt, a seeded
    ``test_fraction`` of train.txt is held out."""
    root = Path(data_dir)
    if not (root / "train.txt").is_file():
        raise FileNotFoundError(f"no train.txt in {str(root)!r}; {EXPECTED}")
    y, rows = read_criteo(root / "train.txt", max_rows)
    if y is None:
        raise ValueError(f"{root / 'train.txt'} has no label column; {EXPECTED}")
    y_test, rows_test = None, None
    if (root / "test.txt").is_file():
        y_test, rows_test = read_criteo(root / "test.txt", max_rows)
        if y_test is None:
            warnings.warn(
                "test.txt has no labels (Kaggle's does not); holding out part of train.txt instead",
                stacklevel=2,
            )
    if y_test is None:
        tr, te = _split(len(rows), test_fraction)
        rows_test, y_test = [rows[i] for i in te], y[te]
        rows, y = [rows[i] for i in tr], y[tr]
    x, (x_test,), sizes = index_fields(rows, [rows_test], min_count)
    return _pair(x, y), _pair(x_test, y_test), sizes


def breast_cancer_fields(
    bins: int = 10, test_fraction: float = 0.2
) -> tuple[TensorDataset, TensorDataset, list[int]]:
    """scikit-learn's bundled breast cancer set (569 rows, 30 numeric features), each feature
    cut into ``bins`` quantile bins of the training split so it acts as a categorical field."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = data.data, data.target
    tr, te = _split(len(x), test_fraction)
    qs = np.linspace(0, 1, bins + 1)[1:-1]
    cols_tr, cols_te, sizes = [], [], []
    for f in range(x.shape[1]):
        edges = np.unique(np.quantile(x[tr, f], qs))
        cols_tr.append(np.searchsorted(edges, x[tr, f], side="right"))
        cols_te.append(np.searchsorted(edges, x[te, f], side="right"))
        sizes.append(len(edges) + 1)
    offsets = np.cumsum([0] + sizes[:-1])
    x_tr = np.stack(cols_tr, 1).astype(np.int64) + offsets
    x_te = np.stack(cols_te, 1).astype(np.int64) + offsets
    return _pair(x_tr, y[tr]), _pair(x_te, y[te]), sizes
