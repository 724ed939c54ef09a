"""Per-shard cluster decisions on arrays: the document kept per cluster and
the neighbour each removed document is explained by (used by
:mod:`transforms.select` and :mod:`transforms.explain`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Chosen(NamedTuple):
  """Members sorted by ``(label, node)`` with their cluster's size and
  kept document; ``starts`` are the row offsets of each cluster (one more
  than there are clusters)."""
  nodes: np.ndarray
  labels: np.ndarray
  sizes: np.ndarray
  kept: np.ndarray
  starts: np.ndarray


def choose_kept(nodes: np.ndarray, labels: np.ndarray,
                lengths: np.ndarray) -> Chosen:
  """The kept document of every cluster: the longest member, ties (and
  equal lengths, the ``first`` policy) to the lowest id.

  Args:
    nodes: the member document ids (each once).
    labels: each member's cluster label.
    lengths: each member's text length (zeros for ``first``).

  >>> c = choose_kept(np.array([5, 2, 9, 4]), np.array([2, 2, 4, 4]),
  ...                 np.array([1, 1, 7, 3]))
  >>> c.nodes.tolist(), c.sizes.tolist(), c.kept.tolist(), c.starts.tolist()
  ([2, 5, 4, 9], [2, 2, 2, 2], [2, 2, 9, 9], [0, 2, 4])
  """
  nodes = np.asarray(nodes, dtype=np.int64)
  labels = np.asarray(labels, dtype=np.int64)
  lengths = np.asarray(lengths, dtype=np.int64)
  # Within a label: longest first, then lowest id.
  best = np.lexsort((nodes, -lengths, labels))
  starts = np.flatnonzero(np.r_[True, labels[best][1:] != labels[best][:-1],
                                True])
  sizes = np.diff(starts)
  kept = nodes[best[starts[:-1]]]
  by_node = np.lexsort((nodes, labels))
  return Chosen(nodes[by_node], labels[by_node], np.repeat(sizes, sizes),
                np.repeat(kept, sizes), starts)


class Matched(NamedTuple):
  """Each explained document's ``neighbours`` and the ``similarity`` of
  that edge (NaN when unknown; the highest of its ends when it has
  several)."""
  neighbours: np.ndarray
  similarity: np.ndarray


def choose_matched(docs: np.ndarray, kept_ids: np.ndarray,
                   end_docs: np.ndarray, end_others: np.ndarray,
                   end_similarity: np.ndarray) -> Matched:
  """The neighbour each of ``docs`` is explained by, among its verified
  edges ``end_docs[i] -> end_others[i]`` (similarity NaN when unknown): its
  cluster's kept document when they share an edge, else the most similar
  neighbour (unknown similarity last), then the lowest id.

  Args:
    docs: the documents to explain, sorted and unique.
    kept_ids: each one's kept document.
    end_docs, end_others, end_similarity: edge ends; ends of other
      documents are ignored.

  Raises:
    ValueError: a document has no edge end.

  >>> m = choose_matched(np.array([3, 7]), np.array([1, 1]),
  ...                    np.array([3, 3, 7, 7]), np.array([8, 1, 9, 2]),
  ...                    np.array([0.9, 0.5, np.nan, 0.6]))
  >>> m.neighbours.tolist(), m.similarity.tolist()
  ([1, 2], [0.5, 0.6])
  """
  docs = np.asarray(docs, dtype=np.int64)
  end_docs = np.asarray(end_docs, dtype=np.int64)
  end_others = np.asarray(end_others, dtype=np.int64)
  rows = np.minimum(np.searchsorted(docs, end_docs), max(len(docs) - 1, 0))
  mine = (docs[rows] == end_docs) if len(docs) else np.zeros(0, dtype=bool)
  rows, others = rows[mine], end_others[mine]
  similarity = np.asarray(end_similarity, dtype=np.float64)[mine]
  not_kept = others != kept_ids[rows]
  rank = np.where(np.isnan(similarity), np.inf, -similarity)
  order = np.lexsort((others, rank, not_kept, rows))
  rows, others, similarity = rows[order], others[order], similarity[order]
  first = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else rows.astype(bool)
  if np.count_nonzero(first) != len(docs):
    missing = np.setdiff1d(np.arange(len(docs)), rows)
    raise ValueError(f"document {int(docs[missing[0]])} has no verified edge"
                     " to explain it by")
  return Matched(others[first], similarity[first])
