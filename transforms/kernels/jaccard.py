"""Exact Jaccard similarity of shingle sets: for given pairs of documents, and
for all pairs of a corpus at or above a threshold (ground truth).

Sets use the flat layout of :mod:`transforms.kernels.reference_text`: ``values`` holds
every document's distinct elements concatenated, document i owns
``values[offsets[i]:offsets[i+1]]``.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from transforms.kernels.lsh import ranges

# Bounds the (pair, element) arrays built at once by the batch kernels.
_CHUNK_ELEMENTS = 1 << 23


def meets_threshold(intersection, union, threshold: float):
  """``|A∩B| / |A∪B| >= threshold``, decided without dividing (so a pair at
  exactly the threshold, e.g. 4/5 at 0.8, is never lost to rounding)."""
  return (np.asarray(intersection, dtype=np.float64)
          >= threshold * np.asarray(union, dtype=np.float64) - 1e-9)


def jaccard(a: np.ndarray, b: np.ndarray) -> Tuple[int, int]:
  """``(|A∩B|, |A∪B|)`` of two arrays of distinct values."""
  inter = len(np.intersect1d(a, b, assume_unique=True))
  return inter, len(a) + len(b) - inter


def _gather(offsets: np.ndarray, docs: np.ndarray) -> np.ndarray:
  """Indices into the flat values of the documents ``docs``, concatenated."""
  return ranges(offsets[docs], offsets[docs + 1] - offsets[docs])


def pair_intersections(values: np.ndarray, offsets: np.ndarray,
                       left: np.ndarray, right: np.ndarray) -> np.ndarray:
  """``|S_left[i] ∩ S_right[i]|`` for every pair i (int64 array)."""
  left = np.asarray(left, dtype=np.int64)
  right = np.asarray(right, dtype=np.int64)
  sizes = np.diff(offsets)
  out = np.zeros(len(left), dtype=np.int64)
  work = np.cumsum(sizes[left] + sizes[right])
  lo = 0
  while lo < len(left):
    base = work[lo - 1] if lo else 0
    hi = max(lo + 1, int(np.searchsorted(work, base + _CHUNK_ELEMENTS,
                                         side="right")))
    l, r = left[lo:hi], right[lo:hi]
    pair = np.concatenate([np.repeat(np.arange(len(l)), sizes[l]),
                           np.repeat(np.arange(len(r)), sizes[r])])
    vals = np.concatenate([values[_gather(offsets, l)],
                           values[_gather(offsets, r)]])
    order = np.lexsort((vals, pair))
    pair, vals = pair[order], vals[order]
    # Each set holds distinct values, so an equal neighbour is a shared one.
    same = (pair[1:] == pair[:-1]) & (vals[1:] == vals[:-1])
    out[lo:hi] = np.bincount(pair[1:][same], minlength=len(l))
    lo = hi
  return out


def similar_pairs(values: np.ndarray, offsets: np.ndarray, threshold: float
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Every pair of documents whose sets have Jaccard >= ``threshold``.

  Exact (no sampling): an inverted index over each set's prefix of its rarest
  ``|x| - ceil(t|x|) + 1`` elements (prefix filtering, Bayardo et al. 2007)
  finds every pair that can reach the threshold; a size filter and an exact
  intersection then decide. Empty sets are never paired. Returns ``(a, b,
  intersection, union)`` with a < b, sorted by (a, b).
  """
  offsets = np.asarray(offsets, dtype=np.int64)
  sizes = np.diff(offsets)
  n = len(sizes)
  empty = np.zeros(0, dtype=np.int64)
  if n < 2 or not len(values):
    return empty, empty, empty, empty
  # Rank elements by corpus frequency (rarest first) and sort each set by rank.
  uniq, inverse, counts = np.unique(values, return_inverse=True,
                                    return_counts=True)
  rank = np.empty(len(uniq), dtype=np.int64)
  rank[np.lexsort((uniq, counts))] = np.arange(len(uniq))
  tokens = rank[inverse.ravel()]
  doc_of = np.repeat(np.arange(n), sizes)
  tokens = tokens[np.lexsort((tokens, doc_of))]

  need = np.ceil(threshold * sizes - 1e-9).astype(np.int64)
  prefix = np.where(sizes > 0, sizes - need + 1, 0).clip(0, sizes)
  position = np.arange(len(tokens)) - offsets[doc_of]
  in_prefix = position < prefix[doc_of]
  p_tok, p_doc = tokens[in_prefix], doc_of[in_prefix]
  order = np.lexsort((p_doc, p_tok))
  p_tok, p_doc = p_tok[order], p_doc[order]

  # Within each posting list (run of equal tokens), element k pairs with the
  # ones after it; chunks end at list boundaries so no list is split.
  starts = np.flatnonzero(np.r_[True, p_tok[1:] != p_tok[:-1]])
  ends = np.r_[starts[1:], len(p_tok)]
  run_end = np.repeat(ends, ends - starts)
  later = run_end - np.arange(len(p_tok)) - 1
  pairs_before_run = np.r_[0, np.cumsum(later)][starts]
  found = []
  lo = 0
  while lo < len(starts):
    hi = max(lo + 1, int(np.searchsorted(
        pairs_before_run, pairs_before_run[lo] + _CHUNK_ELEMENTS,
        side="right")))
    first, last = starts[lo], ends[hi - 1]
    k = later[first:last]
    src = np.repeat(np.arange(first, last), k)
    step = np.arange(len(src)) - np.repeat(np.cumsum(k) - k, k) + 1
    a, b = p_doc[src], p_doc[src + step]
    found.append(_verify(tokens, offsets, sizes, np.minimum(a, b),
                         np.maximum(a, b), threshold))
    lo = hi
  a, b, inter, union = (np.concatenate(parts) for parts in zip(*found))
  key, first = np.unique(a * n + b, return_index=True)
  return key // n, key % n, inter[first], union[first]


def _verify(tokens, offsets, sizes, a, b, threshold):
  key = np.unique(a * len(sizes) + b)
  a, b = key // len(sizes), key % len(sizes)
  small, large = np.minimum(sizes[a], sizes[b]), np.maximum(sizes[a], sizes[b])
  # J <= |small| / |large|, so pairs too different in size cannot qualify.
  fits = small >= threshold * large - 1e-9
  a, b = a[fits], b[fits]
  inter = pair_intersections(tokens, offsets, a, b)
  union = sizes[a] + sizes[b] - inter
  keep = meets_threshold(inter, union, threshold)
  return a[keep], b[keep], inter[keep], union[keep]

