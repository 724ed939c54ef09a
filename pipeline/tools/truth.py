"""Exact ground truth for a corpus: every pair of documents whose shingle sets
have true Jaccard >= ``--threshold``.

``python -m pipeline.tools.truth --input 'data/*.jsonl' --output truth/`` takes the
job's own flags (input format, fields, shingling, normalisation, threshold,
seed, min_tokens), reads and shingles every document exactly as the job does
and finds the pairs with an inverted index over set prefixes (no sampling, no
MinHash). Fine for ~100k documents on one machine. Writes:

* ``pairs.tsv``: header ``id_a  id_b  jaccard``, one row per pair (a's
  position in the input before b's), jaccard with 6 decimals;
* ``clusters.tsv``: header ``id  cluster``, one row per document in a
  connected component of two or more of those pairs (cluster = the
  component's first document's key).

Documents are keyed by ``--key``: ``id`` (the ``--id_field`` value, the ``id``
column of the job's clusters/ rows; must be present and unique) or
``position`` (``<source>:<position>``, the ``source`` and ``position`` columns
of clusters/ rows). Empty documents and those under ``--min_tokens`` have no
set and are never paired, as in the job.
"""

from __future__ import annotations

import os
import sys
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

from pipeline.options import add_detection_arguments, add_io_arguments
from pipeline.tools import config_from_args, parse_args, run_tool, tool_parser
from transforms.config import ConfigError, DedupConfig
from transforms.read import (Document, expand_inputs, read_file,
                                  split_doc_id)
from transforms.kernels import connected as graph_kernels
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import reference_text as text_kernels

KEYS = ("id", "position")
PAIRS_FILE, CLUSTERS_FILE = "pairs.tsv", "clusters.tsv"
_BATCH = 4096


class Corpus(NamedTuple):
  """Documents in input order: their keys and texts."""
  keys: List[str]
  texts: List[str]


def read_corpus(patterns: Sequence[str], input_format: str = "auto",
                text_field: str = "text", id_field: str = "id",
                key: str = "id") -> Corpus:
  """Reads documents with the job's reader (rejected records are skipped:
  the job never clusters them) and keys them by ``key``."""
  files = expand_inputs(patterns, input_format)
  keys, texts = [], []
  for input_file in files:
    for record in read_file(input_file, text_field, id_field):
      if not isinstance(record, Document):
        continue
      if key == "id":
        if record.user_id is None:
          raise ValueError(
              f"{input_file.path} row {split_doc_id(record.doc_id)[1] + 1} has"
              f" no {id_field!r} field: use --key position.")
        keys.append(str(record.user_id))
      else:
        keys.append(f"{input_file.path}:{split_doc_id(record.doc_id)[1] + 1}")
      texts.append(record.text)
  if len(set(keys)) != len(keys):
    raise ValueError(f"document keys ({key}) are not unique: use --key "
                     "position, or give every document its own id.")
  return Corpus(keys, texts)


def shingle_sets(texts: Sequence[str], config: DedupConfig):
  """``(values, offsets)``: each document's distinct shingle hashes, from the
  same kernels and parameters as the job's signatures; documents under
  ``min_tokens`` units get an empty set."""
  sets = []
  for lo in range(0, len(texts), _BATCH):
    shingles, offsets, units = text_kernels.shingle_batch(
        texts[lo:lo + _BATCH], unit=config.shingle_unit, ngram=config.ngram,
        seed=config.seed, nfkc=config.nfkc, lowercase=config.lowercase,
        strip_punctuation=config.strip_punctuation,
        fold_digits=config.fold_digits)
    for doc_set, n_units in zip(
        text_kernels.unique_per_document(shingles, offsets), units):
      sets.append(doc_set if n_units >= config.min_tokens else doc_set[:0])
  offsets = np.zeros(len(sets) + 1, dtype=np.int64)
  np.cumsum([len(s) for s in sets], out=offsets[1:])
  values = (np.concatenate(sets) if sets else np.zeros(0, dtype=np.uint64))
  return values, offsets


def exact_pairs(texts: Sequence[str], config: DedupConfig):
  """``(a, b, jaccard)``: index pairs a < b with true Jaccard >=
  ``config.threshold`` and their similarity."""
  values, offsets = shingle_sets(texts, config)
  a, b, inter, union = jaccard_kernels.similar_pairs(values, offsets,
                                                     config.threshold)
  return a, b, inter / np.maximum(union, 1)


def write_truth(directory: str, keys: Sequence[str], a, b, similarity) -> None:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, PAIRS_FILE), "w", encoding="utf-8") as f:
    f.write("id_a\tid_b\tjaccard\n")
    for i, j, s in zip(a.tolist(), b.tolist(), similarity.tolist()):
      f.write(f"{keys[i]}\t{keys[j]}\t{s:.6f}\n")
  labels = graph_kernels.union_find_labels(zip(a.tolist(), b.tolist()))
  with open(os.path.join(directory, CLUSTERS_FILE), "w",
            encoding="utf-8") as f:
    f.write("id\tcluster\n")
    for node in sorted(labels):
      f.write(f"{keys[node]}\t{keys[labels[node]]}\n")


def main(argv: Optional[List[str]] = None) -> int:
  parser = tool_parser("truth", __doc__)
  add_io_arguments(parser)
  add_detection_arguments(parser)
  parser.add_argument("--key", choices=KEYS, default="id",
                      help="How pairs.tsv names documents: id (the id field)"
                      " or position (<source>:<position>).")
  args = parse_args(parser, argv)
  if isinstance(args, int):
    return args
  if not args.input or not args.output:
    print("error: --input and --output (a directory) are required.",
          file=sys.stderr)
    return 2
  try:
    config = config_from_args(args)
    corpus = read_corpus([p.strip() for p in args.input.split(",")
                          if p.strip()], args.input_format, args.text_field,
                         args.id_field, args.key)
  except (ConfigError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  a, b, similarity = exact_pairs(corpus.texts, config)
  write_truth(args.output, corpus.keys, a, b, similarity)
  print(f"{len(corpus.texts):,} documents: {len(a):,} pairs with Jaccard >= "
        f"{config.threshold} in {len(set(a.tolist()) | set(b.tolist())):,} "
        f"documents; wrote {os.path.join(args.output, PAIRS_FILE)} and "
        f"{CLUSTERS_FILE}")
  return 0


if __name__ == "__main__":
  run_tool(main)
