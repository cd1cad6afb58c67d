"""A byte-level decoder-only transformer on CPython's own standard-library sources.

The text ships with every Python: the ``.py`` files of a few standard-library packages, read
from the running interpreter's library folder in sorted order. Whole files go to training or
to validation (every ``HOLD_OUT``-th file of the sorted list is held out), so no validation
window shares a file with training. Each file's bytes are cut into windows of ``context + 1``
bytes (input and next-byte target); the vocabulary is the 256 byte values.

Trained the way such models are (as GPT-2 and nanoGPT): AdamW (0.9, 0.95, weight decay 0.1),
linear warm-up then cosine decay (``lr_schedule="warmup-cosine"``), gradients clipped at 1.0
before each step. The metric is the validation loss (mean cross-entropy per byte, in nats).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dssync.lab.workloads.base import Batch, Workload

PACKAGES = ("json", "email", "textwrap.py", "html", "http")
HOLD_OUT = 8  # every 8th file (sorted) is validation
CLIP = 1.0


def stdlib_files(packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The ``.py`` files of ``packages`` in this interpreter's standard library, sorted."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for name in packages:
        path = lib / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(path.rglob("*.py"))
    if not files:
        raise FileNotFoundError(f"none of {packages} found in the standard library at {lib}")
    return sorted(files, key=lambda p: p.relative_to(lib).as_posix())


def split_files(files: list[Path], hold_out: int = HOLD_OUT) -> tuple[list[Path], list[Path]]:
    """(train, validation): every ``hold_out``-th file of the sorted list is validation."""
    val = [f for i, f in enumerate(files) if i % hold_out == hold_out - 1]
    train = [f for i, f in enumerate(files) if i % hold_out != hold_out - 1]
    return train, val


def windows(files: list[Path], context: int) -> TensorDataset:
    """Non-overlapping (input, target) byte windows of ``context`` bytes, file by file."""
    rows = []
    for f in files:
        raw = f.read_bytes()
        n = (len(raw) - 1) // context
        if n > 0:
            data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
            x = data[: n * context].view(n, context)
            y = data[1 : n * context + 1].view(n, context)
            rows.append(torch.stack([x, y], dim=1))
    both = torch.cat(rows)
    return TensorDataset(both[:, 0].contiguous(), both[:, 1].contiguous())


class ByteGPT(nn.Module):
    """A small GPT: byte and position embeddings, pre-norm causal blocks, a tied output layer."""

    def __init__(self, layers: int = 2, d_model: int = 64, heads: int = 4, context: int = 64):
        super().__init__()
        self.tok = nn.Embedding(256, d_model)
        self.pos = nn.Embedding(context, d_model)
        block = nn.TransformerEncoderLayer(
            d_model,
            heads,
            dim_feedforward=4 * d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        for emb in (self.tok, self.pos):  # GPT-2's scale: logits start near uniform (ln 256)
            nn.init.normal_(emb.weight, std=0.02)
        # True where a position may not look (the future); a bool buffer, so never averaged
        mask = torch.ones(context, context, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tok(ids) + self.pos.weight[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.norm(h) @ self.tok.weight.T


def clip_before_step(optimizer: torch.optim.Optimizer, max_norm: float = CLIP) -> None:
    """Clip the gradients of ``optimizer``'s parameters to ``max_norm`` before each step."""

    def clip(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    optimizer.register_step_pre_hook(clip)


class LM(Workload):
    """Next-byte prediction on CPython's json, email, textwrap, html and http sources.

    Options: ``layers`` (2), ``d_model`` (64), ``context`` (64).
    """

    name = "lm"
    metric_name = "loss"
    higher_is_better = False
    epochs = 4
    batch_size = 32
    lr = 3e-3
    lr_schedule = "warmup-cosine"
    # DDP on 4 workers, the default run's 320 steps (tools/lm_parity.py, seeds 0-2; results in
    # docs/results/lm/parity.json): validation loss at step 224 (70%) 2.102, 2.157, 2.149, at
    # the end 2.041, 2.102, 2.090. On 8 workers the default run is 160 steps and DDP ends at
    # 2.413, 2.507, 2.432 (seeds 0-2): it does not reach the target there; a race on 8 workers
    # needs a longer run (--epochs) or a target of its own.
    target = 2.16

    def _size(self) -> tuple[int, int, int]:
        o = self.options
        return int(o.get("layers", 2)), int(o.get("d_model", 64)), int(o.get("context", 64))

    def model(self) -> nn.Module:
        layers, d_model, context = self._size()
        return ByteGPT(layers, d_model, heads=4, context=context)

    def datasets(self):
        train, val = split_files(stdlib_files())
        context = self._size()[2]
        return windows(train, context), windows(val, context)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data) -> dict[str, float]:
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for x, y in DataLoader(data, batch_size=256):
            out = model(x).flatten(0, 1)
            total += nn.functional.cross_entropy(out, y.flatten(), reduction="sum").item()
            count += y.numel()
        model.train(was_training)
        return {"loss": total / max(count, 1)}

    def optimizer(self, params) -> torch.optim.Optimizer:
        opt = torch.optim.AdamW(params, lr=self.lr, betas=(0.9, 0.95), weight_decay=0.1)
        clip_before_step(opt)
        return opt
