"""BandKey → GroupByKey collision → candidate edges (verified in
:mod:`transforms.verify`).

Everything from signatures to verified edges moves as numpy arrays, one
element per (batch, shard): the shuffles carry a few large elements, never
one per document, band or edge.

* signature batch: ``(ids int64[n], signatures uint32[n, K])``
* edge batch: ``(edge shard, (src int64[m], dst int64[m]))`` with src < dst;
  candidate pairs are in the shard (:func:`lsh_kernels.node_shard`) of the
  smallest id of the bucket that found them
* verified edge batch: ``(edge shard, (src, dst, similarity float64[m]))``,
  a spanning forest of the pairs that passed (similarity NaN if unknown)
"""

from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.kernels import connected as graph_kernels
from transforms.kernels import lsh as lsh_kernels


class BandKey(beam.PTransform):
  """Signature batches → ``(shard, (keys uint64[m], ids int64[m], digests
  uint64[m]))``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values), sent with the digest of its whole signature (what
  :class:`FindCandidates` collapses identical documents by in large
  buckets). Keys are routed to ``config.lsh_shards`` shards by their high
  bits. Returns ``{"keys", "counts"}``.
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
    digests = np.repeat(lsh_kernels.signature_digests(sigs, c.seed), c.bands)
    ids = np.repeat(ids, c.bands)
    shards = list(lsh_kernels.split_by_shard(
        lsh_kernels.shard_of(keys, c.lsh_shards), keys, ids, digests))
    self._meter.stop()
    self._meter.done(len(sigs))
    yield metrics.shuffled("band_keys",
                           keys.nbytes + ids.nbytes + digests.nbytes)
    for shard, parts in shards:
      yield shard, tuple(parts)

  def finish_bundle(self):
    return self._meter.flush()


class FindCandidates(beam.PTransform):
  """Band-key shards → distinct candidate edge batches.

  A bucket (documents sharing a band key) of k <= ``config.
  exhaustive_bucket_size`` members yields all its k(k-1)/2 pairs, so the
  verified graph holds every pair of it that passes verification. A larger
  bucket costs at most k * ``config.bucket_hubs`` pairs (see
  :func:`~transforms.kernels.lsh.bucket_pairs`). Pairs go to the edge shard
  of their bucket's smallest id (so a bucket's pairs are verified, and
  reduced to a spanning forest, in one place); a pair found in several
  buckets of that shard is kept once. Returns ``{"edges", "counts"}``
  (``buckets_multi``, ``buckets_large``, ``candidate_edges``).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, band_keys):
    found = (band_keys
             | "GroupByShard" >> beam.GroupByKey()
             | "CollideInShard" >> beam.ParDo(
                 _CollideFn(self._config)).with_outputs(
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

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._bucket_sizes = metrics.distribution("bucket_size")
    self._meter = metrics.StageMeter("collision", "band keys")

  def process(self, element):
    _, parts = element
    c = self._config
    self._meter.start()
    keys, ids, digests = concat_arrays(parts)
    found = lsh_kernels.bucket_pairs(keys, ids, digests,
                                     c.exhaustive_bucket_size, c.bucket_hubs)
    batches = list(lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(found.anchor, c.lsh_shards), found.src,
        found.dst))
    self._meter.stop()
    self._meter.done(len(keys))
    sizes = found.sizes
    if len(sizes):
      yield metrics.count_tag("buckets_multi", len(sizes))
      yield from metrics.histogram_tags(metrics.BUCKET_SIZES, sizes)
      self._bucket_sizes.update(int(sizes.max()))
    if found.large:
      yield metrics.count_tag("buckets_large", found.large)
    if len(found.src):
      yield metrics.shuffled("candidate_edges",
                             found.src.nbytes + found.dst.nbytes)
      for shard, (src, dst) in batches:
        yield shard, (src, dst)

  def finish_bundle(self):
    return self._meter.flush()


def concat_arrays(parts):
  """Tuples of arrays → one tuple of the concatenated arrays."""
  columns = None
  for part in parts:
    if columns is None:
      columns = [[] for _ in part]
    for column, array in zip(columns, part):
      column.append(array)
  return tuple(np.concatenate(column) for column in columns)


@beam.typehints.with_output_types(Tuple[int, Any])
class _DistinctFn(beam.DoFn):

  def process(self, element):
    shard, parts = element
    src, dst = lsh_kernels.distinct_edges(*concat_arrays(parts))
    yield metrics.count_tag("candidate_edges", len(src))
    yield shard, (src, dst)


def forest_batch(shard, src, dst, similarity):
  """The verified edge batch ``(shard, (src, dst, similarity))`` of one
  shard's edges that passed: only a maximum-similarity spanning forest of
  them (real edges, the same connected components, at most nodes - 1 edges
  however dense the buckets were), with its ``graph_edges`` count."""
  keep = graph_kernels.spanning_forest(src, dst, similarity)
  yield metrics.count_tag("graph_edges", int(keep.sum()))
  yield shard, (src[keep], dst[keep], similarity[keep])


class ReduceUnverified(beam.PTransform):
  """Candidate edge batches → verified edge batches without verification
  (``--verify none``): every candidate passes, similarity unknown (NaN).
  Returns ``{"edges", "counts"}``."""

  def expand(self, edges):
    out = edges | "SpanningForest" >> beam.ParDo(
        _ReduceFn()).with_outputs(metrics.COUNTS, main="edges")
    return {"edges": out.edges, "counts": out[metrics.COUNTS]}


@beam.typehints.with_output_types(Tuple[int, Any])
class _ReduceFn(beam.DoFn):

  def process(self, element):
    shard, (src, dst) = element
    yield metrics.count_tag("verified_edges", len(src))
    yield from forest_batch(shard, src, dst,
                            np.full(len(src), np.nan))


def explode_edges(element):
  """A verified edge batch as ``(src, dst)`` int pairs."""
  _, (src, dst, _) = element
  return zip(src.tolist(), dst.tolist())
