"""DeepFM workload, the bundled tabular stand-in and the Criteo TSV loader."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from workload_helpers import first_batch, train_steps

from dssync.lab.workloads import get
from dssync.lab.workloads.criteo import int_token, load_criteo, read_criteo
from dssync.lab.workloads.deepfm import DeepFM


def criteo_lines(n: int, seed: int = 0, labelled: bool = True) -> str:
    """Criteo-like lines; the label follows categorical column C1 so a model can learn it."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        y = int(rng.integers(0, 2))
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-1, 500))) for _ in range(13)]
        cats = [f"{rng.integers(0, 5 if j else 2):08x}" for j in range(26)]
        cats[0] = "aaaaaaaa" if y else "bbbbbbbb"
        cats[5] = ""  # a missing categorical value
        lines.append("\t".join(([str(y)] if labelled else []) + ints + cats))
    return "\n".join(lines) + "\n"


def test_breast_cancer_default_learns_and_reports_auc():
    wl = get("deepfm")
    train, test = wl.datasets()
    assert (len(train), len(test)) == (456, 113)
    x, y = train.tensors
    assert x.shape[1] == 30 and x.dtype == torch.long and y.dtype == torch.float32
    model = wl.model()
    assert int(x.max()) < model.embed.num_embeddings
    losses = train_steps(wl, first_batch(wl, 64), steps=20)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.9 * losses[0]
    result = wl.evaluate(model, test)
    assert set(result) >= {"auc", "logloss", "loss"} and 0 <= result["auc"] <= 1


def test_int_token_log_squares():
    assert [int_token(v) for v in ["", "-1", "2", "3", "100"]] == ["", "-1", "2", "1", "21"]


def test_criteo_split_and_min_count(tmp_path):
    (tmp_path / "train.txt").write_text(criteo_lines(200))
    train, test, sizes = load_criteo(tmp_path, min_count=1, test_fraction=0.25)
    assert (len(train), len(test)) == (150, 50) and len(sizes) == 39
    x = train.tensors[0]
    assert x.shape == (150, 39) and int(x.max()) < sum(sizes)
    assert sizes[13] == 3 and sizes[13 + 5] == 1  # C1: missing slot + 2 values; C6 all empty
    _, _, coarse = load_criteo(tmp_path, min_count=1000)
    assert coarse == [1] * 39
    _, _, few = load_criteo(tmp_path, min_count=1, max_rows=10, test_fraction=0.2)
    assert max(few) <= 9


def test_criteo_workload_learns_with_a_test_file(tmp_path):
    (tmp_path / "train.txt").write_text(criteo_lines(300))
    (tmp_path / "test.txt").write_text(criteo_lines(60, seed=1))
    wl = get("deepfm", data_dir=str(tmp_path), min_count=2, dim=4, hidden="16")
    train, test = wl.datasets()
    assert (len(train), len(test)) == (300, 60)
    torch.manual_seed(0)
    model = wl.model()
    opt = wl.optimizer(model.parameters())
    for _ in range(10):
        for batch in wl.loader(train, batch_size=32, shuffle=True):
            opt.zero_grad()
            wl.loss(model, batch).backward()
            opt.step()
    assert wl.evaluate(model, train)["auc"] > 0.99
    assert wl.evaluate(model, test)["auc"] > 0.85  # 0.52 untrained; noise fields slow it down


def test_criteo_unlabelled_test_file_falls_back_to_a_split(tmp_path):
    (tmp_path / "train.txt").write_text(criteo_lines(100))
    (tmp_path / "test.txt").write_text(criteo_lines(10, labelled=False))
    assert read_criteo(tmp_path / "test.txt")[0] is None
    with pytest.warns(UserWarning, match="no labels"):
        train, test, _ = load_criteo(tmp_path, min_count=1)
    assert (len(train), len(test)) == (90, 10)


def test_criteo_errors_name_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.txt"):
        get("deepfm", data_dir=str(tmp_path / "nowhere")).datasets()
    (tmp_path / "train.txt").write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match="13 integer"):
        get("deepfm", data_dir=str(tmp_path)).datasets()
    (tmp_path / "train.txt").write_text(criteo_lines(5, labelled=False))
    with pytest.raises(ValueError, match="no label"):
        load_criteo(tmp_path)


def test_evaluate_gives_nan_auc_for_one_class():
    wl = get("deepfm", dim=2, hidden="4")
    x = torch.zeros(4, 30, dtype=torch.long)
    data = torch.utils.data.TensorDataset(x, torch.ones(4))
    assert math.isnan(wl.evaluate(wl.model(), data)["auc"])


def test_deepfm_fm_term_matches_explicit_pairs():
    torch.manual_seed(0)
    net = DeepFM(vocab=20, fields=3, dim=4, hidden=())
    ids = torch.tensor([[1, 7, 12]])
    e = net.embed(ids)[0]
    pairs = sum(e[i] @ e[j] for i in range(3) for j in range(i + 1, 3))
    expect = net.bias + net.first(ids).sum() + pairs + net.mlp(e.flatten()[None])[0, 0]
    assert torch.allclose(net(ids), expect, atol=1e-6)
