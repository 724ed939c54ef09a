"""The named elements of exact-substring deduplication, with deterministic
array coders (registered on import). Keyed by a block (``doc_id >>
BLOCK_BITS``: up to 4,096 consecutive rows of one file, so any step can
route a document's results back to its block from its id) or by an anchor
shard:

* ``(block, DocBlock)``: documents' UTF-8 bytes back to back,
* ``(anchor shard, AnchorBatch)``: winnowed anchors of a block,
* ``(block, AnchorBatch)``: the anchors whose hash repeats,
* ``(anchor shard, ContextBatch)``: the text around those anchors
  (:class:`transforms.kernels.substrings.Contexts`),
* ``(block, SpanBatch)``: struck byte ranges, then merged, narrowed spans
  (:class:`transforms.kernels.substrings.Spans`),
* ``(block, BlockLayout)``: a block's documents without their text, all
  that merging and narrowing its spans needs.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np

from transforms.elements import ArraysCoder
from transforms.kernels import substrings as kernels

BLOCK_BITS = 12


class DocBlock(NamedTuple):
  """Documents ``ids`` int64[n] (increasing) and their UTF-8 bytes
  ``data[starts[i]:starts[i + 1]]`` (``starts`` int64[n + 1], ``data``
  uint8)."""
  ids: np.ndarray
  starts: np.ndarray
  data: np.ndarray


class BlockLayout(NamedTuple):
  """A :class:`DocBlock` without its bytes: the documents ``ids`` and
  ``starts`` as there, and ``continuation``: ``np.packbits`` of which bytes
  continue a UTF-8 code point, empty when none does (ASCII text). An
  eighth of the text's bytes at most, where the block would be all of
  them."""
  ids: np.ndarray
  starts: np.ndarray
  continuation: np.ndarray

  @classmethod
  def of(cls, block: DocBlock) -> "BlockLayout":
    cont = kernels.continuation_bytes(block.data)
    packed = np.packbits(cont) if cont.any() else np.zeros(0, np.uint8)
    return cls(block.ids, block.starts, packed)

  def continuation_bytes(self) -> np.ndarray:
    """bool[bytes of the block]: the unpacked ``continuation``."""
    size = int(self.starts[-1]) if len(self.starts) else 0
    if not len(self.continuation):
      return np.zeros(size, dtype=bool)
    return np.unpackbits(self.continuation, count=size).astype(bool)


class AnchorBatch(NamedTuple):
  """Anchors of documents of one block: k-gram ``hashes`` uint64[m], the
  ``doc_ids`` int64[m] and the k-grams' byte ``offsets`` int64[m]."""
  hashes: np.ndarray
  doc_ids: np.ndarray
  offsets: np.ndarray


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


def block_of(doc_ids):
  """The block of document ids (ints or int64 arrays)."""
  return doc_ids >> BLOCK_BITS


def payload_bytes(element) -> int:
  """The bytes of an element's arrays (what a shuffle carries)."""
  return sum(column.nbytes for column in element)
