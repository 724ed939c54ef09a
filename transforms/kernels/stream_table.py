"""A table of opaque records by string id, sorted by a 64-bit hash of the
id, that an invocation reads and rewrites in proportion to the rows it
touches plus one vectorised copy of the others.

Verdicts keeps each undecided document's progress in one: a bounded
input's documents all arrive before their first answers, and a cell of
every pending document's progress, decoded and encoded record by record
on each invocation, made the streaming CLI's cost grow with the square of
a file's length.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence

import numpy as np

from transforms.kernels.stream_shard import find_id, id_hash


class BlobTable(NamedTuple):
  """Rows sorted by ``hashes`` (:func:`id_hash` of the id; equal hashes
  are told apart by the ids): row i's id is ``id_bytes[id_offsets[i]:
  id_offsets[i + 1]]`` (UTF-8) and its record ``blobs[blob_offsets[i]:
  blob_offsets[i + 1]]``."""
  hashes: np.ndarray
  id_bytes: bytes
  id_offsets: np.ndarray
  blobs: bytes
  blob_offsets: np.ndarray

  def __len__(self):
    return len(self.hashes)

  def blob(self, row: int) -> bytes:
    return self.blobs[self.blob_offsets[row]:self.blob_offsets[row + 1]]


def empty_table() -> BlobTable:
  one = np.zeros(1, np.int64)
  return BlobTable(np.zeros(0, np.uint64), b"", one, b"", one)


def find(table: BlobTable, ids: Sequence[str]) -> np.ndarray:
  """The row of each id, -1 where it has none."""
  rows = [find_id(table.hashes, table.id_bytes, table.id_offsets, i)
          for i in ids]
  return np.array([-1 if row is None else row for row in rows], np.int64)


def updated(table: BlobTable, drop: np.ndarray, ids: List[str],
            blobs: List[bytes]) -> BlobTable:
  """``table`` without the rows ``drop`` and with rows ``(ids[i],
  blobs[i])`` added (ids not in the table, or among those dropped), each
  placed after the kept rows of an equal or lower hash. The rows kept are
  copied as runs (one slice per run between rows dropped or added), and
  the offsets and hashes are computed for all rows at once, so this costs
  the rows touched plus one copy of the bytes."""
  keep = np.ones(len(table), bool)
  keep[np.asarray(drop, np.int64)] = False
  kept = np.flatnonzero(keep)
  new_hashes = np.array([id_hash(i) for i in ids], np.uint64)
  order = np.argsort(new_hashes, kind="stable")
  if not len(kept) and not len(order):
    return empty_table()
  encoded = [ids[i].encode("utf-8") for i in order.tolist()]
  added = [blobs[i] for i in order.tolist()]
  # The new table's rows: kept rows as themselves, the k-th new row (in
  # hash order) as len(table) + k, each after the kept rows of a hash <=.
  n_old = len(table)
  at = np.searchsorted(table.hashes[kept], new_hashes[order], "right")
  rows = np.insert(kept, at, n_old + np.arange(len(order)))
  is_new = rows >= n_old
  hashes = np.concatenate([table.hashes, new_hashes[order]])[rows]
  id_lengths = np.concatenate([
      np.diff(table.id_offsets), np.array([len(e) for e in encoded],
                                          np.int64)])[rows]
  blob_lengths = np.concatenate([
      np.diff(table.blob_offsets), np.array([len(b) for b in added],
                                            np.int64)])[rows]
  # Runs of consecutive old rows are copied with one slice each.
  breaks = np.flatnonzero(is_new[1:] | is_new[:-1]
                          | (np.diff(rows) != 1)) + 1
  id_parts, blob_parts = [], []
  bounds = [0] + breaks.tolist() + [len(rows)]
  for start, end in zip(bounds[:-1], bounds[1:]):
    first = int(rows[start])
    if first >= n_old:
      id_parts.append(encoded[first - n_old])
      blob_parts.append(added[first - n_old])
      continue
    last = int(rows[end - 1]) + 1
    id_parts.append(table.id_bytes[table.id_offsets[first]:
                                   table.id_offsets[last]])
    blob_parts.append(table.blobs[table.blob_offsets[first]:
                                  table.blob_offsets[last]])

  def offsets_of(lengths):
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out

  return BlobTable(hashes, b"".join(id_parts), offsets_of(id_lengths),
                   b"".join(blob_parts), offsets_of(blob_lengths))
