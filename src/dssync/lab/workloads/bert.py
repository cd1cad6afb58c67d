"""A small BERT-style encoder trained from scratch with masked-language modelling."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dssync.lab.workloads.base import Batch, Workload
from dssync.lab.workloads.text import (
    WordTokenizer,
    chunk,
    folder_corpus,
    mask_tokens,
    pydoc_corpus,
)


class BertMLM(nn.Module):
    """Token + position embeddings, a pre-norm transformer encoder, and a tied MLM head.

    ``forward(ids)`` returns vocabulary logits of shape (batch, seq_len, vocab);
    ``forward(ids, picked)`` only those at the positions where the bool mask ``picked`` is set,
    shape (picked.sum(), vocab), which is what MLM training needs and much cheaper.

    Example::

        net = BertMLM(vocab_size=100, seq_len=16, dim=32, layers=1, heads=2)
        ids = torch.zeros(2, 16, dtype=torch.long)
        net(ids).shape                                   # (2, 16, 100)
        net(ids, ids == 0).shape                         # (32, 100)
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int = 64,
        dim: int = 128,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(seq_len, dim)
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, layers, norm=nn.LayerNorm(dim), enable_nested_tensor=False
        )
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, ids: torch.Tensor, picked: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.encoder(self.drop(self.norm(self.tokens(ids) + self.positions(pos))))
        if picked is not None:
            hidden = hidden[picked]
        return self.head(hidden) @ self.tokens.weight.T + self.bias


def mlm_loss(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the masked positions, and the number of them predicted right."""
    picked = labels != -100
    logits = model(inputs, picked)
    target = labels[picked]
    loss = nn.functional.cross_entropy(logits, target, reduction="sum")
    if reduction == "mean":
        loss = loss / picked.sum().clamp_min(1)
    return loss, (logits.argmax(1) == target).sum()


class BERT(Workload):
    """Masked-language modelling on English text with a small BERT (AdamW).

    Options: ``seq_len`` (64), ``vocab_size`` (5000), ``dim`` (128), ``layers`` (2), ``heads``
    (4), ``mask_seed`` (0, for the fixed masking of the test set), ``max_docs`` (all). Data: the
    pydoc help text, or the ``*.txt``/SQuAD ``*.json`` files in ``data_dir``; 10% of the
    sequences are held out. Train batches are ``(ids,)`` and are masked afresh at every step
    from torch's global generator; test batches are a fixed ``(inputs, labels)`` masked copy.

    Example::

        wl = BERT(layers=1, dim=64)
        train, test = wl.datasets()
        model = wl.model()
        print(wl.evaluate(model, test))   # {'mlm_loss': ..., 'loss': ..., 'mlm_accuracy': ...}
    """

    name = "bert"
    metric_name = "mlm_loss"
    higher_is_better = False
    epochs = 4
    batch_size = 32
    lr = 1e-3

    def __init__(self, data_dir: str | None = None, **options) -> None:
        super().__init__(data_dir, **options)
        self.seq_len = int(options.get("seq_len", 64))
        self.vocab_size = int(options.get("vocab_size", 5000))
        self.mask_seed = int(options.get("mask_seed", 0))
        self._data: tuple[WordTokenizer, TensorDataset, TensorDataset] | None = None

    def _load(self):
        if self._data is None:
            docs = pydoc_corpus() if self.data_dir is None else folder_corpus(self.data_dir)
            if "max_docs" in self.options:
                docs = docs[: int(self.options["max_docs"])]
            tok = WordTokenizer(docs, self.vocab_size)
            ids = [i for d in docs for i in [*tok.encode(d), tok.stoi["[SEP]"]]]
            rows = chunk(ids, self.seq_len)
            if len(rows) < 2:
                raise ValueError(
                    f"corpus has {len(ids)} tokens, too few for two sequences "
                    f"of seq_len={self.seq_len}"
                )
            order = torch.from_numpy(np.random.default_rng(0).permutation(len(rows)))
            n_test = max(1, len(rows) // 10)
            test_rows, train_rows = rows[order[:n_test]], rows[order[n_test:]]
            gen = torch.Generator().manual_seed(self.mask_seed)
            test = TensorDataset(*mask_tokens(test_rows, len(tok), generator=gen))
            self._data = (tok, TensorDataset(train_rows), test)
        return self._data

    @property
    def tokenizer(self) -> WordTokenizer:
        return self._load()[0]

    def model(self) -> nn.Module:
        o = self.options
        return BertMLM(
            len(self.tokenizer),
            self.seq_len,
            dim=int(o.get("dim", 128)),
            layers=int(o.get("layers", 2)),
            heads=int(o.get("heads", 4)),
        )

    def datasets(self):
        _, train, test = self._load()
        return train, test

    def _masked(self, batch: Batch, generator: torch.Generator | None = None) -> Batch:
        if len(batch) == 2:
            return batch
        return mask_tokens(batch[0], len(self.tokenizer), generator=generator)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, labels = self._masked(batch)
        return mlm_loss(model, inputs, labels)[0]

    @torch.no_grad()
    def evaluate(self, model, data):
        was_training = model.training
        model.eval()
        gen = torch.Generator().manual_seed(self.mask_seed)
        loss_sum, correct, count = 0.0, 0, 0
        for batch in DataLoader(data, batch_size=256):
            inputs, labels = self._masked(batch, gen)
            loss, right = mlm_loss(model, inputs, labels, reduction="sum")
            loss_sum += loss.item()
            correct += int(right)
            count += int((labels != -100).sum())
        model.train(was_training)
        mean = loss_sum / max(count, 1)
        return {"mlm_loss": mean, "loss": mean, "mlm_accuracy": correct / max(count, 1)}

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=0.01)
