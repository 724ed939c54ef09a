"""FindCandidates: band-key shards → GroupByKey collision → distinct
candidate edge batches (Collide; verified next in :mod:`transforms.verify`).

* in: ``{"keys": (shard, KeyShard)}`` from :mod:`transforms.band`
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
from transforms.elements import (BucketMembers, EdgeBatch, ShardOutputs,
                                 key_columns)
from transforms.join import JoinByKey
from transforms.kernels import lsh as lsh_kernels


class FindCandidates(beam.PTransform):
  """Band-key shards → distinct candidate edge batches.

  A bucket (documents sharing a band key) of k <= ``config.
  exhaustive_bucket_size`` members yields all its k(k-1)/2 pairs, so the
  verified graph holds every pair of it that passes verification. A larger
  bucket yields its members instead, in the edge shard of its smallest id
  (so only the documents of such buckets are shuffled once more): verification
  finds the components that all its pairs would give with about k x
  (components) comparisons (:mod:`~transforms.kernels.bucket_components`);
  with ``verify`` none, where every pair passes, they are a star from the
  smallest id. Pairs go to the edge shard of their bucket's smallest id (so
  a bucket's pairs are verified, and reduced to a spanning forest, in one
  place); a pair found in several buckets is kept once.

  Against an index (``first_new_id`` given: indexed documents have lower
  ids), only buckets holding a new document are collided, whole, and pairs
  of two indexed documents are dropped.

  Args:
    config: ``exhaustive_bucket_size``, ``verify`` and ``lsh_shards``.
    first_new_id: the lowest id of a new document, or None.

  Returns:
    ``{"edges": (edge shard, EdgeBatch), "buckets": (edge shard,
    BucketMembers), "counts"}`` (``buckets_multi``, ``buckets_large``,
    ``candidate_edges``, the bucket size histogram); ``buckets`` is empty
    with ``verify`` none.
  """

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    super().__init__()
    self._config = config
    self._first_new_id = first_new_id

  def expand(self, inputs):
    c = self._config
    found = (inputs["keys"]
             | "GroupByShard" >> beam.GroupByKey()
             | "CollideInShard" >> beam.ParDo(
                 _CollideFn(c, self._first_new_id)).with_output_types(
                     Tuple[int, EdgeBatch],
                     **{_LARGE: Tuple[int, BucketMembers],
                        metrics.COUNTS: metrics.Count}).with_outputs(
                            metrics.COUNTS, _LARGE, main="edges"))
    distinct = ({"edges": found.edges, "large": found[_LARGE]}
                | "GroupEdges" >> JoinByKey()
                | "DistinctEdges" >> beam.ParDo(_DistinctFn(
                    c, self._first_new_id)).with_output_types(
                        Tuple[int, EdgeBatch],
                        **{_BUCKETS: Tuple[int, BucketMembers],
                           metrics.COUNTS: metrics.Count}).with_outputs(
                               metrics.COUNTS, _BUCKETS, main="edges"))
    return {"edges": distinct.edges, "buckets": distinct[_BUCKETS],
            "counts": (found[metrics.COUNTS], distinct[metrics.COUNTS])}


_LARGE = "large"
_BUCKETS = "buckets"


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
    self._large = ShardOutputs(BucketMembers)

  def finish_bundle(self):
    return (self._outputs.flush()
            + [beam.pvalue.TaggedOutput(_LARGE, out)
               for out in self._large.flush()]
            + super().finish_bundle())

  def process(self, element):
    _, parts = element
    c = self._config
    with self.meter.timed():
      keys, ids = key_columns(parts)
      if self._first_new_id is not None:
        reach = lsh_kernels.buckets_reaching(keys, ids, self._first_new_id)
        keys, ids = keys[reach], ids[reach]
      found = lsh_kernels.bucket_pairs(keys, ids, c.exhaustive_bucket_size)
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
      members = (found.large_keys, found.large_anchors, found.large_ids)
      yield metrics.shuffled("large_buckets", sum(m.nbytes for m in members))
      yield from (beam.pvalue.TaggedOutput(_LARGE, out) for out in
                  self._large.add_rows(lsh_kernels.node_shard(
                      found.large_anchors, c.lsh_shards), *members))
    if len(found.src):
      yield metrics.shuffled("candidate_edges",
                             found.src.nbytes + found.dst.nbytes)
      yield from self._outputs.add_rows(shards, found.src, found.dst)


class _DistinctFn(beam.DoFn):

  def __init__(self, config: DedupConfig, first_new_id: int = None):
    self._config = config
    self._first_new_id = first_new_id

  def process(self, element):
    shard, joined = element
    parts = list(joined["edges"])
    if joined["large"]:
      keys, anchors, ids = lsh_kernels.concat_arrays(joined["large"])
      if self._config.verify != "none":
        yield beam.pvalue.TaggedOutput(_BUCKETS, (shard, BucketMembers(
            keys, anchors, ids)))
      else:
        # Every pair passes: the bucket is one component, a star spans it.
        star = ids != anchors
        if self._first_new_id is not None:
          star &= ids >= self._first_new_id
        parts.append((anchors[star], ids[star]))
    if not parts:
      return
    src, dst = lsh_kernels.distinct_edges(*lsh_kernels.concat_arrays(parts))
    if not len(src):
      return
    yield metrics.count_tag("candidate_edges", len(src))
    yield shard, EdgeBatch(src, dst)
