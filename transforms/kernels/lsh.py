"""Banding (LSH) kernels: the S-curve, parameter choice, band keys and
collision finding within a shard of band keys."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import numpy as np

from transforms.kernels import dispatch
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
                      fn_weight: float = 0.5,
                      min_candidate: Optional[float] = None) -> Tuple[int, int]:
  """(b, r) with b*r <= num_perm minimising the weighted error areas.

  With ``min_candidate``, only bandings whose P(candidate) at ``threshold``
  (and so at every higher similarity) reaches it are eligible; when none
  does, the one with the highest P(candidate) there is returned. Ties go to
  the smaller b*r (cheaper), then fewer bands.
  """
  best = None
  for bands in range(1, num_perm + 1):
    for rows in range(1, num_perm // bands + 1):
      short = 0.0
      if min_candidate is not None:
        short = max(0.0, min_candidate - float(collision_probability(
            threshold, bands, rows)))
      err = (fp_weight * false_positive_area(threshold, bands, rows)
             + fn_weight * false_negative_area(threshold, bands, rows))
      key = (round(short, 12), round(err, 12), bands * rows, bands)
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


def band_entries(signatures: np.ndarray, ids: np.ndarray, bands: int,
                 rows: int, seed: int, num_shards: int):
  """Yields ``(shard, [keys, ids])`` of a signature batch's band-key
  entries, shard by shard in shard order, entries in (document, band)
  order: the :func:`band_keys` of every document and band with the
  document's id, split by :func:`shard_of` as :func:`split_by_shard` splits
  them. Compiled, it is one pass.
  """
  sig = np.ascontiguousarray(signatures, dtype=np.uint32)
  ids = np.asarray(ids, dtype=np.int64)
  kernels = dispatch.compiled_kernels(sig.size)
  if kernels is None:
    keys = band_keys(sig, bands, rows, seed).ravel()
    yield from split_by_shard(shard_of(keys, num_shards), keys,
                              np.repeat(ids, bands))
    return
  band_ids = np.arange(bands, dtype=np.uint64)
  band_starts = fmix64(band_ids * GOLDEN ^ np.uint64(seed))
  keys, entry_ids, bounds = kernels.band_entries(sig, ids, rows, band_starts,
                                                 num_shards)
  for shard in np.flatnonzero(np.diff(bounds)).tolist():
    lo, hi = bounds[shard], bounds[shard + 1]
    yield shard, [keys[lo:hi], entry_ids[lo:hi]]


class BucketPairs(NamedTuple):
  """Candidate pairs of one shard of band keys, and the members of its
  buckets above the exhaustive size.

  ``src < dst``; ``anchor`` is the smallest id of the bucket that produced
  the pair (pairs are routed by it, so one bucket's pairs meet in one place).
  ``sizes`` holds the size of every bucket of two or more, ``large`` how
  many of them were above the exhaustive size; ``large_keys``,
  ``large_anchors`` and ``large_ids`` list those buckets' distinct members
  (one row per bucket and document, the bucket's key and smallest id), whose
  components verification finds
  (:mod:`~transforms.kernels.bucket_components`).
  """
  src: np.ndarray
  dst: np.ndarray
  anchor: np.ndarray
  sizes: np.ndarray
  large: int
  large_keys: np.ndarray
  large_anchors: np.ndarray
  large_ids: np.ndarray


def bucket_pairs(keys: np.ndarray, ids: np.ndarray, exhaustive: int
                 ) -> BucketPairs:
  """Candidate pairs of one shard of ``(band key, doc id)`` entries.

  A bucket (run of equal keys) of k <= ``exhaustive`` distinct documents
  yields all k(k-1)/2 pairs, so every pair of it that passes verification
  is an edge; pairs repeated across buckets of the same anchor are emitted
  once. A larger bucket yields no pair here: its members are returned.
  """
  keys = np.asarray(keys, dtype=np.uint64)
  ids = np.asarray(ids, dtype=np.int64)
  # Most keys are alone in their bucket (97.5% of a shard's at 1M seed-style
  # documents) and yield nothing: only the entries whose key repeats are
  # sorted by (key, id) (such a 500k-entry shard: 175 → 36 ms).
  repeats = repeated(keys)
  keys, ids = keys[repeats], ids[repeats]
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
    return BucketPairs(empty, empty, empty, empty, 0,
                       np.zeros(0, dtype=np.uint64), empty, empty)
  starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
  sizes = np.diff(np.r_[starts, n])
  small = (sizes >= 2) & (sizes <= exhaustive)
  src, dst = run_pairs(ids, starts[small], sizes[small])
  anchor = np.repeat(ids[starts[small]],
                     sizes[small] * (sizes[small] - 1) // 2)
  # The same pair from several buckets of one anchor is one candidate.
  order = np.lexsort((dst, src, anchor))
  src, dst, anchor = src[order], dst[order], anchor[order]
  fresh = np.ones(len(src), dtype=bool)
  fresh[1:] = ((anchor[1:] != anchor[:-1]) | (src[1:] != src[:-1])
               | (dst[1:] != dst[:-1]))
  large = sizes > exhaustive
  members = ranges(starts[large], sizes[large])
  return BucketPairs(src[fresh], dst[fresh], anchor[fresh],
                     sizes[sizes >= 2], int(large.sum()), keys[members],
                     np.repeat(ids[starts[large]], sizes[large]),
                     ids[members])


def repeated(values: np.ndarray) -> np.ndarray:
  """Mask of the entries of the uint64 ``values`` whose value occurs more
  than once."""
  values = np.asarray(values, dtype=np.uint64)
  ordered = np.sort(values)
  again = ordered[1:][ordered[1:] == ordered[:-1]]
  if not len(again):
    return np.zeros(len(values), dtype=bool)
  kernels = dispatch.compiled_kernels(len(values))
  if kernels is None:
    return np.isin(values, again)
  return kernels.occurs_in(values, np.unique(again))


def run_pairs(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray
              ) -> Tuple[np.ndarray, np.ndarray]:
  """All pairs ``(values[i], values[j])``, i < j, within each run
  ``[start, start + size)`` of ``values`` (sorted runs give first < second).
  """
  starts = np.asarray(starts, dtype=np.int64)
  sizes = np.asarray(sizes, dtype=np.int64)
  empty = np.zeros(0, dtype=values.dtype)
  if not len(starts):
    return empty, empty
  position = ranges(starts, sizes)
  run_end = np.repeat(starts + sizes, sizes)
  later = run_end - position - 1
  first = np.repeat(position, later)
  step = ranges(np.ones(len(later), dtype=np.int64), later)
  return values[first], values[first + step]


def ranges(starts, lengths) -> np.ndarray:
  """``start, start+1, ..., start+length-1`` for every (start, length),
  concatenated."""
  lengths = np.asarray(lengths, dtype=np.int64)
  total = int(lengths.sum())
  shift = np.repeat(np.asarray(starts, dtype=np.int64)
                    - (np.cumsum(lengths) - lengths), lengths)
  return shift + np.arange(total, dtype=np.int64)


def buckets_reaching(keys: np.ndarray, ids: np.ndarray,
                     min_id: int) -> np.ndarray:
  """Mask of the rows whose bucket (key) holds an id >= ``min_id``: the
  buckets a run against an index must collide (the others hold indexed
  documents only)."""
  return np.isin(keys, keys[ids >= min_id])


def node_shard(ids: np.ndarray, num_shards: int) -> np.ndarray:
  """Shard of each document id; ids are mixed first, so runs of
  consecutive ids spread over all shards."""
  mixed = fmix64(np.asarray(ids, dtype=np.int64).view(np.uint64))
  return shard_of(mixed, num_shards)


def split_by_shard(shards: np.ndarray, *arrays: np.ndarray):
  """Yields ``(shard, [array[rows of that shard] ...])`` for every shard
  present, in shard order; rows keep their relative order."""
  shards = np.asarray(shards)
  if not len(shards):
    return
  # A stable sort of 16-bit values is a radix sort: five times faster than
  # on int64 (measured on a batch's 131k band keys).
  narrow = (shards.astype(np.uint16) if 0 <= shards.min() and
            shards.max() < 1 << 16 else shards)
  order = np.argsort(narrow, kind="stable")
  shards = shards[order]
  arrays = [a[order] for a in arrays]
  bounds = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1], True])
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    yield int(shards[lo]), [a[lo:hi] for a in arrays]


def concat_arrays(parts):
  """Tuples of arrays (one tuple per batch) → one tuple of the concatenated
  columns: the inverse of :func:`split_by_shard` once its batches met.

  >>> concat_arrays([(np.array([1]), np.array([2])),
  ...                (np.array([3, 4]), np.array([5, 6]))])
  (array([1, 3, 4]), array([2, 5, 6]))
  """
  columns = None
  for part in parts:
    if columns is None:
      columns = [[] for _ in part]
    for column, array in zip(columns, part):
      column.append(array)
  return tuple(np.concatenate(column) for column in columns)


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
