"""The connected components of a large LSH bucket's verified pairs without
verifying all its pairs.

A bucket of k documents has k(k-1)/2 pairs; its duplicate graph (the pairs
that pass verification) has usually few components. :func:`bucket_forest`
finds exactly the components that verifying every pair would give, with
about k x (representatives) comparisons instead: both verification measures
are distances of a metric space (``1 - exact Jaccard`` of shingle sets,
the share of unequal signature entries), so the triangle inequality proves
most pairs fail from their distances to a few representatives.

Members are taken in order. Each is compared with every representative; one
farther than ``spread`` (3 x (1 - t)) from all of them becomes a
representative itself (so a bucket whose members drift along a chain gets
one every ``spread``),
the others join the cover of their nearest one, whose radius (largest
member distance) is kept. A member x then needs comparing only with the
cover members m of a representative r with |d(x, r) - d(r, m)| <= 1 - t
(every other m is farther than 1 - t from x), and only with those not
already in x's component. Every processed member is compared with x at most
once, so the worst case is the k(k-1)/2 pairs of all-pairs verification,
reached only when no distance proves anything.

Written in numba's subset of Python: :mod:`~transforms.kernels.compiled`
compiles :func:`forest_loop` for large buckets; small ones run it as it is.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from transforms.kernels import dispatch, jaccard
from transforms.kernels.hashing import fmix64
from transforms.kernels.jaccard import merged_count
from transforms.kernels.union_find import root

SETS, ROWS = 0, 1
# Distances are float64 differences of ratios; a pair is pruned only when
# the triangle inequality clears the threshold by more than this.
SLACK = 1e-7
# A member farther than SPREAD x (1 - t) from every representative becomes
# one. Measured on the test buckets (families, chains, many components):
# 3 needs 0.16-0.37 comparisons per member and component (singletons
# included), 0.5 needs all pairs, 1.5 about 0.6x as many as 3 for chains
# and no fewer for the others.
SPREAD = 3.0


class BucketForest(NamedTuple):
  """Edges ``src`` -> ``dst`` (positions in the bucket's member list) of a
  spanning forest of the bucket's verified pairs, their ``similarity``, the
  number of ``comparisons`` (pairs verified) it took and how many of them
  ``passed``."""
  src: np.ndarray
  dst: np.ndarray
  similarity: np.ndarray
  comparisons: int
  passed: int


def set_forest(values, offsets, members, threshold: float,
               first_new: int = 0, spread: float = None) -> BucketForest:
  """:class:`BucketForest` of the members whose shingle sets are
  ``values[offsets[members[i]]:offsets[members[i] + 1]]`` (sorted, distinct:
  :func:`~transforms.kernels.jaccard.sorted_sets`), a pair verified when its
  exact Jaccard reaches ``threshold`` (as
  :func:`~transforms.kernels.jaccard.meets_threshold` decides). Members
  before position ``first_new`` (indexed documents) are never paired with
  each other.
  """
  return _forest(SETS, np.ascontiguousarray(values),
                 np.asarray(offsets, dtype=np.int64),
                 np.zeros((0, 0), dtype=np.uint32), members, threshold,
                 0, first_new, spread)


def row_forest(signatures, members, min_equal: int, first_new: int = 0,
               spread: float = None) -> BucketForest:
  """:class:`BucketForest` of the members whose signatures are
  ``signatures[members[i]]``, a pair verified when at least ``min_equal``
  of its entries are equal; ``first_new`` as in :func:`set_forest`."""
  signatures = np.ascontiguousarray(signatures, dtype=np.uint32)
  return _forest(ROWS, np.zeros(0, dtype=np.uint64),
                 np.zeros(1, dtype=np.int64), signatures, members,
                 min_equal / max(signatures.shape[1], 1), min_equal,
                 first_new, spread)


def _forest(kind, values, offsets, signatures, members, threshold, min_equal,
            first_new, spread):
  members = np.asarray(members, dtype=np.int64)
  radius = 1.0 - threshold
  spread = min(1.0, SPREAD * radius) if spread is None else spread
  k = len(members)
  work = k * k * (signatures.shape[1] if kind == ROWS else 64)
  kernels = dispatch.compiled_kernels(work)
  loop = forest_loop if kernels is None else kernels.forest_loop
  src, dst, similarity, comparisons, passed = loop(
      kind, values, offsets, signatures, members, threshold, min_equal,
      radius, spread, first_new, SLACK)
  return BucketForest(src, dst, similarity, int(comparisons), int(passed))


def forest_loop(kind, values, offsets, signatures, members, threshold,
                min_equal, radius, spread, first_new, slack):
  """The loop of :func:`set_forest` and :func:`row_forest` (``kind`` SETS
  or ROWS): ``(src, dst, similarity, comparisons, passed)``, in numba's
  subset of Python; it calls ``root`` and ``merged_count``, which
  :mod:`~transforms.kernels.compiled` replaces by their compiled forms."""
  k = len(members)
  parent = np.arange(k)
  reps = np.zeros(k, dtype=np.int64)
  cover_radius = np.zeros(k)
  head = np.full(k, -1)
  following = np.full(k, -1)
  to_rep = np.zeros(k)
  rep_distance = np.zeros(k)
  # Who x is compared with in this step, and the similarity and verdict.
  other = np.zeros(k, dtype=np.int64)
  src = np.zeros(k, dtype=np.int64)
  dst = np.zeros(k, dtype=np.int64)
  similarity = np.zeros(k)
  edges = n_reps = comparisons = passed = 0
  for x in range(k):
    # Step 0: the representatives; step 1: the cover members not ruled out.
    for step in range(2):
      n_other = 0
      if step == 0:
        for q in range(n_reps):
          other[n_other] = reps[q]
          n_other += 1
      else:
        root_x = root(parent, x)
        for q in range(n_reps):
          d = rep_distance[q]
          if d > radius + cover_radius[q] + slack:
            continue
          m = head[q]
          while m != -1:
            if (m != reps[q] and abs(d - to_rep[m]) <= radius + slack
                and root(parent, m) != root_x):
              other[n_other] = m
              n_other += 1
            m = following[m]
      for i in range(n_other):
        m = other[i]
        # x may have joined m's component since m was listed.
        if step == 1 and root(parent, x) == root(parent, m):
          continue
        a, b = members[x], members[m]
        comparisons += 1
        if kind == 1:
          equal = 0
          for j in range(signatures.shape[1]):
            if signatures[a, j] == signatures[b, j]:
              equal += 1
          s = equal / max(signatures.shape[1], 1)
          ok = equal >= min_equal
        else:
          shared = merged_count(values, offsets[a], offsets[a + 1],
                                offsets[b], offsets[b + 1])
          union = (offsets[a + 1] - offsets[a]
                   + offsets[b + 1] - offsets[b] - shared)
          s = shared / max(union, 1)
          # As jaccard.meets_threshold: no division decides the threshold.
          ok = union > 0 and shared >= threshold * union - 1e-9
        if step == 0:
          rep_distance[i] = 1.0 - s
        if not ok or (x < first_new and m < first_new):
          continue
        passed += 1
        root_x, root_m = root(parent, x), root(parent, m)
        if root_x != root_m:
          parent[max(root_x, root_m)] = min(root_x, root_m)
          src[edges], dst[edges], similarity[edges] = min(x, m), max(x, m), s
          edges += 1
    nearest, nearest_d = -1, 2.0
    for q in range(n_reps):
      if rep_distance[q] < nearest_d:
        nearest, nearest_d = q, rep_distance[q]
    if nearest >= 0 and nearest_d <= spread:
      to_rep[x] = nearest_d
      following[x] = head[nearest]
      head[nearest] = x
      cover_radius[nearest] = max(cover_radius[nearest], nearest_d)
    else:
      reps[n_reps] = x
      head[n_reps] = x
      n_reps += 1
  return src[:edges], dst[:edges], similarity[:edges], comparisons, passed


def set_twins(values, offsets, rows) -> np.ndarray:
  """For each of the sorted ``rows``, the first of them with the same
  non-empty shingle set (itself if none): equal sets are equal members of
  any bucket, so one stands for all (fingerprints group them, an
  intersection confirms each, so a fingerprint collision changes nothing).
  """
  values = np.ascontiguousarray(values)
  offsets = np.asarray(offsets, dtype=np.int64)
  rows = np.asarray(rows, dtype=np.int64)
  sizes = np.diff(offsets)[rows]
  mixed = fmix64(values.view(np.uint64)) if len(values) else values
  sums = np.zeros(len(offsets) - 1, dtype=np.uint64)
  if len(values):
    doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    np.add.at(sums, doc, mixed)
  canon = _first_of_groups(rows, sizes.astype(np.uint64), sums[rows])
  twin = (canon != rows) & (sizes > 0)
  if twin.any():
    shared = jaccard.pair_intersections(values, offsets, canon[twin],
                                        rows[twin])
    twin[twin] = shared == sizes[twin]
  return np.where(twin, canon, rows)


def row_twins(signatures, rows) -> np.ndarray:
  """:func:`set_twins` for signatures: the first of the sorted ``rows``
  with the same signature."""
  rows = np.asarray(rows, dtype=np.int64)
  if not len(rows):
    return rows
  _, inverse = np.unique(np.asarray(signatures)[rows], axis=0,
                         return_inverse=True)
  first = np.full(inverse.max() + 1, len(rows))
  np.minimum.at(first, inverse.ravel(), np.arange(len(rows)))
  return rows[first[inverse.ravel()]]


def _first_of_groups(rows, *keys):
  """For each row, the first row with equal ``keys``."""
  order = np.lexsort((rows, *keys))
  fresh = np.ones(len(rows), dtype=bool)
  if len(rows):
    same = np.ones(len(rows) - 1, dtype=bool)
    for key in keys:
      same &= key[order][1:] == key[order][:-1]
    fresh[1:] = ~same
  start = np.maximum.accumulate(np.where(fresh, np.arange(len(rows)), 0))
  canon = np.empty(len(rows), dtype=np.int64)
  canon[order] = rows[order][start]
  return canon
