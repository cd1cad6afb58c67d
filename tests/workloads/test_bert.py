"""BERT masked-language-model workload, its tokenizer, masking and text loaders."""

from __future__ import annotations

import json
import math

import pytest
import torch
from workload_helpers import first_batch, train_steps

from dssync.lab.workloads import get
from dssync.lab.workloads.text import (
    CLS,
    MASK,
    SEP,
    SPECIALS,
    UNK,
    WordTokenizer,
    chunk,
    mask_tokens,
)

TINY = {"max_docs": 4, "dim": 32, "layers": 1, "heads": 2, "seq_len": 32}


def test_tokenizer_is_deterministic_and_frequency_ranked():
    tok = WordTokenizer(["b a a c b a", "__init__ 42 !"], vocab_size=8)
    assert tok.itos[: len(SPECIALS)] == SPECIALS
    assert tok.itos[5:8] == ["a", "b", "!"]  # by count, ties alphabetically
    assert tok.encode("A zebra") == [5, UNK]
    assert WordTokenizer(["__init__ x"]).encode("__init__") == [5]


def test_chunk_wraps_rows_in_cls_and_sep():
    rows = chunk(list(range(10, 30)), seq_len=8)
    assert rows.shape == (3, 8)
    assert (rows[:, 0] == CLS).all() and (rows[:, -1] == SEP).all()


def test_masking_is_seeded_and_follows_80_10_10():
    ids = torch.randint(len(SPECIALS), 1000, (200, 64))
    ids[:, 0] = CLS
    a = mask_tokens(ids, 1000, generator=torch.Generator().manual_seed(1))
    b = mask_tokens(ids, 1000, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    inputs, labels = a
    picked = labels != -100
    assert not picked[:, 0].any()
    assert abs(picked.float().mean().item() - 0.15) < 0.01
    assert torch.equal(labels[picked], ids[picked])
    share_mask = (inputs[picked] == MASK).float().mean().item()
    share_kept = (inputs[picked] == ids[picked]).float().mean().item()
    assert abs(share_mask - 0.8) < 0.02 and abs(share_kept - 0.1) < 0.02
    assert torch.equal(inputs[~picked], ids[~picked])


def test_pydoc_default_learns_and_evaluates_on_a_fixed_masking():
    wl = get("bert", **TINY)
    train, test = wl.datasets()
    assert len(train) > 10 and len(test) >= 1
    assert len(get("bert").datasets()[0]) > 1000  # the full pydoc corpus
    losses = train_steps(wl, first_batch(wl, 16), steps=20)
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    torch.manual_seed(0)
    model = wl.model()
    r1, r2 = wl.evaluate(model, test), wl.evaluate(model, train)
    assert set(r1) >= {"mlm_loss", "loss", "mlm_accuracy"}
    assert r1 == wl.evaluate(model, test) and r2 == wl.evaluate(model, train)
    assert wl.higher_is_better is False


def test_text_and_squad_folder(tmp_path):
    squad = {
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {"context": "The aardvark digs burrows at night. " * 20, "qas": []},
                    {"context": "The aardvark digs burrows at night. " * 20, "qas": []},
                ],
            }
        ]
    }
    (tmp_path / "a.json").write_text(json.dumps(squad))
    (tmp_path / "b.txt").write_text("Zebras graze on the open plains all day long. " * 20)
    (tmp_path / "ignored.csv").write_text("x")
    wl = get("bert", data_dir=str(tmp_path), **TINY)
    train, test = wl.datasets()
    assert {"aardvark", "zebras"} <= set(wl.tokenizer.itos)
    n_tokens = 20 * 7 + 1 + 20 * 10 + 1  # the duplicate SQuAD context is read once
    assert len(train) + len(test) == n_tokens // 30
    assert math.isfinite(wl.loss(wl.model(), first_batch(wl, 4)).item())


def test_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="SQuAD"):
        get("bert", data_dir=str(tmp_path / "nowhere")).datasets()
    with pytest.raises(FileNotFoundError, match=r"\.txt"):
        get("bert", data_dir=str(tmp_path)).datasets()
    (tmp_path / "bad.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="SQuAD"):
        get("bert", data_dir=str(tmp_path)).datasets()
    (tmp_path / "bad.json").unlink()
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(ValueError, match="too few"):
        get("bert", data_dir=str(tmp_path)).datasets()
