"""Pure connected-component kernels (transforms/kernels/graph.py) on small,
hand-checked neighbourhoods."""

import numpy as np
import pytest

from transforms.kernels import connected as graph


def _ints(a):
  return [int(x) for x in a]


# --- large_star -------------------------------------------------------------


def test_large_star_repoints_larger_neighbours_to_neighbourhood_minimum():
  larger, m = graph.large_star(5, np.array([3, 7, 9, 7, 1], dtype=np.int64))
  assert _ints(larger) == [7, 9]  # Unique, sorted, strictly larger than 5.
  assert m == 1


def test_large_star_local_minimum_keeps_itself_as_target():
  larger, m = graph.large_star(2, np.array([30, 7, 7], dtype=np.int64))
  assert _ints(larger) == [7, 30]
  assert m == 2


def test_large_star_without_larger_neighbours_emits_nothing():
  larger, m = graph.large_star(10, np.array([4, 8], dtype=np.int64))
  assert len(larger) == 0
  assert m == 4


def test_large_star_no_neighbours():
  larger, m = graph.large_star(10, np.array([], dtype=np.int64))
  assert len(larger) == 0
  assert m == 10


def test_large_star_accepts_lists_and_large_ids():
  big = 2**50
  larger, m = graph.large_star(big, [big + 3, big - 1, big + 1])
  assert _ints(larger) == [big + 1, big + 3]
  assert m == big - 1
  assert isinstance(m, int)


# --- small_star -------------------------------------------------------------


def test_small_star_connects_node_and_smaller_neighbours_to_their_minimum():
  members, m = graph.small_star(9, np.array([4, 2, 4, 6], dtype=np.int64))
  assert m == 2
  # 2 itself is excluded; the node joins the others, each exactly once.
  assert _ints(members) == [4, 6, 9]


def test_small_star_single_parent_is_unchanged_edge():
  members, m = graph.small_star(9, np.array([2, 2], dtype=np.int64))
  assert m == 2
  assert _ints(members) == [9]


def test_small_star_no_smaller_neighbours():
  members, m = graph.small_star(9, np.array([], dtype=np.int64))
  assert len(members) == 0
  assert m == 9


def test_small_star_ignores_the_node_itself():
  members, m = graph.small_star(9, np.array([9, 3], dtype=np.int64))
  assert m == 3
  assert _ints(members) == [9]


def test_small_star_then_large_star_build_a_star():
  # Path 1 - 5 - 3 - 8 oriented as child > parent: (5,1), (5,3), (8,3).
  # Small star at 5 (smaller: 1, 3) re-points 3 to 1; at 8 (smaller: 3),
  # 8 stays on 3.
  members, m = graph.small_star(5, np.array([1, 3]))
  assert (m, _ints(members)) == (1, [3, 5])
  members, m = graph.small_star(8, np.array([3]))
  assert (m, _ints(members)) == (3, [8])
  # Now edges (3,1), (5,1), (8,3): large star at 3 (neighbours 1, 8) moves
  # 8 onto 1, so the component becomes a star around 1.
  larger, m = graph.large_star(3, np.array([1, 8]))
  assert (m, _ints(larger)) == (1, [8])


# --- union_find_labels ------------------------------------------------------


def test_union_find_labels_minimum_of_each_component():
  edges = [(5, 3), (3, 8), (10, 11), (12, 11), (100, 7), (7, 5)]
  assert graph.union_find_labels(edges) == {
      3: 3, 5: 3, 7: 3, 8: 3, 100: 3,
      10: 10, 11: 10, 12: 10}


def test_union_find_labels_duplicates_and_both_orientations():
  edges = [(2, 1), (1, 2), (2, 1), (4, 3), (3, 4)]
  assert graph.union_find_labels(edges) == {1: 1, 2: 1, 3: 3, 4: 3}


def test_union_find_labels_long_descending_chain():
  # Unions always attach the larger root below the smaller one; a chain
  # built from the top down exercises path compression.
  n = 5000
  edges = [(i, i - 1) for i in range(n, 0, -1)]
  labels = graph.union_find_labels(edges)
  assert len(labels) == n + 1
  assert set(labels.values()) == {0}


def test_union_find_labels_empty():
  assert graph.union_find_labels([]) == {}


def test_union_find_labels_matches_brute_force_on_random_graphs():
  rng = np.random.default_rng(7)
  for _ in range(20):
    n = int(rng.integers(2, 40))
    ids = rng.choice(1000, size=n, replace=False)
    pairs = rng.integers(n, size=(int(rng.integers(1, 40)), 2))
    edges = [(int(ids[a]), int(ids[b])) for a, b in pairs if a != b]
    # Brute force: repeat min-propagation along edges to a fixed point.
    label = {x: x for e in edges for x in e}
    changed = True
    while changed:
      changed = False
      for a, b in edges:
        low = min(label[a], label[b])
        for x in (a, b):
          if label[x] != low:
            label[x], changed = low, True
    assert graph.union_find_labels(edges) == label


# --- classify_node ----------------------------------------------------------


@pytest.mark.parametrize("parents, children, role", [
    ([], [4, 5], "root"),
    ([], [], "root"),
    ([1], [], "leaf"),
    ([1, 1, 1], [], "leaf"),
    ([1, 2], [], "unsettled"),
    ([1], [9], "unsettled"),
    ([1, 1], [9, 9], "unsettled"),
])
def test_classify_node(parents, children, role):
  assert graph.classify_node(np.asarray(parents, dtype=np.int64),
                             np.asarray(children, dtype=np.int64)) == role


# --- spanning forest ----------------------------------------------------------

def test_spanning_forest_keeps_the_most_similar_real_edges():
  # Triangle 1-2-3 plus edge 5-6: the lightest triangle edge is dropped.
  src = np.array([1, 1, 2, 5])
  dst = np.array([2, 3, 3, 6])
  keep = graph.spanning_forest(src, dst, np.array([0.9, 0.8, 0.95, 0.7]))
  assert keep.tolist() == [True, False, True, True]


def test_spanning_forest_unknown_weights_by_lowest_ids():
  src = np.array([2, 1, 1])
  dst = np.array([3, 3, 2])
  keep = graph.spanning_forest(src, dst, np.full(3, np.nan))
  assert keep.tolist() == [False, True, True]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spanning_forest_has_the_same_components(seed):
  rng = np.random.default_rng(seed)
  src = rng.integers(0, 300, size=900)
  dst = rng.integers(0, 300, size=900)
  src, dst = np.minimum(src, dst), np.maximum(src, dst)
  src, dst = src[src != dst], dst[src != dst]
  weight = rng.random(len(src))
  keep = graph.spanning_forest(src, dst, weight)
  full = graph.union_find_labels(zip(src.tolist(), dst.tolist()))
  forest = graph.union_find_labels(zip(src[keep].tolist(), dst[keep].tolist()))
  assert forest == full
  assert keep.sum() == len(full) - len(set(full.values()))
  # The result depends on the edge set only, not on its order.
  order = rng.permutation(len(src))
  assert np.array_equal(graph.spanning_forest(src[order], dst[order],
                                              weight[order]), keep[order])
