"""Normalize → Shingle → MinHash as Beam transforms over (doc_id, value)
pairs. Each batches documents internally and calls the vectorised kernels."""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import SignatureBatch, TextBatch
from transforms.kernels import minhash as minhash_kernels
from transforms.kernels import compiled_signature as signature_kernels
from transforms.kernels import reference_text as text_kernels

_MIN_BATCH = 64
_MAX_BATCH = 4096


def normalize_options(config: DedupConfig) -> dict:
  return dict(nfkc=config.nfkc, lowercase=config.lowercase,
              strip_punctuation=config.strip_punctuation,
              fold_digits=config.fold_digits)


class _BatchFn(beam.DoFn):
  """Unzips a batch of ``(doc_id, value)`` pairs (or a
  :class:`~transforms.elements.TextBatch`) for a vectorised kernel."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def process(self, batch):
    if isinstance(batch, TextBatch):
      ids, values = batch.ids, batch.texts
    else:
      ids = [doc_id for doc_id, _ in batch]
      values = [value for _, value in batch]
    yield from self.compute(ids, values)

  def compute(self, ids, values):
    raise NotImplementedError


class _NormalizeFn(_BatchFn):

  def compute(self, ids, values):
    normalized = text_kernels.normalize_texts(
        values, **normalize_options(self._config)).to_pylist()
    yield from zip(ids, normalized)


class _ShingleFn(_BatchFn):
  """Normalised text → sorted unique uint64 shingle hashes."""

  def compute(self, ids, values):
    c = self._config
    units, unit_offsets = text_kernels.unit_hashes(
        text_kernels.normalize_texts(values, nfkc=False, lowercase=False,
                                     strip_punctuation=False),
        c.shingle_unit, c.seed)
    shingles, offsets = text_kernels.ngram_hashes(units, unit_offsets, c.ngram,
                                                  c.seed)
    yield from zip(ids, text_kernels.unique_per_document(shingles, offsets))


class _PermutationsFn(_BatchFn):
  """Builds the K permutations once per worker, from the config's seed."""

  def setup(self):
    self._a, self._b = minhash_kernels.permutations(self._config.num_perm,
                                                    self._config.seed)


class _MinHashFn(_PermutationsFn):
  """Shingle arrays → uint32 signatures (``config.sketch``); empty sets get
  no signature."""

  def compute(self, ids, values):
    sizes = np.fromiter((len(v) for v in values), dtype=np.int64,
                        count=len(values))
    keep = np.flatnonzero(sizes > 0)
    if len(keep) < len(values):
      yield metrics.count_tag("docs_empty", len(values) - len(keep))
    if not len(keep):
      return
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(sizes[keep], out=offsets[1:])
    flat = np.concatenate([values[i] for i in keep]).astype(np.uint64)
    if self._config.sketch == "oph":
      sigs = minhash_kernels.oph_batch(flat, offsets, self._config.num_perm,
                                       self._config.seed)
    else:
      sigs = minhash_kernels.minhash_batch(flat, offsets, self._a, self._b)
    for row, i in enumerate(keep):
      yield ids[i], sigs[row]


@beam.typehints.with_output_types(SignatureBatch)
class _SignatureFn(metrics.MeteredDoFn, _PermutationsFn):
  """Raw texts → one signature batch (the fused Normalize/Shingle/MinHash).

  Documents with no units are counted as ``docs_empty``, those with fewer
  than ``min_tokens`` units as ``docs_too_short``; neither gets a signature,
  so neither is ever clustered.
  """

  STAGE = "signatures"

  def compute(self, ids, values):
    c = self._config
    with self.meter.timed():
      sigs, unit_counts = signature_kernels.signature_batch(
          values, unit=c.shingle_unit, ngram=c.ngram, seed=c.seed, a=self._a,
          b=self._b, sketch=c.sketch, **normalize_options(c))
    self.meter.done(len(values))
    empty = unit_counts == 0
    short = ~empty & (unit_counts < c.min_tokens)
    signed = np.flatnonzero(~empty & ~short)
    if empty.any():
      yield metrics.count_tag("docs_empty", int(empty.sum()))
    if short.any():
      yield metrics.count_tag("docs_too_short", int(short.sum()))
    yield metrics.count_tag("docs_signed", len(signed))
    if len(signed):
      yield SignatureBatch(np.asarray(ids, dtype=np.int64)[signed],
                           sigs[signed])


class _Batched(beam.PTransform):
  """Batches ``(doc_id, value)`` pairs (unless they come ``batched``, as
  :class:`~transforms.elements.TextBatch`) and applies a ``_BatchFn``."""

  def __init__(self, fn: _BatchFn, with_counts: bool, batched: bool = False):
    super().__init__()
    self._fn = fn
    self._with_counts = with_counts
    self._batched = batched

  def expand(self, pcoll):
    batches = pcoll
    if not self._batched:
      batches = pcoll | "Batch" >> beam.BatchElements(
          min_batch_size=_MIN_BATCH, max_batch_size=_MAX_BATCH)
    applied = batches | "Apply" >> beam.ParDo(self._fn).with_outputs(
        metrics.COUNTS, main="main")
    if self._with_counts:
      return {"main": applied.main, metrics.COUNTS: applied[metrics.COUNTS]}
    return applied.main


class _Stage(beam.PTransform):
  """A per-document stage run as a vectorised kernel over batches."""

  _FN = None
  _LABEL = None

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, pcoll):
    return pcoll | self._LABEL >> _Batched(self._FN(self._config),
                                           with_counts=False)


class Normalize(_Stage):
  """``(doc_id, text)`` → ``(doc_id, normalised text)``: NFKC, lowercase,
  punctuation to space, optional digit folding, whitespace collapsed."""
  _FN = _NormalizeFn
  _LABEL = "NormalizeBatches"


class Shingle(_Stage):
  """``(doc_id, normalised text)`` → ``(doc_id, uint64 array)``: the sorted
  set of n-gram shingle hashes; a document with fewer than n units yields one
  shingle, an empty one yields an empty array."""
  _FN = _ShingleFn
  _LABEL = "ShingleBatches"


class MinHash(_Stage):
  """``(doc_id, uint64 shingle array)`` → ``(doc_id, uint32[K] signature)``;
  documents with an empty shingle set are counted (``docs_empty``) and
  dropped."""
  _FN = _MinHashFn
  _LABEL = "MinHashBatches"


class ComputeSignatures(beam.PTransform):
  """``(doc_id, raw text)`` → ``{"signatures", "counts"}``: Normalize, Shingle
  and MinHash fused per batch of up to 4096 documents.

  Args:
    config: the shingling, sketch and ``min_tokens`` parameters.
    batched: the input is :class:`~transforms.elements.TextBatch` elements
      (each signed as one batch) rather than pairs.

  Returns:
    ``{"signatures", "counts"}``: :class:`~transforms.elements.
    SignatureBatch` elements, and the ``docs_signed``, ``docs_empty`` and
    ``docs_too_short`` counts.
  """

  def __init__(self, config: DedupConfig, batched: bool = False):
    super().__init__()
    self._config = config
    self._batched = batched

  def expand(self, pcoll):
    out = pcoll | "SignatureBatches" >> _Batched(
        _SignatureFn(self._config), with_counts=True, batched=self._batched)
    return {"signatures": out["main"], "counts": (out[metrics.COUNTS],)}
