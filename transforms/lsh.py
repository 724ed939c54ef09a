"""BandKey → GroupByKey collision → candidate edges (verified in
:mod:`transforms.verify`).

Everything from signatures to verified edges moves as numpy arrays, one
element per (batch, shard): the shuffles carry a few large elements, never
one per document, band or edge.

* signature batch: ``(ids int64[n], signatures uint32[n, K])``
* edge batch: ``(edge shard, (src int64[m], dst int64[m]))`` with src < dst;
  the shard is that of ``src`` (:func:`lsh_kernels.node_shard`).
"""

from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.kernels import lsh as lsh_kernels


class BandKey(beam.PTransform):
  """Signature batches → ``(shard, (keys uint64[m], ids int64[m]))``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values). Keys are routed to ``config.lsh_shards`` shards by
  their high bits. Returns ``{"keys", "counts"}``.
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signature_batches):
    out = signature_batches | "ComputeBandKeys" >> beam.ParDo(
        _BandKeyFn(self._config)).with_outputs(metrics.COUNTS, main="keys")
    return {"keys": out.keys, "counts": out[metrics.COUNTS]}


@beam.typehints.with_output_types(Tuple[int, Any])
class _BandKeyFn(beam.DoFn):

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._meter = metrics.StageMeter("band_keys", "documents")

  def process(self, batch):
    c = self._config
    ids, sigs = batch
    self._meter.start()
    keys = lsh_kernels.band_keys(sigs, c.bands, c.rows, c.seed).ravel()
    ids = np.repeat(ids, c.bands)
    shards = list(lsh_kernels.split_by_shard(
        lsh_kernels.shard_of(keys, c.lsh_shards), keys, ids))
    self._meter.stop()
    self._meter.done(len(sigs))
    yield metrics.shuffled("band_keys", keys.nbytes + ids.nbytes)
    for shard, (shard_keys, shard_ids) in shards:
      yield shard, (shard_keys, shard_ids)

  def finish_bundle(self):
    return self._meter.flush()


class FindCandidates(beam.PTransform):
  """Band-key shards → distinct candidate edge batches.

  Each bucket (documents sharing a band key) of k members yields k-1 star
  edges from its smallest id, never k^2 pairs; an edge found by several
  bands is kept once. Returns ``{"edges", "counts"}`` (``buckets_multi``,
  ``candidate_edges``).
  """

  def __init__(self, num_shards: int):
    super().__init__()
    self._num_shards = num_shards

  def expand(self, band_keys):
    found = (band_keys
             | "GroupByShard" >> beam.GroupByKey()
             | "CollideInShard" >> beam.ParDo(
                 _CollideFn(self._num_shards)).with_outputs(
                     metrics.COUNTS, main="edges"))
    distinct = (found.edges
                | "GroupEdges" >> beam.GroupByKey()
                | "DistinctEdges" >> beam.ParDo(_DistinctFn()).with_outputs(
                    metrics.COUNTS, main="edges"))
    counts = ((found[metrics.COUNTS], distinct[metrics.COUNTS])
              | "FlattenCounts" >> beam.Flatten())
    return {"edges": distinct.edges, "counts": counts}


@beam.typehints.with_output_types(Tuple[int, Any])
class _CollideFn(beam.DoFn):

  def __init__(self, num_shards: int):
    self._num_shards = num_shards

  def setup(self):
    self._bucket_sizes = metrics.distribution("bucket_size")
    self._meter = metrics.StageMeter("collision", "band keys")

  def process(self, element):
    _, parts = element
    self._meter.start()
    keys, ids = concat_pairs(parts)
    src, dst, sizes = lsh_kernels.star_edges(keys, ids)
    batches = list(_edge_batches(src, dst, self._num_shards))
    self._meter.stop()
    self._meter.done(len(keys))
    if len(sizes):
      yield metrics.count_tag("buckets_multi", len(sizes))
      yield from metrics.histogram_tags(metrics.BUCKET_SIZES, sizes)
      self._bucket_sizes.update(int(sizes.max()))
    if len(src):
      yield metrics.shuffled("candidate_edges", src.nbytes + dst.nbytes)
      yield from batches

  def finish_bundle(self):
    return self._meter.flush()


def _edge_batches(src, dst, num_shards):
  for shard, (s, d) in lsh_kernels.split_by_shard(
      lsh_kernels.node_shard(src, num_shards), src, dst):
    yield shard, (s, d)


def concat_pairs(parts):
  """``(a, b)`` array pairs → one concatenated ``(a, b)`` pair."""
  firsts, seconds = [], []
  for first, second in parts:
    firsts.append(first)
    seconds.append(second)
  return np.concatenate(firsts), np.concatenate(seconds)


@beam.typehints.with_output_types(Tuple[int, Any])
class _DistinctFn(beam.DoFn):

  def process(self, element):
    shard, parts = element
    src, dst = lsh_kernels.distinct_edges(*concat_pairs(parts))
    yield metrics.count_tag("candidate_edges", len(src))
    yield shard, (src, dst)


class EdgeBatchCount(beam.PTransform):
  """Counts the edges of edge batches into one ``(name, n)`` element."""

  def __init__(self, name: str):
    super().__init__()
    self._name = name

  def expand(self, edges):
    return (edges
            | "EdgesPerBatch" >> beam.Map(lambda kv: len(kv[1][0]))
            | "Sum" >> beam.CombineGlobally(sum)
            | "Name" >> beam.Map(metrics.named_count, self._name))


def explode_edges(element):
  """An edge batch as ``(src, dst)`` int pairs."""
  _, (src, dst) = element
  return zip(src.tolist(), dst.tolist())
