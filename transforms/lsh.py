"""BandKey → GroupByKey collision → candidate edges (verified in
transforms/verify.py)."""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.kernels import lsh as lsh_kernels

_MAX_BATCH = 4096


class BandKey(beam.PTransform):
  """``(doc_id, signature)`` → ``(shard, (keys uint64[m], ids int64[m]))``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values). Keys are routed to ``config.lsh_shards`` shards by
  their high bits and shipped as numpy arrays, one element per (batch, shard),
  so the shuffle moves a few large elements instead of one per (doc, band).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signatures):
    return (signatures
            | "BatchSignatures" >> beam.BatchElements(max_batch_size=_MAX_BATCH)
            | "ComputeBandKeys" >> beam.ParDo(_BandKeyFn(self._config)))


class _BandKeyFn(beam.DoFn):

  def __init__(self, config: DedupConfig):
    self._config = config

  def process(self, batch):
    c = self._config
    ids = np.fromiter((doc_id for doc_id, _ in batch), dtype=np.int64,
                      count=len(batch))
    sigs = np.stack([sig for _, sig in batch])
    keys = lsh_kernels.band_keys(sigs, c.bands, c.rows, c.seed).ravel()
    ids = np.repeat(ids, c.bands)
    shards = lsh_kernels.shard_of(keys, c.lsh_shards)
    order = np.argsort(shards, kind="stable")
    shards, keys, ids = shards[order], keys[order], ids[order]
    bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
      yield int(shards[lo]), (keys[lo:hi], ids[lo:hi])


class FindCandidates(beam.PTransform):
  """Band-key shards → distinct candidate edges ``(src, dst)``, src < dst.

  Returns ``{"edges", "counts"}``. Each bucket (documents sharing a band key)
  of k members yields k-1 star edges from its smallest id, never k^2 pairs.
  """

  def expand(self, band_keys):
    found = (band_keys
             | "GroupByShard" >> beam.GroupByKey()
             | "CollideInShard" >> beam.ParDo(_CollideFn()).with_outputs(
                 metrics.COUNTS, main="edges"))
    edges = found.edges | "DistinctEdges" >> beam.Distinct()
    counts = ((found[metrics.COUNTS],
               edges | "CountCandidates" >> metrics.CountAs("candidate_edges"))
              | "FlattenCounts" >> beam.Flatten())
    return {"edges": edges, "counts": counts}


@beam.typehints.with_output_types(Tuple[int, int])
class _CollideFn(beam.DoFn):

  def setup(self):
    self._bucket_sizes = metrics.distribution("bucket_size")

  def process(self, element):
    _, parts = element
    keys, ids = [], []
    for part_keys, part_ids in parts:
      keys.append(part_keys)
      ids.append(part_ids)
    src, dst, sizes = lsh_kernels.star_edges(np.concatenate(keys),
                                             np.concatenate(ids))
    if len(sizes):
      yield metrics.count_tag("buckets_multi", len(sizes))
      self._bucket_sizes.update(int(sizes.max()))
    for a, b in zip(src.tolist(), dst.tolist()):
      yield a, b

