"""StrikeSubstrings: exact-substring deduplication as Beam transforms.

Every step is keyed and sharded like the near-dup graph: documents travel
as blocks (:mod:`transforms.substrings.elements`), anchors and their
contexts by anchor-hash shard, so nothing collects the corpus on one
worker. Why the result equals a suffix array's: see
:mod:`transforms.kernels.substrings`.
"""

from __future__ import annotations

from typing import Any, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.elements import TextBatch
from transforms.join import JoinByKey
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import substrings as kernels
from transforms.substrings.elements import (AnchorBatch, BlockLayout,
                                            ContextBatch, DocBlock,
                                            PackedBlock, PackedContexts,
                                            SpanBatch, block_of, payload_bytes)

# stats.json counts.
BYTES_STRUCK, DOCS_TOUCHED = "substrings_bytes_struck", "substrings_docs_touched"
DOCS_EMPTIED = "substrings_docs_emptied"
_COUNTED = {metrics.COUNTS: Any}


class StrikeSubstrings(beam.PTransform):
  """Finds the struck spans of every document: the byte positions covered by
  a substring of at least ``threshold`` bytes that occurs twice or more in
  the corpus (``strike="all"``), or only those of each such substring's
  later occurrences, in document-id order (``strike="later"``), equal to a
  suffix array's, narrowed to whole UTF-8 code points.

  Input: :class:`~transforms.elements.TextBatch` elements (document ids in
  input order, as :class:`~transforms.read.ReadDocuments` numbers them).

  Args:
    threshold: T, the shortest repeated substring struck, in bytes.
    strike: ``later`` (default) or ``all``.
    shards: the number of anchor shards.
    removed: optional PCollection of int64 document ids to leave out (the
      documents near-dup removed), so that only the kept ones count.

  Returns:
    ``{"spans": (block, SpanBatch) of each block with struck spans, sorted by
    (document, start); "blocks": (block, DocBlock) of the documents taken
    into account; "counts": a tuple of count PCollections}``.
  """

  def __init__(self, threshold: int, strike: str = "later",
               shards: int = 64, removed=None):
    super().__init__()
    if strike not in kernels.STRIKE_MODES:
      raise ValueError(f"strike={strike!r}: use one of "
                       f"{kernels.STRIKE_MODES}")
    if not isinstance(threshold, int) or threshold < 1:
      raise ValueError(f"threshold={threshold!r}: use a positive number of"
                       " bytes")
    self._threshold = threshold
    self._strike = strike
    self._shards = shards
    self._removed = removed

  def expand(self, batches):
    t, shards = self._threshold, self._shards
    # The blocks cross joins compressed (one join, two with ``removed``);
    # their layouts (no text) go into the last one.
    blocks = (batches
              | "ToBlocks" >> beam.FlatMap(_to_blocks)
              .with_output_types(Tuple[int, DocBlock]))
    counts = []
    if self._removed is not None:
      packed, packed_counts = _pack_blocks(blocks, "PackBlocks")
      counts.append(packed_counts)
      blocks = ({"docs": packed, "removed": self._removed}
                | "JoinRemoved" >> JoinByKey(key_by={"removed": block_of})
                | "DropRemoved" >> beam.FlatMap(_drop_removed)
                .with_output_types(Tuple[int, DocBlock]))
    anchors = (blocks
               | "Winnow" >> beam.ParDo(_WinnowFn(t, shards))
               .with_output_types(Tuple[int, AnchorBatch], **_COUNTED)
               .with_outputs(metrics.COUNTS, main="anchors"))
    candidates = (anchors.anchors
                  | "GroupAnchors" >> beam.GroupByKey()
                  | "KeepRepeated" >> beam.FlatMap(_keep_repeated)
                  .with_output_types(Tuple[int, AnchorBatch]))
    packed, packed_counts = _pack_blocks(
        blocks, "PackBlocks" if self._removed is None else "PackKeptBlocks")
    counts.append(packed_counts)
    found = ({"docs": packed, "anchors": candidates}
             | "JoinAnchors" >> JoinByKey()
             | "TakeContexts" >> beam.ParDo(_ContextsFn(t, shards))
             .with_output_types(Tuple[int, PackedContexts], **_COUNTED)
             .with_outputs(metrics.COUNTS, main="contexts"))
    struck = (found.contexts
              | "GroupContexts" >> beam.GroupByKey()
              | "CompareWindows" >> beam.FlatMap(
                  _compare_windows, t, self._strike)
              .with_output_types(Tuple[int, SpanBatch]))
    layouts = (blocks
               | "ToLayouts" >> beam.FlatMap(_to_layout)
               .with_output_types(Tuple[int, BlockLayout], **_COUNTED)
               .with_outputs(metrics.COUNTS, main="layouts"))
    spans = ({"docs": layouts.layouts, "struck": struck}
             | "JoinStruck" >> JoinByKey()
             | "MergeSpans" >> beam.ParDo(_MergeSpansFn())
             .with_output_types(Tuple[int, SpanBatch], **_COUNTED)
             .with_outputs(metrics.COUNTS, main="spans"))
    return {"spans": spans.spans, "blocks": blocks,
            "counts": (*counts, layouts[metrics.COUNTS],
                       anchors[metrics.COUNTS], found[metrics.COUNTS],
                       spans[metrics.COUNTS])}


def _to_blocks(batch: TextBatch):
  """A text batch's documents as UTF-8 :class:`DocBlock`\\ s, one per
  block."""
  ids = np.asarray(batch.ids, dtype=np.int64)
  encoded = [text.encode("utf-8") for text in batch.texts]
  keys = block_of(ids)
  for key in np.unique(keys):
    rows = np.nonzero(keys == key)[0]
    data, starts = kernels.concatenate([encoded[r] for r in rows])
    yield int(key), DocBlock(ids[rows], starts, data)


def _pack_blocks(blocks, label: str):
  """``blocks`` as :class:`PackedBlock`\\ s for a join (step ``label``), and
  the counts of the bytes they shuffle."""
  packed = (blocks
            | label >> beam.FlatMap(_pack_block)
            .with_output_types(Tuple[int, PackedBlock], **_COUNTED)
            .with_outputs(metrics.COUNTS, main="blocks"))
  return packed.blocks, packed[metrics.COUNTS]


def _pack_block(element):
  key, block = element
  packed = PackedBlock.of(block)
  yield key, packed
  yield metrics.shuffled("substrings_blocks", payload_bytes(packed))


def _to_layout(keyed):
  """A block's :class:`BlockLayout`, and the bytes it shuffles."""
  key, block = keyed
  layout = BlockLayout.of(block)
  yield key, layout
  yield metrics.shuffled("substrings_layouts", payload_bytes(layout))


def _in_id_order(pieces):
  """A block's pieces (one per text batch that held some of its
  documents: DocBlocks or BlockLayouts) sorted by their first id."""
  return sorted(pieces, key=lambda p: int(p.ids[0]) if len(p.ids) else 0)


def _block(pieces) -> DocBlock:
  """The pieces of one block as one :class:`DocBlock` in id order."""
  pieces = _in_id_order(pieces)
  if len(pieces) == 1:
    return pieces[0]
  texts = [bytes(p.data[p.starts[i]:p.starts[i + 1]])
           for p in pieces for i in range(len(p.ids))]
  data, starts = kernels.concatenate(texts)
  return DocBlock(np.concatenate([p.ids for p in pieces]), starts, data)


def _select(block: DocBlock, keep: np.ndarray) -> DocBlock:
  rows = np.nonzero(keep)[0]
  texts = [bytes(block.data[block.starts[r]:block.starts[r + 1]])
           for r in rows]
  data, starts = kernels.concatenate(texts)
  return DocBlock(block.ids[rows], starts, data)


def _drop_removed(joined):
  key, grouped = joined
  if not grouped["docs"]:
    return
  block = _block([piece.unpack() for piece in grouped["docs"]])
  removed = np.asarray(grouped["removed"], dtype=np.int64)
  if len(removed):
    block = _select(block, ~np.isin(block.ids, removed))
  if len(block.ids):
    yield key, block


def _shard_of(hashes: np.ndarray, shards: int) -> np.ndarray:
  return (hashes % np.uint64(shards)).astype(np.int64)


class _WinnowFn(beam.DoFn):
  """``(block, DocBlock)`` → ``(anchor shard, AnchorBatch)`` per shard."""

  def __init__(self, threshold: int, shards: int):
    self._threshold = threshold
    self._shards = shards

  def process(self, element):
    key, block = element
    k = kernels.anchor_length(self._threshold)
    found = kernels.winnow(block.data, block.starts, self._threshold, k)
    sent = 0
    for shard, rows in _by_shard(_shard_of(found.hashes, self._shards)):
      batch = AnchorBatch.of(key, found.hashes[rows],
                             block.ids[found.rows[rows]], found.offsets[rows])
      sent += payload_bytes(batch)
      yield shard, batch
    yield metrics.shuffled("substrings_anchors", sent)


def _by_shard(shards: np.ndarray):
  """``(shard, rows)``: the positions of each shard's rows, in shard order."""
  for shard, (rows,) in lsh_kernels.split_by_shard(shards,
                                                   np.arange(len(shards))):
    yield shard, rows


def _keep_repeated(grouped):
  """A shard's anchors → those whose hash occurs twice or more, by block."""
  _, batches = grouped
  batches = list(batches)
  hashes = np.concatenate([b.hashes for b in batches])
  keep = kernels.repeated_hashes(hashes)
  blocks = np.repeat([int(b.block[0]) for b in batches],
                     [len(b.hashes) for b in batches])[keep]
  hashes = hashes[keep]
  members = np.concatenate([b.members for b in batches])[keep]
  offsets = np.concatenate([b.offsets for b in batches])[keep]
  for block, rows in _by_shard(blocks):
    yield block, AnchorBatch(np.array([block], np.int64), hashes[rows],
                             members[rows], offsets[rows])


class _ContextsFn(beam.DoFn):
  """A block's documents and repeated anchors → the anchors' contexts, by
  anchor shard."""

  def __init__(self, threshold: int, shards: int):
    self._threshold = threshold
    self._shards = shards

  def process(self, joined):
    _, grouped = joined
    if not grouped["anchors"] or not grouped["docs"]:
      return
    block = _block([piece.unpack() for piece in grouped["docs"]])
    anchors = grouped["anchors"]
    hashes = np.concatenate([a.hashes for a in anchors])
    doc_ids = np.concatenate([a.doc_ids() for a in anchors])
    offsets = np.concatenate([a.offsets for a in anchors]).astype(np.int64)
    rows = np.searchsorted(block.ids, doc_ids)
    k = kernels.anchor_length(self._threshold)
    found = kernels.contexts(block.data, block.starts, block.ids,
                             kernels.Anchors(hashes, rows, offsets),
                             self._threshold, k)
    sent = 0
    for shard, picked in _by_shard(_shard_of(found.hashes, self._shards)):
      batch = PackedContexts.of(
          ContextBatch(*(column[picked] for column in found)))
      sent += payload_bytes(batch)
      yield shard, batch
    yield metrics.shuffled("substrings_contexts", sent)


def _compare_windows(grouped, threshold: int, strike: str):
  """A shard's contexts → the struck ranges they prove, by block."""
  _, batches = grouped
  k = kernels.anchor_length(threshold)
  batches = [packed.unpack(k) for packed in batches]
  found = ContextBatch(*(np.concatenate(columns)
                         for columns in zip(*batches)))
  struck = kernels.compare_windows(found, threshold, k, strike)
  for block, rows in _by_shard(block_of(struck.doc_ids)):
    yield block, SpanBatch(*(column[rows] for column in struck))


def _layout(pieces):
  """``(ids, starts, continuation bool[bytes])`` of a block's layout pieces
  (one per text batch that held some of its documents) in id order."""
  pieces = _in_id_order(pieces)
  lengths = np.concatenate([np.diff(p.starts) for p in pieces])
  starts = np.zeros(len(lengths) + 1, dtype=np.int64)
  np.cumsum(lengths, out=starts[1:])
  return (np.concatenate([p.ids for p in pieces]), starts,
          np.concatenate([p.continuation_bytes() for p in pieces]))


class _MergeSpansFn(beam.DoFn):
  """A block's layout and struck ranges → its merged spans, narrowed to
  code points (empty ones dropped), and the counts."""

  def process(self, joined):
    key, grouped = joined
    if not grouped["struck"] or not grouped["docs"]:
      return
    ids, starts, continuation = _layout(grouped["docs"])
    merged = kernels.merge_ranges(SpanBatch(*(
        np.concatenate(columns) for columns in zip(*grouped["struck"]))))
    base = starts[np.searchsorted(ids, merged.doc_ids)]
    narrowed = kernels.narrow_to_code_points(
        continuation, base + merged.starts, base + merged.ends)
    spans = SpanBatch(merged.doc_ids, narrowed[0] - base, narrowed[1] - base,
                      merged.first_doc_ids, merged.first_starts)
    keep = spans.ends > spans.starts
    spans = SpanBatch(*(column[keep] for column in spans))
    if not len(spans.doc_ids):
      return
    struck = spans.ends - spans.starts
    per_doc = np.bincount(np.searchsorted(ids, spans.doc_ids),
                          weights=struck, minlength=len(ids))
    lengths = np.diff(starts)
    yield metrics.count_tag(BYTES_STRUCK, int(struck.sum()))
    yield metrics.count_tag(DOCS_TOUCHED, int((per_doc > 0).sum()))
    yield metrics.count_tag(DOCS_EMPTIED, int(
        ((per_doc == lengths) & (lengths > 0)).sum()))
    yield key, spans


def strike_text(text: str, starts, ends) -> str:
  """``text`` without its UTF-8 byte spans ``[starts[i], ends[i])`` (disjoint,
  on code-point boundaries)."""
  data = text.encode("utf-8")
  kept, at = [], 0
  for start, end in zip(starts, ends):
    kept.append(data[at:int(start)])
    at = int(end)
  kept.append(data[at:])
  return b"".join(kept).decode("utf-8")
