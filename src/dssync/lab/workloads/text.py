"""English text that ships offline, a word-level tokenizer, and BERT-style token masking.

The default corpus is CPython's ``pydoc_data.topics`` (about 465 KB of help text). A
``data_dir`` may instead hold SQuAD-style ``*.json`` files (``{"data": [{"paragraphs":
[{"context": ...}]}]}``) and/or plain ``*.txt`` files; all are read in sorted file order.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))
WORD = re.compile(r"[a-z_][a-z0-9_]*|[0-9]+|[^\s\w]")
EXPECTED = "expected *.txt files or SQuAD-style *.json ({'data': [{'paragraphs': [{'context'}]}]})"


def pydoc_corpus() -> list[str]:
    """CPython's pydoc help topics, one document per topic, in sorted topic order."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def squad_contexts(path: str | Path) -> list[str]:
    """The distinct paragraph contexts of a SQuAD-style JSON file, in file order."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    try:
        contexts = [p["context"] for article in doc["data"] for p in article["paragraphs"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path} is not SQuAD-style JSON; {EXPECTED}") from e
    return list(dict.fromkeys(contexts))


def folder_corpus(data_dir: str | Path) -> list[str]:
    """Documents from the ``*.json`` (SQuAD) and ``*.txt`` files in ``data_dir``."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"text data_dir {str(root)!r} does not exist; {EXPECTED}")
    docs: list[str] = []
    for path in sorted(root.iterdir()):
        if path.suffix == ".json":
            docs += squad_contexts(path)
        elif path.suffix == ".txt":
            docs.append(path.read_text(encoding="utf-8", errors="replace"))
    if not docs:
        raise FileNotFoundError(f"no .txt or .json files in {str(root)!r}; {EXPECTED}")
    return docs


def words(text: str) -> list[str]:
    """Lowercase words (identifiers such as ``__init__`` stay whole), numbers, punctuation."""
    return WORD.findall(text.lower())


class WordTokenizer:
    """A word-level vocabulary: the special tokens, then the most frequent words of a corpus.

    Ties in frequency are broken alphabetically, so the same corpus always gives the same ids.

    Example::

        tok = WordTokenizer(["the cat sat on the mat"], vocab_size=8)
        tok.encode("the dog")   # [5, 1]: "the", then [UNK]
    """

    def __init__(self, docs: list[str], vocab_size: int = 5000) -> None:
        counts = Counter(w for d in docs for w in words(d))
        ranked = sorted(counts, key=lambda w: (-counts[w], w))
        self.itos = SPECIALS + ranked[: max(vocab_size - len(SPECIALS), 0)]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(w, UNK) for w in words(text)]


def chunk(ids: list[int], seq_len: int) -> torch.Tensor:
    """Cut a token stream into ``[CLS] ... [SEP]`` rows of ``seq_len``; the ragged tail is dropped."""
    body = seq_len - 2
    n = len(ids) // body
    rows = torch.tensor(ids[: n * body], dtype=torch.long).view(n, body)
    cls = torch.full((n, 1), CLS, dtype=torch.long)
    sep = torch.full((n, 1), SEP, dtype=torch.long)
    return torch.cat([cls, rows, sep], dim=1)


def mask_tokens(
    ids: torch.Tensor, vocab_size: int, prob: float = 0.15, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: pick ``prob`` of the non-special tokens; of those 80% become [MASK],
    10% a random word, 10% stay. Returns (inputs, labels) with labels -100 where not picked."""
    special = ids < len(SPECIALS)
    special &= ids != UNK
    # Drawn on the CPU (where the generator lives) and moved to the batch's device.
    picked = (torch.rand(ids.shape, generator=generator) < prob).to(ids.device) & ~special
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator).to(ids.device)
    randoms = torch.randint(len(SPECIALS), vocab_size, ids.shape, generator=generator).to(
        ids.device
    )
    inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, MASK), ids)
    inputs = torch.where(picked & (roll >= 0.8) & (roll < 0.9), randoms, inputs)
    return inputs, labels
