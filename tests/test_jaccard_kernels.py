"""Exact Jaccard kernels and the edge-probability model (numpy, numba)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.kernels.jaccard import (jaccard, meets_threshold,
                                        pair_intersections, similar_pairs,
                                        sorted_sets)
from transforms.kernels.lsh import (collision_probability,
                                    detection_probability, min_equal_entries)


def _flat(sets):
  offsets = np.zeros(len(sets) + 1, dtype=np.int64)
  np.cumsum([len(s) for s in sets], out=offsets[1:])
  values = (np.concatenate(sets) if sets else np.zeros(0)).astype(np.uint64)
  return values, offsets


def _random_sets(seed, n=80):
  """Random sets with planted edited copies (similarities over 0..1)."""
  rng = np.random.default_rng(seed)
  sets = []
  for _ in range(n // 2):
    base = rng.choice(300, size=int(rng.integers(1, 40)), replace=False)
    sets.append(np.unique(base))
    copy = base.copy()
    k = int(rng.integers(0, len(base) + 1))
    copy[:k] = rng.integers(300, 600, size=k)
    sets.append(np.unique(copy))
  sets.append(np.zeros(0, dtype=np.int64))
  return sets


def _brute_force(sets, threshold):
  found = {}
  for i, j in itertools.combinations(range(len(sets)), 2):
    a, b = set(sets[i].tolist()), set(sets[j].tolist())
    inter, union = len(a & b), len(a | b)
    if union and inter >= threshold * union - 1e-9:
      found[(i, j)] = (inter, union)
  return found


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("threshold", [0.2, 0.5, 0.8, 0.9, 1.0])
def test_similar_pairs_matches_brute_force(seed, threshold):
  sets = _random_sets(seed)
  a, b, inter, union = similar_pairs(*_flat(sets), threshold)
  got = {(i, j): (x, y) for i, j, x, y in zip(a.tolist(), b.tolist(),
                                              inter.tolist(), union.tolist())}
  assert got == _brute_force(sets, threshold)
  assert np.all(a < b)
  assert list(zip(a.tolist(), b.tolist())) == sorted(got)


def test_similar_pairs_exact_threshold_and_edge_cases():
  # 4/5 = 0.8 exactly must count at threshold 0.8.
  sets = [np.arange(5), np.arange(4), np.arange(100, 103)]
  a, b, inter, union = similar_pairs(*_flat(sets), 0.8)
  assert (a.tolist(), b.tolist(), inter.tolist(), union.tolist()) == (
      [0], [1], [4], [5])
  empty = similar_pairs(*_flat([np.arange(3)]), 0.5)
  assert all(len(x) == 0 for x in empty)
  # Many identical sets: every pair, from one posting list.
  same = [np.arange(10)] * 30
  a, _, _, _ = similar_pairs(*_flat(same), 0.9)
  assert len(a) == 30 * 29 // 2


def test_pair_intersections_and_jaccard():
  sets = _random_sets(3)
  values, offsets = _flat(sets)
  rng = np.random.default_rng(0)
  left = rng.integers(len(sets), size=200)
  right = rng.integers(len(sets), size=200)
  got = pair_intersections(values, offsets, left, right)
  want = [len(set(sets[i].tolist()) & set(sets[j].tolist()))
          for i, j in zip(left, right)]
  assert got.tolist() == want
  assert jaccard(np.array([1, 2, 3]), np.array([2, 3, 4, 5])) == (2, 5)
  assert meets_threshold(4, 5, 0.8) and not meets_threshold(3, 5, 0.8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=30), max_size=12),
       st.data())
def test_sorted_sets_and_intersections_match_python_sets(docs, data):
  values, offsets = _flat([np.array(d, dtype=np.uint64) for d in docs])
  flat, set_offsets = sorted_sets(values, offsets)
  sets = [sorted(set(d)) for d in docs]
  assert [flat[set_offsets[i]:set_offsets[i + 1]].tolist()
          for i in range(len(docs))] == sets
  if docs:
    pick = st.lists(st.integers(0, len(docs) - 1), max_size=20)
    left, right = np.array(data.draw(pick)), np.array(data.draw(pick))
    n = min(len(left), len(right))
    got = pair_intersections(flat, set_offsets, left[:n], right[:n])
    assert got.tolist() == [len(set(sets[i]) & set(sets[j]))
                            for i, j in zip(left[:n], right[:n])]


@pytest.mark.parametrize("values", [[3, 1], [2, 2]])
def test_pair_intersections_refuses_sets_out_of_order(values):
  values, offsets = _flat([np.array(values)])
  with pytest.raises(ValueError, match="sorted and distinct"):
    pair_intersections(values, offsets, np.array([0]), np.array([0]))


def test_detection_probability_without_verification_is_the_s_curve():
  s = np.linspace(0, 1, 21)
  np.testing.assert_allclose(detection_probability(s, 16, 8, 128),
                             collision_probability(s, 16, 8))


@pytest.mark.parametrize("s,bands,rows,num_perm", [
    (0.82, 16, 8, 128), (0.55, 26, 3, 128), (0.75, 9, 13, 128)])
def test_detection_probability_matches_simulation(s, bands, rows, num_perm):
  """Signature entries equal independently with probability s: simulated
  P(some band all equal AND enough entries equal) vs the exact formula."""
  threshold = {0.82: 0.8, 0.55: 0.5, 0.75: 0.8}[s]
  need = min_equal_entries(threshold, num_perm)
  rng = np.random.default_rng(7)
  n = 100_000
  equal = rng.random((n, num_perm)) < s
  bands_hit = equal[:, :bands * rows].reshape(n, bands, rows).all(2).any(1)
  simulated = np.mean(bands_hit & (equal.sum(1) >= need))
  predicted = float(detection_probability(s, bands, rows, num_perm, need)[0])
  # 5 standard errors of a proportion over 100k draws.
  assert abs(simulated - predicted) < 5 * np.sqrt(0.25 / n)
  assert predicted <= float(collision_probability(s, bands, rows)) + 1e-12


def test_min_equal_entries():
  assert min_equal_entries(0.8, 128) == 103  # 102.4 rounds up
  assert min_equal_entries(0.5, 128) == 64
  assert min_equal_entries(0.8, 5) == 4  # exactly 4.0, not 5
