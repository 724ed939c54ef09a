"""Banding (LSH) kernels: the S-curve, parameter choice, band keys and
collision finding within a shard of band keys."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from transforms.kernels.hashing import GOLDEN, fmix64

_GRID = np.linspace(0.0, 1.0, 2001)


def collision_probability(s, bands: int, rows: int):
  """P(a pair of Jaccard ``s`` shares at least one band) = 1-(1-s^r)^b."""
  return 1.0 - (1.0 - np.asarray(s, dtype=np.float64) ** rows) ** bands


def false_positive_area(threshold: float, bands: int, rows: int) -> float:
  """Integral of P(candidate) over similarities below ``threshold``."""
  s = _GRID[_GRID <= threshold]
  return float(np.trapezoid(collision_probability(s, bands, rows), s))


def false_negative_area(threshold: float, bands: int, rows: int) -> float:
  """Integral of P(not candidate) over similarities above ``threshold``."""
  s = _GRID[_GRID >= threshold]
  return float(np.trapezoid(1.0 - collision_probability(s, bands, rows), s))


def choose_bands_rows(threshold: float, num_perm: int, fp_weight: float = 0.5,
                      fn_weight: float = 0.5) -> Tuple[int, int]:
  """(b, r) with b*r <= num_perm minimising the weighted error areas.

  Ties go to the smaller b*r (cheaper), then fewer bands.
  """
  best = None
  for bands in range(1, num_perm + 1):
    for rows in range(1, num_perm // bands + 1):
      err = (fp_weight * false_positive_area(threshold, bands, rows)
             + fn_weight * false_negative_area(threshold, bands, rows))
      key = (round(err, 12), bands * rows, bands)
      if best is None or key < best[0]:
        best = (key, bands, rows)
  return best[1], best[2]


def min_equal_entries(threshold: float, num_perm: int) -> int:
  """Fewest equal signature entries (of ``num_perm``) whose fraction reaches
  ``threshold``; integer so the threshold is never lost to rounding."""
  return math.ceil(threshold * num_perm - 1e-9)


def detection_probability(s, bands: int, rows: int, num_perm: int,
                          min_equal: Optional[int] = None) -> np.ndarray:
  """P(a pair of Jaccard ``s`` becomes an edge of the duplicate graph).

  Without ``min_equal``: the candidate probability 1-(1-s^r)^b (what
  ``verify`` none, or exact for a pair at or above the threshold, keeps).
  With it: P(some band has all r entries equal AND at least ``min_equal`` of
  the ``num_perm`` entries are equal), the two events computed jointly (they
  share the signature), each entry equal independently with probability s.
  """
  s = np.atleast_1d(np.asarray(s, dtype=np.float64))
  if min_equal is None:
    return collision_probability(s, bands, rows)
  uniq, inverse = np.unique(s, return_inverse=True)
  out = np.array([_detect_one(float(x), bands, rows, num_perm, min_equal)
                  for x in uniq])
  return out[inverse.ravel()]


def _detect_one(s, bands, rows, num_perm, min_equal):
  band = _binomial(rows, s)
  # miss[c] / hit[c]: P(c equal entries so far and no band / some band full).
  miss, hit = np.ones(1), np.zeros(1)
  for _ in range(bands):
    full = np.zeros(len(miss) + rows)
    full[rows:] = miss * band[rows]
    hit = np.convolve(hit, band) + full
    miss = np.r_[np.convolve(miss, band[:rows]), 0.0]
  hit = np.convolve(hit, _binomial(num_perm - bands * rows, s))
  return float(hit[min_equal:].sum())


def _binomial(n, p):
  k = np.arange(n + 1)
  if p <= 0.0 or p >= 1.0:
    return (k == (n if p >= 1.0 else 0)).astype(np.float64)
  logc = np.array([math.lgamma(n + 1) - math.lgamma(i + 1)
                   - math.lgamma(n - i + 1) for i in k])
  return np.exp(logc + k * np.log(p) + (n - k) * np.log1p(-p))


def band_keys(signatures: np.ndarray, bands: int, rows: int,
              seed: int) -> np.ndarray:
  """Stable 64-bit key per (document, band): uint64 ``(n_docs, bands)``.

  The key hashes the band index together with the band's r values, so equal
  values in different bands never share a bucket.
  """
  sig = np.asarray(signatures, dtype=np.uint32)
  n = sig.shape[0]
  band_ids = np.arange(bands, dtype=np.uint64)
  h = np.broadcast_to(fmix64(band_ids * GOLDEN ^ np.uint64(seed)),
                      (n, bands)).copy()
  block = sig[:, :bands * rows].reshape(n, bands, rows).astype(np.uint64)
  for j in range(rows):
    h = fmix64((h ^ block[:, :, j]) * GOLDEN)
  return h


def shard_of(keys: np.ndarray, num_shards: int) -> np.ndarray:
  """Shard index of each key, from its high bits (uniform for mixed keys)."""
  return ((np.asarray(keys, dtype=np.uint64) >> np.uint64(32))
          % np.uint64(num_shards)).astype(np.int64)


def star_edges(keys: np.ndarray, ids: np.ndarray
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Candidate edges of one shard of (band key, doc id) entries.

  For every bucket (run of equal keys) with at least two distinct documents,
  emits star edges from the bucket's smallest id to each other member, never
  all pairs. Returns ``(src, dst, bucket_sizes)`` with src < dst, edges
  de-duplicated and sorted, and the size of every bucket of two or more.
  """
  keys = np.asarray(keys, dtype=np.uint64)
  ids = np.asarray(ids, dtype=np.int64)
  order = np.lexsort((ids, keys))
  keys, ids = keys[order], ids[order]
  if len(keys):
    # A document listed twice in one bucket counts once.
    fresh = np.ones(len(keys), dtype=bool)
    fresh[1:] = (keys[1:] != keys[:-1]) | (ids[1:] != ids[:-1])
    keys, ids = keys[fresh], ids[fresh]
  n = len(keys)
  empty = np.zeros(0, dtype=np.int64)
  if n < 2:
    return empty, empty, empty
  starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
  sizes = np.diff(np.r_[starts, n])
  run_of = np.repeat(np.arange(len(starts)), sizes)
  center = ids[starts][run_of]
  member = ids != center
  src, dst = distinct_edges(center[member], ids[member])
  return src, dst, sizes[sizes >= 2]


def node_shard(ids: np.ndarray, num_shards: int) -> np.ndarray:
  """Shard of each document id; ids are mixed first, so runs of
  consecutive ids spread over all shards."""
  mixed = fmix64(np.asarray(ids, dtype=np.int64).view(np.uint64))
  return shard_of(mixed, num_shards)


def split_by_shard(shards: np.ndarray, *arrays: np.ndarray):
  """Yields ``(shard, [array[rows of that shard] ...])`` for every shard
  present, in shard order; rows keep their relative order."""
  if not len(shards):
    return
  order = np.argsort(shards, kind="stable")
  shards = shards[order]
  arrays = [a[order] for a in arrays]
  bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    yield int(shards[lo]), [a[lo:hi] for a in arrays]


def distinct_edges(src: np.ndarray, dst: np.ndarray
                   ) -> Tuple[np.ndarray, np.ndarray]:
  """The distinct (src, dst) pairs, sorted by src then dst."""
  src = np.asarray(src, dtype=np.int64)
  dst = np.asarray(dst, dtype=np.int64)
  order = np.lexsort((dst, src))
  src, dst = src[order], dst[order]
  fresh = np.ones(len(src), dtype=bool)
  fresh[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
  return src[fresh], dst[fresh]


def rows_of(sorted_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
  """Positions of ``wanted`` ids in the sorted, unique ``sorted_ids``;
  raises ``KeyError`` naming an id that is absent."""
  wanted = np.asarray(wanted, dtype=np.int64)
  if not len(sorted_ids):
    if len(wanted):
      raise KeyError(f"document id {int(wanted[0])} is not among the given ids")
    return np.zeros(0, dtype=np.int64)
  rows = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
  missing = sorted_ids[rows] != wanted
  if np.any(missing):
    raise KeyError(f"document id {int(wanted[missing][0])} is not among the given ids")
  return rows
