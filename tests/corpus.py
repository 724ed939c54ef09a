"""Test corpora (the seed experiment's, as JSONL) and readers of job outputs."""

from __future__ import annotations

import glob
import json
import os
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


def read_jsonl(pattern):
  """Rows of every JSONL file matching ``pattern``, files in path order."""
  rows = []
  for path in sorted(glob.glob(pattern)):
    with open(path, encoding="utf-8") as f:
      rows.extend(json.loads(line) for line in f)
  return rows


def stats_of(out) -> dict:
  with open(os.path.join(out, "stats.json"), encoding="utf-8") as f:
    return json.load(f)


# Measured times differ run to run; the rest of the report must not.
_TIMED_REPORT_FIELDS = ("worker_seconds", "wall_seconds")


def tree_bytes(out) -> dict:
  """Every file under ``out`` as relative path -> bytes; ``report.json``
  without its timings, ``report.html`` (its rendering, with them) left out."""
  files = {}
  for path in sorted(glob.glob(os.path.join(out, "**", "*"), recursive=True)):
    name = os.path.relpath(path, out)
    if not os.path.isfile(path) or name == "report.html":
      continue
    with open(path, "rb") as f:
      files[name] = f.read()
    if name == "report.json":
      report = json.loads(files[name])
      for field in _TIMED_REPORT_FIELDS:
        report.pop(field, None)
      files[name] = json.dumps(report, sort_keys=True).encode("utf-8")
  return files
