"""Timing scenarios of the streaming path on runners with real watermarks:
TestStream on the BundleBasedDirectRunner and on Prism (skipped with the
reason where Prism is not installed). Never on the FnApiRunner, which fires
event-time timers early and does not run TestStream."""

import collections
import os

import pytest

from pipeline.engines import find_prism, missing_prism_reason
from tests.stream_harness import DIRECT, PRISM, PrismServer, run_stream
from transforms import metrics
from transforms.config import DedupConfig, StreamConfig
from transforms.stream.dedup import DeduplicateStream

pytestmark = pytest.mark.extended

FULL = os.environ.get("NEARDUP_FULL") == "1"
DEDUP = DedupConfig(ngram=3, num_perm=64, bands=16, rows=4, threshold=0.5,
                    verify="signature")
WINDOW_MS = 100_000
LATENESS_MS = 5_000
SETTLE_MS = 1_000
WORDS = [f"w{i}" for i in range(60)]
BASE = " ".join(WORDS)
COPY = " ".join(WORDS[:57] + ["x1", "x2", "x3"])
COPY2 = " ".join(["y1"] + WORDS[1:58] + ["y2", "y3"])
OTHER = " ".join(f"z{i}" for i in range(60))


def stream_config(mode, **overrides):
  fields = dict(mode=mode, settle_ms=SETTLE_MS, dedup_window_ms=WINDOW_MS,
                allowed_lateness_ms=LATENESS_MS)
  fields.update(overrides)
  return StreamConfig(DEDUP, **fields)


class Runner(list):
  """Runner options, named; ``counts`` says whether its counters hold."""

  def __init__(self, name, options):
    super().__init__(options)
    self.counts = name == PRISM


@pytest.fixture(scope="module",
                params=[DIRECT, pytest.param(PRISM, marks=pytest.mark.engine)])
def runner(request, tmp_path_factory):
  """Runner options; Prism runs as a job server this fixture stops."""
  if request.param == DIRECT:
    yield Runner(DIRECT, ["--runner", "BundleBasedDirectRunner"])
    return
  if find_prism() is None:
    pytest.skip(missing_prism_reason())
  server = PrismServer(str(tmp_path_factory.mktemp("prism")))
  try:
    yield Runner(PRISM, server.options())
  finally:
    server.stop()


def full_only_on_prism(runner):
  """Quick form: these scenarios run on Prism only with NEARDUP_FULL=1 (each
  Prism run costs seconds; in-order, late, the race and the hot bucket
  always run there)."""
  if runner.counts and not FULL:
    pytest.skip("quick form: NEARDUP_FULL=1 runs this scenario on Prism")


def run(runner, events, tmp_path, mode="event_time", **overrides):
  return run_stream(DeduplicateStream(stream_config(mode, **overrides)),
                    events, runner, str(tmp_path))


def by_id(result):
  rows = result["verdicts"] + result["late"]
  counts = collections.Counter(r["id"] for r in rows)
  assert all(n == 1 for n in counts.values()), counts
  return {r["id"]: r for r in rows}


def outcome(row):
  return (row["verdict"], row["of"])


@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_in_order(runner, tmp_path, mode):
  result = run(runner, [("add", [("a", BASE, 1000)]), ("wm", 1500),
                        ("add", [("b", COPY, 2000)]), ("wm", 2500),
                        ("add", [("c", OTHER, 3000), ("e", "", 3100)])],
               tmp_path, mode)
  got = by_id(result)
  assert {k: outcome(v) for k, v in got.items()} == {
      "a": ("kept", None), "b": ("duplicate", "a"), "c": ("kept", None),
      "e": ("kept", None)}
  assert got["e"]["reason"] == "empty"
  assert 0.5 <= got["b"]["similarity"] < 1.0
  if not runner.counts:
    return
  counters = result["counters"]
  assert counters[metrics.STREAM_DOCS_IN] == 4
  assert counters[metrics.STREAM_KEPT] == 3
  assert counters[metrics.STREAM_DUPLICATES] == 1
  # a's and c's 16 buckets each, all expired by the final watermark.
  assert counters[metrics.STREAM_LIVE_REPS] == 0
  assert counters[metrics.STREAM_REP_STATE_BYTES] == 0
  assert counters.get(metrics.STREAM_PENDING, 0) == 0


def test_out_of_order_event_time_gives_the_in_order_verdicts(runner,
                                                               tmp_path):
  full_only_on_prism(runner)
  result = run(runner, [("add", [("b", COPY, 2000)]),
                        ("add", [("a", BASE, 1000)]),
                        ("add", [("b2", COPY2, 1500)])], tmp_path)
  assert {k: outcome(v) for k, v in by_id(result).items()} == {
      "a": ("kept", None), "b": ("duplicate", "a"), "b2": ("duplicate", "a")}


def test_out_of_order_arrival_never_drops_the_earlier_document(runner,
                                                               tmp_path):
  full_only_on_prism(runner)
  result = run(runner, [("add", [("b", COPY, 2000)]), ("wm", 1000),
                        ("add", [("a", BASE, 1000)])], tmp_path, "arrival")
  got = by_id(result)
  # b arrived first and was kept at once; a precedes it, so a can never be
  # b's duplicate: both are kept (arrival mode depends on arrival order).
  assert outcome(got["a"]) == ("kept", None)
  assert outcome(got["b"]) == ("kept", None)


def test_late_document_goes_to_late_with_its_reason(runner, tmp_path):
  # a's representatives expire once the watermark passes 1000 + window +
  # lateness; its copy with a's event time then arrives far too late.
  result = run(runner, [("add", [("a", BASE, 1000)]),
                        ("wm", 1000 + WINDOW_MS + LATENESS_MS + 10),
                        ("add", [("late", BASE, 1000)])], tmp_path)
  assert [r["id"] for r in result["late"]] == ["late"]
  assert "allowed lateness" in result["late"][0]["reason"]
  assert outcome(by_id(result)["a"]) == ("kept", None)
  if runner.counts:
    assert result["counters"][metrics.STREAM_LATE] == 1


@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_representative_past_the_window_no_longer_suppresses(runner,
                                                             tmp_path, mode):
  full_only_on_prism(runner)
  after = 1000 + WINDOW_MS + LATENESS_MS + 10
  result = run(runner, [("add", [("a", BASE, 1000)]),
                        ("add", [("in", BASE, 1000 + WINDOW_MS)]),
                        ("wm", after),
                        ("add", [("out", BASE, after + 100)]),
                        ("add", [("next", COPY, after + 200)])],
               tmp_path, mode)
  assert {k: outcome(v) for k, v in by_id(result).items()} == {
      "a": ("kept", None), "in": ("duplicate", "a"), "out": ("kept", None),
      "next": ("duplicate", "out")}
  assert not result["late"]


@pytest.mark.parametrize("first", ["x", "y"])
def test_equal_timestamps_race(runner, tmp_path, first):
  docs = {"x": ("x", BASE, 5000), "y": ("y", COPY, 5000)}
  second = "y" if first == "x" else "x"
  events = [("add", [docs[first]]), ("add", [docs[second]])]
  result = run(runner, events, tmp_path)
  # event_time: (event time, id) order decides, whatever arrives first.
  assert {k: outcome(v) for k, v in by_id(result).items()} == {
      "x": ("kept", None), "y": ("duplicate", "x")}
  arrival = by_id(run(runner, events, tmp_path, "arrival"))
  assert outcome(arrival["x"]) == ("kept", None)
  assert arrival["y"]["verdict"] in ("kept", "duplicate")


@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_redelivery_gets_exactly_one_verdict(runner, tmp_path, mode):
  full_only_on_prism(runner)
  result = run(runner, [("add", [("a", BASE, 1000), ("b", COPY, 2000)]),
                        ("wm", 1500),
                        ("add", [("b", COPY, 2000), ("a", BASE, 1000)]),
                        ("wm", 4000),
                        ("add", [("a", BASE, 1000)])], tmp_path, mode)
  assert {k: outcome(v) for k, v in by_id(result).items()} == {
      "a": ("kept", None), "b": ("duplicate", "a")}
  if runner.counts:
    assert result["counters"][metrics.STREAM_REDELIVERED] == 3


@pytest.mark.parametrize("mode", ["arrival", "event_time"])
def test_hot_bucket_holds_one_representative(runner, tmp_path, mode):
  n = 120
  events = []
  for chunk in range(4):
    events.append(("add", [(f"d{i:04d}", BASE, 1000 + i)
                           for i in range(chunk, n, 4)]))
  result = run(runner, events, tmp_path, mode, max_pending=8)
  got = by_id(result)
  assert outcome(got["d0000"]) == ("kept", None)
  assert all(outcome(got[f"d{i:04d}"]) == ("duplicate", "d0000")
             for i in range(1, n))
  if not runner.counts:
    return
  counters = result["counters"]
  if mode == "event_time":
    # Everything arrived before the first settle: the buckets hit
    # max_pending and decided early, in order within what they held.
    assert counters[metrics.STREAM_EARLY_SETTLES] >= 16
  assert counters[metrics.STREAM_DUPLICATES] == n - 1
