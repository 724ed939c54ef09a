"""BandKey: signature batches → band-key shards (Band, the step before
:mod:`transforms.collide`).

Keys move as numpy arrays, one element per (batch, shard): the shuffle
carries a few large elements, never one per (document, band).

* in: :class:`~transforms.elements.SignatureBatch` (from
  :mod:`transforms.sign`)
* out: ``(shard, KeyShard)`` (:class:`~transforms.elements.KeyShard`)
"""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam

from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import KeyShard, SignatureBatch
from transforms.kernels import lsh as lsh_kernels


@beam.typehints.with_input_types(SignatureBatch)
class BandKey(beam.PTransform):
  """Signature batches → ``(shard, KeyShard)``.

  Each document gets one stable 64-bit key per band (hash of band index and
  the band's r values); keys are routed to ``config.lsh_shards`` shards by
  their high bits.

  Args:
    config: ``bands``, ``rows``, ``seed`` and ``lsh_shards``.

  Returns:
    ``{"keys": (shard, KeyShard), "counts"}`` (``shuffle_bytes``).
  """

  def __init__(self, config: DedupConfig):
    super().__init__()
    self._config = config

  def expand(self, signature_batches):
    out = signature_batches | "ComputeBandKeys" >> beam.ParDo(
        _BandKeyFn(self._config)).with_outputs(metrics.COUNTS, main="keys")
    return {"keys": out.keys, "counts": (out[metrics.COUNTS],)}


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
