"""Connected-component kernels: the two star operations of Kiveris et al.
(2014), applied to one node's neighbourhood, and an exact union-find for the
small residual left after the distributed rounds.

Edges are pairs of int node ids; labels are the minimum node id of each
component, so a component's label is also its first document in input order.
"""

from __future__ import annotations

from typing import Iterable, Tuple

import numba
import numpy as np


def large_star(node: int, neighbors: np.ndarray) -> Tuple[np.ndarray, int]:
  """Large-star at ``node``: connects every strictly larger neighbour to the
  minimum of the closed neighbourhood.

  Returns ``(larger, m)``: the new edges are (v, m) for v in ``larger``;
  ``changed`` edges are those with m != node.
  """
  nbrs = np.unique(np.asarray(neighbors, dtype=np.int64))
  m = min(int(nbrs[0]), node) if len(nbrs) else node
  return nbrs[nbrs > node], m


def small_star(node: int, smaller: np.ndarray) -> Tuple[np.ndarray, int]:
  """Small-star at ``node`` given its neighbours not larger than itself:
  connects the node and each of those neighbours to their minimum m.

  Returns ``(members, m)``: the new edges are (v, m) for v in ``members``
  (m itself excluded).
  """
  nbrs = np.unique(np.asarray(smaller, dtype=np.int64))
  nbrs = nbrs[nbrs != node]
  if len(nbrs) == 0:
    return nbrs, node
  m = int(nbrs[0])
  return np.append(nbrs[1:], np.int64(node)), m


def union_find_labels(edges: Iterable[Tuple[int, int]]) -> dict:
  """Exact component labels (minimum node id) for every node in ``edges``."""
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


def classify_node(parents: np.ndarray, children: np.ndarray) -> str:
  """Role of a node in the oriented (child → smaller parent) edge set left by
  the rounds: ``"root"`` (children only), ``"leaf"`` (exactly one parent, no
  children) or ``"unsettled"`` (several parents, or both parents and
  children). The edge set is a star forest exactly when no node is
  unsettled."""
  n_parents = len(np.unique(parents))
  if n_parents > 1 or (n_parents and len(children)):
    return "unsettled"
  return "leaf" if n_parents else "root"


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
  keep[order] = _kruskal(index[:len(src)][order], index[len(src):][order],
                         len(nodes))
  return keep


@numba.njit(cache=True, nogil=True)
def _kruskal(a, b, n):
  parent = np.arange(n)
  keep = np.zeros(len(a), dtype=np.bool_)
  for i in range(len(a)):
    x = a[i]
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    y = b[i]
    while parent[y] != y:
      parent[y] = parent[parent[y]]
      y = parent[y]
    if x != y:
      parent[max(x, y)] = min(x, y)
      keep[i] = True
  return keep
