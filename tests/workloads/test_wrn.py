"""WideResNet workload and its CIFAR pickle loader."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from workload_helpers import first_batch, train_steps

from dssync.lab.workloads import get
from dssync.lab.workloads.wrn import WideResNet, blocks_per_group, random_crop_flip


def write_cifar(root, hundred: bool = False, per_file: int = 6):
    rng = np.random.default_rng(0)
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True)
    names = (
        ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    )
    key = b"fine_labels" if hundred else b"labels"
    for name in names:
        d = {
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            key: rng.integers(0, 100 if hundred else 10, per_file).tolist(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(d, f)
    return folder


def test_mnist_default_learns_and_evaluates():
    wl = get("wrn", depth=10, width=1)
    train, test = wl.datasets()
    assert (len(train), len(test)) == (4000, 1000)
    assert train[0][0].shape == (1, 28, 28)
    losses = train_steps(wl, first_batch(wl, 32))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.75 * losses[0]
    torch.manual_seed(0)
    result = wl.evaluate(wl.model(), torch.utils.data.Subset(test, range(64)))
    assert set(result) >= {"accuracy", "loss"} and 0 <= result["accuracy"] <= 1


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_folder_autodetected(tmp_path, hundred):
    write_cifar(tmp_path, hundred)
    wl = get("wrn", data_dir=str(tmp_path), depth=10, width=1)
    train, test = wl.datasets()
    n_train = 6 if hundred else 30
    assert (len(train), len(test)) == (n_train, 6)
    x = train.tensors[0]
    assert x.shape == (n_train, 3, 32, 32) and x.dtype == torch.float32
    assert abs(x.mean().item()) < 1e-4
    assert wl.model().fc.out_features == (100 if hundred else 10)
    assert wl.augment
    losses = train_steps(wl, first_batch(wl, 6), steps=2)
    assert all(math.isfinite(v) for v in losses)


def test_cifar_folder_given_directly(tmp_path):
    folder = write_cifar(tmp_path)
    train, _ = get("wrn", data_dir=str(folder), dataset="cifar10").datasets()
    assert len(train) == 30


def test_cifar_errors_name_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        get("wrn", data_dir=str(tmp_path / "nowhere")).datasets()
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        get("wrn", data_dir=str(tmp_path)).datasets()
    write_cifar(tmp_path)
    with pytest.raises(ValueError, match="cifar10 or cifar100"):
        get("wrn", data_dir=str(tmp_path), dataset="svhn").datasets()
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8)}, f)
    with pytest.raises(ValueError, match="labels"):
        get("wrn", data_dir=str(tmp_path)).datasets()


def test_depth_counts_6n_plus_4_or_6n_plus_2():
    assert [blocks_per_group(d) for d in (10, 8, 28, 26)] == [1, 1, 4, 4]
    for bad in (12, 4, 2):
        with pytest.raises(ValueError, match="6n\\+4 or 6n\\+2"):
            WideResNet(depth=bad)
    assert WideResNet(depth=16, width=1)(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_random_crop_flip_keeps_shape_and_content():
    x = torch.randn(5, 3, 8, 8)
    assert torch.equal(random_crop_flip(x, pad=0, flip=False), x)
    torch.manual_seed(0)
    out = random_crop_flip(x, pad=2)
    assert out.shape == x.shape
