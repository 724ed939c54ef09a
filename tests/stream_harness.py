"""Runs the streaming transforms on runners with real watermarks: the
BundleBasedDirectRunner (TestStream) and Prism (a job server this harness
starts and stops by pid)."""

from __future__ import annotations

import glob
import json
import os
import time
import uuid
from typing import Dict, List, Sequence, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from pipeline.engines import find_prism
from tests.services import Service, free_port
from transforms.stream.dedup import PRISM_NO_SPLIT
from transforms.stream.elements import StreamDocument, StreamRejected

DIRECT = "direct"
PRISM = "prism"
START_TIMEOUT_S = 60


class PrismServer(Service):
  """Prism as a job server (its own process group, logging to a file)."""

  def __init__(self, log_dir: str):
    port = free_port()
    super().__init__("prism", [find_prism(), "--job_port", str(port),
                               "--serve_http=false"], port, log_dir)
    self.wait_listening(START_TIMEOUT_S)

  def options(self) -> List[str]:
    return ["--runner", "PortableRunner", "--job_endpoint",
            f"localhost:{self.port}", "--environment_type", "LOOPBACK",
            f"--experiments={PRISM_NO_SPLIT}"]


def doc(doc_id: str, text: str, ts_ms: int) -> TimestampedValue:
  return TimestampedValue(StreamDocument(doc_id, text, text.encode("utf-8")),
                          Timestamp(micros=ts_ms * 1000))


def make_test_stream(events: Sequence[Tuple]) -> TestStream:
  """A TestStream from ``("add", [(id, text, ts_ms), ...])`` and ``("wm",
  ms)`` events; it ends by advancing the watermark past every timer and then
  to infinity."""
  stream = TestStream(coder=beam.coders.registry.get_coder(StreamDocument))
  stream.advance_watermark_to(Timestamp(micros=0))
  last = 0
  for kind, value in events:
    if kind == "add":
      stream.add_elements([doc(*d) for d in value])
    else:
      stream.advance_watermark_to(Timestamp(micros=value * 1000))
      last = value
  stream.advance_watermark_to(Timestamp(micros=(last + 10**12) * 1000))
  return stream.advance_watermark_to_infinity()


class Collect(beam.DoFn):
  """Writes each bundle's elements as JSON lines to its own file."""

  def __init__(self, folder: str, name: str):
    self._folder = folder
    self._name = name

  def start_bundle(self):
    self._rows = []

  def process(self, verdict):
    if isinstance(verdict, StreamRejected):
      self._rows.append(verdict._asdict())
      return
    self._rows.append({"id": verdict.doc_id, "verdict": verdict.verdict,
                       "of": verdict.duplicate_of, "reason": verdict.reason,
                       "similarity": verdict.similarity,
                       "event_ms": verdict.event_ms})

  def finish_bundle(self):
    if self._rows:
      path = os.path.join(self._folder, f"{self._name}-{uuid.uuid4().hex}")
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in self._rows))


def read_collected(folder: str, name: str) -> List[dict]:
  rows = []
  for path in sorted(glob.glob(os.path.join(folder, f"{name}-*"))):
    with open(path, encoding="utf-8") as f:
      rows += [json.loads(line) for line in f]
  return rows


def run_stream(transform: beam.PTransform, events, runner_options,
               folder: str) -> Dict[str, object]:
  """Runs ``transform`` (e.g. DeduplicateStream) on the TestStream of
  ``events``; returns its verdicts, late and rejected rows (none where it
  has no ``rejected`` output) and the committed counters
  (attempted where a runner commits none). The BundleBasedDirectRunner in
  streaming mode reports only each step's first bundle (measured on Beam
  2.77: 2 of 5 elements counted), so only Prism's counters are checked."""
  folder = os.path.join(folder, uuid.uuid4().hex)
  os.makedirs(folder)
  options = PipelineOptions(list(runner_options) + ["--streaming"])
  p = beam.Pipeline(options=options)
  out = p | "Events" >> make_test_stream(events) | "Dedup" >> transform
  names = [n for n in ("verdicts", "late", "rejected") if n in out]
  for name in names:
    _ = out[name] | f"Collect{name}" >> beam.ParDo(Collect(folder, name))
  result = p.run()
  result.wait_until_finish()
  counters = {}
  for c in result.metrics().query()["counters"]:
    counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + (
        c.committed if c.committed is not None else c.attempted)
  rows = {name: read_collected(folder, name)
          for name in ("verdicts", "late", "rejected")}
  return dict(rows, counters=counters)


def read_rows(folder) -> List[dict]:
  """The JSON rows of a streaming job's windowed output folder, in file
  order."""
  rows = []
  for path in sorted(glob.glob(os.path.join(str(folder), "part-*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      rows += [json.loads(line) for line in f]
  return rows


def wait_for_rows(folder, count: int, timeout_s: float, alive=None,
                  hold_s: float = 0.0) -> float:
  """Waits until the JSON rows under ``folder`` (see :func:`read_rows`)
  number at least ``count``, then ``hold_s`` more (so that a late extra
  copy would show); returns the seconds until ``count``. Raises if that
  takes over ``timeout_s`` or ``alive()`` (the job's process) turns
  false."""
  began = time.monotonic()
  while len(read_rows(folder)) < count:
    if alive is not None and not alive():
      raise AssertionError(f"the job exited with {len(read_rows(folder))}"
                           f" of {count} rows in {folder}")
    if time.monotonic() - began > timeout_s:
      raise TimeoutError(f"{len(read_rows(folder))} of {count} rows in"
                         f" {folder} after {timeout_s}s")
    time.sleep(0.5)
  reached = time.monotonic() - began
  time.sleep(hold_s)
  return reached
