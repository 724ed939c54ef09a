"""The array union-find of the connected-component kernels, in numba's
subset of Python, in a module of its own: :mod:`~transforms.kernels.compiled`
compiles it and :mod:`~transforms.kernels.connected` runs it as it is, so
neither imports the other (the compiled module is what
:mod:`~transforms.kernels.dispatch` loads for connected)."""

from __future__ import annotations

import numpy as np


def root(parent, x):
  """The root of ``x`` in the union-find array ``parent``, halving the
  path on the way."""
  while parent[x] != x:
    parent[x] = parent[parent[x]]
    x = parent[x]
  return x


def unite(a, b, n):
  """Union-find over n dense indices, uniting ``a[i]`` with ``b[i]`` in
  order: ``(roots, joined)``, the root of every index (the smallest of its
  component) and the mask of the edges that joined two components
  (Kruskal's choice when the edges come heaviest first). Path halving, in
  numba's subset of Python: :mod:`~transforms.kernels.compiled` compiles
  this very function for large inputs; small ones run it as it is
  (:func:`transforms.kernels.connected._unite` picks)."""
  parent = np.arange(n)
  joined = np.zeros(len(a), dtype=np.bool_)
  for i in range(len(a)):
    x, y = root(parent, a[i]), root(parent, b[i])
    if x != y:
      parent[max(x, y)] = min(x, y)
      joined[i] = True
  # Roots are smaller than their descendants, so one ascending pass
  # finishes every path.
  for x in range(n):
    parent[x] = parent[parent[x]]
  return parent, joined
