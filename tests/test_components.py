"""ConnectedComponents (transforms/components.py) against an independent,
plain union-find, on the FnApiRunner."""

from typing import Tuple

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import BeamAssertException
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

from transforms import metrics
from transforms.components import ConnectedComponents
from transforms.elements import EdgeBatch

DEFAULT_ROUNDS = 20  # transforms.config default for --max_cc_rounds.
# Every edge passes through every round, converged or not, so graphs that
# settle early use fewer rounds to keep the file fast (the random graphs below
# change edges in 5 rounds, stars in at most 1); each such test still asserts
# that its last round changed nothing.
SMALL_ROUNDS = 8
STAR_ROUNDS = 3
ROOMY_RESIDUAL = 10**6


def _pipeline():
  # Never the default DirectRunner: it tries to download Prism.
  return TestPipeline(runner="FnApiRunner")


# --- reference --------------------------------------------------------------


def reference_labels(edges):
  """Component minimum per node: plain union-find, written independently of
  transforms.kernels.connected."""
  parent = {}

  def find(x):
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for a, b in edges:
    for x in (a, b):
      if x not in parent:
        parent[x] = x
    ra, rb = find(a), find(b)
    if ra != rb:
      parent[max(ra, rb)] = min(ra, rb)
  return {x: find(x) for x in parent}


# --- graphs -----------------------------------------------------------------


def random_sparse_graph(seed, n_nodes=2000, n_edges=1500):
  """Ids from a large sparse range; both orientations and duplicates."""
  rng = np.random.default_rng(seed)
  ids = np.unique(rng.integers(0, 2**40, size=n_nodes * 2))[:n_nodes]
  rng.shuffle(ids)
  pairs = rng.integers(n_nodes, size=(n_edges, 2))
  edges = [(int(ids[a]), int(ids[b])) for a, b in pairs if a != b]
  dups = [edges[i] for i in rng.integers(len(edges), size=n_edges // 10)]
  flipped = [(b, a) for a, b in
             (edges[i] for i in rng.integers(len(edges), size=n_edges // 10))]
  edges = edges + dups + flipped
  rng.shuffle(edges)
  return edges


def shuffled_path(n, seed):
  """A path over n nodes whose ids are a random permutation of a sparse set,
  each edge in a random orientation."""
  rng = np.random.default_rng(seed)
  ids = (rng.permutation(n) * 7 + 11).tolist()
  flip = rng.random(n - 1) < 0.5
  return [(ids[i + 1], ids[i]) if f else (ids[i], ids[i + 1])
          for i, f in enumerate(flip.tolist())]


def star(center, leaves, seed):
  rng = np.random.default_rng(seed)
  flip = rng.random(len(leaves)) < 0.5
  return [(center, leaf) if f else (leaf, center)
          for leaf, f in zip(leaves, flip.tolist())]


# --- matchers ---------------------------------------------------------------


def exact_labels(expected):
  """Every node exactly once, with its reference label."""

  def _match(actual):
    nodes = [node for node, _ in actual]
    if len(nodes) != len(set(nodes)):
      seen, repeated = set(), set()
      for node in nodes:
        (repeated if node in seen else seen).add(node)
      raise BeamAssertException(
          f"{len(repeated)} nodes labelled more than once, e.g. "
          f"{sorted(repeated)[:5]}")
    got = dict(actual)
    if got != expected:
      missing = set(expected) - set(got)
      extra = set(got) - set(expected)
      wrong = [n for n in set(got) & set(expected) if got[n] != expected[n]]
      examples = [(n, got[n], expected[n]) for n in wrong[:5]]
      raise BeamAssertException(
          f"labels differ: {len(missing)} missing, {len(extra)} unexpected, "
          f"{len(wrong)} wrong (node, got, expected), e.g. {examples}")

  return _match


def counts_satisfy(check):
  """Runs ``check(summed counts dict)``; the check raises AssertionError."""

  def _match(actual):
    got = dict(actual)
    if len(got) != len(actual):
      raise BeamAssertException(f"duplicate stat names after summing: {actual}")
    try:
      check(got)
    except AssertionError as e:
      raise BeamAssertException(f"counts {sorted(got.items())}: {e}") from e

  return _match


def edge_batches(edges, batch: int = 256):
  """The edges as the transform takes them: ``(key, EdgeBatch)`` batches."""
  return [(key, EdgeBatch(np.array([a for a, _ in part], dtype=np.int64),
                          np.array([b for _, b in part], dtype=np.int64)))
          for key, part in enumerate(
              edges[i:i + batch] for i in range(0, len(edges), batch))]


def node_labels(element):
  """A label batch as ``(node, label)`` pairs."""
  _, pairs = element
  return zip(pairs.a.tolist(), pairs.b.tolist())


def run_components(edges, max_rounds=DEFAULT_ROUNDS,
                   max_residual_edges=ROOMY_RESIDUAL, check_counts=None):
  expected = reference_labels(edges)
  with _pipeline() as p:
    out = (p
           | beam.Create(edge_batches(edges))
           | ConnectedComponents(max_rounds, max_residual_edges))
    assert_that(out["labels"] | beam.FlatMap(node_labels),
                exact_labels(expected), label="Labels")
    if check_counts is not None:
      summed = (out["counts"]
                | beam.Flatten()
                | beam.Filter(lambda kv: not metrics.is_timing(kv[0]))
                | beam.CombinePerKey(sum))
      assert_that(summed, counts_satisfy(check_counts), label="Counts")
  return expected


def converged(rounds):
  """Counts check: no residual, and the last round changed nothing (a round
  that changes nothing emits no stat, i.e. a missing stat is zero)."""

  def _check(counts):
    assert "cc_residual_edges" not in counts, "residual edges left"
    assert "cc_residual_nodes" not in counts, "union-find ran"
    changes = [counts.get(metrics.round_stat(i), 0)
               for i in range(1, rounds + 1)]
    assert changes[-1] == 0, f"last round still changed edges: {changes}"
    assert changes[0] > 0 or not any(changes), changes
    unknown = set(counts) - {metrics.round_stat(i) for i in
                             range(1, rounds + 1)} - {
                                 metrics.SHUFFLE_PREFIX
                                 + "connected_components"}
    assert not unknown, f"unexpected stats {unknown}"

  return _check


# --- tests ------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_sparse_graphs_match_union_find(seed):
  edges = random_sparse_graph(seed)
  expected = run_components(edges, max_rounds=SMALL_ROUNDS,
                            check_counts=converged(SMALL_ROUNDS))
  # The graph is non-trivial: many components, some of them large.
  sizes = np.unique(list(expected.values()), return_counts=True)[1]
  assert len(sizes) > 100 and sizes.max() > 10


def test_random_graph_with_small_dense_clusters():
  rng = np.random.default_rng(3)
  edges = []
  for c in range(40):
    members = (rng.choice(10**6, size=int(rng.integers(2, 30)), replace=False)
               + c * 10**6).tolist()
    for _ in range(3 * len(members)):
      a, b = rng.choice(len(members), size=2, replace=False)
      edges.append((members[a], members[b]))
    # Keep each cluster connected regardless of the random picks.
    edges.extend(zip(members, members[1:]))
  rng.shuffle(edges)
  run_components(edges, max_rounds=SMALL_ROUNDS,
                 check_counts=converged(SMALL_ROUNDS))


def test_star_center_has_largest_id():
  rng = np.random.default_rng(4)
  leaves = (rng.choice(10**7, size=3000, replace=False) + 5).tolist()
  center = 10**9
  expected = run_components(star(center, leaves, seed=4),
                            max_rounds=STAR_ROUNDS,
                            check_counts=converged(STAR_ROUNDS))
  assert set(expected.values()) == {min(leaves)}
  assert len(expected) == 3001


def test_star_center_has_smallest_id():
  rng = np.random.default_rng(5)
  leaves = (rng.choice(10**7, size=3000, replace=False) + 5).tolist()
  center = 1
  expected = run_components(star(center, leaves, seed=5),
                            max_rounds=STAR_ROUNDS,
                            check_counts=converged(STAR_ROUNDS))
  assert set(expected.values()) == {1}


def test_two_node_and_tiny_components():
  edges = [(1, 2), (2, 1), (10, 3), (3, 10), (3, 4), (7, 8), (8, 9), (9, 7)]
  expected = run_components(edges, max_rounds=STAR_ROUNDS,
                            check_counts=converged(STAR_ROUNDS))
  assert expected == {1: 1, 2: 1, 3: 3, 4: 3, 10: 3, 7: 7, 8: 7, 9: 7}


def test_long_shuffled_path_converges_within_default_rounds():
  edges = shuffled_path(10_000, seed=6)
  expected = run_components(edges, check_counts=converged(DEFAULT_ROUNDS))
  assert set(expected.values()) == {11}  # min id: 0 * 7 + 11.
  assert len(expected) == 10_000


def test_few_rounds_leave_a_residual_that_union_find_resolves_exactly():
  edges = shuffled_path(2000, seed=7)

  def _check(counts):
    assert counts["cc_residual_edges"] > 0, "expected a residual"
    assert counts["cc_residual_nodes"] > 0, "union-find did not run"
    assert counts.get(metrics.round_stat(1), 0) > 0, "round 1 idle"
    assert counts.get(metrics.round_stat(2), 0) > 0, "round 2 idle"
    assert metrics.round_stat(3) not in counts, "only 2 rounds were asked"

  expected = run_components(edges, max_rounds=2, check_counts=_check)
  assert set(expected.values()) == {11}


def test_residual_resolves_several_components_and_settled_stars():
  # Long paths stay unsettled after one round; small stars settle at once.
  # The union-find labels must override and coexist with settled labels.
  edges = []
  for k in range(5):
    edges += [(a + k * 10**6, b + k * 10**6)
              for a, b in shuffled_path(300, seed=10 + k)]
  for k in range(20):
    base = 10**8 + k * 100
    edges += [(base, base + j) for j in range(1, 6)]
  rng = np.random.default_rng(8)
  rng.shuffle(edges)

  def _check(counts):
    assert counts["cc_residual_edges"] > 0, "expected a residual"

  run_components(edges, max_rounds=1, check_counts=_check)


def test_residual_too_large_fails_naming_max_cc_rounds():
  edges = shuffled_path(1000, seed=9)
  with pytest.raises(Exception, match="--max_cc_rounds"):
    with _pipeline() as p:
      out = (p
             | beam.Create(edge_batches(edges))
             | ConnectedComponents(max_rounds=1, max_residual_edges=1))
      assert_that(out["labels"] | beam.FlatMap(node_labels),
                  exact_labels(reference_labels(edges)))


def test_empty_edge_set_gives_no_labels():
  with _pipeline() as p:
    out = (p
           | beam.Create([]).with_output_types(Tuple[int, EdgeBatch])
           | ConnectedComponents(SMALL_ROUNDS, ROOMY_RESIDUAL))
    assert_that(out["labels"], equal_to([]), label="Labels")
    assert_that(out["counts"] | beam.Flatten(), equal_to([]),
                label="Counts")
