"""The seed experiment's synthetic corpus, written as JSONL for the CLI."""

from __future__ import annotations

import json
from typing import List, Set, Tuple

import numpy as np


def seed_corpus(n_base: int = 8000, vocab: int = 3000, length: int = 50,
                dup_rate: float = 0.3, edit_frac: float = 0.10,
                seed: int = 0) -> Tuple[List[str], Set[Tuple[int, int]]]:
  """Random documents with planted near-duplicates (a fraction of tokens
  replaced); returns the texts and the planted (original, copy) index pairs.
  """
  rng = np.random.default_rng(seed)
  docs, truth = [], set()
  for _ in range(n_base):
    tokens = rng.integers(vocab, size=length)
    docs.append(tokens)
    if rng.random() < dup_rate:
      copy = tokens.copy()
      edits = rng.choice(length, size=int(length * edit_frac), replace=False)
      copy[edits] = rng.integers(vocab, size=len(edits))
      docs.append(copy)
      truth.add((len(docs) - 2, len(docs) - 1))
  texts = [" ".join(f"w{t}" for t in d) for d in docs]
  return texts, truth


def write_jsonl(path, texts, ids=None) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"id": ids[i] if ids else f"doc-{i}", "text": text})
              + "\n")
