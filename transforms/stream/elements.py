"""The named elements of the streaming path and their compact binary coders.

Every coder writes a format byte first, then little-endian fixed-width
integers, length-prefixed UTF-8 strings and raw array bytes: deterministic
(usable for grouping keys and state), a few bytes over the payload, and
never pickled, so state written by one version of the job can be read by
the next (Dataflow ``--update``, Flink savepoints). A changed layout gets a
new format byte; decoders reject one they do not know.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Optional, Tuple

import apache_beam as beam
import numpy as np

from transforms.kernels.stream_layers import DueIndex
from transforms.kernels.stream_table import BlobTable
from transforms.kernels.stream_shard import (MemberTable, SeenState,
                                             ShardState)

# Format 2 pads each array to 8 bytes from the encoding's start, so that a
# decoded view is aligned (numpy copies an unaligned array on every search,
# which made each search over a shard's state cost its size); format 1
# (no padding) is still read.
_FORMAT = 2
_UNPADDED = 1
_PAD = bytes(8)
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_NO_SHINGLES = np.zeros(0, dtype=np.uint64)
# The tag of the StreamRejected outputs (ParseRecords', DeduplicateStream's).
REJECTED = "rejected"


class StreamDocument(NamedTuple):
  """One document of the stream; its element timestamp is its event time.
  ``doc_id`` must be stable across redeliveries; ``record`` is what a
  ``kept`` output writes back (the message bytes)."""
  doc_id: str
  text: str
  record: bytes


class Member(NamedTuple):
  """What a bucket stores of its representative and compares entries with:
  the signature, and the shingle set when verification is exact (else
  empty)."""
  doc_id: str
  event_ms: int
  signature: np.ndarray
  shingles: np.ndarray = _NO_SHINGLES


class Signed(NamedTuple):
  """A document after Sign: its member, its band keys (uint64[b]), and the
  ``status`` ``signed``, or ``empty`` / ``too_short`` for documents without
  a signature (no band keys; kept, never compared)."""
  member: Member
  band_keys: np.ndarray
  status: str
  record: bytes


class Answer(NamedTuple):
  """A bucket's answer for one band of a document (see
  :mod:`transforms.kernels.stream` for ``kind``); ``other_id`` and
  ``other_ms`` name the representative that judged it."""
  band: int
  kind: int
  other_id: str
  other_ms: int
  similarity: float


class Arrival(NamedTuple):
  """The document itself, sent to its verdict next to its answers:
  ``expect`` answers will come (0 when it has no signature)."""
  event_ms: int
  expect: int
  status: str
  record: bytes
  arrived_ms: int


class Verdict(NamedTuple):
  """The one decision per document: ``verdict`` is ``kept``, ``duplicate``
  (of ``duplicate_of``, with the similarity that verified it) or ``late``;
  ``reason`` says why."""
  doc_id: str
  event_ms: int
  verdict: str
  reason: str
  duplicate_of: Optional[str]
  duplicate_of_ms: Optional[int]
  similarity: Optional[float]
  record: bytes


class Progress(NamedTuple):
  """What is known of one document's verdict: its arrival, the bands that
  answered (a bit each), the best match and the first late answer so far;
  ``done`` once its verdict went out. A shard of buckets sends one per
  document and invocation (the answers it gave), Sign one with the
  arrival; Verdicts merges them."""
  done: bool = False
  arrival: Optional[Arrival] = None
  bands: int = 0
  best: Optional[Answer] = None
  late: Optional[Answer] = None


class DocBatch(NamedTuple):
  """Documents of one bundle and window for one shard of document ids,
  each with its own timestamp (``micros[i]``, in microseconds)."""
  docs: Tuple[StreamDocument, ...]
  micros: np.ndarray


class ProgressBatch(NamedTuple):
  """Progress of many documents (``items[i]`` is ``ids[i]``'s): one element
  per verdict shard and invocation, and a verdict shard's state."""
  ids: Tuple[str, ...]
  items: Tuple[Progress, ...]


class ShardEntries(NamedTuple):
  """The band entries of one bundle for one shard of buckets: entry i is
  band ``bands[i]`` of member ``rows[i]`` of ``members`` (each document
  once, with its signature), for the bucket of ``keys[i]``."""
  keys: np.ndarray
  bands: np.ndarray
  rows: np.ndarray
  members: MemberTable


class StreamRejected(NamedTuple):
  """An input message that is not a document, or a document under an id
  already taken, with the reason."""
  source: str
  reason: str
  excerpt: str


class _Writer:

  def __init__(self):
    self.parts = [bytes([_FORMAT])]
    self.size = 1

  def _add(self, part) -> None:
    self.parts.append(part)
    self.size += len(part)

  def i64(self, value: int) -> "_Writer":
    self._add(_I64.pack(value))
    return self

  def f64(self, value: float) -> "_Writer":
    self._add(_F64.pack(value))
    return self

  def blob(self, data: bytes) -> "_Writer":
    self._add(_U32.pack(len(data)))
    self._add(data)
    return self

  def text(self, value: str) -> "_Writer":
    return self.blob(value.encode("utf-8"))

  def array(self, values: np.ndarray, dtype: str) -> "_Writer":
    # The array's own buffer, copied once, by done().
    values = np.ascontiguousarray(values, dtype=dtype)
    self._add(_U32.pack(values.nbytes))
    self._add(_PAD[:-self.size % 8])
    if values.nbytes:
      self._add(values.reshape(-1).data.cast("B"))
    return self

  def done(self) -> bytes:
    return b"".join(self.parts)


class _Reader:

  def __init__(self, data: bytes, what: str):
    if not data or data[0] not in (_FORMAT, _UNPADDED):
      raise ValueError(f"{what}: unknown encoding format "
                       f"{data[:1].hex() or 'empty'} (expected {_FORMAT:02x})")
    self.data = memoryview(data)
    self.padded = data[0] == _FORMAT
    self.pos = 1

  def i64(self) -> int:
    value = _I64.unpack_from(self.data, self.pos)[0]
    self.pos += 8
    return value

  def f64(self) -> float:
    value = _F64.unpack_from(self.data, self.pos)[0]
    self.pos += 8
    return value

  def blob(self) -> bytes:
    return bytes(self.blob_view())

  def blob_view(self) -> memoryview:
    """A blob as a view of the encoded bytes (no copy)."""
    size = _U32.unpack_from(self.data, self.pos)[0]
    start = self.pos + 4
    self.pos = start + size
    return self.data[start:self.pos]

  def text(self) -> str:
    return self.blob().decode("utf-8")

  def _array_bytes(self) -> memoryview:
    size = _U32.unpack_from(self.data, self.pos)[0]
    start = self.pos + 4
    if self.padded:
      start += -start % 8
    self.pos = start + size
    return self.data[start:self.pos]

  def array(self, dtype: str) -> np.ndarray:
    return np.frombuffer(self._array_bytes(), dtype=dtype).copy()

  def view(self, dtype: str) -> np.ndarray:
    """A read-only array over the encoded bytes (no copy, unless they are
    not aligned in memory)."""
    values = np.frombuffer(self._array_bytes(), dtype=dtype)
    return values if values.flags.aligned else values.copy()


def _write_member(w: _Writer, m: Member) -> _Writer:
  return (w.text(m.doc_id).i64(m.event_ms).array(m.signature, "<u4")
          .array(m.shingles, "<u8"))


def _read_member(r: _Reader) -> Member:
  return Member(r.text(), r.i64(), r.array("<u4"), r.array("<u8"))


class _Coder(beam.coders.Coder):
  """Base of the streaming coders: deterministic, no pickling of values."""

  def is_deterministic(self) -> bool:
    return True

  def __eq__(self, other):
    return type(self) is type(other)

  def __hash__(self):
    return hash(type(self))


class _FunctionsCoder(_Coder):
  """A coder from a writer and a reader function (``WRITE``, ``READ``) of
  one element type (``WHAT``, named in decoding errors)."""

  WHAT = ""

  def encode(self, value) -> bytes:
    return type(self).WRITE(_Writer(), value).done()

  def decode(self, encoded: bytes):
    return type(self).READ(_Reader(encoded, self.WHAT))


class MemberCoder(_FunctionsCoder):
  WHAT, WRITE, READ = "Member", staticmethod(_write_member), staticmethod(
      _read_member)


class SignedCoder(_Coder):

  def encode(self, value: Signed) -> bytes:
    return (_write_member(_Writer(), value.member)
            .array(value.band_keys, "<u8").text(value.status)
            .blob(value.record).done())

  def decode(self, encoded: bytes) -> Signed:
    r = _Reader(encoded, "Signed")
    return Signed(_read_member(r), r.array("<u8"), r.text(), r.blob())


def _write_answer(w: _Writer, a: Answer) -> _Writer:
  return (w.i64(a.band).i64(a.kind).text(a.other_id).i64(a.other_ms)
          .f64(a.similarity))


def _read_answer(r: _Reader) -> Answer:
  return Answer(r.i64(), r.i64(), r.text(), r.i64(), r.f64())


class AnswerCoder(_FunctionsCoder):
  WHAT, WRITE, READ = "Answer", staticmethod(_write_answer), staticmethod(
      _read_answer)


def _write_arrival(w: _Writer, a: Arrival) -> _Writer:
  return (w.i64(a.event_ms).i64(a.expect).text(a.status).blob(a.record)
          .i64(a.arrived_ms))


def _read_arrival(r: _Reader) -> Arrival:
  return Arrival(r.i64(), r.i64(), r.text(), r.blob(), r.i64())


class ArrivalCoder(_FunctionsCoder):
  WHAT, WRITE, READ = "Arrival", staticmethod(_write_arrival), staticmethod(
      _read_arrival)


class StreamDocumentCoder(_Coder):

  def encode(self, value: StreamDocument) -> bytes:
    return (_Writer().text(value.doc_id).text(value.text).blob(value.record)
            .done())

  def decode(self, encoded: bytes) -> StreamDocument:
    r = _Reader(encoded, "StreamDocument")
    return StreamDocument(r.text(), r.text(), r.blob())


_NONE = -(2**63)


class VerdictCoder(_Coder):

  def encode(self, value: Verdict) -> bytes:
    w = (_Writer().text(value.doc_id).i64(value.event_ms).text(value.verdict)
         .text(value.reason))
    has_other = value.duplicate_of is not None
    w.i64(int(has_other)).text(value.duplicate_of or "")
    w.i64(_NONE if value.duplicate_of_ms is None else value.duplicate_of_ms)
    w.f64(float("nan") if value.similarity is None else value.similarity)
    return w.blob(value.record).done()

  def decode(self, encoded: bytes) -> Verdict:
    r = _Reader(encoded, "Verdict")
    doc_id, event_ms, verdict, reason = r.text(), r.i64(), r.text(), r.text()
    has_other, other = r.i64(), r.text()
    other_ms, similarity = r.i64(), r.f64()
    return Verdict(doc_id, event_ms, verdict, reason,
                   other if has_other else None,
                   None if other_ms == _NONE else other_ms,
                   None if similarity != similarity else similarity, r.blob())


def _write_progress(w: _Writer, value: Progress) -> _Writer:
  w.i64(int(value.done))
  w.blob(value.bands.to_bytes((value.bands.bit_length() + 7) // 8, "little"))
  w.i64(int(value.arrival is not None))
  if value.arrival is not None:
    _write_arrival(w, value.arrival)
  for answer in (value.best, value.late):
    w.i64(int(answer is not None))
    if answer is not None:
      _write_answer(w, answer)
  return w


def _read_progress(r: _Reader) -> Progress:
  done, bands = bool(r.i64()), int.from_bytes(r.blob(), "little")
  arrival = _read_arrival(r) if r.i64() else None
  best = _read_answer(r) if r.i64() else None
  late = _read_answer(r) if r.i64() else None
  return Progress(done, arrival, bands, best, late)


class ProgressCoder(_FunctionsCoder):
  WHAT, WRITE, READ = "Progress", staticmethod(_write_progress), staticmethod(
      _read_progress)


class ProgressBatchCoder(_Coder):

  def encode(self, value: ProgressBatch) -> bytes:
    w = _Writer().i64(len(value.ids))
    for doc_id, progress in zip(value.ids, value.items):
      _write_progress(w.text(doc_id), progress)
    return w.done()

  def decode(self, encoded: bytes) -> ProgressBatch:
    r = _Reader(encoded, "ProgressBatch")
    ids, items = [], []
    for _ in range(r.i64()):
      ids.append(r.text())
      items.append(_read_progress(r))
    return ProgressBatch(tuple(ids), tuple(items))


def _write_table(w: _Writer, t: MemberTable) -> _Writer:
  w.i64(len(t)).i64(t.signatures.shape[1]).blob(t.id_bytes)
  w.array(t.id_offsets, "<i8").array(t.event_ms, "<i8")
  w.array(t.signatures, "<u4").array(t.shingles, "<u8")
  return w.array(t.offsets, "<i8")


def _read_table(r: _Reader) -> MemberTable:
  m, k = r.i64(), r.i64()
  return MemberTable(r.blob_view(), r.view("<i8"), r.view("<i8"),
                     r.view("<u4").reshape(m, k), r.view("<u8"),
                     r.view("<i8"))


class MemberTableCoder(_FunctionsCoder):
  WHAT, WRITE, READ = "MemberTable", staticmethod(_write_table), staticmethod(
      _read_table)


class ShardEntriesCoder(_Coder):

  def encode(self, value: ShardEntries) -> bytes:
    w = (_Writer().array(value.keys, "<u8").array(value.bands, "<i8")
         .array(value.rows, "<i8"))
    return _write_table(w, value.members).done()

  def decode(self, encoded: bytes) -> ShardEntries:
    r = _Reader(encoded, "ShardEntries")
    return ShardEntries(r.view("<u8"), r.view("<i8"), r.view("<i8"),
                        _read_table(r))


_SHARD_DTYPES = ("<u8",) + ("<i8",) * 5 + ("<u8", "<i8", "<i8")


class ShardStateCoder(_Coder):

  def encode(self, value: ShardState) -> bytes:
    w = _Writer()
    for values, dtype in zip(value, _SHARD_DTYPES):
      w.array(values, dtype)
    return w.done()

  def decode(self, encoded: bytes) -> ShardState:
    r = _Reader(encoded, "ShardState")
    return ShardState(*(r.view(dtype) for dtype in _SHARD_DTYPES))


class DocBatchCoder(_Coder):

  def encode(self, value: DocBatch) -> bytes:
    w = _Writer().i64(len(value.docs))
    for d in value.docs:
      w.text(d.doc_id).text(d.text).blob(d.record)
    return w.array(value.micros, "<i8").done()

  def decode(self, encoded: bytes) -> DocBatch:
    r = _Reader(encoded, "DocBatch")
    docs = tuple(StreamDocument(r.text(), r.text(), r.blob())
                 for _ in range(r.i64()))
    return DocBatch(docs, r.array("<i8"))


class SeenStateCoder(_Coder):

  def encode(self, value: SeenState) -> bytes:
    return (_Writer().array(value.hashes, "<u8").blob(value.id_bytes)
            .array(value.id_offsets, "<i8").array(value.event_ms, "<i8")
            .array(value.record_digests, "u1")
            .array(value.text_digests, "u1")
            .array(value.forget_at, "<i8").done())

  def decode(self, encoded: bytes) -> SeenState:
    r = _Reader(encoded, "SeenState")
    return SeenState(r.view("<u8"), r.blob(), r.view("<i8"), r.view("<i8"),
                     r.view("u1").reshape(-1, 16),
                     r.view("u1").reshape(-1, 16), r.view("<i8"))


class DueIndexCoder(_Coder):

  def encode(self, value: DueIndex) -> bytes:
    return _Writer().array(value.times, "<i8").array(value.keys,
                                                     "<u8").done()

  def decode(self, encoded: bytes) -> DueIndex:
    r = _Reader(encoded, "DueIndex")
    return DueIndex(r.view("<i8"), r.view("<u8"))


class BlobTableCoder(_Coder):

  def encode(self, value: BlobTable) -> bytes:
    return (_Writer().array(value.hashes, "<u8").blob(value.id_bytes)
            .array(value.id_offsets, "<i8").blob(value.blobs)
            .array(value.blob_offsets, "<i8").done())

  def decode(self, encoded: bytes) -> BlobTable:
    r = _Reader(encoded, "BlobTable")
    return BlobTable(r.view("<u8"), r.blob_view(), r.view("<i8"),
                     r.blob_view(), r.view("<i8"))


class StreamRejectedCoder(_Coder):

  def encode(self, value: StreamRejected) -> bytes:
    return (_Writer().text(value.source).text(value.reason)
            .text(value.excerpt).done())

  def decode(self, encoded: bytes) -> StreamRejected:
    r = _Reader(encoded, "StreamRejected")
    return StreamRejected(r.text(), r.text(), r.text())


for _type, _coder in ((StreamDocument, StreamDocumentCoder),
                      (Member, MemberCoder), (Signed, SignedCoder),
                      (Answer, AnswerCoder), (Arrival, ArrivalCoder),
                      (Verdict, VerdictCoder), (Progress, ProgressCoder),
                      (ProgressBatch, ProgressBatchCoder),
                      (MemberTable, MemberTableCoder),
                      (ShardEntries, ShardEntriesCoder),
                      (ShardState, ShardStateCoder),
                      (DueIndex, DueIndexCoder),
                      (BlobTable, BlobTableCoder),
                      (DocBatch, DocBatchCoder),
                      (SeenState, SeenStateCoder),
                      (StreamRejected, StreamRejectedCoder)):
  beam.coders.registry.register_coder(_type, _coder)
