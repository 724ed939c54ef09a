"""Connected-component kernels on int64 edge arrays: an array union-find
(compiled by numba where :mod:`~transforms.kernels.dispatch` says so), the
per-shard contraction and classification steps of the distributed rounds in
:mod:`transforms.components`, and a maximum-weight spanning forest.

Edges are pairs of int node ids; labels are the minimum node id of each
component, so a component's label is also its first document in input order.
Every function depends only on the *set* of edges it is given (not on their
order or multiplicity), which keeps the distributed results independent of
how a runner bundles them.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Tuple

import numpy as np

from transforms.kernels import dispatch
from transforms.kernels.union_find import unite

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def shard_of(nodes: np.ndarray, shards: int) -> np.ndarray:
  """Owner shard in ``[0, shards)`` of each node id (splitmix64 finalizer of
  the id, so consecutive ids spread evenly)."""
  with np.errstate(over="ignore"):
    h = np.asarray(nodes, dtype=np.int64).view(np.uint64) + _GOLDEN
    h = (h ^ (h >> np.uint64(30))) * _M1
    h = (h ^ (h >> np.uint64(27))) * _M2
    h ^= h >> np.uint64(31)
  return (h % np.uint64(shards)).astype(np.int64)


def oriented_unique(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray,
                                                           np.ndarray]:
  """The distinct edges as ``(child, parent)`` with child > parent, sorted
  by (child, parent); self-loops dropped."""
  a = np.asarray(a, dtype=np.int64)
  b = np.asarray(b, dtype=np.int64)
  child, parent = np.maximum(a, b), np.minimum(a, b)
  loop = child == parent
  if loop.any():
    child, parent = child[~loop], parent[~loop]
  order = np.lexsort((parent, child))
  child, parent = child[order], parent[order]
  if len(child) > 1:
    new = np.empty(len(child), dtype=bool)
    new[0] = True
    new[1:] = (child[1:] != child[:-1]) | (parent[1:] != parent[:-1])
    child, parent = child[new], parent[new]
  return child, parent


def _unite(a: np.ndarray, b: np.ndarray, n: int):
  """:func:`unite` on the path the call's size picks: compiled, or run by
  the interpreter."""
  kernels = dispatch.compiled_kernels(len(a) * dispatch.PYTHON_STEP)
  return (unite if kernels is None else kernels.unite)(a, b, n)


def component_minima(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray,
                                                            np.ndarray]:
  """``(nodes, labels)``: every node on an edge (sorted) and the minimum id
  of its component, exactly."""
  a = np.asarray(a, dtype=np.int64)
  b = np.asarray(b, dtype=np.int64)
  nodes, index = np.unique(np.concatenate([a, b]), return_inverse=True)
  index = index.ravel()
  roots, _ = _unite(index[:len(a)], index[len(a):], len(nodes))
  return nodes, nodes[roots]


def union_find_labels(edges: Iterable[Tuple]) -> dict:
  """Exact component labels (minimum node id) for every node in ``edges``;
  ids may be any orderable hashables (evaluation reads string ids)."""
  parent = {}

  def find(x):
    root = x
    while parent[root] != root:
      root = parent[root]
    while parent[x] != root:
      parent[x], x = root, parent[x]
    return root

  for u, v in edges:
    parent.setdefault(u, u)
    parent.setdefault(v, v)
    ru, rv = find(u), find(v)
    if ru != rv:
      # The smaller id becomes the root, so the root is the component minimum.
      if rv < ru:
        ru, rv = rv, ru
      parent[rv] = ru
  return {x: find(x) for x in parent}


def destinations(a: np.ndarray, b: np.ndarray, shards: int, both: bool
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Where each edge goes: the owner shard of ``a`` (and of ``b`` too when
  ``both``; an edge whose ends share an owner goes there once). Returns
  ``(shard, a, b)`` aligned, the edges sent to a second shard repeated
  after all the others.

  >>> destinations(np.array([10, 11]), np.array([1, 11]), 4, both=True)
  (array([2, 1, 1]), array([10, 11, 10]), array([ 1, 11,  1]))
  """
  a = np.asarray(a, dtype=np.int64)
  b = np.asarray(b, dtype=np.int64)
  dest = shard_of(a, shards)
  if not both:
    return dest, a, b
  other = shard_of(b, shards)
  apart = other != dest
  return (np.concatenate([dest, other[apart]]),
          np.concatenate([a, a[apart]]), np.concatenate([b, b[apart]]))


class Star(NamedTuple):
  """A star step's result on one shard: new ``(child, parent)`` edges (a
  multiset), edges re-pointed (``changed``) and node-edge incidences read
  (what was shuffled to the shard, 16 bytes each)."""
  child: np.ndarray
  parent: np.ndarray
  changed: int
  incidences: int


def _first_of_runs(keys: np.ndarray) -> np.ndarray:
  starts = np.ones(len(keys), dtype=bool)
  starts[1:] = keys[1:] != keys[:-1]
  return starts


def large_star(a: np.ndarray, b: np.ndarray, shard: int,
               shards: int) -> Star:
  """Large-star (Kiveris et al., 2014) at every node the shard owns, given
  every edge touching them: each strictly larger neighbour of node u is
  connected to m(u), the minimum of u's closed neighbourhood. ``changed``
  counts the new edges of the nodes u with m(u) != u."""
  a = np.asarray(a, dtype=np.int64)
  b = np.asarray(b, dtype=np.int64)
  u, v = np.concatenate([a, b]), np.concatenate([b, a])
  own = shard_of(u, shards) == shard
  u, v = u[own], v[own]
  order = np.lexsort((v, u))
  u, v = u[order], v[order]
  starts = _first_of_runs(u)
  # v is sorted within each u, so a run's first v is its minimum neighbour.
  m = np.minimum(u, v[starts][np.cumsum(starts) - 1])
  distinct = np.ones(len(u), dtype=bool)
  distinct[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
  larger = distinct & (v > u)
  changed = int(np.count_nonzero(larger & (m != u)))
  return Star(v[larger], m[larger], changed, len(u))


def small_star(child: np.ndarray, parent: np.ndarray) -> Star:
  """Small-star at every child of the given ``(child, parent)`` edges
  (child > parent; all edges of each child): the child and its distinct
  parents are connected to the smallest of those parents. ``changed``
  counts, per child, the distinct parents other than that minimum."""
  incidences = len(child)
  child, parent = oriented_unique(child, parent)
  starts = _first_of_runs(child)
  m = parent[starts][np.cumsum(starts) - 1]
  # Each child's minimum parent is re-pointed to nothing; every other
  # parent, and the child itself, point at it.
  moved = ~starts
  changed = int(np.count_nonzero(moved))
  new_child = np.concatenate([child[starts], parent[moved]])
  new_parent = np.concatenate([m[starts], m[moved]])
  return Star(new_child, new_parent, changed, incidences)


class Classified(NamedTuple):
  """A shard's owned nodes classified in a (child → parent) edge set.

  ``residual_*``: every edge touching an owned unsettled node (several
  parents, or a parent and children); ``leaf_parent``/``leaf``: each owned
  node with exactly one parent and no children, with that parent;
  ``unsettled``: the owned unsettled node ids (sorted)."""
  residual_child: np.ndarray
  residual_parent: np.ndarray
  leaf_parent: np.ndarray
  leaf: np.ndarray
  unsettled: np.ndarray


def classify(a: np.ndarray, b: np.ndarray, shard: int,
             shards: int) -> Classified:
  """Classify the nodes the shard owns, given every edge touching them
  (edges among other nodes may be present and are ignored)."""
  child, parent = oriented_unique(a, b)
  nodes = np.unique(np.concatenate([child, parent]))
  owned = nodes[shard_of(nodes, shards) == shard]
  # Edges are sorted by child, so each node's parents are one run.
  n_parents = (np.searchsorted(child, owned, side="right")
               - np.searchsorted(child, owned, side="left"))
  has_children = np.isin(owned, parent)
  unsettled = owned[(n_parents > 1) | ((n_parents == 1) & has_children)]
  leaf = owned[(n_parents == 1) & ~has_children]
  touch = np.isin(child, unsettled) | np.isin(parent, unsettled)
  return Classified(child[touch], parent[touch],
                    parent[np.searchsorted(child, leaf)], leaf, unsettled)


def final_labels(leaf_parent: np.ndarray, leaf: np.ndarray,
                 unsettled: np.ndarray, uf_nodes: np.ndarray,
                 uf_labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """``(nodes, labels)`` a shard emits after the residual union-find.

  Args:
    leaf_parent, leaf: leaves whose parent this shard owns.
    unsettled: the unsettled nodes this shard owns (their leaves are in the
      union-find already).
    uf_nodes, uf_labels: the union-find's labels of the nodes this shard
      owns, sorted by node.
  Every node is emitted by exactly one shard: residual nodes with their
  union-find label, leaves of a settled parent with the parent's label,
  and settled roots outside the residual with themselves.
  """
  settled = ~np.isin(leaf_parent, unsettled)
  leaf_parent, leaf = leaf_parent[settled], leaf[settled]
  roots = np.unique(leaf_parent)
  pos = np.searchsorted(uf_nodes, roots)
  in_uf = pos < len(uf_nodes)
  in_uf[in_uf] = uf_nodes[pos[in_uf]] == roots[in_uf]
  root_label = roots.copy()
  root_label[in_uf] = uf_labels[pos[in_uf]]
  leaf_label = root_label[np.searchsorted(roots, leaf_parent)]
  return (np.concatenate([uf_nodes, leaf, roots[~in_uf]]),
          np.concatenate([uf_labels, leaf_label, roots[~in_uf]]))


def spanning_forest(src: np.ndarray, dst: np.ndarray,
                    weight: np.ndarray) -> np.ndarray:
  """Mask of the edges of a maximum-weight spanning forest (Kruskal).

  The kept edges are real edges and connect exactly the same components as
  all of them, with at most (nodes - components) edges. Heavier edges win,
  then lower (src, dst); NaN weights (unknown) count as the lightest, so the
  result depends only on the set of edges, not on their order.
  """
  src = np.asarray(src, dtype=np.int64)
  dst = np.asarray(dst, dtype=np.int64)
  weight = np.asarray(weight, dtype=np.float64)
  if not len(src):
    return np.zeros(0, dtype=bool)
  order = np.lexsort((dst, src, -np.nan_to_num(weight, nan=-np.inf)))
  nodes, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
  index = index.ravel()
  keep = np.zeros(len(src), dtype=bool)
  keep[order] = _unite(index[:len(src)][order], index[len(src):][order],
                       len(nodes))[1]
  return keep

