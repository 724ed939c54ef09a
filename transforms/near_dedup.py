"""NearDedup: the whole near-duplicate detection as one composite transform."""

from __future__ import annotations

import apache_beam as beam

from transforms.band import BandKey
from transforms.collide import FindCandidates
from transforms.components import ConnectedComponents
from transforms.config import DedupConfig
from transforms.explain import ExplainClusters
from transforms.select import Clustered, SelectKept, cluster_rows
from transforms.sign import ComputeSignatures
from transforms.verify import ReduceUnverified, VerifyEdges, VerifyExact

# The length an indexed document counts with under keep="longest".
INDEXED_LENGTH = 1 << 62


class NearDedup(beam.PTransform):
  """``(doc_id: int, text: str)`` (or, ``batched``,
  :class:`~transforms.elements.TextBatch`) → ``{"clusters", "counts"}``.

  ``clusters``: ``(doc_id, ClusterInfo)`` for every document in a duplicate
  cluster of two or more (``batched``: those rows as
  :class:`~transforms.select.ClusterColumns`, one element per shard, which
  :func:`~transforms.select.cluster_rows` turns back into rows); a document
  absent from it is unique and kept.
  Exactly one document per cluster is the kept one (``kept_doc_id``); every
  other member carries its explanation (matched document, exact Jaccard to
  it and to the kept one) and is removed (``kept=False``) unless the chain
  guard keeps it. ``counts``: a tuple of PCollections of ``(stat, n)``
  elements for the run's statistics, to flatten where they are summed. Doc
  ids must be unique ints; with the default keep policy the lowest id of a
  cluster is kept.

  Texts are needed for exact verification and for the explanations: they
  come from ``texts`` when given (e.g.
  :class:`~transforms.verify.ServeTextsFromFiles`) and ``explain_texts``
  (the same with an ``id_field``, so explanations name user ids), otherwise
  from the input PCollection (see :class:`~transforms.verify.VerifyExact`).

  With ``index`` (an :class:`~transforms.index.IndexedCorpus`), the new
  documents (ids from ``index.first_new_id`` on) are deduplicated against
  the indexed ones and among themselves: the indexed band keys join the
  collision, their signatures the verification, and a cluster holding an
  indexed document keeps it (with ``keep="longest"`` too); only the new
  documents' rows are returned. ``texts`` must then serve indexed texts as
  well. Also returned: ``signatures`` and ``keys`` of the new documents
  (what :class:`~transforms.index.WriteIndex` stores).
  """

  def __init__(self, config: DedupConfig, texts: beam.PTransform = None,
               explain_texts: beam.PTransform = None, index=None,
               batched: bool = False):
    super().__init__()
    self._config = config
    self._texts = texts
    self._explain_texts = explain_texts
    self._index = index
    self._batched = batched

  def expand(self, inputs):
    c = self._config
    signed = inputs | "ComputeSignatures" >> ComputeSignatures(
        c, self._batched)
    # Per-document pairs only where texts are not served from the files.
    docs = inputs
    if self._batched and self._texts is None:
      docs = inputs | "UnbatchTexts" >> beam.FlatMap(_pairs)
    signatures = signed["signatures"]
    keyed = signatures | "BandKey" >> BandKey(c)
    index = self._index
    keys, compared = keyed["keys"], signatures
    counts = (*signed["counts"], *keyed["counts"])
    if index is not None:
      keys = (keys, index.keys) | "WithIndexedKeys" >> beam.Flatten()
      compared = ((signatures, index.signatures)
                  | "WithIndexedSignatures" >> beam.Flatten())
    first_new_id = None if index is None else index.first_new_id
    found = ({"keys": keys}
             | "FindCandidates" >> FindCandidates(c, first_new_id))
    counts += found["counts"]
    edges, buckets = found["edges"], found["buckets"]
    if c.verify == "none":
      verified = edges | "KeepAllCandidates" >> ReduceUnverified()
    elif c.verify == "exact":
      verified = ({"edges": edges, "docs": docs, "buckets": buckets}
                  | "VerifyExact" >> VerifyExact(c, self._texts,
                                                 first_new_id))
    else:
      verified = ({"edges": edges, "signatures": compared,
                   "buckets": buckets}
                  | "VerifyEdges" >> VerifyEdges(c, first_new_id))
    counts += verified["counts"]
    components = (verified["edges"]
                  | "ConnectedComponents" >> ConnectedComponents(
                      c.max_cc_rounds, c.max_residual_edges))
    lengths = None
    if c.keep == "longest":
      lengths = (inputs | "TextLengths" >> beam.FlatMap(_lengths)
                 if self._batched else
                 docs | "TextLengths" >> beam.Map(lambda d: (d[0], len(d[1]))))
      if index is not None:
        # An indexed document always wins: it is longer than any new one.
        lengths = ((lengths, index.signatures | "IndexedLengths" >>
                    beam.FlatMap(lambda b: ((i, INDEXED_LENGTH)
                                            for i in b.ids.tolist())))
                   | "AllLengths" >> beam.Flatten())
    selected = components["labels"] | "SelectKept" >> SelectKept(
        c.keep, lengths, first_new_id, c.lsh_shards)
    explained = ({"clusters": selected["clusters"],
                  "edges": verified["edges"], "docs": docs}
                 | "ExplainClusters" >> ExplainClusters(
                     c, self._explain_texts or self._texts))
    counts += (*components["counts"], *selected["counts"],
               *explained["counts"])
    clusters = explained["clusters"]
    if not self._batched:
      clusters = clusters | "UnbatchClusters" >> beam.FlatMap(
          cluster_rows).with_output_types(Clustered)
    return {"clusters": clusters, "counts": counts,
            "signatures": signatures, "keys": keyed["keys"]}


def _pairs(batch):
  return zip(batch.ids.tolist(), batch.texts)


def _lengths(batch):
  return zip(batch.ids.tolist(), map(len, batch.texts))
