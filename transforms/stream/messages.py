"""Messages in and out of the streaming path: raw records (Pub/Sub message
data or file lines) to timestamped :class:`StreamDocument` s with the batch
reader's rejection reasons, and verdicts to JSON."""

from __future__ import annotations

import json
import math
import re
from typing import NamedTuple

import apache_beam as beam
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms import metrics
from transforms.read import Rejected, parse_record
from transforms.stream.elements import (REJECTED, StreamDocument,
                                        StreamRejected, Verdict)

# Event times the job takes: those a verdict can write in RFC 3339, years
# 0001 to 9999. Far inside Beam's int64 microseconds, so the timers at event
# time + settle or retention stay in range too.
FIRST_EVENT_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
END_EVENT_MS = 253_402_300_800_000  # 10000-01-01T00:00:00Z, not included
# A date, a time and the UTC offset: without one the parser would read the
# machine's local time, and the verdict would depend on the worker's zone.
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(?:\.\d+)?"
                      r"(?:[Zz]|[+-]\d\d:\d\d)")


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
  ``event_time_field`` when given (see :func:`event_timestamp`); outside
  years 0001 to 9999 either is ``bad_event_time``.

  Args:
    input_format: ``jsonl`` or ``text`` (one document per line).
    text_field, id_field: the JSON fields of the text and the stable id.
    event_time_field: JSON field of the event time (``jsonl`` only), or
      None.
  """

  def __init__(self, input_format: str = "jsonl", text_field: str = "text",
               id_field: str = "id", event_time_field: str = None):
    super().__init__()
    if event_time_field is not None and input_format != "jsonl":
      raise ValueError("event_time_field needs JSONL records, not"
                       f" {input_format} lines (they have no fields)")
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

  def process(self, record: RawRecord, timestamp=beam.DoFn.TimestampParam):
    parsed = parse_record(record.data, self._format, record.source,
                          record.row, self._text_field, self._id_field)
    if isinstance(parsed, Rejected):
      yield self._reject(parsed.source, parsed.message, parsed.excerpt)
      return
    doc_id = _stable_id(parsed.user_id, record.fallback_id)
    doc = StreamDocument(doc_id, parsed.text, record.data)
    try:
      if self._event_time_field is None:
        # The source's timestamp (a Pub/Sub timestamp attribute) is held to
        # the field's range: the verdict writes it.
        check_event_time(timestamp, "source timestamp")
        yield doc
        return
      timestamp = event_timestamp(
          json.loads(record.data).get(self._event_time_field))
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
  """The Beam timestamp (in microseconds) of an event-time field value:
  finite epoch seconds (int or float) or an RFC 3339 date-time with its UTC
  offset, in years 0001 to 9999; raises ``ValueError`` saying what it got.

  >>> event_timestamp("2024-05-01T12:00:00+02:00")
  Timestamp(1714557600)
  """
  if isinstance(value, bool) or value is None:
    raise ValueError(f"event time field holds {json.dumps(value)}; use epoch"
                     " seconds or an RFC 3339 string")
  if isinstance(value, float) and not math.isfinite(value):
    raise ValueError(f"event time {value} is not a finite number of epoch"
                     " seconds")
  if isinstance(value, (int, float)):
    # Compared before scaling: 1e300 seconds is inf microseconds.
    if not FIRST_EVENT_MS <= value * 1000 < END_EVENT_MS:
      raise ValueError(_out_of_range(f"event time {value!r}"))
    return check_event_time(Timestamp(micros=round(value * 1_000_000)),
                            f"event time {value!r}")
  if isinstance(value, str) and _RFC3339.fullmatch(value):
    try:
      parsed = Timestamp.from_rfc3339(value)
    except OverflowError:
      # In range as written, but not once moved to UTC.
      raise ValueError(_out_of_range(f"event time {value!r}")) from None
    return check_event_time(
        parsed.to_precision(Timestamp.MICROS_PRECISION,
                            allow_lossy_conversion=True),
        f"event time {value!r}")
  raise ValueError(f"event time {value!r} is neither epoch seconds nor an"
                   " RFC 3339 date-time with its UTC offset (e.g."
                   " 2024-05-01T12:00:00Z)")


def check_event_time(timestamp: Timestamp, what: str) -> Timestamp:
  """``timestamp`` if it is in years 0001 to 9999, else raises ValueError
  naming it as ``what``."""
  ms = timestamp.micros // 1000
  if not FIRST_EVENT_MS <= ms < END_EVENT_MS:
    raise ValueError(_out_of_range(f"{what} ({ms} ms after the epoch)"))
  return timestamp


def _out_of_range(what: str) -> str:
  return f"{what} is outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z"


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
