"""Verification of candidate edges before connected components: by signature
agreement (VerifyEdges) or by the exact Jaccard of the shingle sets
(VerifyExact). Only edges that pass join the duplicate graph."""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import text as text_kernels
from transforms.signatures import _normalize_options

_MIN_BATCH = 64
_MAX_BATCH = 4096
REMOVED_STAT = "verify_removed_edges"


class _Verify(beam.PTransform):
  """Joins each edge with both endpoints' values (two keyed joins: only the
  values move, never the documents) and keeps the edges ``compare_fn``
  accepts. Returns ``{"edges", "counts"}`` with ``verified_edges`` and
  ``verify_removed_edges``."""

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def endpoint_values(self, inputs):
    raise NotImplementedError

  def compare_fn(self):
    raise NotImplementedError

  def expand(self, inputs):
    edges = inputs["edges"]
    values = self.endpoint_values(inputs)
    by_dst = edges | "KeyByDst" >> beam.Map(lambda e: (e[1], e[0]))
    halves = ({"value": values, "edge": by_dst}
              | "JoinDstValue" >> beam.CoGroupByKey()
              | "AttachDstValue" >> beam.FlatMap(_attach_dst_value))
    compared = ({"value": values, "half": halves}
                | "JoinSrcValue" >> beam.CoGroupByKey()
                | "Compare" >> beam.ParDo(self.compare_fn()).with_outputs(
                    metrics.COUNTS, main="edges"))
    counts = ((compared[metrics.COUNTS], compared.edges
               | "CountVerified" >> metrics.CountAs("verified_edges"))
              | "FlattenCounts" >> beam.Flatten())
    return {"edges": compared.edges, "counts": counts}


def _attach_dst_value(element):
  dst, grouped = element
  value = next(iter(grouped["value"]), None)
  if value is None:
    return
  for src in grouped["edge"]:
    yield src, (dst, value)


@beam.typehints.with_output_types(Tuple[int, int])
class _CompareFn(beam.DoFn):
  """Emits ``(src, dst)`` for every pair ``similarity_permille`` accepts
  (returns a value rather than None) and counts the others."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._similarity = metrics.distribution("verified_similarity_permille")

  def similarity_permille(self, a, b):
    raise NotImplementedError

  def process(self, element):
    src, grouped = element
    value = next(iter(grouped["value"]), None)
    if value is None:
      return
    removed = 0
    for dst, other in grouped["half"]:
      permille = self.similarity_permille(value, other)
      if permille is None:
        removed += 1
      else:
        self._similarity.update(permille)
        yield src, dst
    if removed:
      yield metrics.count_tag(REMOVED_STAT, removed)


class VerifyEdges(_Verify):
  """``{"edges", "signatures"}`` → edges whose estimated Jaccard (fraction
  of equal signature entries) is >= the threshold, plus counts."""

  def endpoint_values(self, inputs):
    return inputs["signatures"]

  def compare_fn(self):
    return _SignatureCompareFn(self._config)


class _SignatureCompareFn(_CompareFn):

  def setup(self):
    super().setup()
    self._min_equal = lsh_kernels.min_equal_entries(self._config.threshold,
                                                    self._config.num_perm)

  def similarity_permille(self, a, b):
    equal = int(np.count_nonzero(a == b))
    return 1000 * equal // len(a) if equal >= self._min_equal else None


class VerifyExact(_Verify):
  """``{"edges", "docs"}`` → edges whose shingle sets have true Jaccard >=
  the threshold, plus counts. ``docs`` are ``(doc_id, raw text)``.

  Only the candidate documents (endpoints of an edge) are shingled again, with
  the same kernels and parameters as their signatures, and only their sets
  are shuffled; the sorted candidate ids reach every worker as a side input
  (8 bytes per candidate document).
  """

  def endpoint_values(self, inputs):
    ids = (inputs["edges"]
           | "EndpointIds" >> beam.FlatMap(lambda e: e)
           | "CollectCandidateIds" >> beam.CombineGlobally(_SortedIdsFn()))
    return (inputs["docs"]
            | "BatchDocs" >> beam.BatchElements(min_batch_size=_MIN_BATCH,
                                                max_batch_size=_MAX_BATCH)
            | "ShingleCandidates" >> beam.ParDo(
                _CandidateSetsFn(self._config), beam.pvalue.AsSingleton(ids)))

  def compare_fn(self):
    return _JaccardCompareFn(self._config)


class _SortedIdsFn(beam.CombineFn):
  """Doc ids → one sorted int64 array of the distinct ids."""

  def create_accumulator(self):
    return [], []

  def add_input(self, mutable_accumulator, element):
    mutable_accumulator[1].append(element)
    return mutable_accumulator

  def merge_accumulators(self, accumulators):
    return [np.unique(np.concatenate([_ids(a) for a in accumulators]))], []

  def compact(self, accumulator):
    return [_ids(accumulator)], []

  def extract_output(self, accumulator):
    return _ids(accumulator)


def _ids(accumulator):
  arrays, pending = accumulator
  return np.unique(np.concatenate(
      arrays + [np.asarray(pending, dtype=np.int64)]))


class _CandidateSetsFn(beam.DoFn):
  """A batch of ``(doc_id, text)`` → ``(doc_id, sorted unique uint64
  shingles)`` for the candidate documents only."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def process(self, batch, candidate_ids):
    if not len(candidate_ids):
      return
    ids = np.fromiter((doc_id for doc_id, _ in batch), dtype=np.int64,
                      count=len(batch))
    where = np.searchsorted(candidate_ids, ids).clip(0, len(candidate_ids) - 1)
    chosen = np.flatnonzero(candidate_ids[where] == ids)
    if not len(chosen):
      return
    c = self._config
    shingles, offsets, _ = text_kernels.shingle_batch(
        [batch[i][1] for i in chosen], unit=c.shingle_unit, ngram=c.ngram,
        seed=c.seed, **_normalize_options(c))
    sets = text_kernels.unique_per_document(shingles, offsets)
    for i, shingle_set in zip(chosen.tolist(), sets):
      yield int(ids[i]), shingle_set


class _JaccardCompareFn(_CompareFn):

  def similarity_permille(self, a, b):
    inter, union = jaccard_kernels.jaccard(a, b)
    if not jaccard_kernels.meets_threshold(inter, union,
                                           self._config.threshold):
      return None
    return 1000 * inter // union
