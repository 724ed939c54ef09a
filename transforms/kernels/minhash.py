"""MinHash signatures with an exact, overflow-free permutation family.

Scheme (``MINHASH_SCHEME``): a shingle's 64-bit hash x is reduced to its low
32 bits x32, and permutation i maps it to

    h_i(x) = ((a_i * x32 + b_i) mod 2**64) >> 32

with a_i, b_i uniform 64-bit values drawn from PCG64 seeded by the config's
seed. This is Dietzfelbinger's multiply-add-shift family, 2-independent on
32-bit keys; the mod 2**64 is exactly what uint64 arithmetic computes, so there
is no silent overflow (unlike ``(a*x+b) mod (2**61-1)`` evaluated in uint64).
A signature is the K per-permutation minima as uint32.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from transforms.kernels.hashing import seeded_uint64

MINHASH_SCHEME = "multiply-add-shift-u32-v1"
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
# Bound on the temporary (permutations x shingles) matrix, in elements.
_BLOCK_ELEMENTS = 1 << 22


def permutations(num_perm: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """The (a, b) coefficients of the K permutations; identical on every
  worker for the same seed."""
  return seeded_uint64(seed, num_perm, 1), seeded_uint64(seed, num_perm, 2)


def minhash_batch(shingles: np.ndarray, offsets: np.ndarray, a: np.ndarray,
                  b: np.ndarray) -> np.ndarray:
  """Signatures of a batch of documents in the flat layout.

  ``shingles``: uint64 hashes of all documents concatenated; ``offsets``:
  int64, document i owns ``shingles[offsets[i]:offsets[i+1]]`` and every
  document must own at least one shingle. Returns uint32 ``(n_docs, K)``.
  """
  offsets = np.asarray(offsets, dtype=np.int64)
  n_docs = len(offsets) - 1
  if n_docs and np.any(np.diff(offsets) <= 0):
    raise ValueError("every document needs at least one shingle")
  x = (np.asarray(shingles, dtype=np.uint64) & _LOW32)
  k = len(a)
  out = np.empty((n_docs, k), dtype=np.uint32)
  if n_docs == 0:
    return out
  # Block over documents so that the temporary stays cache-friendly.
  doc_block = _doc_blocks(offsets, k)
  for lo, hi in doc_block:
    seg = x[offsets[lo]:offsets[hi]]
    starts = offsets[lo:hi] - offsets[lo]
    hashed = (a[:, None] * seg[None, :] + b[:, None]) >> _SHIFT
    out[lo:hi] = np.minimum.reduceat(hashed, starts, axis=1).T
  return out


def _doc_blocks(offsets, k):
  """Splits documents into runs whose shingles x K fit the block budget."""
  per_block = max(1, _BLOCK_ELEMENTS // k)
  n_docs = len(offsets) - 1
  blocks, lo = [], 0
  while lo < n_docs:
    hi = int(np.searchsorted(offsets, offsets[lo] + per_block, side="right")) - 1
    hi = min(max(hi, lo + 1), n_docs)
    blocks.append((lo, hi))
    lo = hi
  return blocks


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
  """Fraction of equal signature entries (last axis); broadcasts."""
  return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)
