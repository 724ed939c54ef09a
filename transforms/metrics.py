"""The single Beam metrics namespace, and counts as Beam counters and tagged
outputs (their names and how they are read back: :mod:`transforms.stats`).

Every count that lands in ``stats.json`` is also a Beam counter of the same
name in ``NAMESPACE`` so it shows on Dataflow/Flink dashboards while a job runs.
Heavy DoFns also carry a :class:`StageMeter`: a ``<stage>_<unit>`` counter
and a throttled progress log line as work is done, and their summed worker
time as ``worker_ms_<stage>`` counts (for the run report, not stats.json).
"""

import collections
import contextlib
import logging
import threading
import time
from typing import Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

# The stat names, re-exported: steps build them through this module.
from transforms.stats import (BUCKET_SIZES, CLUSTER_SIZES, SHUFFLE_PREFIX,
                              TIMING_PREFIX, is_timing, log2_bins,
                              rejected_stat, round_stat, shuffle_stat,
                              size_bin_stat, timing_stat)

NAMESPACE = "neardup"
COUNTS = "counts"
# The elements of every ``counts`` output: (stat name, value).
Count = Tuple[str, int]
# A composite's ``counts`` is a tuple of such PCollections, flattened once
# where they are summed: on the local runner every Flatten of PCollections
# from different stages is a stage of its own (6 of a 20-document run's 43
# were nested count flattens).
PROGRESS_LOGGER = "neardup.progress"
# At most one progress line per stage and process in this many seconds.
PROGRESS_INTERVAL_S = 5.0
# A meter passes its units on to the counter and the log at most this often
# (and at the end of each bundle): per-element calls cost microseconds.
_METER_REPORT_S = 1.0


# The unit of each stage's progress lines and ``<stage>_<unit>`` counter, in
# the order the stages run; the CLI ends a run with one total per stage.
PROGRESS_UNITS = {
    "signatures": "documents",
    "band_keys": "documents",
    "collision": "band keys",
    "verification": "candidate edges",
    "components": "nodes",
    "selection": "clusters",
    "writing": "documents",
    "stream_signatures": "documents",
}


def progress_counter(stage: str) -> str:
  """Name of the counter of a stage's processed units."""
  return f"{stage}_{PROGRESS_UNITS[stage].replace(' ', '_')}"


def quantity(n: int, unit: str) -> str:
  """``n`` and the unit, singular for one: ``1 document``, ``2 documents``."""
  return f"{n:,} {unit[:-1] if n == 1 and unit.endswith('s') else unit}"


def progress_totals(counters: dict) -> list:
  """One ``<stage>: <total> <unit> in total`` line per stage that counted
  anything, from counter name -> value (as a finished job reports them)."""
  return [f"{stage}: {quantity(counters[progress_counter(stage)], unit)} in"
          " total" for stage, unit in PROGRESS_UNITS.items()
          if counters.get(progress_counter(stage))]


def counter(name: str):
  return Metrics.counter(NAMESPACE, name)


def distribution(name: str):
  return Metrics.distribution(NAMESPACE, name)


def count_tag(name: str, value: int):
  """A ``(stat name, value)`` element for the tagged ``counts`` output, also
  added to the Beam counter of that name."""
  counter(name).inc(value)
  return beam.pvalue.TaggedOutput(COUNTS, (name, int(value)))


def shuffled(name: str, nbytes: int):
  """A count tag for the payload bytes a step sends into a shuffle
  (``shuffle_bytes`` in stats.json)."""
  return count_tag(shuffle_stat(name), nbytes)


def histogram_tags(histogram: str, sizes):
  """Count tags of the log2-binned ``sizes`` (one per non-empty bin)."""
  bins = np.bincount(log2_bins(sizes)) if len(sizes) else []
  return [count_tag(size_bin_stat(histogram, k), int(n))
          for k, n in enumerate(bins) if n]


class StageMeter:
  """Instruments one heavy DoFn; build it in ``setup()`` (or derive the DoFn
  from :class:`MeteredDoFn`, which does).

  ``with meter.timed():`` adds the elapsed time of the work inside; keep yields outside, as fused downstream steps run
  inside a yield.
  ``done(n)`` adds n units to the ``<stage>_<unit>`` counter and to the
  process's progress log (passed on at most once a second and at the end of
  the bundle). ``flush()``, from ``finish_bundle``, does the latter and
  returns the whole milliseconds so far as a ``worker_ms_<stage>`` count (a
  windowed tagged output; the fraction carries over to the next bundle).
  """

  def __init__(self, stage: str):
    if stage not in PROGRESS_UNITS:
      raise ValueError(f"stage {stage!r}: add it with its unit to "
                       "metrics.PROGRESS_UNITS")
    self._stage = stage
    self._unit = PROGRESS_UNITS[stage]
    self._progress = counter(progress_counter(stage))
    self._seconds = 0.0
    self._pending = 0
    self._reported = None

  @contextlib.contextmanager
  def timed(self):
    """Times the block (also when it raises)."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self._seconds += time.perf_counter() - start

  def done(self, n: int) -> None:
    self._pending += n
    now = time.monotonic()
    if self._reported is None or now - self._reported >= _METER_REPORT_S:
      self._report(now)

  def _report(self, now: float) -> None:
    self._reported = now
    if self._pending:
      self._progress.inc(self._pending)
      report_progress(self._stage, self._unit, self._pending, now)
      self._pending = 0

  def flush(self):
    self._report(time.monotonic())
    ms = int(self._seconds * 1000)
    if not ms:
      return []
    self._seconds -= ms / 1000
    name = timing_stat(self._stage)
    counter(name).inc(ms)
    return [beam.pvalue.TaggedOutput(
        COUNTS, GlobalWindows.windowed_value((name, ms)))]


class MeteredDoFn(beam.DoFn):
  """A DoFn metered as stage ``STAGE`` (a key of ``PROGRESS_UNITS``):
  ``self.meter`` is its :class:`StageMeter`, flushed at the end of every
  bundle. Time the work with ``with self.meter.timed():`` and count it with
  ``self.meter.done(n)``; a subclass's ``setup``/``finish_bundle`` call
  ``super()`` (``finish_bundle`` returns the list of outputs to add to)."""

  STAGE: str = None

  def setup(self):
    super().setup()
    if self.STAGE not in PROGRESS_UNITS:
      raise ValueError(f"{type(self).__name__}.STAGE {self.STAGE!r}: add it "
                       "with its unit to metrics.PROGRESS_UNITS")
    self.meter = StageMeter(self.STAGE)

  def finish_bundle(self):
    return self.meter.flush()


class SumByName(beam.CombineFn):
  """``(stat name, n)`` elements → ``{name: sum}`` (sorted by name): one
  combine for what a per-key sum and a dict would take two shuffles for."""

  def create_accumulator(self):
    return collections.Counter()

  def add_input(self, totals, count):
    name, n = count
    totals[name] += n
    return totals

  def merge_accumulators(self, accumulators):
    merged = collections.Counter()
    for totals in accumulators:
      for name, n in totals.items():
        merged[name] += n
    return merged

  def extract_output(self, totals):
    return dict(sorted(totals.items()))

  def get_accumulator_coder(self):
    return CountsCoder()


class CountsCoder(beam.coders.Coder):
  """:class:`SumByName`'s accumulator (a Counter) as a plain dict through
  Beam's ``FastPrimitivesCoder``, which pickles a Counter."""

  def __init__(self):
    self._dict = beam.coders.FastPrimitivesCoder()

  def encode(self, value) -> bytes:
    return self._dict.encode(dict(value))

  def decode(self, encoded: bytes):
    return collections.Counter(self._dict.decode(encoded))

  def is_deterministic(self) -> bool:
    return False

  def __eq__(self, other):
    return type(self) is type(other)

  def __hash__(self):
    return hash(type(self))


class BundleCounts:
  """Sums counts over a bundle and emits each once, from ``finish_bundle``,
  for DoFns that would otherwise emit a count tag per element."""

  def __init__(self):
    self._totals = collections.Counter()

  def add(self, name: str, n: int) -> None:
    self._totals[name] += n

  def flush(self):
    out = []
    for name, n in sorted(self._totals.items()):
      if n:
        counter(name).inc(n)
        out.append(beam.pvalue.TaggedOutput(
            COUNTS, GlobalWindows.windowed_value((name, int(n)))))
    self._totals.clear()
    return out


_progress_lock = threading.Lock()
_progress = {}  # stage -> [total, first report, last line] (monotonic s)


def report_progress(stage: str, unit: str, n: int, now: float = None) -> None:
  """Adds n units to the stage's running total in this process and logs it
  (INFO, logger ``neardup.progress``) unless a line for this stage was logged
  less than ``PROGRESS_INTERVAL_S`` ago; a stage's first report always logs."""
  now = time.monotonic() if now is None else now
  with _progress_lock:
    state = _progress.setdefault(stage, [0, now, None])
    state[0] += n
    if state[2] is not None and now - state[2] < PROGRESS_INTERVAL_S:
      return
    state[2] = now
    total, elapsed = state[0], now - state[1]
  rate = f" ({total / elapsed:,.0f}/s)" if elapsed > 0 else ""
  logging.getLogger(PROGRESS_LOGGER).info("%s: %s processed%s", stage,
                                          quantity(total, unit), rate)


def reset_progress() -> None:
  """Forgets the running totals, so a new run in this process starts at 0."""
  with _progress_lock:
    _progress.clear()


# Streaming path (transforms.stream). Counters unless marked.
STREAM_DOCS_IN = "stream_docs_in"
STREAM_KEPT = "stream_kept"
STREAM_DUPLICATES = "stream_duplicates"
STREAM_LATE = "stream_late"
STREAM_REJECTED = "stream_rejected"
STREAM_REDELIVERED = "stream_redelivered"
# Buckets holding a representative now (+1 on gain, -1 on expiry) and the
# encoded bytes of those representatives' state.
STREAM_LIVE_REPS = "stream_live_representatives"
STREAM_REP_STATE_BYTES = "stream_rep_state_bytes"
# Entries buffered in event_time mode now, and the times a bucket reached
# max_pending and decided early.
STREAM_PENDING = "stream_pending_entries"
STREAM_EARLY_SETTLES = "stream_early_settles"
# Distribution: milliseconds from Sign to the document's verdict.
STREAM_VERDICT_LATENCY = "stream_verdict_latency_ms"
