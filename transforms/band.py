"""BandKey: signature batches → band-key shards and signature digests (Band,
the step before :mod:`transforms.collide`).

Keys move as numpy arrays, one element per (batch, shard): the shuffle
carries a few large elements, never one per (document, band).

* in: :class:`~transforms.elements.SignatureBatch` (from
  :mod:`transforms.sign`)
* out: ``(shard, KeyShard)`` (:class:`~transforms.elements.KeyShard`) and
  ``(node shard, DigestBatch)`` (:class:`~transforms.elements.DigestBatch`)
"""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import (DigestBatch, KeyShard, RouteByShard,
                                 SignatureBatch)
from transforms.kernels import lsh as lsh_kernels


@beam.typehints.with_input_types(SignatureBatch)
class BandKey(beam.PTransform):
  """Signature batches → ``(shard, KeyShard)`` and ``(node shard,
  DigestBatch)``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values); keys are routed to ``config.lsh_shards`` shards by
  their high bits. The digest of each whole signature (what
  :class:`~transforms.collide.FindCandidates` collapses identical documents
  by in buckets above the exhaustive size) travels once per document, to
  the document's node shard (:class:`RouteDigests`), not with each of its
  band keys: 16 bytes a document instead of 8 a band key.

  Args:
    config: ``bands``, ``rows``, ``seed`` and ``lsh_shards``.

  Returns:
    ``{"keys": (shard, KeyShard), "digests": (node shard, DigestBatch),
    "counts"}`` (``shuffle_bytes``).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signature_batches):
    out = signature_batches | "ComputeBandKeys" >> beam.ParDo(
        _BandKeyFn(self._config)).with_outputs(metrics.COUNTS, main="keys")
    digests = signature_batches | "RouteDigests" >> RouteDigests(self._config)
    return {"keys": out.keys, "digests": digests["digests"],
            "counts": (out[metrics.COUNTS], digests["counts"])}


@beam.typehints.with_input_types(SignatureBatch)
class RouteDigests(beam.PTransform):
  """Signature batches → ``(node shard, DigestBatch)``: each document's
  whole-signature digest, in the shard of its id
  (:func:`~transforms.kernels.lsh.node_shard` over ``config.lsh_shards``),
  one batch per shard and bundle.

  Args:
    config: ``seed`` and ``lsh_shards``.

  Returns:
    ``{"digests", "counts"}`` (``shuffle_bytes``).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signature_batches):
    out = signature_batches | "DigestSignatures" >> beam.ParDo(
        _DigestFn(self._config)).with_outputs(metrics.COUNTS, main="digests")
    return {"digests": out.digests, "counts": out[metrics.COUNTS]}


@beam.typehints.with_output_types(Tuple[int, KeyShard])
class _BandKeyFn(metrics.MeteredDoFn):

  STAGE = "band_keys"

  def __init__(self, config: DedupConfig):
    self._config = config

  def process(self, batch):
    c = self._config
    ids, sigs = batch
    with self.meter.timed():
      shards = [(shard, KeyShard.of(*parts)) for shard, parts in
                lsh_kernels.band_entries(sigs, ids, c.bands, c.rows, c.seed,
                                         c.lsh_shards)]
    self.meter.done(len(sigs))
    # Per entry (an element's 8-byte id base aside).
    yield metrics.shuffled("band_keys", sum(
        p.keys.nbytes + p.id_offsets.nbytes for _, p in shards))
    yield from shards


@beam.typehints.with_output_types(Tuple[int, DigestBatch])
class _DigestFn(RouteByShard):

  OUTPUT = DigestBatch

  def __init__(self, config: DedupConfig):
    super().__init__(config.lsh_shards)
    self._seed = config.seed

  def process(self, batch):
    ids, sigs = batch
    ids = ids.astype("int64", copy=False)
    digests = lsh_kernels.signature_digests(sigs, self._seed)
    yield metrics.shuffled("digests", ids.nbytes + digests.nbytes)
    yield from self.outputs.add_rows(
        lsh_kernels.node_shard(ids, self._shards), ids, digests)
