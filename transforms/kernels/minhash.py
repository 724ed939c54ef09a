"""MinHash signatures: classic K-permutation MinHash and one-permutation
hashing (OPH), both as uint32 ``(n_docs, K)`` rows compared entry by entry.

Classic scheme (``MINHASH_SCHEME``): a shingle's 64-bit hash x is reduced to
its low 32 bits x32, and permutation i maps it to

    h_i(x) = ((a_i * x32 + b_i) mod 2**64) >> 32

with a_i, b_i uniform 64-bit values drawn from PCG64 seeded by the config's
seed. This is Dietzfelbinger's multiply-add-shift family, 2-independent on
32-bit keys; the mod 2**64 is exactly what uint64 arithmetic computes, so there
is no silent overflow (unlike ``(a*x+b) mod (2**61-1)`` evaluated in uint64).
A signature is the K per-permutation minima as uint32. Cost O(n K).

OPH scheme (``OPH_SCHEME``): each shingle is hashed once, h = fmix64(x ^ k1);
its bin is ``((h >> 32) * K) >> 32`` and its value ``h mod 2**32``; a bin
keeps its minimum value. An empty bin i is filled by optimal densification
(Shrivastava, ICML 2017): it copies the value of the first non-empty bin
among ``p(i, 1), p(i, 2), ...`` with ``p(i, t) = ((fmix64(k2 ^ (i << 32 | t))
>> 32) * K) >> 32``. k1, k2 come from PCG64 seeded by the config's seed, so
every worker probes identically. Each entry of two signatures agrees with
probability (about) their Jaccard similarity, also for documents with fewer
shingles than bins. Cost O(n + K) per document (plus the probes of empty
bins, K/m each when m bins are non-empty).
"""

from __future__ import annotations

import functools
from typing import Tuple

import numpy as np

from transforms.kernels import dispatch
from transforms.kernels.hashing import fmix64, seeded_uint64

MINHASH_SCHEME = "multiply-add-shift-u32-v1"
OPH_SCHEME = "oph-fmix64-optimal-densification-v1"
SKETCH_SCHEMES = {"classic": MINHASH_SCHEME, "oph": OPH_SCHEME}
_NO_PERMUTATIONS = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64))
_MASK32 = np.uint64(0xFFFFFFFF)
_EMPTY = np.uint64(1 << 32)  # above every 32-bit value: marks an empty bin
# Bounds the (shingle, permutation) matrix the pure classic path builds.
_PURE_CHUNK = 1 << 20


def permutations(num_perm: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """The (a, b) coefficients of the K permutations; identical on every
  worker for the same seed."""
  return seeded_uint64(seed, num_perm, 1), seeded_uint64(seed, num_perm, 2)


@functools.lru_cache(maxsize=16)
def oph_keys(seed: int) -> Tuple[np.uint64, np.uint64]:
  """OPH's hash key k1 and probe key k2; identical on every worker."""
  return seeded_uint64(seed, 1, 3)[0], seeded_uint64(seed, 1, 4)[0]


def minhash_batch(shingles: np.ndarray, offsets: np.ndarray, a: np.ndarray,
                  b: np.ndarray) -> np.ndarray:
  """Classic MinHash signatures of a batch of documents in the flat layout.

  ``shingles``: uint64 hashes of all documents concatenated; ``offsets``:
  int64, document i owns ``shingles[offsets[i]:offsets[i+1]]`` and every
  document must own at least one shingle. Returns uint32 ``(n_docs, K)``.
  """
  return _sketch(shingles, offsets, len(a), a, b, False, 0)


def oph_batch(shingles: np.ndarray, offsets: np.ndarray, num_perm: int,
              seed: int) -> np.ndarray:
  """One-permutation-hashing signatures (``OPH_SCHEME``) of a batch in the
  layout of :func:`minhash_batch`; uint32 ``(n_docs, num_perm)``."""
  a, b = _NO_PERMUTATIONS
  return _sketch(shingles, offsets, num_perm, a, b, True, seed)


def _sketch(shingles, offsets, k, a, b, oph, seed):
  offsets = np.ascontiguousarray(offsets, dtype=np.int64)
  n_docs = len(offsets) - 1
  if n_docs and np.any(np.diff(offsets) <= 0):
    raise ValueError("every document needs at least one shingle")
  out = np.empty((n_docs, k), dtype=np.uint32)
  if n_docs:
    sketch(np.ascontiguousarray(shingles, dtype=np.uint64), offsets, k,
           np.ascontiguousarray(a, np.uint64),
           np.ascontiguousarray(b, np.uint64), oph, seed, out)
  return out


def sketch(shingles: np.ndarray, offsets: np.ndarray, k: int, a: np.ndarray,
           b: np.ndarray, oph: bool, seed: int, out: np.ndarray) -> None:
  """Writes the signature rows of the documents
  ``shingles[offsets[i]:offsets[i+1]]`` into ``out`` (uint32 ``(n, k)``):
  classic MinHash with ``(a, b)`` (uint64, contiguous), or OPH keyed by
  ``seed`` (``oph``). A document with no shingles gets an all-``0xFFFFFFFF``
  row. Compiled or numpy, as :mod:`~transforms.kernels.dispatch` picks.
  """
  kernels = dispatch.compiled_kernels(len(shingles) * k)
  if kernels is not None:
    kernels.sketch_rows(shingles, offsets, 0, np.uint64(seed), oph, a, b,
                        *oph_keys(seed), out)
    return
  out[:] = 0xFFFFFFFF
  sizes = np.diff(offsets)
  filled = np.flatnonzero(sizes > 0)
  if not len(filled):
    return
  doc = np.repeat(np.arange(len(sizes)), sizes)
  if oph:
    _oph_rows(shingles, doc, filled, k, seed, out)
  else:
    _classic_rows(shingles, offsets, filled, a, b, out)


def _classic_rows(shingles, offsets, filled, a, b, out):
  """The numpy classic sketch: per-document minima of ``(a x32 + b) >> 32``
  over chunks of documents, the matrix at most ``_PURE_CHUNK`` entries."""
  per_chunk = max(1, _PURE_CHUNK // max(1, len(a)))
  lo = 0
  while lo < len(filled):
    # Documents filled[lo:hi] own shingles[first:last].
    hi = lo + 1
    while (hi < len(filled) and offsets[filled[hi] + 1] - offsets[filled[lo]]
           <= per_chunk):
      hi += 1
    first, last = offsets[filled[lo]], offsets[filled[hi - 1] + 1]
    x = shingles[first:last] & _MASK32
    with np.errstate(over="ignore"):
      h = (x[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)
    starts = offsets[filled[lo:hi]] - first
    out[filled[lo:hi]] = np.minimum.reduceat(h, starts, axis=0)
    lo = hi


def _oph_rows(shingles, doc, filled, k, seed, out):
  """The numpy OPH sketch: bins keep their minimum, then every empty bin of
  a non-empty document walks its probe sequence (``_probe_bins``) until it
  reaches a non-empty bin, all empty bins one probe at a time."""
  oph_key, probe_key = oph_keys(seed)
  with np.errstate(over="ignore"):
    h = fmix64(shingles ^ oph_key)
  slot = _bin_of(h, k)
  rows = np.full((len(out), k), _EMPTY, dtype=np.uint64)
  np.minimum.at(rows, (doc, slot), h & _MASK32)
  rows = rows[filled]
  empty_doc, empty_bin = np.nonzero(rows == _EMPTY)
  found = rows.copy()
  attempt = 1
  while len(empty_doc):
    source = _probe_bins(probe_key, empty_bin, attempt, k)
    value = rows[empty_doc, source]
    hit = value != _EMPTY
    found[empty_doc[hit], empty_bin[hit]] = value[hit]
    empty_doc, empty_bin = empty_doc[~hit], empty_bin[~hit]
    attempt += 1
  out[filled] = found


def _probe_bins(probe_key, bins, attempt, k):
  """p(i, attempt) of every bin i: the bin it tries at that attempt."""
  with np.errstate(over="ignore"):
    h = fmix64(probe_key ^ ((bins.astype(np.uint64) << np.uint64(32))
                            | np.uint64(attempt)))
  return _bin_of(h, k)


def _bin_of(h, k):
  """The bin of each 64-bit hash among k: its high 32 bits scaled to k."""
  return (((h >> np.uint64(32)) * np.uint64(k)) >> np.uint64(32)).astype(
      np.int64)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
  """Fraction of equal signature entries (last axis); broadcasts."""
  return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)
