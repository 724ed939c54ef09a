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

from transforms.kernels import compiled
from transforms.kernels.hashing import seeded_uint64

MINHASH_SCHEME = "multiply-add-shift-u32-v1"
OPH_SCHEME = "oph-fmix64-optimal-densification-v1"
SKETCH_SCHEMES = {"classic": MINHASH_SCHEME, "oph": OPH_SCHEME}
_NO_PERMUTATIONS = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64))


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
    compiled.sketch_rows(np.ascontiguousarray(shingles, dtype=np.uint64), offsets,
                    0, np.uint64(0), oph, np.ascontiguousarray(a, np.uint64),
                    np.ascontiguousarray(b, np.uint64), *oph_keys(seed), out)
  return out


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
  """Fraction of equal signature entries (last axis); broadcasts."""
  return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)
