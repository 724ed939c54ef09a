"""Connected-component kernels: the two star operations of Kiveris et al.
(2014), applied to one node's neighbourhood, and an exact union-find for the
small residual left after the distributed rounds.

Edges are pairs of int node ids; labels are the minimum node id of each
component, so a component's label is also its first document in input order.
"""

from __future__ import annotations

from typing import Iterable, Tuple

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
