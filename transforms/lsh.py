"""BandKey → GroupByKey collision → candidate edges → verification."""

from __future__ import annotations

import math

from typing import Any, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.config import DedupConfig
from transforms.kernels import lsh as lsh_kernels

_MAX_BATCH = 4096


class BandKey(beam.PTransform):
  """``(doc_id, signature)`` → ``{"keys": (shard, (keys uint64[m], ids
  int64[m])), "counts"}``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values). Keys are routed to ``config.lsh_shards`` shards by
  their high bits and shipped as numpy arrays, one element per (batch, shard),
  so the shuffle moves a few large elements instead of one per (doc, band).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signatures):
    keyed = (signatures
             | "BatchSignatures" >> beam.BatchElements(
                 max_batch_size=_MAX_BATCH)
             | "ComputeBandKeys" >> beam.ParDo(
                 _BandKeyFn(self._config)).with_outputs(metrics.COUNTS,
                                                        main="keys"))
    return {"keys": keyed.keys, "counts": keyed[metrics.COUNTS]}


@beam.typehints.with_output_types(Tuple[int, Any])
class _BandKeyFn(beam.DoFn):

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    self._meter = metrics.StageMeter("band_keys", "documents")

  def process(self, batch):
    c = self._config
    self._meter.start()
    ids = np.fromiter((doc_id for doc_id, _ in batch), dtype=np.int64,
                      count=len(batch))
    sigs = np.stack([sig for _, sig in batch])
    keys = lsh_kernels.band_keys(sigs, c.bands, c.rows, c.seed).ravel()
    ids = np.repeat(ids, c.bands)
    shards = lsh_kernels.shard_of(keys, c.lsh_shards)
    order = np.argsort(shards, kind="stable")
    shards, keys, ids = shards[order], keys[order], ids[order]
    bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
    self._meter.stop()
    self._meter.done(len(batch))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
      yield int(shards[lo]), (keys[lo:hi], ids[lo:hi])

  def finish_bundle(self):
    return self._meter.flush()


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
    self._meter = metrics.StageMeter("collision", "band keys")

  def process(self, element):
    _, parts = element
    keys, ids = [], []
    for part_keys, part_ids in parts:
      keys.append(part_keys)
      ids.append(part_ids)
    self._meter.start()
    keys = np.concatenate(keys)
    src, dst, sizes = lsh_kernels.star_edges(keys, np.concatenate(ids))
    self._meter.stop()
    self._meter.done(len(keys))
    if len(sizes):
      yield metrics.count_tag("buckets_multi", len(sizes))
      yield from metrics.histogram_tags(metrics.BUCKET_SIZES, sizes)
      self._bucket_sizes.update(int(sizes.max()))
    for a, b in zip(src.tolist(), dst.tolist()):
      yield a, b

  def finish_bundle(self):
    return self._meter.flush()


class VerifyEdges(beam.PTransform):
  """Keeps candidate edges whose estimated Jaccard is >= the threshold.

  Joins each edge with both endpoints' signatures (two keyed joins: only the
  signatures, never the documents, move). Returns ``{"edges", "counts"}``
  with the ``verified_edges`` count.
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, inputs):
    edges, signatures = inputs["edges"], inputs["signatures"]
    by_dst = edges | "KeyByDst" >> beam.Map(lambda e: (e[1], e[0]))
    halves = ({"sig": signatures, "edge": by_dst}
              | "JoinDstSignature" >> beam.CoGroupByKey()
              | "AttachDstSignature" >> beam.FlatMap(_attach_dst_signature))
    compared = ({"sig": signatures, "half": halves}
                | "JoinSrcSignature" >> beam.CoGroupByKey()
                | "CompareSignatures" >> beam.ParDo(
                    _CompareFn(self._config)).with_outputs(metrics.COUNTS,
                                                           main="edges"))
    verified = compared.edges
    counts = ((compared[metrics.COUNTS],
               verified | "CountVerified" >> metrics.CountAs("verified_edges"))
              | "FlattenCounts" >> beam.Flatten())
    return {"edges": verified, "counts": counts}


def _attach_dst_signature(element):
  dst, grouped = element
  sig = next(iter(grouped["sig"]), None)
  if sig is None:
    return
  for src in grouped["edge"]:
    yield src, (dst, sig)


@beam.typehints.with_output_types(Tuple[int, int])
class _CompareFn(beam.DoFn):
  """Emits ``(src, dst)`` when the signatures agree on enough entries."""

  def __init__(self, config: DedupConfig):
    self._config = config

  def setup(self):
    k = self._config.num_perm
    # Integer comparison avoids float rounding at the threshold.
    self._min_equal = math.ceil(self._config.threshold * k - 1e-9)
    self._similarity = metrics.distribution("verified_similarity_permille")
    self._rejected = metrics.counter("edges_below_threshold")
    self._meter = metrics.StageMeter("verification", "candidate edges")

  def process(self, element):
    src, grouped = element
    sig = next(iter(grouped["sig"]), None)
    if sig is None:
      return
    passed, checked = [], 0
    self._meter.start()
    for dst, dst_sig in grouped["half"]:
      checked += 1
      equal = int(np.count_nonzero(sig == dst_sig))
      if equal >= self._min_equal:
        self._similarity.update(1000 * equal // len(sig))
        passed.append(dst)
      else:
        self._rejected.inc()
    self._meter.stop()
    self._meter.done(checked)
    for dst in passed:
      yield src, dst

  def finish_bundle(self):
    return self._meter.flush()
