"""Pure connected-component kernels (transforms/kernels/connected.py) on
small, hand-checked graphs, and the sharded steps against a union-find."""

import numpy as np
import pytest

from transforms.kernels import connected as graph


def _ints(a):
  return [int(x) for x in a]


# --- shard_of / route ------------------------------------------------------


def test_shard_of_is_a_fixed_spread_function_of_the_id():
  ids = np.arange(10_000, dtype=np.int64)
  shards = graph.shard_of(ids, 16)
  assert shards.min() == 0 and shards.max() == 15
  # Splitmix64 spreads consecutive ids: every shard within 20% of even.
  assert np.all(np.abs(np.bincount(shards) - 625) < 125)
  # Pinned: changing the function re-deals nodes between runs' shards.
  assert _ints(graph.shard_of(np.array([0, 1, 2**40]), 64)) == [47, 1, 9]
  assert _ints(graph.shard_of(np.array([0, 1, 2**40]), 1)) == [0, 0, 0]


def _routed(a, b, shards, both):
  """destinations() grouped: {shard: (a, b)}."""
  dest, ra, rb = graph.destinations(a, b, shards, both)
  assert len(dest) == len(ra) == len(rb)
  return {int(s): (ra[dest == s], rb[dest == s]) for s in np.unique(dest)}


def test_destinations_send_an_edge_to_both_owners_once_each():
  a = np.array([10, 11, 12, 13, 14], dtype=np.int64)
  b = np.array([1, 2, 3, 4, 5], dtype=np.int64)
  owner_a, owner_b = graph.shard_of(a, 4), graph.shard_of(b, 4)
  parts = _routed(a, b, 4, both=True)
  got = {(s, x, y) for s, (pa, pb) in parts.items()
         for x, y in zip(_ints(pa), _ints(pb))}
  want = {(int(o), x, y) for x, y, oa, ob in zip(_ints(a), _ints(b), owner_a,
                                                 owner_b) for o in {oa, ob}}
  assert got == want
  assert sum(len(pa) for pa, _ in parts.values()) == len(want)
  one = _routed(a, b, 4, both=False)
  assert {(s, x) for s, (pa, _) in one.items() for x in _ints(pa)} == {
      (int(o), x) for x, o in zip(_ints(a), owner_a)}


# --- large_star / small_star (one shard owning every node) -------------------


def _edges(star):
  return sorted(zip(_ints(star.child), _ints(star.parent)))


def test_large_star_repoints_larger_neighbours_to_neighbourhood_minimum():
  # Node 5 with neighbours 3, 7, 9, 7 (a duplicate) and 1.
  a = np.array([5, 7, 9, 7, 5], dtype=np.int64)
  b = np.array([3, 5, 5, 5, 1], dtype=np.int64)
  star = graph.large_star(a, b, 0, 1)
  # At 5 (m = 1): 7 and 9 move onto 1. At 1 (m = 1): 5 stays. At 3: 5 stays
  # on 3. 7 and 9 have no larger neighbour.
  assert _edges(star) == [(5, 1), (5, 3), (7, 1), (9, 1)]
  assert star.changed == 2  # the larger neighbours of 5, whose m != 5
  assert star.incidences == 10  # 16 bytes each reached the shard


def test_large_star_handles_only_owned_nodes():
  a = np.array([5, 7], dtype=np.int64)
  b = np.array([1, 5], dtype=np.int64)
  owned = graph.shard_of(np.array([1, 5, 7]), 2)
  for shard in (0, 1):
    star = graph.large_star(a, b, shard, 2)
    mine = {n for n, o in zip((1, 5, 7), owned) if o == shard}
    want = set()
    if 1 in mine:
      want.add((5, 1))
    if 5 in mine:
      want.add((7, 1))
    assert set(_edges(star)) == want
    assert star.incidences == sum(2 if n == 5 else 1 for n in mine)


def test_large_star_accepts_large_ids():
  big = 2**50
  star = graph.large_star(np.array([big + 3, big + 1, big]),
                          np.array([big, big, big - 1]), 0, 1)
  assert (big + 3, big - 1) in _edges(star)


def test_small_star_connects_child_and_its_parents_to_their_minimum():
  star = graph.small_star(np.array([9, 9, 9, 9], dtype=np.int64),
                          np.array([4, 2, 4, 6], dtype=np.int64))
  assert _edges(star) == [(4, 2), (6, 2), (9, 2)]
  assert star.changed == 2  # parents 4 and 6 re-pointed
  assert star.incidences == 4


def test_small_star_single_parent_is_unchanged_edge():
  star = graph.small_star(np.array([9, 9]), np.array([2, 2]))
  assert _edges(star) == [(9, 2)]
  assert star.changed == 0


def test_small_star_then_large_star_build_a_star():
  # Path 1 - 5 - 3 - 8 oriented as child > parent: (5,1), (5,3), (8,3).
  star = graph.small_star(np.array([5, 5, 8]), np.array([1, 3, 3]))
  assert _edges(star) == [(3, 1), (5, 1), (8, 3)]
  # Large star at 3 (neighbours 1, 8) moves 8 onto 1.
  star = graph.large_star(star.child, star.parent, 0, 1)
  assert _edges(star) == [(3, 1), (5, 1), (8, 1)]


# --- classify / final_labels -------------------------------------------------


def test_classify_roles_of_owned_nodes():
  # 2 -> 1, 3 -> 1 (leaves of root 1); 7 -> 5 and 7 -> 6 (7 unsettled);
  # 9 -> 7 (a child of an unsettled node, itself a leaf).
  a = np.array([2, 3, 7, 7, 9, 2], dtype=np.int64)
  b = np.array([1, 1, 5, 6, 7, 1], dtype=np.int64)
  c = graph.classify(a, b, 0, 1)
  assert _ints(c.unsettled) == [7]
  assert sorted(zip(_ints(c.leaf), _ints(c.leaf_parent))) == [
      (2, 1), (3, 1), (9, 7)]
  assert sorted(zip(_ints(c.residual_child), _ints(c.residual_parent))) == [
      (7, 5), (7, 6), (9, 7)]


def test_final_labels_every_node_once():
  # Root 1 with leaf 2; root 5 in the residual (labelled 4) with leaf 8;
  # unsettled 7 whose leaf 9 the union-find labelled.
  nodes, labels = graph.final_labels(
      leaf_parent=np.array([1, 5, 7]), leaf=np.array([2, 8, 9]),
      unsettled=np.array([7]), uf_nodes=np.array([4, 5, 7, 9]),
      uf_labels=np.array([4, 4, 4, 4]))
  assert sorted(zip(_ints(nodes), _ints(labels))) == [
      (1, 1), (2, 1), (4, 4), (5, 4), (7, 4), (8, 4), (9, 4)]


def _all_shards(a, b, shards, rounds):
  """The rounds, classification, union-find and labelling of
  transforms.components, run in memory."""

  def by_shard(x, y, both):
    return _routed(x, y, shards, both)

  a, b = np.maximum(a, b), np.minimum(a, b)
  for _ in range(rounds):
    large = [graph.large_star(x, y, s, shards)
             for s, (x, y) in by_shard(a, b, True).items()]
    a = np.concatenate([st.child for st in large] + [np.zeros(0, np.int64)])
    b = np.concatenate([st.parent for st in large] + [np.zeros(0, np.int64)])
    small = [graph.small_star(x, y) for x, y in by_shard(a, b, False).values()]
    a = np.concatenate([st.child for st in small] + [np.zeros(0, np.int64)])
    b = np.concatenate([st.parent for st in small] + [np.zeros(0, np.int64)])
  parts = {s: graph.classify(x, y, s, shards)
           for s, (x, y) in by_shard(a, b, True).items()}
  rc = np.concatenate([c.residual_child for c in parts.values()])
  rp = np.concatenate([c.residual_parent for c in parts.values()])
  uf_nodes, uf_labels = graph.component_minima(*graph.oriented_unique(rc, rp))
  out = {}
  for s in range(shards):
    own = graph.shard_of(uf_nodes, shards) == s
    leaf_parent = np.concatenate([c.leaf_parent for c in parts.values()])
    leaf = np.concatenate([c.leaf for c in parts.values()])
    mine = graph.shard_of(leaf_parent, shards) == s
    unsettled = parts[s].unsettled if s in parts else np.zeros(0, np.int64)
    nodes, labels = graph.final_labels(leaf_parent[mine], leaf[mine],
                                       unsettled, uf_nodes[own],
                                       uf_labels[own])
    for n, lab in zip(_ints(nodes), _ints(labels)):
      assert n not in out, f"node {n} labelled twice"
      out[n] = lab
  return out


@pytest.mark.parametrize("shards", [1, 3, 16])
@pytest.mark.parametrize("rounds", [0, 1, 6])
def test_sharded_steps_give_exact_labels_for_any_shards_and_rounds(shards,
                                                                   rounds):
  rng = np.random.default_rng(shards * 10 + rounds)
  for _ in range(5):
    n = int(rng.integers(2, 300))
    ids = rng.choice(10**9, size=n, replace=False)
    pairs = rng.integers(n, size=(int(rng.integers(1, 300)), 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    a, b = ids[pairs[:, 0]], ids[pairs[:, 1]]
    expected = graph.union_find_labels(zip(_ints(a), _ints(b)))
    assert _all_shards(a, b, shards, rounds) == expected


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
