"""ExplainClusters: why each removed document was removed (the matched
neighbour on a verified edge, the exact Jaccard to it and to the kept one),
and the chain guard. Runs after :mod:`transforms.select`, before
:mod:`transforms.write`."""

from __future__ import annotations

import math
from typing import Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import EdgeBatch
from transforms.join import JoinByKey
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import lsh as lsh_kernels
from transforms.select import ClusterInfo, Clustered
from transforms.verify import (MAX_TEXT_BATCH, exact_overlaps, serve_texts,
                               sorted_values)


class ExplainClusters(beam.PTransform):
  """``{"clusters", "edges", "docs"}`` → ``(doc_id, ClusterInfo)`` with the
  explanation of every clustered document that is not the kept one.

  ``clusters`` come from :class:`~transforms.select.SelectKept`, ``edges``
  are the verified edge batches the clusters were built from. Each such
  document is matched with a neighbour on a verified edge (the kept
  document when they share one, else the most similar neighbour, then the
  lowest id); the exact Jaccard to that neighbour and to the kept document
  are computed from the texts (``texts``: a source of ``(text, user id)``
  pairs such as :class:`ServeTextsFromFiles` with an ``id_field``; by
  default the ``docs`` texts are routed, without user ids). With ``config.chain_guard``
  a document whose Jaccard to the kept one is below the threshold is kept
  (``chain_kept``). Counts: ``chain_docs`` (clustered, not kept, below the
  threshold to the kept document) and ``chain_kept``.
  """

  def __init__(self, config: DedupConfig, texts: beam.PTransform = None):
    super().__init__()
    self._config = config
    self._texts = texts

  def expand(self, inputs):
    n = self._config.lsh_shards
    chosen = ({"info": inputs["clusters"],
               "edge": inputs["edges"] | "EdgeEnds" >> beam.FlatMap(
                   _edge_ends)}
              | "JoinNeighbours" >> JoinByKey()
              | "ChooseMatched" >> beam.ParDo(_ChooseMatchedFn())
              .with_output_types(Clustered, **{_ASKED: _Asked})
              .with_outputs(_ASKED, main="kept"))
    pairs = (chosen[_ASKED]
             | "PairsToCompare" >> beam.FlatMap(_pairs_to_compare)
             | "BatchPairs" >> beam.BatchElements(
                 min_batch_size=64, max_batch_size=MAX_TEXT_BATCH)
             | "PairBatches" >> beam.FlatMap(_pair_batches, n)
             .with_output_types(Tuple[int, EdgeBatch]))
    served = serve_texts(self._texts, inputs["docs"], pairs, n)
    measured = ({"values": served["values"], "pairs": pairs}
                | "GroupPairEnds" >> JoinByKey()
                | "ExactJaccard" >> beam.ParDo(_JaccardFn(self._config))
                | "ByDocument" >> beam.FlatMap(_by_document))
    explained = ({"asked": chosen[_ASKED] | "KeyAsked" >> beam.Map(
                     lambda a: (a[0], a[1:])).with_output_types(
                         Tuple[int, Tuple[ClusterInfo, int]]),
                  "measured": measured}
                 | "JoinMeasured" >> JoinByKey()
                 | "Explain" >> beam.ParDo(_ExplainFn(self._config))
                 .with_output_types(Clustered)
                 .with_outputs(metrics.COUNTS, main="clusters"))
    clusters = ((chosen.kept, explained.clusters)
                | "AllClusters" >> beam.Flatten())
    return {"clusters": clusters,
            "counts": (served["counts"], explained[metrics.COUNTS])
                      | "FlattenCounts" >> beam.Flatten()}


_ASKED = "asked"
# A document to explain: (doc id, its cluster, the neighbour it matched).
_Asked = Tuple[int, ClusterInfo, int]


def _edge_ends(element):
  _, (src, dst, similarity) = element
  for a, b, sim in zip(src.tolist(), dst.tolist(), similarity.tolist()):
    yield a, (b, sim)
    yield b, (a, sim)


def _matched(kept_doc_id, neighbours):
  """The neighbour a document is explained by: the kept document if it is
  one, else the most similar (unknown similarity last), then lowest id."""
  if any(other == kept_doc_id for other, _ in neighbours):
    return kept_doc_id
  return min(neighbours, key=lambda e: (
      -e[1] if not math.isnan(e[1]) else math.inf, e[0]))[0]


class _ChooseMatchedFn(beam.DoFn):
  """Kept documents pass through; every other one is asked about as
  ``(doc_id, info, matched doc id)``."""

  def process(self, element):
    node, grouped = element
    infos = list(grouped["info"])
    if not infos:
      return
    info = infos[0]
    if info.kept:
      yield node, info
      return
    yield beam.pvalue.TaggedOutput(_ASKED, (
        node, info, _matched(info.kept_doc_id, list(grouped["edge"]))))


def _pairs_to_compare(asked):
  node, info, matched = asked
  yield node, matched
  if matched != info.kept_doc_id:
    yield node, info.kept_doc_id


def _pair_batches(batch, num_shards):
  """``(doc, other)`` pairs → ``(shard, EdgeBatch(docs, others))`` by the
  shard of the document."""
  docs = np.fromiter((d for d, _ in batch), dtype=np.int64, count=len(batch))
  others = np.fromiter((o for _, o in batch), dtype=np.int64,
                       count=len(batch))
  for shard, (d, o) in lsh_kernels.split_by_shard(
      lsh_kernels.node_shard(docs, num_shards), docs, others):
    yield shard, EdgeBatch(d, o)


class _JaccardFn(beam.DoFn):
  """``(doc, other, jaccard, reaches threshold, other's user id)`` of every
  pair of one pair shard, exactly."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def process(self, element):
    _, grouped = element
    if not grouped["pairs"]:
      return
    docs, others = lsh_kernels.concat_arrays(grouped["pairs"])
    ids, values = sorted_values(grouped["values"])
    texts, user_ids = _texts_and_user_ids(values)
    doc_rows = lsh_kernels.rows_of(ids, docs)
    other_rows = lsh_kernels.rows_of(ids, others)
    inter, union = exact_overlaps(self._config, texts, doc_rows, other_rows)
    reaches = jaccard_kernels.meets_threshold(inter, union,
                                              self._config.threshold)
    yield (docs, others, inter / np.maximum(union, 1), reaches,
           user_ids[other_rows])


def _texts_and_user_ids(values):
  texts = np.empty(len(values), dtype=object)
  user_ids = np.empty(len(values), dtype=object)
  for i, value in enumerate(values):
    texts[i], user_ids[i] = value if isinstance(value, tuple) else (value,
                                                                    None)
  return texts, user_ids


def _by_document(measured):
  docs, others, similarity, reaches, user_ids = measured
  for doc, other, sim, ok, user_id in zip(
      docs.tolist(), others.tolist(), similarity.tolist(), reaches.tolist(),
      user_ids.tolist()):
    yield doc, (other, sim, ok, user_id)


class _ExplainFn(beam.DoFn):

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._counts = metrics.BundleCounts()

  def finish_bundle(self):
    return self._counts.flush()

  def process(self, element):
    node, grouped = element
    (info, matched), = grouped["asked"]
    measured = {other: rest for other, *rest in grouped["measured"]}
    matched_sim, _, matched_id = measured[matched]
    kept_sim, reaches, _ = measured[info.kept_doc_id]
    chain = not reaches
    guarded = chain and self._config.chain_guard
    self._counts.add("chain_docs", int(chain))
    self._counts.add("chain_kept", int(guarded))
    yield node, info._replace(
        kept=guarded, matched_doc_id=matched, matched_id=matched_id,
        matched_jaccard=matched_sim, jaccard_to_kept=kept_sim,
        chain_kept=guarded)
