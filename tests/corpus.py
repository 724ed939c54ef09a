"""Test corpora (the seed experiment's, as JSONL) and readers of job outputs."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import lzma
import os
import re
from typing import List, Set, Tuple

import numpy as np

from transforms.report import MEASURED_FIELDS


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


def _make_sample():
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))), "bench", "make_sample.py")
  spec = importlib.util.spec_from_file_location("make_sample", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def real_text_documents(max_files: int = 0) -> List[Tuple[str, str, str,
                                                             str]]:
  """Real prose every Debian-like machine with Python packages has offline.

  The license and copyright texts of /usr/share/common-licenses, the
  site-packages licence files (bench/make_sample.py's sources) and
  /usr/share/doc/*/copyright, cut into 40-400-word documents with
  make_sample's chunker (files that short stay whole), plus make_sample's
  planted variants of 12% of them. Texts equal after normalisation are kept
  once (thousands of verbatim GPL paragraphs would otherwise swamp the
  figures); the boilerplate shared by many packages still makes natural
  near-duplicates at every similarity. ``max_files`` > 0 keeps the first
  that many copyright files. Returns ``(id, text, source, path)`` per
  document, deterministic for a given set of files; which files exist
  differs between machines, so tests use the committed
  :func:`licence_corpus` built from it.
  """
  from transforms.kernels.reference_text import normalize_texts
  ms = _make_sample()
  copyrights = sorted(p for p in glob.glob("/usr/share/doc/*/copyright")
                      if os.path.isfile(p) and not os.path.islink(p))
  if max_files:
    copyrights = copyrights[:max_files]
  sources = ms.source_files() + [(p[len("/usr/share/doc/"):], p)
                                 for p in copyrights]
  docs, paths = [], {}
  for source, path in sources:
    text = ms.read_text(path)
    if text is None:
      continue
    paths[source] = path
    if ms.MIN_WORDS <= len(text.split()) <= ms.MAX_WORDS:
      docs.append(ms.Doc(source, text.strip(), source))
    else:
      docs.extend(ms.Doc(f"{source}#{i:03d}", c, source)
                  for i, c in enumerate(ms.chunk(text)))
  variants = []
  for doc in docs:
    rng = ms.doc_rng(doc.id)
    if rng.random() < ms.VARIANT_RATE:
      variants.extend(ms.plant_variants(doc, rng))
  docs += variants
  seen, out = set(), []
  for doc, norm in zip(docs, normalize_texts([d.text for d in docs])
                       .to_pylist()):
    if norm not in seen:
      seen.add(norm)
      out.append((doc.id, doc.text, doc.source, paths[doc.source]))
  return out


def real_text_corpus(max_files: int = 0) -> Tuple[List[str], List[str]]:
  """``(ids, texts)`` of :func:`real_text_documents` on this machine."""
  docs = real_text_documents(max_files)
  return [d[0] for d in docs], [d[1] for d in docs]


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LICENCE_CORPUS = os.path.join(DATA, "licence_corpus.jsonl.xz")
LICENCE_MANIFEST = os.path.join(DATA, "licence_corpus_manifest.tsv")


def licence_corpus() -> Tuple[List[str], List[str]]:
  """``(ids, texts)`` of the committed real-text corpus (tests/data/README.md:
  :func:`real_text_documents` of one machine, frozen, with a manifest of
  every source file's package, path and licence)."""
  return committed_corpus("licence")


# The committed corpora (tests/data/README.md): licence and copyright texts
# of one machine, PyPI READMEs, npm READMEs.
COMMITTED_CORPORA = ("licence", "pypi", "npm")


def committed_corpus(name: str) -> Tuple[List[str], List[str]]:
  """``(ids, texts)`` of the committed corpus ``name`` (one of
  :data:`COMMITTED_CORPORA`)."""
  ids, texts = [], []
  with lzma.open(os.path.join(DATA, f"{name}_corpus.jsonl.xz"), "rt",
                 encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      ids.append(row["id"])
      texts.append(row["text"])
  return ids, texts


def read_manifest(name: str = "licence") -> List[dict]:
  """The manifest's rows (one per source file) as dicts."""
  with open(os.path.join(DATA, f"{name}_corpus_manifest.tsv"),
            encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f, delimiter="\t"))
  return [dict(zip(rows[0], r)) for r in rows[1:]]


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


_TIMING_SECTION = re.compile(rb'<section id="timings">.*?</section>\n',
                             re.S)


def comparable_report_html(page: bytes) -> bytes:
  """report.html without its timing section (the only measured part)."""
  stripped, found = _TIMING_SECTION.subn(b"", page)
  assert found == 1, "report.html has no timing section to leave out"
  return stripped


def tree_bytes(out) -> dict:
  """Every file under ``out`` as relative path -> bytes; ``report.json``
  without its timings and ``report.html`` without its timing section."""
  files = {}
  for path in sorted(glob.glob(os.path.join(out, "**", "*"), recursive=True)):
    name = os.path.relpath(path, out)
    if not os.path.isfile(path):
      continue
    with open(path, "rb") as f:
      files[name] = f.read()
    if name == "report.json":
      report = json.loads(files[name])
      for field in MEASURED_FIELDS:
        report.pop(field, None)
      files[name] = json.dumps(report, sort_keys=True).encode("utf-8")
    elif name == "report.html":
      files[name] = comparable_report_html(files[name])
  return files


def chain_corpus(n: int = 2000, window: int = 50, step: int = 1,
                 seed: int = 0) -> List[str]:
  """A chain: windows of ``window`` words sliding by ``step`` over one random
  word stream (consecutive word-3-gram Jaccard (w-2-s)/(w-2+s), 0.959 for 50
  and 1), so consecutive documents are near-duplicates while the two ends
  share nothing."""
  rng = np.random.default_rng(seed)
  stream = [f"w{t}" for t in rng.integers(1_000_000, size=window + n * step)]
  return [" ".join(stream[i * step:i * step + window]) for i in range(n)]
