"""Messages in and out of the streaming path: raw records (Pub/Sub message
data or file lines) to timestamped :class:`StreamDocument` s with the batch
reader's rejection reasons, and verdicts to JSON."""

from __future__ import annotations

import json
from typing import NamedTuple

import apache_beam as beam
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms import metrics
from transforms.read import Rejected, parse_record
from transforms.stream.elements import StreamDocument, StreamRejected, Verdict

REJECTED = "rejected"


class RawRecord(NamedTuple):
  """One input record: ``source`` names where it came from (for rejections),
  ``fallback_id`` is its stable id when the record has no id field (the
  Pub/Sub message id, or ``path:row``)."""
  source: str
  row: int
  fallback_id: str
  data: bytes


class ParseRecords(beam.PTransform):
  """:class:`RawRecord` → timestamped :class:`StreamDocument` (main) and
  :class:`StreamRejected` (``rejected``), with the batch reader's reasons
  plus ``bad_event_time``.

  Event time is the element's own timestamp (Pub/Sub publish time or
  ``timestamp_attribute``, a file's modification time), or the JSON field
  ``event_time_field`` when given: epoch seconds (a number) or an RFC 3339
  string.

  Args:
    input_format: ``jsonl`` or ``text`` (one document per line).
    text_field, id_field: the JSON fields of the text and the stable id.
    event_time_field: JSON field of the event time, or None.
  """

  def __init__(self, input_format: str = "jsonl", text_field: str = "text",
               id_field: str = "id", event_time_field: str = None):
    super().__init__()
    self._args = (input_format, text_field, id_field, event_time_field)

  def expand(self, records):
    return records | "Parse" >> beam.ParDo(_ParseFn(*self._args)).with_outputs(
        REJECTED, main="documents")


class _ParseFn(beam.DoFn):

  def __init__(self, input_format, text_field, id_field, event_time_field):
    self._format = input_format
    self._text_field = text_field
    self._id_field = id_field
    self._event_time_field = event_time_field

  def setup(self):
    self._rejected = metrics.counter(metrics.STREAM_REJECTED)

  def process(self, record: RawRecord):
    parsed = parse_record(record.data, self._format, record.source,
                          record.row, self._text_field, self._id_field)
    if isinstance(parsed, Rejected):
      yield self._reject(parsed.source, parsed.message, parsed.excerpt)
      return
    doc_id = _stable_id(parsed.user_id, record.fallback_id)
    doc = StreamDocument(doc_id, parsed.text, record.data)
    if self._event_time_field is None:
      yield doc
      return
    value = json.loads(record.data).get(self._event_time_field)
    try:
      timestamp = event_timestamp(value)
    except ValueError as e:
      yield self._reject(record.source, f"bad_event_time: {e}",
                         parsed.text[:300])
      return
    yield TimestampedValue(doc, timestamp)

  def _reject(self, source, reason, excerpt):
    self._rejected.inc()
    return beam.pvalue.TaggedOutput(REJECTED,
                                    StreamRejected(source, reason, excerpt))


def _stable_id(user_id, fallback: str) -> str:
  if user_id is None:
    return fallback
  if isinstance(user_id, str):
    return user_id
  return json.dumps(user_id, sort_keys=True, separators=(",", ":"))


def event_timestamp(value) -> Timestamp:
  """The Beam timestamp of an event-time field value: epoch seconds (int or
  float) or an RFC 3339 string; raises ``ValueError`` saying what it got."""
  if isinstance(value, bool) or value is None:
    raise ValueError(f"event time field holds {json.dumps(value)}; use epoch"
                     " seconds or an RFC 3339 string")
  if isinstance(value, (int, float)):
    return Timestamp(micros=int(round(value * 1_000_000)))
  if isinstance(value, str):
    try:
      return Timestamp.from_rfc3339(value)
    except ValueError:
      pass
  raise ValueError(f"event time {value!r} is neither epoch seconds nor RFC"
                   " 3339")


def _rfc3339(ms):
  return None if ms is None else Timestamp(micros=ms * 1000).to_rfc3339()


def verdict_json(verdict: Verdict) -> bytes:
  """A verdict as one JSON object (no trailing newline), keys sorted."""
  return json.dumps({
      "id": verdict.doc_id, "event_time": _rfc3339(verdict.event_ms),
      "verdict": verdict.verdict, "reason": verdict.reason,
      "duplicate_of": verdict.duplicate_of,
      "duplicate_of_event_time": _rfc3339(verdict.duplicate_of_ms),
      "similarity": (None if verdict.similarity is None
                     else round(verdict.similarity, 6)),
  }, sort_keys=True, ensure_ascii=False).encode("utf-8")


def rejected_json(rejected: StreamRejected) -> bytes:
  return json.dumps({"verdict": "rejected", "source": rejected.source,
                     "reason": rejected.reason, "excerpt": rejected.excerpt},
                    sort_keys=True, ensure_ascii=False).encode("utf-8")
