"""The per-shard cluster kernels against the per-document rules they
replace (golden cases and arbitrary inputs)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.kernels import clusters


def _kept_by_rule(members):
  """The per-cluster rule: longest first, then lowest id."""
  return min(members, key=lambda m: (-m[1], m[0]))[0]


def _matched_by_rule(kept, neighbours):
  """The per-document rule: the kept document if it is a neighbour, else
  the most similar (unknown similarity last), then the lowest id."""
  if any(other == kept for other, _ in neighbours):
    return kept
  return min(neighbours, key=lambda e: (
      -e[1] if not math.isnan(e[1]) else math.inf, e[0]))[0]


def test_choose_kept_golden():
  c = clusters.choose_kept(np.array([8, 3, 5, 4, 6]), np.array([3, 3, 3, 4, 4]),
                           np.array([10, 2, 10, 0, 0]))
  assert c.nodes.tolist() == [3, 5, 8, 4, 6]
  assert c.labels.tolist() == [3, 3, 3, 4, 4]
  assert c.sizes.tolist() == [3, 3, 3, 2, 2]
  # Label 3: 5 and 8 are longest, 5 is the lower id; label 4: equal lengths.
  assert c.kept.tolist() == [5, 5, 5, 4, 4]
  assert c.starts.tolist() == [0, 3, 5]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)),
                min_size=1, max_size=40),
       st.integers(0, 2**31))
def test_choose_kept_matches_the_rule(member_specs, seed):
  rng = np.random.default_rng(seed)
  nodes = rng.permutation(10 * len(member_specs))[:len(member_specs)]
  labels = np.array([label for label, _ in member_specs])
  lengths = np.array([length for _, length in member_specs])
  c = clusters.choose_kept(nodes, labels, lengths)
  by_label = {}
  for node, label, length in zip(nodes.tolist(), labels.tolist(),
                                 lengths.tolist()):
    by_label.setdefault(label, []).append((node, length))
  want = sorted((label, node, len(m), _kept_by_rule(m))
                for label, m in by_label.items() for node, _ in m)
  assert list(zip(c.labels.tolist(), c.nodes.tolist(), c.sizes.tolist(),
                  c.kept.tolist())) == want
  assert np.diff(c.starts).tolist() == [len(by_label[k])
                                        for k in sorted(by_label)]


def test_choose_matched_prefers_the_kept_document_then_similarity_then_id():
  got = clusters.choose_matched(
      np.array([10, 20, 30]), np.array([1, 1, 2]),
      np.array([10, 10, 20, 20, 20, 30, 30, 99]),
      np.array([7, 1, 5, 4, 6, 8, 9, 1]),
      np.array([0.99, 0.1, 0.5, 0.5, 0.7, np.nan, np.nan, 1.0]))
  assert got.neighbours.tolist() == [1, 6, 8]
  assert got.similarity[:2].tolist() == [0.1, 0.7]
  assert np.isnan(got.similarity[2])


def test_choose_matched_names_a_document_without_edges():
  with pytest.raises(ValueError, match="document 20 has no verified edge"):
    clusters.choose_matched(np.array([10, 20]), np.array([1, 1]),
                            np.array([10]), np.array([1]), np.array([0.5]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8),
                          st.sampled_from([0.2, 0.5, 0.5, 0.9, math.nan])),
                min_size=1, max_size=40))
def test_choose_matched_matches_the_rule(ends):
  docs = np.array(sorted({d for d, _, _ in ends}))
  kept = np.array([(d * 7) % 9 for d in docs.tolist()])
  got = clusters.choose_matched(docs, kept,
                                np.array([d for d, _, _ in ends]),
                                np.array([o for _, o, _ in ends]),
                                np.array([s for _, _, s in ends]))
  neighbours = {}
  for d, o, s in ends:
    neighbours.setdefault(d, []).append((o, s))
  want = [_matched_by_rule(k, neighbours[d])
          for d, k in zip(docs.tolist(), kept.tolist())]
  assert got.neighbours.tolist() == want
  for d, m, s in zip(docs.tolist(), want, got.similarity.tolist()):
    known = [x for o, x in neighbours[d] if o == m and not math.isnan(x)]
    assert s == max(known) if known else math.isnan(s)
