"""FindCandidates: band-key shards → GroupByKey collision → distinct
candidate edge batches (Collide; verified next in :mod:`transforms.verify`).

* in: ``(shard, KeyShard)`` from :mod:`transforms.band`
* out: ``(edge shard, EdgeBatch)`` (:class:`~transforms.elements.EdgeBatch`,
  src < dst);
  candidate pairs are in the shard (:func:`lsh_kernels.node_shard`) of the
  smallest id of the bucket that found them
"""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import EdgeBatch, KeyShard, ShardOutputs, key_columns
from transforms.kernels import lsh as lsh_kernels


@beam.typehints.with_input_types(Tuple[int, KeyShard])
class FindCandidates(beam.PTransform):
  """Band-key shards → distinct candidate edge batches.

  A bucket (documents sharing a band key) of k <= ``config.
  exhaustive_bucket_size`` members yields all its k(k-1)/2 pairs, so the
  verified graph holds every pair of it that passes verification. A larger
  bucket costs at most k * ``config.bucket_hubs`` pairs (see
  :func:`~transforms.kernels.lsh.bucket_pairs`). Pairs go to the edge shard
  of their bucket's smallest id (so a bucket's pairs are verified, and
  reduced to a spanning forest, in one place); a pair found in several
  buckets of that shard is kept once.

  Against an index (``first_new_id`` given: indexed documents have lower
  ids), only buckets holding a new document are collided, whole, and pairs
  of two indexed documents are dropped.

  Args:
    config: ``exhaustive_bucket_size``, ``bucket_hubs`` and ``lsh_shards``.
    first_new_id: the lowest id of a new document, or None.

  Returns:
    ``{"edges": (edge shard, EdgeBatch), "counts"}`` (``buckets_multi``,
    ``buckets_large``, ``candidate_edges``, the bucket size histogram).
  """

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    super().__init__()
    self._config = config
    self._first_new_id = first_new_id

  def expand(self, band_keys):
    found = (band_keys
             | "GroupByShard" >> beam.GroupByKey()
             | "CollideInShard" >> beam.ParDo(
                 _CollideFn(self._config, self._first_new_id)).with_outputs(
                     metrics.COUNTS, main="edges"))
    distinct = (found.edges
                | "GroupEdges" >> beam.GroupByKey()
                | "DistinctEdges" >> beam.ParDo(_DistinctFn()).with_outputs(
                    metrics.COUNTS, main="edges"))
    return {"edges": distinct.edges,
            "counts": (found[metrics.COUNTS], distinct[metrics.COUNTS])}


@beam.typehints.with_output_types(Tuple[int, EdgeBatch])
class _CollideFn(metrics.MeteredDoFn):

  STAGE = "collision"

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    self._config = config
    self._first_new_id = first_new_id

  def setup(self):
    super().setup()
    self._bucket_sizes = metrics.distribution("bucket_size")
    # Every band-key shard finds pairs for every edge shard.
    self._outputs = ShardOutputs(EdgeBatch)

  def finish_bundle(self):
    return self._outputs.flush() + super().finish_bundle()

  def process(self, element):
    _, parts = element
    c = self._config
    with self.meter.timed():
      keys, ids, digests = key_columns(parts)
      if self._first_new_id is not None:
        reach = lsh_kernels.buckets_reaching(keys, ids, self._first_new_id)
        keys, ids, digests = keys[reach], ids[reach], digests[reach]
      found = lsh_kernels.bucket_pairs(keys, ids, digests,
                                       c.exhaustive_bucket_size, c.bucket_hubs)
      if self._first_new_id is not None:
        new = found.dst >= self._first_new_id
        found = found._replace(src=found.src[new], dst=found.dst[new],
                               anchor=found.anchor[new])
      shards = lsh_kernels.node_shard(found.anchor, c.lsh_shards)
    self.meter.done(len(keys))
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
      yield from self._outputs.add_rows(shards, found.src, found.dst)


@beam.typehints.with_output_types(Tuple[int, EdgeBatch])
class _DistinctFn(beam.DoFn):

  def process(self, element):
    shard, parts = element
    src, dst = lsh_kernels.distinct_edges(*lsh_kernels.concat_arrays(parts))
    yield metrics.count_tag("candidate_edges", len(src))
    yield shard, EdgeBatch(src, dst)
