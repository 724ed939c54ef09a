"""Verification of candidate edges before connected components: by signature
agreement (:class:`VerifyEdges`) or by the exact Jaccard of the shingle sets
(:class:`VerifyExact`). Only edges that pass join the duplicate graph.

Both work on edge batches (see :mod:`transforms.collide`) and never collect
ids in one place: each candidate edge's shard asks the shards (or input
files) that own its endpoints for their values, and compares them when they
arrive. ``--verify none`` is :class:`ReduceUnverified`.

* out: ``(edge shard, VerifiedEdges)``
  (:class:`~transforms.elements.VerifiedEdges`), a spanning forest of the
  pairs that passed (similarity NaN if unknown)

Every join here is a :class:`~transforms.join.JoinByKey` of a shard's
``values`` (``(ids, values)``) with what asks for them.
"""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple, Optional, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import (EdgeBatch, Served, TextRequest,
                                 VerifiedEdges, Wanted)
from transforms.join import JoinByKey
from transforms.read import make_doc_id, read_texts, split_doc_id
from transforms.kernels import bucket_components as bucket_kernels
from transforms.kernels import connected as graph_kernels
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import compiled_signature as signature_kernels
from transforms.sign import normalize_options

REMOVED_STAT = "verify_removed_edges"
MAX_TEXT_BATCH = 4096


class VerifyEdges(beam.PTransform):
  """``{"edges", "signatures", "buckets"}`` (edge and signature batches,
  optionally large buckets' members) → verified edge batches ``(shard,
  (src, dst, similarity))``: a spanning forest of the edges whose estimated
  Jaccard (fraction of equal signature entries) is >= the threshold, the
  most similar edges first (see :func:`forest_batch`), and of each large
  bucket's pairs that are (see :func:`bucket_edges`). Every signature is
  shuffled once, to its document's shard, which forwards just the ones
  candidate edges and buckets need.

  Args:
    config: ``threshold`` and ``lsh_shards``.
    first_new_id: against an index, the lowest new id (two indexed
      documents of a bucket are never paired), or None.

  Returns:
    ``{"edges": (edge shard, VerifiedEdges), "counts"}``
    (``verified_edges``, ``verify_removed_edges``, ``graph_edges``).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    super().__init__()
    self._config = config
    self._first_new_id = first_new_id

  def expand(self, inputs):
    n = self._config.lsh_shards
    routed = inputs["signatures"] | "RouteSignatures" >> beam.ParDo(
        _RouteFn(n, "verify_signatures")).with_outputs(
            metrics.COUNTS, main="values")
    requests = with_member_requests(inputs)
    served = ({"values": routed.values, "edges": requests}
              | "ServeSignatures" >> _Serve(n))
    compared = ({"values": served["values"], **_edges_and_buckets(inputs)}
                | "CompareSignatures" >> _Compare(_SignatureCompareFn(
                    self._config, self._first_new_id)))
    return {"edges": compared["edges"],
            "counts": (routed[metrics.COUNTS], *served["counts"],
                       *compared["counts"])}


class VerifyExact(beam.PTransform):
  """``{"edges", "docs", "buckets"}`` → verified edge batches ``(shard,
  (src, dst, similarity))``: a spanning forest of the edges, and of each
  large bucket's pairs (see :func:`bucket_edges`), whose shingle sets have
  true Jaccard >= the threshold (that Jaccard is the similarity). ``docs``
  are ``(doc_id, raw text)``; only the texts of candidate documents reach
  the comparison, where they are shingled with the same kernels and
  parameters as their signatures.

  By default the texts are routed to their documents' shards (one shuffle of
  the corpus text). ``texts`` can replace that with a cheaper source: a
  PTransform from endpoint requests to served texts, such as
  :class:`ServeTextsFromFiles`, which reads the candidates back from the
  input files.

  Args:
    config: the shingling parameters, ``threshold`` and ``lsh_shards``.
    texts: optional, a PTransform from edge batches to ``{"values",
      "counts"}`` of the endpoints' texts.
    first_new_id: as :class:`VerifyEdges`'s.

  Returns:
    ``{"edges": (edge shard, VerifiedEdges), "counts"}``
    (``verified_edges``, ``verify_removed_edges``, ``graph_edges``).
  """

  def __init__(self, config: DedupConfig, texts: beam.PTransform = None,
               first_new_id: int = None):
    super().__init__()
    self._config = config
    self._texts = texts
    self._first_new_id = first_new_id

  def expand(self, inputs):
    served = serve_texts(self._texts, inputs["docs"],
                         with_member_requests(inputs),
                         self._config.lsh_shards)
    compared = ({"values": served["values"], **_edges_and_buckets(inputs)}
                | "CompareShingleSets" >> _Compare(_ExactCompareFn(
                    self._config, self._first_new_id)))
    return {"edges": compared["edges"],
            "counts": (*served["counts"], *compared["counts"])}


def with_member_requests(inputs):
  """The edge batches of ``inputs["edges"]``, and when ``inputs`` has
  ``buckets``, one request per large-bucket batch for its members' values
  (an :class:`EdgeBatch` of each member with itself, so every server
  answers it as it answers edges)."""
  if "buckets" not in inputs:
    return inputs["edges"]
  members = inputs["buckets"] | "RequestMembers" >> beam.Map(
      _member_request).with_output_types(Tuple[int, EdgeBatch])
  return (inputs["edges"], members) | "WithMembers" >> beam.Flatten()


def _member_request(element):
  shard, buckets = element
  ids = np.unique(buckets.ids)
  return shard, EdgeBatch(ids, ids)


def _edges_and_buckets(inputs):
  return {"edges": inputs["edges"],
          **({"buckets": inputs["buckets"]} if "buckets" in inputs else {})}


class ServeTextsFromFiles(beam.PTransform):
  """Edge batches → the texts of their endpoints, read back from the input
  files: requests are grouped by file, and each file is read once, parsing
  only the requested rows. No document text goes through a shuffle until it
  is a candidate. ``files`` is the :class:`InputFile` PCollection of
  :class:`~transforms.read.ReadDocuments`. With ``id_field``, each
  value is a ``(text, user id)`` pair (every row up to the last requested
  one is parsed).

  Args:
    files: the PCollection of :class:`~transforms.read.InputFile`.
    text_field: the field (JSONL) or column (Parquet) holding the text.
    id_field: the field holding the user's id, or None for texts only.

  Returns:
    ``{"values": (edge shard, Served), "counts"}``.
  """

  def __init__(self, files, text_field: str = "text",
               id_field: Optional[str] = None):
    super().__init__()
    self._files = files
    self._text_field = text_field
    self._id_field = id_field

  def expand(self, edges):
    requests = edges | "RequestByFile" >> beam.ParDo(_RequestByFileFn())
    served = ({"file": self._files, "wants": requests}
              | "GroupByFile" >> JoinByKey(
                  key_by={"file": attrgetter("index")})
              | "ReadCandidates" >> beam.ParDo(
                  _ReadCandidatesFn(self._text_field,
                                    self._id_field)).with_outputs(
                      metrics.COUNTS, main="values"))
    return {"values": served.values, "counts": (served[metrics.COUNTS],)}


def serve_texts(texts, docs, requests, num_shards: int):
  """``{"values", "counts"}``: the texts the edge (or pair) batches
  ``requests`` ask for, from the ``texts`` PTransform (step ``ServeTexts``)
  or, when it is None, routed from ``docs`` (step ``ServeTextsFromDocs``)."""
  if texts is None:
    return ({"docs": docs, "edges": requests}
            | "ServeTextsFromDocs" >> ServeTextsFromDocs(num_shards))
  return requests | "ServeTexts" >> texts


class ServeTextsFromDocs(beam.PTransform):

  def __init__(self, num_shards: int):
    super().__init__()
    self._num_shards = num_shards

  def expand(self, inputs):
    routed = (inputs["docs"]
              | "BatchDocs" >> beam.BatchElements(
                  min_batch_size=64, max_batch_size=MAX_TEXT_BATCH)
              | "ToArrays" >> beam.Map(_text_batch)
              | "RouteTexts" >> beam.ParDo(
                  _RouteFn(self._num_shards, "verify_texts")).with_outputs(
                      metrics.COUNTS, main="values"))
    served = ({"values": routed.values, "edges": inputs["edges"]}
              | "Serve" >> _Serve(self._num_shards))
    return {"values": served["values"],
            "counts": (routed[metrics.COUNTS], *served["counts"])}


def _text_batch(batch):
  ids = np.fromiter((doc_id for doc_id, _ in batch), dtype=np.int64,
                    count=len(batch))
  texts = np.empty(len(batch), dtype=object)
  texts[:] = [text for _, text in batch]
  return ids, texts


def _nbytes(values) -> int:
  if values.dtype == object:
    return sum(len((v[0] or "") if isinstance(v, tuple) else v)
               for v in values)
  return values.nbytes


@beam.typehints.with_output_types(Tuple[int, Served])
class _RouteFn(beam.DoFn):
  """``(ids, values)`` batches → ``(node shard, Served(ids, values))``."""

  def __init__(self, num_shards: int, stat: str):
    self._num_shards = num_shards
    self._stat = stat

  def process(self, batch):
    ids, values = batch
    yield metrics.shuffled(self._stat, ids.nbytes + _nbytes(values))
    for shard, (shard_ids, shard_values) in lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(ids, self._num_shards), ids, values):
      yield shard, Served(shard_ids, shard_values)


class _Serve(beam.PTransform):
  """``{"values": node-shard values, "edges": edge batches}`` → ``{"values":
  (edge shard, Served), "counts"}``: each node shard sends the values
  of the endpoints an edge shard asked for."""

  def __init__(self, num_shards: int):
    super().__init__()
    self._num_shards = num_shards

  def expand(self, inputs):
    wants = inputs["edges"] | "RequestEndpoints" >> beam.ParDo(
        _RequestFn(self._num_shards))
    served = ({"values": inputs["values"], "wants": wants}
              | "JoinValues" >> JoinByKey()
              | "ServeValues" >> beam.ParDo(_ServeFn()).with_outputs(
                  metrics.COUNTS, main="values"))
    return {"values": served.values, "counts": (served[metrics.COUNTS],)}


def _endpoints(element):
  """``(edge shard, the requested documents, whether each one's text is
  asked for)``, from an :class:`EdgeBatch` (texts of both ends) or a
  :class:`TextRequest` (its ``ids`` want only their user ids)."""
  edge_shard, request = element
  texts = np.unique(np.concatenate(request[:2]))
  if not isinstance(request, TextRequest):
    return edge_shard, texts, np.ones(len(texts), dtype=bool)
  only_ids = np.setdiff1d(request.ids, texts)
  nodes = np.concatenate([texts, only_ids])
  order = np.argsort(nodes, kind="stable")
  return edge_shard, nodes[order], (np.arange(len(nodes)) < len(texts))[order]


@beam.typehints.with_output_types(Tuple[int, Wanted])
class _RequestFn(beam.DoFn):

  def __init__(self, num_shards: int):
    self._num_shards = num_shards

  def process(self, element):
    edge_shard, nodes, with_text = _endpoints(element)
    for shard, wanted in lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(nodes, self._num_shards), nodes, with_text):
      yield shard, Wanted(*wanted, np.array([edge_shard], dtype=np.int64))


@beam.typehints.with_output_types(Tuple[int, Served])
class _ServeFn(beam.DoFn):

  def process(self, element):
    _, grouped = element
    if not grouped["wants"]:
      return
    ids, values = sorted_values(grouped["values"])
    for wanted, _, edge_shard in grouped["wants"]:
      found = values[lsh_kernels.rows_of(ids, wanted)]
      yield metrics.shuffled("verify_endpoints",
                             wanted.nbytes + _nbytes(found))
      yield int(edge_shard[0]), Served(wanted, found)


def sorted_values(batches):
  """The ``(ids, values)`` batches of a group as one pair sorted by id."""
  ids, values = lsh_kernels.concat_arrays(batches)
  order = np.argsort(ids, kind="stable")
  return ids[order], values[order]


@beam.typehints.with_output_types(Tuple[int, Wanted])
class _RequestByFileFn(beam.DoFn):

  def process(self, element):
    edge_shard, nodes, with_text = _endpoints(element)
    for file_index, wanted in lsh_kernels.split_by_shard(
        split_doc_id(nodes)[0], nodes, with_text):
      yield file_index, Wanted(*wanted, np.array([edge_shard],
                                                 dtype=np.int64))


@beam.typehints.with_output_types(Tuple[int, Served])
class _ReadCandidatesFn(beam.DoFn):

  def __init__(self, text_field: str, id_field: Optional[str]):
    self._text_field = text_field
    self._id_field = id_field

  def process(self, element):
    _, grouped = element
    wants = grouped["wants"]
    if not wants:
      return
    (source,) = grouped["file"]
    _, rows = split_doc_id(np.unique(np.concatenate([w for w, _, _ in wants])))
    texts = np.empty(len(rows), dtype=object)
    for i, value in enumerate(self._read(source, rows)):
      texts[i] = value
    ids = make_doc_id(source.index, rows)
    for wanted, with_text, edge_shard in wants:
      found = texts[lsh_kernels.rows_of(ids, wanted)]
      # A document asked for its user id alone sends no text.
      for i in np.flatnonzero(~with_text).tolist():
        found[i] = (None, found[i][1]) if self._id_field else None
      yield metrics.shuffled(self._stat, wanted.nbytes + _nbytes(found))
      yield int(edge_shard[0]), Served(wanted, found)

  @property
  def _stat(self):
    return "verify_texts" if self._id_field is None else "explain_texts"

  def _read(self, source, rows):
    """The texts (or ``(text, user id)`` pairs) of the sorted ``rows``."""
    return (value for _, value in read_texts(source, rows.tolist(),
                                             self._text_field, self._id_field))


class _Compare(beam.PTransform):
  """Groups each edge shard's edges with its endpoints' values and applies a
  ``_CompareFn``."""

  def __init__(self, fn):
    super().__init__()
    self._fn = fn

  def expand(self, inputs):
    compared = (dict(inputs)
                | "GroupEdgeEnds" >> JoinByKey()
                | "Compare" >> beam.ParDo(self._fn).with_outputs(
                    metrics.COUNTS, main="edges"))
    return {"edges": compared.edges, "counts": (compared[metrics.COUNTS],)}


@beam.typehints.with_output_types(Tuple[int, VerifiedEdges])
class _CompareFn(metrics.MeteredDoFn):
  """Keeps the edges of one edge shard for which ``passes`` holds, and the
  spanning forest of each large bucket's pairs that would pass (see
  :func:`bucket_edges`)."""

  STAGE = "verification"

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    self._config = config
    self._first_new_id = first_new_id

  def setup(self):
    super().setup()
    self._similarity = metrics.distribution("verified_similarity_permille")

  def prepare(self, values):
    """What ``passes`` and ``forest`` compare (the values, or derived)."""
    return values

  def passes(self, prepared, src_rows, dst_rows):
    """``(passed bool[m], similarity float64[m])`` of the edges."""
    raise NotImplementedError

  def forest(self, prepared, rows, first_new):
    """The :class:`~transforms.kernels.bucket_components.BucketForest` of
    the documents at ``rows`` (one bucket, by id)."""
    raise NotImplementedError

  def twins(self, prepared, rows):
    """For each of the sorted ``rows``, the first of them with equal values
    that pass verification together (itself if none)."""
    raise NotImplementedError

  def process(self, element):
    shard, grouped = element
    buckets = grouped["buckets"] if "buckets" in grouped else []
    if not grouped["edges"] and not buckets:
      return
    with self.meter.timed():
      ids, values = sorted_values(grouped["values"])
      prepared = self.prepare(values)
      src, dst = (lsh_kernels.concat_arrays(grouped["edges"])
                  if grouped["edges"] else (np.zeros(0, np.int64),) * 2)
      passed, similarity = self.passes(prepared,
                                       lsh_kernels.rows_of(ids, src),
                                       lsh_kernels.rows_of(ids, dst))
      found = bucket_edges(self, prepared, ids, buckets, self._first_new_id)
    self.meter.done(len(src) + found.comparisons)
    for value in (1000 * similarity[passed]).astype(np.int64).tolist():
      self._similarity.update(value)
    if buckets:
      # A large bucket's compared pairs are candidates verified here.
      yield metrics.count_tag("candidate_edges", found.comparisons)
    yield metrics.count_tag("verified_edges", int(passed.sum()) + found.passed)
    yield metrics.count_tag(REMOVED_STAT, int((~passed).sum())
                            + found.comparisons - found.passed)
    src = np.concatenate([src[passed], found.src])
    if len(src):
      yield from forest_batch(shard, src,
                              np.concatenate([dst[passed], found.dst]),
                              np.concatenate([similarity[passed],
                                              found.similarity]))


class BucketEdges(NamedTuple):
  """The forest edges ``src`` → ``dst`` (document ids) of an edge shard's
  large buckets, their ``similarity``, and how many pairs were compared
  (``comparisons``) and ``passed``."""
  src: np.ndarray
  dst: np.ndarray
  similarity: np.ndarray
  comparisons: int
  passed: int


def bucket_edges(compare, prepared, ids, buckets, first_new_id=None
                 ) -> BucketEdges:
  """Each large bucket's spanning forest of the pairs that pass
  verification: the components all its pairs would give, from about k x
  (components) comparisons (:mod:`~transforms.kernels.bucket_components`),
  members with equal values counted once per shard.

  Args:
    compare: the ``_CompareFn`` whose ``forest`` compares.
    prepared: its ``prepare`` of the values of ``ids``.
    ids: the sorted ids of the served values.
    buckets: :class:`~transforms.elements.BucketMembers` batches.
    first_new_id: members below it (indexed) are never paired together.
  """
  if not buckets:
    empty = np.zeros(0, dtype=np.int64)
    return BucketEdges(empty, empty, np.zeros(0), 0, 0)
  keys, _, members = lsh_kernels.concat_arrays(buckets)
  rows = lsh_kernels.rows_of(ids, members)
  # Members with equal values are one member to every bucket they share:
  # each is joined to the first of them (similarity 1, counted as a
  # comparison), once per shard, and only that one is searched. Indexed
  # members stand for themselves (two of them are never paired).
  distinct = np.unique(rows)
  if first_new_id is not None:
    new = ids[distinct] >= first_new_id
    canon = distinct.copy()
    canon[new] = compare.twins(prepared, distinct[new])
  else:
    canon = compare.twins(prepared, distinct)
  twin = canon != distinct
  src, dst = [ids[canon[twin]]], [ids[distinct[twin]]]
  similarity = [np.ones(int(twin.sum()))]
  comparisons = passed = int(twin.sum())
  rows = canon[np.searchsorted(distinct, rows)]
  order = np.lexsort((rows, keys))
  keys, rows = keys[order], rows[order]
  starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
  for lo, hi in zip(starts.tolist(), np.r_[starts[1:], len(keys)].tolist()):
    bucket = np.unique(rows[lo:hi])
    first_new = (0 if first_new_id is None else
                 int(np.searchsorted(ids[bucket], first_new_id)))
    forest = compare.forest(prepared, bucket, first_new)
    src.append(ids[bucket[forest.src]])
    dst.append(ids[bucket[forest.dst]])
    similarity.append(forest.similarity)
    comparisons += forest.comparisons
    passed += forest.passed
  return BucketEdges(np.concatenate(src), np.concatenate(dst),
                     np.concatenate(similarity), comparisons, passed)


class _SignatureCompareFn(_CompareFn):

  def _min_equal(self, values):
    return lsh_kernels.min_equal_entries(self._config.threshold,
                                         values.shape[1])

  def passes(self, prepared, src_rows, dst_rows):
    k = prepared.shape[1]
    equal = np.count_nonzero(prepared[src_rows] == prepared[dst_rows], axis=1)
    return equal >= self._min_equal(prepared), equal / k

  def forest(self, prepared, rows, first_new):
    return bucket_kernels.row_forest(prepared, rows,
                                     self._min_equal(prepared), first_new)

  def twins(self, prepared, rows):
    return bucket_kernels.row_twins(prepared, rows)


class _ExactCompareFn(_CompareFn):

  def prepare(self, values):
    return shingled(self._config, values)

  def passes(self, prepared, src_rows, dst_rows):
    inter, union = set_overlaps(*prepared, src_rows, dst_rows)
    return (jaccard_kernels.meets_threshold(inter, union,
                                            self._config.threshold),
            inter / np.maximum(union, 1))

  def forest(self, prepared, rows, first_new):
    return bucket_kernels.set_forest(*prepared, rows, self._config.threshold,
                                     first_new)

  def twins(self, prepared, rows):
    return bucket_kernels.set_twins(*prepared, rows)


def exact_similarity(config: DedupConfig, texts, src_rows, dst_rows):
  """``(reaches config.threshold bool[m], exact Jaccard float64[m])`` of
  the pairs ``(texts[src_rows[i]], texts[dst_rows[i]])``."""
  inter, union = exact_overlaps(config, texts, src_rows, dst_rows)
  return (jaccard_kernels.meets_threshold(inter, union, config.threshold),
          inter / np.maximum(union, 1))


def exact_overlaps(config: DedupConfig, texts, src_rows, dst_rows):
  """``(|A∩B|, |A∪B|)`` of the shingle sets of ``texts[src_rows[i]]`` and
  ``texts[dst_rows[i]]``, shingled as the signatures were."""
  return set_overlaps(*shingled(config, texts), src_rows, dst_rows)


def shingled(config: DedupConfig, texts):
  """``(values, offsets)``: the shingle sets of ``texts``, shingled as the
  signatures were."""
  return signature_kernels.shingle_sets(
      list(texts), unit=config.shingle_unit, ngram=config.ngram,
      seed=config.seed, **normalize_options(config))


def set_overlaps(flat, set_offsets, src_rows, dst_rows):
  """``(|A∩B|, |A∪B|)`` of the sets at ``src_rows`` and ``dst_rows``."""
  sizes = np.diff(set_offsets)
  inter = jaccard_kernels.pair_intersections(flat, set_offsets, src_rows,
                                             dst_rows)
  return inter, sizes[src_rows] + sizes[dst_rows] - inter


def forest_batch(shard, src, dst, similarity):
  """The verified edge batch ``(shard, (src, dst, similarity))`` of one
  shard's edges that passed: only a maximum-similarity spanning forest of
  them (real edges, the same connected components, at most nodes - 1 edges
  however dense the buckets were), with its ``graph_edges`` count."""
  keep = graph_kernels.spanning_forest(src, dst, similarity)
  yield metrics.count_tag("graph_edges", int(keep.sum()))
  yield shard, VerifiedEdges(src[keep], dst[keep], similarity[keep])


@beam.typehints.with_input_types(Tuple[int, EdgeBatch])
class ReduceUnverified(beam.PTransform):
  """Candidate edge batches → verified edge batches without verification
  (``--verify none``): every candidate passes, similarity unknown (NaN).

  Returns:
    ``{"edges": (edge shard, VerifiedEdges), "counts"}``
    (``verified_edges``, ``graph_edges``).
  """

  def expand(self, edges):
    out = edges | "SpanningForest" >> beam.ParDo(
        _ReduceFn()).with_outputs(metrics.COUNTS, main="edges")
    return {"edges": out.edges, "counts": (out[metrics.COUNTS],)}


@beam.typehints.with_output_types(Tuple[int, VerifiedEdges])
class _ReduceFn(beam.DoFn):

  def process(self, element):
    shard, (src, dst) = element
    yield metrics.count_tag("verified_edges", len(src))
    yield from forest_batch(shard, src, dst,
                            np.full(len(src), np.nan))
