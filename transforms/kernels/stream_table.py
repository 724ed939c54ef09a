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
  blobs[i])`` added (ids not in the table, or among those dropped). The
  rows kept are copied as runs (one slice per run between rows dropped or
  added), so this costs the rows touched plus one copy of the bytes."""
  keep = np.ones(len(table), bool)
  keep[np.asarray(drop, np.int64)] = False
  kept = np.flatnonzero(keep)
  new_hashes = np.array([id_hash(i) for i in ids], np.uint64)
  order = np.argsort(new_hashes, kind="stable")
  # Where each new row goes: after this many kept rows.
  at = np.searchsorted(table.hashes[kept], new_hashes[order], "right")
  cuts = np.union1d(np.flatnonzero(np.diff(kept) != 1) + 1, at)
  cuts = np.union1d(cuts, [0, len(kept)]).tolist()
  at = at.tolist()
  hashes, id_parts, id_lengths, blob_parts, blob_lengths = [], [], [], [], []

  def add_new(i):
    encoded = ids[i].encode("utf-8")
    hashes.append(new_hashes[i:i + 1])
    id_parts.append(encoded)
    id_lengths.append(np.array([len(encoded)], np.int64))
    blob_parts.append(blobs[i])
    blob_lengths.append(np.array([len(blobs[i])], np.int64))

  n = 0
  for start, end in zip(cuts[:-1], cuts[1:]):
    while n < len(order) and at[n] == start:
      add_new(int(order[n]))
      n += 1
    first, last = int(kept[start]), int(kept[end - 1]) + 1
    hashes.append(table.hashes[first:last])
    for parts, lengths, data, offsets in (
        (id_parts, id_lengths, table.id_bytes, table.id_offsets),
        (blob_parts, blob_lengths, table.blobs, table.blob_offsets)):
      parts.append(data[offsets[first]:offsets[last]])
      lengths.append(np.diff(offsets[first:last + 1]))
  while n < len(order):
    add_new(int(order[n]))
    n += 1
  if not hashes:
    return empty_table()

  def offsets_of(lengths):
    out = np.zeros(sum(map(len, lengths)) + 1, np.int64)
    np.cumsum(np.concatenate(lengths), out=out[1:])
    return out

  return BlobTable(np.concatenate(hashes), b"".join(id_parts),
                   offsets_of(id_lengths), b"".join(blob_parts),
                   offsets_of(blob_lengths))
