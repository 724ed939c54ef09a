"""The streaming job through the CLI's ``main(argv)``: argument errors
before anything starts, and a local run over files on Prism (skipped with
the reason where Prism is not installed)."""

import glob
import json
import os
import threading
import time

import pytest

from pipeline.cli import main
from pipeline.engines import find_prism, missing_prism_reason
from tests.stream_harness import PrismServer, read_rows
from tests.test_streaming import BASE, COPY, OTHER

pytestmark = pytest.mark.extended


def write_docs(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


@pytest.mark.parametrize("args, message", [
    ([], "exactly one of --input"),
    (["--input", "x.jsonl", "--input_subscription", "projects/p/"
      "subscriptions/s", "--output_topic", "projects/p/topics/t"],
     "exactly one of --input"),
    (["--input_subscription", "projects/p/subscriptions/s"],
     "exactly one of --output"),
    (["--input_subscription", "projects/p/subscriptions/s",
      "--output_topic", "projects/p/topics/t", "--publish", "kept"],
     "--dead_letter_topic"),
    (["--input_subscription", "projects/p/subscriptions/s",
      "--output_topic", "projects/p/topics/t", "--settle", "2m",
      "--allowed_lateness", "1m"], "raise --allowed_lateness"),
    (["--input_subscription", "projects/p/subscriptions/s",
      "--output_topic", "projects/p/topics/t", "--dedup_window", "7 days"],
     "duration '7 days'"),
    (["--input_subscription", "projects/p/subscriptions/s",
      "--output_topic", "projects/p/topics/t", "--bands", "40", "--rows",
      "4"], "exceeds num_perm"),
    (["--input", "{tmp}/none-*.jsonl", "--output_topic",
      "projects/p/topics/t"], "No input files match"),
    (["--input", "{tmp}/docs.jsonl", "--output", "{tmp}/out", "--runner",
      "BundleBasedDirectRunner", "--watch_interval", "5"],
     "needs a runner with splittable DoFns"),
    (["--input", "{tmp}/docs.jsonl", "--output", "{tmp}/out",
      "--checkpointing_interval", "10000"], "is a Flink runner option"),
    *((["--input", "{tmp}/docs.jsonl", "--output", "{tmp}/out", "--runner",
        "FlinkRunner", "--checkpointing_interval", value],
      "an integer >= 10") for value in ("10s", "0", "-1", "5", "1e4")),
    (["--input", "{tmp}/docs.jsonl", "--output", "{tmp}/out", "--runner",
      "FlinkRunner", "--checkpointing_interval"], "an integer >= 10"),
    (["--input", "{tmp}/docs.jsonl", "--output", "{tmp}/out", "--runner",
      "FlinkRunner", "--checkpointing_interval", "10000",
      "--shutdown_sources_after_idle_ms", "5000"], "runs until cancelled"),
])
def test_bad_arguments_fail_before_the_job_starts(tmp_path, capsys, args,
                                                  message):
  write_docs(tmp_path / "docs.jsonl", [{"id": 1, "text": "a b c"}])
  argv = ["--streaming"] + [a.format(tmp=tmp_path) for a in args]
  assert main(argv) == 2
  assert message in capsys.readouterr().err


def test_help_lists_the_streaming_flags(capsys):
  assert main(["--streaming", "--help"]) == 0
  out = capsys.readouterr().out
  for flag in ("--input_subscription", "--mode", "--dedup_window",
               "--threshold"):
    assert flag in out


def test_files_to_windowed_verdict_files(tmp_path):
  write_docs(tmp_path / "docs.jsonl", [
      {"id": "a", "text": BASE, "ts": 100}, {"id": "b", "text": COPY,
                                             "ts": 101},
      {"id": "c", "text": OTHER, "ts": 102}, "not json",
      {"id": "d", "text": BASE, "ts": "yesterday"}])
  out = tmp_path / "out"
  assert main(["--streaming", "--input", str(tmp_path / "docs.jsonl"),
               "--output", str(out), "--event_time_field", "ts",
               "--ngram", "3", "--num_perm", "64", "--bands", "16",
               "--rows", "4", "--threshold", "0.5", "--verify", "exact",
               "--settle", "1s", "--output_window", "1m"]) == 0
  verdicts = {v["id"]: v for v in read_rows(out / "verdicts")}
  assert {k: (v["verdict"], v["duplicate_of"]) for k, v in verdicts.items()
          } == {"a": ("kept", None), "b": ("duplicate", "a"),
                "c": ("kept", None)}
  # Exact verification: the true Jaccard of the 3-gram sets, 55/61.
  assert verdicts["b"]["similarity"] == pytest.approx(55 / 61, abs=1e-6)
  assert verdicts["a"]["event_time"].startswith("1970-01-01T00:01:40")
  reasons = sorted(r["reason"].split(":")[0]
                   for r in read_rows(out / "rejected"))
  assert reasons == ["bad_event_time", "malformed_json"]
  assert sorted(r["id"] for r in read_rows(out / "deduped")) == ["a", "c"]
  assert not read_rows(out / "late")
  # Files are per 1-minute event-time window: a, b and c fall in 00:01.
  names = [os.path.basename(p) for p in glob.glob(str(out / "verdicts" /
                                                      "*"))]
  assert names and all(n.startswith("part-1970-01-01T000100Z-")
                       for n in names), names


@pytest.mark.slow
@pytest.mark.engine
def test_watched_folder_stops_after_watch_stop_after_on_prism(tmp_path):
  """New files are picked up while watching; the job ends on its own once
  --watch_stop_after has passed and every document has its verdict."""
  if os.environ.get("NEARDUP_FULL") != "1":
    pytest.skip("NEARDUP_FULL=1 runs it: ~30 s of polling, and Prism's gRPC"
                " streams time out on a loaded 2-core machine (measured)")
  if find_prism() is None:
    pytest.skip(missing_prism_reason())
  folder = tmp_path / "in"
  folder.mkdir()
  write_docs(folder / "a.jsonl", [{"id": "a", "text": BASE},
                                  {"id": "c", "text": OTHER}])
  out = tmp_path / "out"
  server = PrismServer(str(tmp_path))
  added = threading.Timer(6.0, write_docs, (folder / "b.jsonl",
                                            [{"id": "b", "text": COPY}]))
  added.start()
  try:
    started = time.monotonic()
    assert main(server.options() + [
                 "--streaming", "--input", str(folder / "*.jsonl"),
                 "--output", str(out), "--watch_interval", "1",
                 "--watch_stop_after", "12s", "--ngram", "3", "--num_perm",
                 "64", "--bands", "16", "--rows", "4", "--threshold", "0.5",
                 "--verify", "signature", "--settle", "1s"]) == 0
    elapsed = time.monotonic() - started
  finally:
    added.cancel()
    server.stop()
  verdicts = {v["id"]: (v["verdict"], v["duplicate_of"])
              for v in read_rows(out / "verdicts")}
  assert verdicts == {"a": ("kept", None), "c": ("kept", None),
                      "b": ("duplicate", "a")}
  assert elapsed >= 12
