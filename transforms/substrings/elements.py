"""The named elements of exact-substring deduplication, with deterministic
array coders (registered on import). Keyed by a block (``doc_id >>
BLOCK_BITS``: up to 4,096 consecutive rows of one file, so any step can
route a document's results back to its block from its id) or by an anchor
shard:

* ``(block, DocBlock)``: documents' UTF-8 bytes back to back (as a
  :class:`PackedBlock` in a join),
* ``(anchor shard, AnchorBatch)``: winnowed anchors of a block,
* ``(block, AnchorBatch)``: the anchors whose hash repeats,
* ``(anchor shard, PackedContexts)``: the text around those anchors
  (:class:`transforms.kernels.substrings.Contexts`), compressed,
* ``(block, SpanBatch)``: struck byte ranges, then merged, narrowed spans
  (:class:`transforms.kernels.substrings.Spans`),
* ``(block, BlockLayout)``: a block's documents without their text, all
  that merging and narrowing its spans needs.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np
import zstandard

from transforms.elements import ArraysCoder
from transforms.kernels import substrings as kernels

BLOCK_BITS = 12
# Anchors' offsets are stored in 32 bits.
assert kernels.MAX_DOC_BYTES <= 1 << 32
# zstd's level 1: the contexts of 20,000 web-like documents (without their
# hashes) shrank 3.7x at 340 MB/s; level 3 3.8x at half that speed,
# negative levels 2.3-2.7x, zlib's level 1 2.9x at a third of it.
ZSTD_LEVEL = 1


def _compress(data) -> np.ndarray:
  """uint8: one zstd frame of the bytes-like ``data``."""
  return np.frombuffer(
      zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data), np.uint8)


def _decompress(frame: np.ndarray) -> bytes:
  return zstandard.ZstdDecompressor().decompress(frame)


class DocBlock(NamedTuple):
  """Documents ``ids`` int64[n] (increasing) and their UTF-8 bytes
  ``data[starts[i]:starts[i + 1]]`` (``starts`` int64[n + 1], ``data``
  uint8)."""
  ids: np.ndarray
  starts: np.ndarray
  data: np.ndarray


class BlockLayout(NamedTuple):
  """A :class:`DocBlock` without its bytes: the documents ``ids`` and
  ``starts`` as there, and ``continuation``: a zstd frame of the
  ``np.packbits`` of which bytes continue a UTF-8 code point, empty when
  none does (ASCII text). At most an eighth of the text's bytes before
  compression, where the block would be all of them."""
  ids: np.ndarray
  starts: np.ndarray
  continuation: np.ndarray

  @classmethod
  def of(cls, block: DocBlock) -> "BlockLayout":
    cont = kernels.continuation_bytes(block.data)
    if not cont.any():
      return cls(block.ids, block.starts, np.zeros(0, np.uint8))
    return cls(block.ids, block.starts, _compress(np.packbits(cont)))

  def continuation_bytes(self) -> np.ndarray:
    """bool[bytes of the block]: the unpacked ``continuation``."""
    size = int(self.starts[-1]) if len(self.starts) else 0
    if not len(self.continuation):
      return np.zeros(size, dtype=bool)
    packed = np.frombuffer(_decompress(self.continuation), np.uint8)
    return np.unpackbits(packed, count=size).astype(bool)


class AnchorBatch(NamedTuple):
  """Anchors of documents of one ``block`` (int64[1]): k-gram ``hashes``
  uint64[m], each one's document as the low ``BLOCK_BITS`` bits of its id,
  ``members`` uint16[m] (the id is ``block << BLOCK_BITS | member``), and
  the k-grams' byte ``offsets`` uint32[m] in their documents (at most
  ``kernels.MAX_DOC_BYTES``): 14 bytes an anchor, where int64 ids and
  offsets took 24."""
  block: np.ndarray
  hashes: np.ndarray
  members: np.ndarray
  offsets: np.ndarray

  @classmethod
  def of(cls, block: int, hashes: np.ndarray, doc_ids: np.ndarray,
         offsets: np.ndarray) -> "AnchorBatch":
    """The batch of anchors of documents ``doc_ids`` (all of ``block``)."""
    return cls(np.array([block], np.int64), hashes,
               (doc_ids & ((1 << BLOCK_BITS) - 1)).astype(np.uint16),
               offsets.astype(np.uint32))

  def doc_ids(self) -> np.ndarray:
    """int64[m]: the anchors' document ids."""
    return (self.block[0] << BLOCK_BITS) | self.members.astype(np.int64)


def _coder(element_type) -> type:
  name = f"{element_type.__name__}Coder"
  coder = type(name, (ArraysCoder,), {"TYPE": element_type,
                                      "__module__": __name__,
                                      "__qualname__": name})
  beam.coders.registry.register_coder(element_type, coder)
  return coder


DocBlockCoder = _coder(DocBlock)
BlockLayoutCoder = _coder(BlockLayout)
AnchorBatchCoder = _coder(AnchorBatch)
# The kernels' own types cross the shuffle as they are.
ContextBatch, SpanBatch = kernels.Contexts, kernels.Spans
ContextBatchCoder = _coder(ContextBatch)
SpanBatchCoder = _coder(SpanBatch)


def _frame(value, coder) -> np.ndarray:
  return _compress(coder.encode(value))


def _unframe(frame: np.ndarray, coder):
  return coder.decode(_decompress(frame))


class PackedBlock(NamedTuple):
  """A :class:`DocBlock` as one zstd frame (uint8) of its coder's bytes: what
  crosses a join (text shrinks about 3x)."""
  frame: np.ndarray

  @classmethod
  def of(cls, block: DocBlock) -> "PackedBlock":
    return cls(_frame(block, DocBlockCoder()))

  def unpack(self) -> DocBlock:
    return _unframe(self.frame, DocBlockCoder())


class PackedContexts(NamedTuple):
  """A :class:`ContextBatch` as one zstd frame (uint8) of its coder's bytes,
  without its hashes (8 bytes a context that do not compress; the shard
  recomputes them from the text): what crosses the shuffle to the anchor
  shards."""
  frame: np.ndarray

  @classmethod
  def of(cls, batch: ContextBatch) -> "PackedContexts":
    return cls(_frame(batch._replace(hashes=np.zeros(0, np.uint64)),
                      ContextBatchCoder()))

  def unpack(self, k: int) -> ContextBatch:
    """The batch, its hashes recomputed for anchors of ``k`` bytes."""
    batch = _unframe(self.frame, ContextBatchCoder())
    return batch._replace(hashes=kernels.context_hashes(batch.text, k))


PackedBlockCoder = _coder(PackedBlock)
PackedContextsCoder = _coder(PackedContexts)


def block_of(doc_ids):
  """The block of document ids (ints or int64 arrays)."""
  return doc_ids >> BLOCK_BITS


def payload_bytes(element) -> int:
  """The bytes of an element's arrays (what a shuffle carries)."""
  return sum(column.nbytes for column in element)
