"""Reliability of the streaming job (issue 26, item 4): every message in
gets exactly one verdict or rejection, or is a counted redelivery (the same
id and the same bytes); an event time the job cannot hold is a
``bad_event_time`` rejection, never a crash."""

import glob
import json
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from pipeline.cli import main
from pipeline import streaming
from pipeline.streaming import WriteWindowedLines
from tests.stream_harness import read_rows, run_stream
from tests.test_streaming import BASE, COPY, OTHER, stream_config
from transforms.stream.dedup import DeduplicateStream
from transforms.stream.messages import (REJECTED, ParseRecords, RawRecord,
                                        event_timestamp)

DIRECT = ["--runner", "BundleBasedDirectRunner"]
FIRST_S = -62_135_596_800  # 0001-01-01T00:00:00Z
END_S = 253_402_300_800  # 10000-01-01T00:00:00Z


@pytest.mark.parametrize("value", [
    1e300, -1e12, 10**30, -10**30, float("inf"), float("-inf"), float("nan"),
    FIRST_S - 0.001, END_S, "0001-01-01T00:00:00+01:00",
    "2020-01-01T00:00:00", "2020-01-01"])
def test_event_time_outside_years_1_to_9999_or_without_offset_is_refused(
    value):
  """Out of range (or not a finite number, or a local time whose UTC
  instant depends on the machine): a ValueError saying so, never an
  OverflowError and never a time the verdict cannot write."""
  with pytest.raises(ValueError,
                     match=r"finite|0001-01-01T00:00:00Z|UTC offset"):
    event_timestamp(value)


def test_event_time_range_ends_are_accepted_at_microsecond_precision():
  assert event_timestamp(FIRST_S) == Timestamp(FIRST_S)
  assert event_timestamp(END_S - 0.001) < Timestamp(END_S)
  assert event_timestamp("9999-12-31T23:59:59.999Z").micros == (
      END_S * 10**6 - 1000)
  # Nanoseconds are cut to the microseconds Beam timestamps carry.
  assert event_timestamp("2020-01-01T00:00:00.123456789Z").micros == (
      1_577_836_800_123_456)


def test_source_timestamp_outside_the_range_is_bad_event_time():
  """Without --event_time_field the source's timestamp (a Pub/Sub
  --timestamp_attribute) is the event time: out of range, it is rejected."""
  ok = RawRecord("s", 0, "m1", b'{"id": "a", "text": "x y z"}')
  far = RawRecord("s", 1, "m2", b'{"id": "b", "text": "x y z"}')
  with beam.Pipeline() as p:
    parsed = (p | beam.Create([(ok, 1e9), (far, -1e12)])
              | beam.Map(lambda r: TimestampedValue(r[0], r[1]))
              | ParseRecords())
    assert_that(parsed.documents | "Ids" >> beam.Map(lambda d: d.doc_id),
                equal_to(["a"]), label="Documents")
    assert_that(parsed[REJECTED] | "Reasons" >> beam.Map(
        lambda r: r.reason.split(":")[0]), equal_to(["bad_event_time"]),
                label="Rejected")


def test_windowed_files_outside_years_1_to_9999_get_the_nearest_name(
    tmp_path):
  """A rejected record keeps its source's timestamp, which may have no RFC
  3339 name: its file is still written."""
  with beam.Pipeline() as p:
    _ = (p | beam.Create([(-10**15, b"old"), (10**15, b"new"), (0, b"now")])
         | WriteWindowedLines(str(tmp_path), 60_000))
  # part-<window start>-<16 hex digits>.jsonl
  stamps = sorted(os.path.basename(n)[5:-23]
                  for n in glob.glob(str(tmp_path / "part-*")))
  assert stamps == ["0001-01-01T000000Z", "1970-01-01T000000Z",
                    "9999-12-31T235959.999000Z"]


def run_direct(events, tmp_path, mode):
  return run_stream(DeduplicateStream(stream_config(mode)), events, DIRECT,
                    str(tmp_path))


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_same_id_with_another_text_is_rejected_and_changes_no_bucket(
    tmp_path, mode):
  """The id keys the job's state: a second text under it is rejected
  ``duplicate_id`` (the first keeps its verdict) and is never compared,
  so ``c``, a copy of that second text, is kept, not a duplicate of a."""
  result = run_direct([("add", [("a", BASE, 1000)]), ("wm", 1500),
                       ("add", [("a", OTHER, 2000)]), ("wm", 2500),
                       ("add", [("c", OTHER, 3000), ("b", COPY, 3100)])],
                      tmp_path, mode)
  verdicts = {(r["id"], r["verdict"], r["of"])
              for r in result["verdicts"] + result["late"]}
  assert verdicts == {("a", "kept", None), ("c", "kept", None),
                      ("b", "duplicate", "a")}
  assert len(result["verdicts"] + result["late"]) == 3
  [rejected] = result["rejected"]
  assert rejected["reason"].startswith("duplicate_id: ")
  assert "another text" in rejected["reason"]


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_redelivery_after_the_allowed_lateness_gets_no_second_verdict(
    tmp_path, mode):
  """An id is remembered as long as its document can be in a bucket
  (event time + window + lateness), not just until its verdict's state
  goes (event time + lateness): a redelivery in between is dropped."""
  result = run_direct([("add", [("a", BASE, 1000)]), ("wm", 7000),
                       ("add", [("a", BASE, 1000)])], tmp_path, mode)
  assert [(r["id"], r["verdict"]) for r in result["verdicts"]
          + result["late"]] == [("a", "kept")]
  assert not result["rejected"]


def write_lines(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                    for r in rows))


def text(i):
  return " ".join(f"t{i}w{j}" for j in range(60))


@pytest.mark.extended
def test_every_line_gets_one_verdict_or_rejection_or_is_a_redelivery(
    tmp_path):
  """12 lines in: 10 documents, another text under d3 (rejected
  ``duplicate_id``) and d5's line again (a redelivery): 11 out. Event times
  the job cannot hold are ``bad_event_time`` rejections; the first instant
  of year 1 is a document, even in a week-long output window."""
  rows = [{"id": f"d{i}", "text": text(i), "ts": 100 + i} for i in range(10)]
  rows += [{"id": "d3", "text": BASE, "ts": 120}, rows[5]]
  bad = ['{"id": "big", "text": "a b c", "ts": 1e300}',
         '{"id": "old", "text": "a b c", "ts": -1e12}',
         '{"id": "huge", "text": "a b c", "ts": 1e400}',
         '{"id": "nan", "text": "a b c", "ts": NaN}',
         '{"id": "inf", "text": "a b c", "ts": -Infinity}',
         '{"id": "local", "text": "a b c", "ts": "2020-01-01T00:00:00"}']
  first = {"id": "year1", "text": OTHER, "ts": "0001-01-01T00:00:00Z"}
  write_lines(tmp_path / "in.jsonl", rows + bad + [first])
  out = tmp_path / "out"
  assert main(["--streaming", "--runner", "BundleBasedDirectRunner",
               "--input", str(tmp_path / "in.jsonl"), "--output", str(out),
               "--event_time_field", "ts", "--ngram", "3", "--num_perm",
               "64", "--bands", "16", "--rows", "4", "--output_window",
               "7d"]) == 0
  verdicts = read_rows(out / "verdicts") + read_rows(out / "late")
  assert sorted(v["id"] for v in verdicts) == sorted(
      [f"d{i}" for i in range(10)] + ["year1"])
  assert all(v["verdict"] == "kept" for v in verdicts)
  year1 = [v for v in verdicts if v["id"] == "year1"]
  assert year1[0]["event_time"] == "0001-01-01T00:00:00Z"
  rejected = read_rows(out / "rejected")
  reasons = sorted(r["reason"].split(":")[0] for r in rejected)
  assert reasons == ["bad_event_time"] * len(bad) + ["duplicate_id"]
  # 12 + 7 lines = 11 verdicts + 7 rejections + 1 redelivery.
  assert len(verdicts) + len(rejected) + 1 == len(rows) + len(bad) + 1
  assert sorted(r["id"] for r in read_rows(out / "deduped")) == sorted(
      v["id"] for v in verdicts)


@pytest.mark.extended
def test_event_time_field_on_text_lines_fails_before_the_job(tmp_path,
                                                              capsys):
  write_lines(tmp_path / "in.txt", ["a b c"])
  assert main(["--streaming", "--input", str(tmp_path / "in.txt"),
               "--input_format", "text", "--output", str(tmp_path / "out"),
               "--event_time_field", "ts"]) == 2
  assert "--event_time_field" in capsys.readouterr().err



def test_seen_ids_state_round_trips_through_its_coder():
  # pylint: disable=import-outside-toplevel
  from transforms.kernels import stream_shard as ss
  from transforms.stream.elements import SeenStateCoder
  seen = ss.SeenIds(ss.empty_seen(), retention_ms=10, tick_ms=5)
  assert seen.admit("a", -62_135_596_800_000, bytes(range(16)),
                    b"\xff" * 16)[0] == ss.FIRST
  assert seen.admit("é", 7, b"\x01" * 16, b"\x02" * 16)[0] == ss.FIRST
  state = seen.state()
  back = SeenStateCoder().decode(SeenStateCoder().encode(state))
  assert back.id_bytes == state.id_bytes
  assert all(np.array_equal(a, b) for a, b in zip(back[2:], state[2:]))
  assert beam.coders.registry.get_coder(ss.SeenState) == SeenStateCoder()
  again = ss.SeenIds(back, retention_ms=10, tick_ms=5)
  assert again.admit("é", 9, b"\x01" * 16, b"\x02" * 16) == (
      ss.REDELIVERY, 7, True)
  assert again.admit("a", 9, b"\x03" * 16, b"\xff" * 16) == (
      ss.OTHER_RECORD, -62_135_596_800_000, True)
  again.forget(-62_135_596_800_000 + 10)  # a's time passed, not é's
  assert again.state().id_bytes == "é".encode()


@pytest.mark.parametrize("flag", [["--checkpointing_interval", "1000"],
                                  ["--checkpointing_interval=1000"]])
def test_checkpointing_on_flink_finishes_bundles_before_checkpoints(flag):
  # Measured on Beam's 2.62 Flink runner: without the flag a checkpointed
  # file job read nothing (templates/flink/README.md).
  flink = ["--runner", "FlinkRunner", *flag]
  assert streaming.checkpointing_flags(PipelineOptions(flink)) == [
      "--finish_bundle_before_checkpointing"]
  assert streaming.checkpointing_flags(PipelineOptions(
      [*flink, "--finish_bundle_before_checkpointing"])) == []
  assert streaming.checkpointing_flags(PipelineOptions(
      ["--runner", "FlinkRunner"])) == []
