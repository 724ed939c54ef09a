"""NearDedup: the whole near-duplicate detection as one composite transform."""

from __future__ import annotations

import apache_beam as beam

from transforms import metrics
from transforms.components import ConnectedComponents
from transforms.config import DedupConfig
from transforms.lsh import BandKey, FindCandidates, VerifyEdges
from transforms.select import SelectKept
from transforms.signatures import ComputeSignatures


class NearDedup(beam.PTransform):
  """``(doc_id: int, text: str)`` → ``{"clusters", "counts"}``.

  ``clusters``: ``(doc_id, ClusterInfo)`` for every document in a duplicate
  cluster of two or more; a document absent from it is unique and kept.
  Exactly one document per cluster has ``kept=True``. ``counts``: ``(stat,
  n)`` elements for the run's statistics. Doc ids must be unique ints; with
  the default keep policy the lowest id of a cluster is kept.
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, docs):
    c = self._config
    signed = docs | "ComputeSignatures" >> ComputeSignatures(c)
    signatures = signed["signatures"]
    keyed = signatures | "BandKey" >> BandKey(c)
    found = keyed["keys"] | "FindCandidates" >> FindCandidates()
    counts = [signed["counts"], keyed["counts"], found["counts"]]
    edges = found["edges"]
    if c.verify == "signature":
      verified = ({"edges": edges, "signatures": signatures}
                  | "VerifyEdges" >> VerifyEdges(c))
      edges = verified["edges"]
      counts.append(verified["counts"])
    else:
      counts.append(edges | "CountVerified" >> metrics.CountAs(
          "verified_edges"))
    components = edges | "ConnectedComponents" >> ConnectedComponents(
        c.max_cc_rounds, c.max_residual_edges)
    lengths = None
    if c.keep == "longest":
      lengths = docs | "TextLengths" >> beam.Map(lambda d: (d[0], len(d[1])))
    selected = components["labels"] | "SelectKept" >> SelectKept(
        c.keep, lengths)
    counts += [components["counts"], selected["counts"]]
    return {"clusters": selected["clusters"],
            "counts": counts | "FlattenCounts" >> beam.Flatten()}
