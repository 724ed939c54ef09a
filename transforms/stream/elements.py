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

_FORMAT = 1
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


class BandEntry(NamedTuple):
  """One band of a signed document, keyed by its band key downstream."""
  band: int
  member: Member


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


class Report(NamedTuple):
  """What a document's verdict gathers: exactly one of an :class:`Answer`
  and its :class:`Arrival`."""
  answer: Optional[Answer] = None
  arrival: Optional[Arrival] = None


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


class BucketState(NamedTuple):
  """All of one bucket's state in one cell (one state read and one write per
  bundle and key, where a cell per field costs a runner round trip each)
  but for waiting entries beyond the first few: its representative, its
  clock (the latest event-time timer fired for it, None before the first),
  the time its ``settle`` timer is set for, how many entries wait in all,
  and the first of them (``waiting``; the others are in a bag)."""
  rep: Optional[Member] = None
  clock: Optional[int] = None
  settle_at: Optional[int] = None
  pending: int = 0
  waiting: Tuple[BandEntry, ...] = ()


class Progress(NamedTuple):
  """One document's verdict state, in one cell: its arrival, the bands
  that answered (a bit each), the best match and the first late answer so
  far; ``done`` once its verdict went out (then nothing else is kept)."""
  done: bool = False
  arrival: Optional[Arrival] = None
  bands: int = 0
  best: Optional[Answer] = None
  late: Optional[Answer] = None


class Seen(NamedTuple):
  """What the job remembers of the first document under an id: its event
  time and digests of its record and of its text, which tell a redelivery
  (the same record) from another document reusing the id."""
  event_ms: int
  record_digest: bytes
  text_digest: bytes


class StreamRejected(NamedTuple):
  """An input message that is not a document, or a document under an id
  already taken, with the reason."""
  source: str
  reason: str
  excerpt: str


class _Writer:

  def __init__(self):
    self.parts = [bytes([_FORMAT])]

  def i64(self, value: int) -> "_Writer":
    self.parts.append(_I64.pack(value))
    return self

  def f64(self, value: float) -> "_Writer":
    self.parts.append(_F64.pack(value))
    return self

  def blob(self, data: bytes) -> "_Writer":
    self.parts.append(_U32.pack(len(data)))
    self.parts.append(data)
    return self

  def text(self, value: str) -> "_Writer":
    return self.blob(value.encode("utf-8"))

  def array(self, values: np.ndarray, dtype: str) -> "_Writer":
    return self.blob(np.ascontiguousarray(values, dtype=dtype).tobytes())

  def done(self) -> bytes:
    return b"".join(self.parts)


class _Reader:

  def __init__(self, data: bytes, what: str):
    if not data or data[0] != _FORMAT:
      raise ValueError(f"{what}: unknown encoding format "
                       f"{data[:1].hex() or 'empty'} (expected {_FORMAT:02x})")
    self.data = memoryview(data)
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
    size = _U32.unpack_from(self.data, self.pos)[0]
    start = self.pos + 4
    self.pos = start + size
    return bytes(self.data[start:self.pos])

  def text(self) -> str:
    return self.blob().decode("utf-8")

  def array(self, dtype: str) -> np.ndarray:
    return np.frombuffer(self.blob(), dtype=dtype).copy()


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


class MemberCoder(_Coder):

  def encode(self, value: Member) -> bytes:
    return _write_member(_Writer(), value).done()

  def decode(self, encoded: bytes) -> Member:
    return _read_member(_Reader(encoded, "Member"))


class SignedCoder(_Coder):

  def encode(self, value: Signed) -> bytes:
    return (_write_member(_Writer(), value.member)
            .array(value.band_keys, "<u8").text(value.status)
            .blob(value.record).done())

  def decode(self, encoded: bytes) -> Signed:
    r = _Reader(encoded, "Signed")
    return Signed(_read_member(r), r.array("<u8"), r.text(), r.blob())


class BandEntryCoder(_Coder):

  def encode(self, value: BandEntry) -> bytes:
    return _write_member(_Writer().i64(value.band), value.member).done()

  def decode(self, encoded: bytes) -> BandEntry:
    r = _Reader(encoded, "BandEntry")
    return BandEntry(r.i64(), _read_member(r))


_ANSWER, _ARRIVAL = 0, 1


class AnswerCoder(_Coder):

  def encode(self, value: Answer) -> bytes:
    return _write_answer(_Writer(), value).done()

  def decode(self, encoded: bytes) -> Answer:
    return _read_answer(_Reader(encoded, "Answer"))


def _write_answer(w: _Writer, a: Answer) -> _Writer:
  return (w.i64(a.band).i64(a.kind).text(a.other_id).i64(a.other_ms)
          .f64(a.similarity))


def _read_answer(r: _Reader) -> Answer:
  return Answer(r.i64(), r.i64(), r.text(), r.i64(), r.f64())


class ArrivalCoder(_Coder):

  def encode(self, value: Arrival) -> bytes:
    return _write_arrival(_Writer(), value).done()

  def decode(self, encoded: bytes) -> Arrival:
    return _read_arrival(_Reader(encoded, "Arrival"))


def _write_arrival(w: _Writer, a: Arrival) -> _Writer:
  return (w.i64(a.event_ms).i64(a.expect).text(a.status).blob(a.record)
          .i64(a.arrived_ms))


def _read_arrival(r: _Reader) -> Arrival:
  return Arrival(r.i64(), r.i64(), r.text(), r.blob(), r.i64())


class ReportCoder(_Coder):

  def encode(self, value: Report) -> bytes:
    if value.answer is not None:
      return _write_answer(_Writer().i64(_ANSWER), value.answer).done()
    return _write_arrival(_Writer().i64(_ARRIVAL), value.arrival).done()

  def decode(self, encoded: bytes) -> Report:
    r = _Reader(encoded, "Report")
    if r.i64() == _ANSWER:
      return Report(answer=_read_answer(r))
    return Report(arrival=_read_arrival(r))


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


def _write_optional_int(w: _Writer, value: Optional[int]) -> _Writer:
  return w.i64(_NONE if value is None else value)


def _read_optional_int(r: _Reader) -> Optional[int]:
  value = r.i64()
  return None if value == _NONE else value


class BucketStateCoder(_Coder):

  def encode(self, value: BucketState) -> bytes:
    w = _Writer()
    _write_optional_int(w, value.clock)
    _write_optional_int(w, value.settle_at)
    w.i64(value.pending).i64(int(value.rep is not None))
    if value.rep is not None:
      _write_member(w, value.rep)
    w.i64(len(value.waiting))
    for entry in value.waiting:
      _write_member(w.i64(entry.band), entry.member)
    return w.done()

  def decode(self, encoded: bytes) -> BucketState:
    r = _Reader(encoded, "BucketState")
    clock, settle_at = _read_optional_int(r), _read_optional_int(r)
    pending, has_rep = r.i64(), r.i64()
    rep = _read_member(r) if has_rep else None
    waiting = tuple(BandEntry(r.i64(), _read_member(r))
                    for _ in range(r.i64()))
    return BucketState(rep, clock, settle_at, pending, waiting)


class ProgressCoder(_Coder):

  def encode(self, value: Progress) -> bytes:
    w = _Writer().i64(int(value.done))
    w.blob(value.bands.to_bytes((value.bands.bit_length() + 7) // 8,
                                "little"))
    w.i64(int(value.arrival is not None))
    if value.arrival is not None:
      _write_arrival(w, value.arrival)
    for answer in (value.best, value.late):
      w.i64(int(answer is not None))
      if answer is not None:
        _write_answer(w, answer)
    return w.done()

  def decode(self, encoded: bytes) -> Progress:
    r = _Reader(encoded, "Progress")
    done, bands = bool(r.i64()), int.from_bytes(r.blob(), "little")
    arrival = _read_arrival(r) if r.i64() else None
    best = _read_answer(r) if r.i64() else None
    late = _read_answer(r) if r.i64() else None
    return Progress(done, arrival, bands, best, late)


class SeenCoder(_Coder):

  def encode(self, value: Seen) -> bytes:
    return (_Writer().i64(value.event_ms).blob(value.record_digest)
            .blob(value.text_digest).done())

  def decode(self, encoded: bytes) -> Seen:
    r = _Reader(encoded, "Seen")
    return Seen(r.i64(), r.blob(), r.blob())


class StreamRejectedCoder(_Coder):

  def encode(self, value: StreamRejected) -> bytes:
    return (_Writer().text(value.source).text(value.reason)
            .text(value.excerpt).done())

  def decode(self, encoded: bytes) -> StreamRejected:
    r = _Reader(encoded, "StreamRejected")
    return StreamRejected(r.text(), r.text(), r.text())


for _type, _coder in ((StreamDocument, StreamDocumentCoder),
                      (Member, MemberCoder), (Signed, SignedCoder),
                      (BandEntry, BandEntryCoder), (Answer, AnswerCoder),
                      (Arrival, ArrivalCoder), (Report, ReportCoder),
                      (Verdict, VerdictCoder),
                      (BucketState, BucketStateCoder),
                      (Progress, ProgressCoder), (Seen, SeenCoder),
                      (StreamRejected, StreamRejectedCoder)):
  beam.coders.registry.register_coder(_type, _coder)
