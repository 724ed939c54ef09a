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
from transforms.elements import (AskedBatch, ClusterBatch, RouteByShard,
                                 TextRequest, VerifiedEdges)
from transforms.join import JoinByKey
from transforms.kernels import clusters as cluster_kernels
from transforms.kernels import lsh as lsh_kernels
from transforms.select import ClusterColumns, ClusterInfo, cluster_columns
from transforms.verify import (MAX_TEXT_BATCH, exact_similarity,
                               serve_texts, sorted_values)


class ExplainClusters(beam.PTransform):
  """``{"clusters", "edges", "docs"}`` → :class:`~transforms.select.
  ClusterColumns` (the ``(doc_id, ClusterInfo)`` rows of a node shard, as
  :func:`~transforms.select.cluster_rows` gives them back) with the
  explanation of every clustered document that is not the kept one.

  ``clusters`` (``(node shard, ClusterBatch)``) come from
  :class:`~transforms.select.SelectKept`, ``edges``
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
               "edge": inputs["edges"] | "EdgeEnds" >> beam.ParDo(
                   _EdgeEndsFn(n)).with_output_types(
                       Tuple[int, VerifiedEdges])}
              | "JoinNeighbours" >> JoinByKey()
              | "ChooseMatched" >> beam.ParDo(_ChooseMatchedFn(
                  self._config.verify == "exact"))
              .with_output_types(_Asked, **{_KEPT: _Kept})
              .with_outputs(_KEPT, main=_ASKED))
    pairs = chosen[_ASKED] | "PairsToCompare" >> beam.Map(
        _pairs_to_compare).with_output_types(Tuple[int, TextRequest])
    served = serve_texts(self._texts, inputs["docs"], pairs, n)
    # The kept documents join too, so that every cluster row comes out of
    # one step (no flatten for the runner to materialise).
    explained = ({"values": served["values"], "pairs": pairs,
                  "asked": chosen[_ASKED], "kept": chosen[_KEPT]}
                 | "GroupPairEnds" >> JoinByKey()
                 | "Explain" >> beam.ParDo(_ExplainFn(self._config))
                 .with_output_types(ClusterColumns)
                 .with_outputs(metrics.COUNTS, main="clusters"))
    return {"clusters": explained.clusters,
            "counts": (*served["counts"], explained[metrics.COUNTS])}


_ASKED, _KEPT = "asked", "kept"
_Asked = Tuple[int, AskedBatch]
_Kept = Tuple[int, ClusterBatch]
# Removed documents per asked batch: at most two pairs each, so a pair
# batch (and its text request) stays within MAX_TEXT_BATCH.
_ASKED_ROWS = MAX_TEXT_BATCH // 2


class _EdgeEndsFn(RouteByShard):
  """Verified edge batches → ``(node shard, VerifiedEdges(doc, other,
  similarity))`` with both ends of every edge, at the shard of ``doc``, one
  batch per shard and bundle."""

  OUTPUT = VerifiedEdges

  def process(self, element):
    _, (src, dst, similarity) = element
    docs = np.concatenate([src, dst])
    others = np.concatenate([dst, src])
    sims = np.concatenate([similarity, similarity])
    yield from self.outputs.add_rows(
        lsh_kernels.node_shard(docs, self._shards), docs, others, sims)


class _ChooseMatchedFn(beam.DoFn):
  """A node shard's clustered documents: the kept ones go on as they are
  (tag ``kept``); every other one is asked about with the neighbour that
  explains it (:func:`~transforms.kernels.clusters.choose_matched`) and,
  when the edges were verified ``exact``, their exact Jaccard (the edges'
  similarity: the same texts, shingled the same way)."""

  def __init__(self, exact: bool):
    self._exact = exact

  def process(self, element):
    shard, grouped = element
    if not grouped["info"]:
      return
    c = ClusterBatch(*lsh_kernels.concat_arrays(grouped["info"]))
    kept = c.docs == c.kept_ids
    if kept.any():
      yield beam.pvalue.TaggedOutput(_KEPT, (shard, ClusterBatch(
          *(column[kept] for column in c))))
    rows = np.flatnonzero(~kept)
    if not len(rows):
      return
    rows = rows[np.argsort(c.docs[rows])]  # choose_matched wants them sorted
    asked = ClusterBatch(*(column[rows] for column in c))
    ends = (lsh_kernels.concat_arrays(grouped["edge"]) if grouped["edge"]
            else (np.zeros(0, np.int64),) * 2 + (np.zeros(0),))
    matched = cluster_kernels.choose_matched(asked.docs, asked.kept_ids, *ends)
    similarity = (matched.similarity if self._exact
                  else np.full(len(rows), np.nan))
    for lo in range(0, len(rows), _ASKED_ROWS):
      part = slice(lo, lo + _ASKED_ROWS)
      yield shard, AskedBatch(*(column[part] for column in asked),
                              matched.neighbours[part], similarity[part])


def _pairs_to_compare(element):
  """What explains the asked documents: the pairs whose exact Jaccard is
  not known yet (each document with its matched neighbour, unless
  verification measured that edge, and with its kept document when that
  is another), and the matched neighbours' user ids."""
  shard, asked = element
  unknown = np.isnan(asked.similarity)
  also_kept = asked.matched != asked.kept_ids
  return shard, TextRequest(
      np.concatenate([asked.docs[unknown], asked.docs[also_kept]]),
      np.concatenate([asked.matched[unknown], asked.kept_ids[also_kept]]),
      asked.matched)


class _ExplainFn(beam.DoFn):
  """A node shard's asked documents with the exact Jaccard to their matched
  neighbour and kept document (from the texts), and the chain guard."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._counts = metrics.BundleCounts()

  def finish_bundle(self):
    return self._counts.flush()

  def process(self, element):
    _, grouped = element
    rows = []
    for kept in grouped["kept"]:
      rows.extend((doc, ClusterInfo(cluster_id, size, True, doc))
                  for doc, cluster_id, size in zip(kept.docs.tolist(),
                                                   kept.cluster_ids.tolist(),
                                                   kept.sizes.tolist()))
    if grouped["asked"]:
      rows.extend(self._explain(grouped))
    if rows:
      yield cluster_columns(rows)

  def _explain(self, grouped):
    src, dst, _ = lsh_kernels.concat_arrays(grouped["pairs"])
    ids, values = sorted_values(grouped["values"])
    texts, user_ids = _texts_and_user_ids(values)
    # (reaches the threshold, exact Jaccard) per pair: a verified edge
    # passed with the Jaccard measured then; the others are measured here.
    measured = {}
    if len(src):
      src_rows, dst_rows = (lsh_kernels.rows_of(ids, src),
                            lsh_kernels.rows_of(ids, dst))
      shown = np.unique(np.concatenate([src_rows, dst_rows]))
      reaches, similarity = exact_similarity(
          self._config, texts[shown], np.searchsorted(shown, src_rows),
          np.searchsorted(shown, dst_rows))
      measured = dict(zip(zip(src.tolist(), dst.tolist()),
                          zip(reaches.tolist(), similarity.tolist())))
    for asked in grouped["asked"]:
      matched_ids = user_ids[lsh_kernels.rows_of(ids, asked.matched)].tolist()
      for doc, cluster_id, size, kept, matched, known, matched_id in zip(
          *(column.tolist() for column in asked), matched_ids):
        m = measured[doc, matched] if math.isnan(known) else (True, known)
        k = m if kept == matched else measured[doc, kept]
        guarded = not k[0] and self._config.chain_guard
        self._counts.add("chain_docs", int(not k[0]))
        self._counts.add("chain_kept", int(guarded))
        yield doc, ClusterInfo(
            cluster_id, size, guarded, kept, matched_doc_id=matched,
            matched_id=matched_id, matched_jaccard=m[1],
            jaccard_to_kept=k[1], chain_kept=guarded)


def _texts_and_user_ids(values):
  texts = np.empty(len(values), dtype=object)
  user_ids = np.empty(len(values), dtype=object)
  for i, value in enumerate(values):
    texts[i], user_ids[i] = value if isinstance(value, tuple) else (value,
                                                                    None)
  return texts, user_ids
