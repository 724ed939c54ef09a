"""Exact Jaccard similarity of shingle sets: for given pairs of documents, and
for all pairs of a corpus at or above a threshold (ground truth). Sets and
intersections run compiled where :mod:`~transforms.kernels.dispatch` says so.

Sets use the flat layout of :mod:`transforms.kernels.reference_text`: ``values`` holds
every document's distinct elements, sorted, concatenated; document i owns
``values[offsets[i]:offsets[i+1]]`` (:func:`sorted_sets` makes that layout).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from transforms.kernels import dispatch
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


def sorted_sets(values: np.ndarray, offsets: np.ndarray
                ) -> Tuple[np.ndarray, np.ndarray]:
  """``(values, offsets)`` of each document's distinct elements, sorted:
  the set layout, from any flat layout (elements in any order, repeated)."""
  values = np.ascontiguousarray(values)
  offsets = np.asarray(offsets, dtype=np.int64)
  kernels = dispatch.compiled_kernels(len(values))
  if kernels is not None:
    return kernels.sorted_sets(values, offsets)
  doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
  values = values[offsets[0]:offsets[-1]]
  order = np.lexsort((values, doc))
  doc, values = doc[order], values[order]
  fresh = np.ones(len(values), dtype=bool)
  fresh[1:] = (values[1:] != values[:-1]) | (doc[1:] != doc[:-1])
  set_offsets = np.zeros(len(offsets), dtype=np.int64)
  np.cumsum(np.bincount(doc[fresh], minlength=len(offsets) - 1),
            out=set_offsets[1:])
  return values[fresh], set_offsets


def pair_intersections(values: np.ndarray, offsets: np.ndarray,
                       left: np.ndarray, right: np.ndarray) -> np.ndarray:
  """``|S_left[i] ∩ S_right[i]|`` for every pair i (int64 array), each set
  merged with the other once: O(|A| + |B|) per pair.

  Raises:
    ValueError: a set is not sorted and distinct (see :func:`sorted_sets`).
  """
  offsets = np.asarray(offsets, dtype=np.int64)
  values = np.ascontiguousarray(values)
  left = np.asarray(left, dtype=np.int64)
  right = np.asarray(right, dtype=np.int64)
  sizes = np.diff(offsets)
  kernels = dispatch.compiled_kernels(
      len(values) + int(sizes[left].sum() + sizes[right].sum()))
  if not (_are_sets(values, offsets) if kernels is None
          else kernels.are_sets(values, offsets)):
    raise ValueError("pair_intersections needs each set sorted and distinct;"
                     " build them with sorted_sets")
  if kernels is None:
    return _intersections(values, offsets, left, right)
  out = np.zeros(len(left), dtype=np.int64)
  kernels.merge_intersections(values, offsets, left, right, out)
  return out


def merged_count(values, a, a_end, b, b_end):
  """How many values ``values[a:a_end]`` and ``values[b:b_end]`` (sorted,
  distinct) share, by one merge: numba's subset of Python, the inner loop of
  the compiled intersections."""
  shared = 0
  while a < a_end and b < b_end:
    if values[a] == values[b]:
      shared += 1
      a += 1
      b += 1
    elif values[a] < values[b]:
      a += 1
    else:
      b += 1
  return shared


def _are_sets(values, offsets):
  sizes = np.diff(offsets)
  inside = values[offsets[0]:offsets[-1]]
  # Every element but a document's first must exceed its predecessor.
  later = np.ones(len(inside), dtype=bool)
  later[offsets[:-1][sizes > 0] - offsets[0]] = False
  return bool(np.all(inside[1:][later[1:]] > inside[:-1][later[1:]]))


def _intersections(values, offsets, left, right):
  """The pure path of :func:`pair_intersections`: both sets of every pair
  sorted together, an intersection element being a value met twice."""
  sizes = np.diff(offsets)
  pair = np.concatenate([np.repeat(np.arange(len(left)), sizes[left]),
                         np.repeat(np.arange(len(right)), sizes[right])])
  members = values[np.concatenate([ranges(offsets[left], sizes[left]),
                                   ranges(offsets[right], sizes[right])])]
  order = np.lexsort((members, pair))
  pair, members = pair[order], members[order]
  twice = (pair[1:] == pair[:-1]) & (members[1:] == members[:-1])
  return np.bincount(pair[1:][twice], minlength=len(left)).astype(np.int64)


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

