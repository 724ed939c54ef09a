"""Online near-duplicate filtering of an unbounded stream with Beam state.

``DeduplicateStream`` = Admit → Sign → BandEntries → Buckets → Verdicts
(stable step labels: Dataflow ``--update`` and Flink savepoints map state by
them):

* **Admit**, keyed by document id, passes the first document under each id,
  drops redeliveries (the same record again) and rejects another record
  under an id already seen (``duplicate_id``).
* **Sign** batches the documents of a bundle through the batch kernels
  (same config and seed, so the same signature and band keys as batch) and
  re-emits each with its own timestamp and window.
* **BandEntries** groups the b band entries of a bundle's signed documents
  by shard of the band-key space: one element per shard and bundle, each
  document's signature once per shard.
* **Buckets**, keyed by shard, holds every bucket of its shard (one
  representative per band key) and answers every entry (see
  :mod:`transforms.kernels.stream` and
  :mod:`transforms.kernels.stream_shard`), each document's answers
  gathered into one report per invocation.
* **Verdicts**, keyed by shard of document ids, merges each document's
  arrival and answers and emits exactly one :class:`Verdict` per document.

Per-element, per-state-cell and per-timer costs are paid per shard and
bundle (or timer tick), not per band entry: a document costs two keyed
invocations of its own (Admit's element and its timer), where it cost ~100
(b answers and up to 2b bucket timers). A bucket shard's state is two
layers (:mod:`transforms.kernels.stream_layers`), so that an invocation
costs what it touches rather than what the shard holds.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from typing import Tuple

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import DebugOptions, StandardOptions
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from transforms import metrics
from transforms.config import StreamConfig
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import minhash as minhash_kernels
from transforms.kernels import compiled_signature as signature_kernels
from transforms.kernels import stream as stream_kernels
from transforms.kernels import stream_layers as layer_kernels
from transforms.kernels import stream_shard as shard_kernels
from transforms.kernels import stream_table as table_kernels
from transforms.sign import normalize_options
from transforms.stream.elements import (REJECTED, Answer, Arrival,
                                        BlobTableCoder, DocBatch,
                                        DueIndexCoder,
                                        Member,
                                        MemberTableCoder, Progress,
                                        ProgressBatch, ProgressBatchCoder,
                                        ProgressCoder,
                                        SeenStateCoder, ShardEntries,
                                        ShardStateCoder, Signed,
                                        StreamDocument, StreamRejected,
                                        Verdict)

LATE = "late"
# Prism (v2.77) splits a slow bundle of a stateful stage and hands the
# residual's keys to a second bundle while the first still holds them: two
# bundles then read and write one key's state at once, losing or repeating
# verdicts (reproduced in tests/test_stream_prism.py). This experiment turns
# its dynamic splitting off.
PRISM_NO_SPLIT = "prism_disable_sdf_split"
_MAX_BATCH = 4096
_NO_SHINGLES = np.zeros(0, dtype=np.uint64)
_NO_KEYS = np.zeros(0, dtype=np.uint64)


def event_ms(timestamp: Timestamp) -> int:
  return timestamp.micros // 1000


def to_timestamp(ms: int) -> Timestamp:
  return Timestamp(micros=ms * 1000)


class DeduplicateStream(beam.PTransform):
  """Timestamped :class:`StreamDocument` s → ``{"verdicts", "late",
  "rejected"}``.

  ``verdicts``: one :class:`Verdict` per document, ``kept`` or ``duplicate``
  (of an earlier document in (event time, id) order, verified as
  ``config.dedup.verify`` says); ``late``: the :class:`Verdict` (``late``,
  with the reason) of every document found later than the allowed lateness;
  ``rejected``: a :class:`StreamRejected` (``duplicate_id``) for every other
  record under an id already seen (see :class:`Admit`). Each input document
  ends in exactly one of the three, or is a redelivery (the same id and
  record again), dropped and counted as ``stream_redelivered``.

  Args:
    config: the streaming parameters and the shared :class:`DedupConfig`.
  """

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, docs):
    check_runner(docs.pipeline.options)
    c = self._config
    admitted = docs | "Admit" >> Admit(c)
    signed = admitted.documents | "Sign" >> Sign(c)
    answers = (signed | "BandEntries" >> BandEntries(c)
               | "Buckets" >> Buckets(c))
    verdicts = ({"answers": answers, "signed": signed}
                | "Verdicts" >> Verdicts(c))
    return {"verdicts": verdicts.verdicts, "late": verdicts[LATE],
            REJECTED: admitted[REJECTED]}


def check_runner(options) -> None:
  """Raises ValueError before the job starts where the runner would
  corrupt keyed state: PrismRunner without :data:`PRISM_NO_SPLIT`."""
  runner = options.view_as(StandardOptions).runner or ""
  experiments = options.view_as(DebugOptions).experiments or []
  if runner.endswith("PrismRunner") and PRISM_NO_SPLIT not in experiments:
    raise ValueError(
        f"DeduplicateStream on Prism needs --experiments={PRISM_NO_SPLIT}:"
        " Prism's dynamic splits let two bundles process one key's state at"
        " once, which loses or repeats verdicts (python -m pipeline"
        " --streaming adds it).")


class _PerBundle(beam.DoFn):
  """Gathers a bundle's elements per window and emits, from
  ``finish_bundle``, the keyed elements ``self._group`` makes of them (in
  timestamp order, as Prism delivers elements), at the earliest timestamp
  among them: one element per key and bundle, not one per entry (the
  runner's per-element cost is paid per element)."""

  def start_bundle(self):
    self._pending = {}

  def process(self, element, timestamp=beam.DoFn.TimestampParam,
              window=beam.DoFn.WindowParam):
    self._pending.setdefault(window, []).append((timestamp, element))

  def finish_bundle(self):
    pending, self._pending = self._pending, {}
    for window, held in pending.items():
      held.sort(key=lambda t: t[0])
      for keyed in self._group([element for _, element in held]):
        yield WindowedValue(keyed, held[0][0], (window,))

  def _group(self, elements):
    raise NotImplementedError


class Admit(beam.PTransform):
  """Timestamped :class:`StreamDocument` s → the documents to decide (main
  output ``documents``, timestamps kept) and :class:`StreamRejected`
  (``rejected``), from a stateful DoFn keyed by shard of document ids.

  The first document under an id passes. The same record again is a
  redelivery: dropped, counted as ``stream_redelivered``. Any other record
  under that id is rejected ``duplicate_id`` (its ``source`` is the id): the
  id keys the verdict and the buckets' members, so a second text under it
  would mix two documents' answers. An id is remembered for as long as its
  document can be in a bucket, until the watermark passes its event time +
  dedup window + allowed lateness (rounded up to a 64th of that); only
  later can it name a new document.
  """

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, docs):
    return (docs
            | "ById" >> beam.ParDo(_ByIdFn(self._config)).with_output_types(
                Tuple[int, DocBatch])
            | "FirstById" >> beam.ParDo(_AdmitFn(self._config)).with_outputs(
                REJECTED, main="documents"))


class _ByIdFn(_PerBundle):

  def __init__(self, config: StreamConfig):
    self._shards = config.key_shards

  def process(self, element, timestamp=beam.DoFn.TimestampParam,
              window=beam.DoFn.WindowParam):
    # Each document's own timestamp travels with it.
    return super().process((element, timestamp.micros), timestamp, window)

  def _group(self, elements):
    by_shard = {}
    for doc, micros in elements:
      by_shard.setdefault(verdict_shard(doc.doc_id, self._shards), []).append(
          (doc, micros))
    for shard, held in sorted(by_shard.items()):
      yield shard, DocBatch(tuple(d for d, _ in held),
                            np.array([m for _, m in held], np.int64))


def _digest(data: bytes) -> bytes:
  return hashlib.blake2b(data, digest_size=16).digest()


class _AdmitFn(beam.DoFn):
  """Remembers the first document of each id of its shard (digests, not
  the record) in a :class:`SeenState` cell until its time passes; one
  ``forget`` timer per shard, rounded up to the tick."""

  SEEN = ReadModifyWriteStateSpec("seen", SeenStateCoder())
  FORGET = TimerSpec("forget", TimeDomain.WATERMARK)

  def __init__(self, config: StreamConfig):
    self._config = config

  def setup(self):
    self._redelivered = metrics.counter(metrics.STREAM_REDELIVERED)
    self._rejected = metrics.counter(metrics.STREAM_REJECTED)

  def _open(self, seen):
    c = self._config
    # Forgetting is garbage collection: a coarse tick (an id is remembered
    # up to 1/64 of the retention longer) fires rarely.
    return shard_kernels.SeenIds(seen.read() or shard_kernels.empty_seen(),
                                 c.retention_ms, c.expire_tick_ms)

  def _close(self, ids, seen, forget):
    state = ids.state()
    if len(state.hashes):
      seen.write(state)
      forget.set(to_timestamp(ids.next_timer(state)))
    else:
      seen.clear()
      forget.clear()

  def process(self, element, window=beam.DoFn.WindowParam,
              seen=beam.DoFn.StateParam(SEEN),
              forget=beam.DoFn.TimerParam(FORGET)):
    _, batch = element
    ids = self._open(seen)
    for doc, micros in zip(batch.docs, batch.micros.tolist()):
      what, first_ms, same_text = ids.admit(
          doc.doc_id, micros // 1000, _digest(doc.record),
          _digest(doc.text.encode("utf-8")))
      if what == shard_kernels.FIRST:
        yield WindowedValue(doc, Timestamp(micros=micros), (window,))
      elif what == shard_kernels.REDELIVERY:
        self._redelivered.inc()
      else:
        self._rejected.inc()
        other = ("the same text in another record" if same_text
                 else "another text")
        yield beam.pvalue.TaggedOutput(REJECTED, WindowedValue(
            StreamRejected(
                doc.doc_id, f"duplicate_id: id {doc.doc_id!r} was already"
                f" seen with {other} (event time {first_ms} ms); ids must be"
                " unique", doc.text[:300]),
            Timestamp(micros=micros), (window,)))
    self._close(ids, seen, forget)

  @on_timer(FORGET)
  def on_forget(self, fired=beam.DoFn.TimestampParam,
                seen=beam.DoFn.StateParam(SEEN),
                forget=beam.DoFn.TimerParam(FORGET)):
    ids = self._open(seen)
    ids.forget(event_ms(fired))
    self._close(ids, seen, forget)


class Sign(beam.PTransform):
  """:class:`StreamDocument` → :class:`Signed`, keeping each element's own
  timestamp and window (batch's ``BatchElements`` would stamp every batch at
  the end of the window). Documents are signed in batches of up to 4096 per
  bundle with the batch kernels."""

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, docs):
    return docs | "SignBatches" >> beam.ParDo(
        _SignFn(self._config)).with_output_types(Signed)


class _SignFn(metrics.MeteredDoFn):

  STAGE = "stream_signatures"

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config.dedup

  def setup(self):
    super().setup()
    c = self._config
    self._a, self._b = minhash_kernels.permutations(c.num_perm, c.seed)
    self._docs_in = metrics.counter(metrics.STREAM_DOCS_IN)

  def start_bundle(self):
    self._pending = []

  def process(self, doc: StreamDocument, timestamp=beam.DoFn.TimestampParam,
              window=beam.DoFn.WindowParam):
    self._pending.append((doc, timestamp, window))
    if len(self._pending) >= _MAX_BATCH:
      yield from self._flush()

  def finish_bundle(self):
    yield from self._flush()
    yield from super().finish_bundle()

  def _flush(self):
    pending, self._pending = self._pending, []
    if not pending:
      return
    c = self._config
    texts = [doc.text for doc, _, _ in pending]
    with self.meter.timed():
      sigs, unit_counts = signature_kernels.signature_batch(
          texts, unit=c.shingle_unit, ngram=c.ngram, seed=c.seed, a=self._a,
          b=self._b, sketch=c.sketch, **normalize_options(c))
      keys = lsh_kernels.band_keys(sigs, c.bands, c.rows, c.seed)
      if c.verify == "exact":
        flat, offsets = signature_kernels.shingle_sets(
            texts, unit=c.shingle_unit, ngram=c.ngram, seed=c.seed,
            **normalize_options(c))
    self.meter.done(len(pending))
    self._docs_in.inc(len(pending))
    for i, (doc, timestamp, window) in enumerate(pending):
      units = int(unit_counts[i])
      status = ("empty" if units == 0 else
                "too_short" if units < c.min_tokens else "signed")
      shingles = (flat[offsets[i]:offsets[i + 1]]
                  if c.verify == "exact" and status == "signed"
                  else _NO_SHINGLES)
      member = Member(doc.doc_id, event_ms(timestamp), sigs[i], shingles)
      signed = Signed(member, keys[i] if status == "signed" else _NO_KEYS,
                      status, doc.record)
      yield WindowedValue(signed, timestamp, (window,))


class BandEntries(beam.PTransform):
  """:class:`Signed` → ``(shard, ShardEntries)``: the band entries of each
  bundle's signed documents, one element per shard of the band-key space
  that they fall in, each document's signature once per shard."""

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, signed):
    return signed | "Explode" >> beam.ParDo(
        _BandEntriesFn(self._config)).with_output_types(
            Tuple[int, ShardEntries])


class _BandEntriesFn(_PerBundle):

  def __init__(self, config: StreamConfig):
    self._shards = config.key_shards
    self._num_perm = config.dedup.num_perm

  def _group(self, elements):
    signed = [s for s in elements if s.status == "signed"]
    if not signed:
      return
    keys = np.stack([s.band_keys for s in signed])
    n, b = keys.shape
    shards = lsh_kernels.shard_of(keys.ravel(), self._shards)
    docs = np.repeat(np.arange(n), b)
    bands = np.tile(np.arange(b, dtype=np.int64), n)
    flat = keys.ravel()
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(self._shards + 1))
    for shard in range(self._shards):
      at = order[bounds[shard]:bounds[shard + 1]]
      if not len(at):
        continue
      members, rows = np.unique(docs[at], return_inverse=True)
      yield shard, ShardEntries(flat[at], bands[at], rows.astype(np.int64),
                                _table([signed[i].member
                                        for i in members.tolist()],
                                       self._num_perm))


def _table(members, num_perm: int) -> shard_kernels.MemberTable:
  if not members:
    return shard_kernels.empty_members(num_perm)
  return shard_kernels.member_table(
      [m.doc_id for m in members], [m.event_ms for m in members],
      np.stack([m.signature for m in members]), [m.shingles for m in members])


class Buckets(beam.PTransform):
  """``(shard, ShardEntries)`` → ``(verdict shard, ProgressBatch)``: every
  bucket's answers, gathered per document, from a stateful DoFn keyed by
  shard of the band-key space (:mod:`transforms.kernels.stream_shard`)."""

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, entries):
    return entries | "Decide" >> beam.ParDo(
        _BucketsFn(self._config)).with_output_types(Tuple[int, ProgressBatch])


class _BucketsFn(beam.DoFn):
  """One shard of buckets in two layers (see
  :mod:`transforms.kernels.stream_layers`): the cold ``buckets``,
  ``members`` and ``due`` cells, rewritten only when the hot layer is
  merged into them, and the ``hot_buckets``, ``hot_members`` and ``fired``
  cells, rewritten by each invocation that changes a bucket. One runner
  timer, ``tick``, stands for every bucket's settle and expire timers (see
  :mod:`transforms.kernels.stream_shard`)."""

  BUCKETS = ReadModifyWriteStateSpec("buckets", ShardStateCoder())
  MEMBERS = ReadModifyWriteStateSpec("members", MemberTableCoder())
  DUE = ReadModifyWriteStateSpec("due", DueIndexCoder())
  HOT = ReadModifyWriteStateSpec("hot_buckets", ShardStateCoder())
  HOT_MEMBERS = ReadModifyWriteStateSpec("hot_members", MemberTableCoder())
  FIRED = ReadModifyWriteStateSpec("fired", beam.coders.VarIntCoder())
  TICK = TimerSpec("tick", TimeDomain.WATERMARK)

  def __init__(self, config: StreamConfig):
    self._config = config

  def setup(self):
    c = self._config
    self._params = shard_kernels.Params(
        c.mode == "event_time", c.settle_ms, c.dedup_window_ms,
        c.allowed_lateness_ms, c.retention_ms, c.max_pending,
        c.dedup.verify, c.dedup.threshold, c.timer_tick_ms,
        c.expire_tick_ms)
    self._live = metrics.counter(metrics.STREAM_LIVE_REPS)
    self._state_bytes = metrics.counter(metrics.STREAM_REP_STATE_BYTES)
    self._pending_now = metrics.counter(metrics.STREAM_PENDING)
    self._early = metrics.counter(metrics.STREAM_EARLY_SETTLES)

  def start_bundle(self):
    self._answers = {}

  def process(self, element, timestamp=beam.DoFn.TimestampParam,
              window=beam.DoFn.WindowParam,
              buckets=beam.DoFn.StateParam(BUCKETS),
              members=beam.DoFn.StateParam(MEMBERS),
              due=beam.DoFn.StateParam(DUE),
              hot=beam.DoFn.StateParam(HOT),
              hot_members=beam.DoFn.StateParam(HOT_MEMBERS),
              fired_count=beam.DoFn.StateParam(FIRED),
              tick=beam.DoFn.TimerParam(TICK)):
    _, entries = element
    cells = (buckets, members, due, hot, hot_members, fired_count)
    shard = self._open(cells)
    before = shard.layers.nbytes
    shard.add(entries.keys, entries.bands, entries.rows, entries.members)
    self._close(shard, before, cells, tick, timestamp, window)

  @on_timer(TICK)
  def on_tick(self, fired=beam.DoFn.TimestampParam,
              window=beam.DoFn.WindowParam,
              buckets=beam.DoFn.StateParam(BUCKETS),
              members=beam.DoFn.StateParam(MEMBERS),
              due=beam.DoFn.StateParam(DUE),
              hot=beam.DoFn.StateParam(HOT),
              hot_members=beam.DoFn.StateParam(HOT_MEMBERS),
              fired_count=beam.DoFn.StateParam(FIRED),
              tick=beam.DoFn.TimerParam(TICK)):
    cells = (buckets, members, due, hot, hot_members, fired_count)
    shard = self._open(cells)
    before = shard.layers.nbytes
    shard.fire(event_ms(fired))
    self._close(shard, before, cells, tick, fired, window)

  def finish_bundle(self):
    # The answers of every key and timer of the bundle, one element per
    # verdict shard: a timer tick fires every shard in one bundle.
    answers, self._answers = self._answers, {}
    for window, (timestamp, held) in answers.items():
      for keyed in _progress_batches(held, self._config.key_shards):
        yield WindowedValue(keyed, timestamp, (window,))

  def _open(self, cells):
    return layer_kernels.LayeredShard(layer_kernels.from_cells(
        [cell.read() for cell in cells], self._config.dedup.num_perm),
                                      self._params)

  def _close(self, shard, before, cells, tick, timestamp, window):
    layers = shard.layers
    # The parts that changed are written; an empty layer is cleared.
    empty = {"cold": not (len(layers.cold.keys) or len(layers.cold_members)),
             "hot": not (len(layers.hot.keys) or len(layers.hot_members)
                         or layers.fired)}
    for name, cell, part in zip(layers._fields, cells, layers):
      if name not in shard.changed:
        continue
      if empty["cold" if name.startswith("cold") else "hot"]:
        cell.clear()
      else:
        cell.write(part)
    due = shard.next_timer()
    if due is None:
      tick.clear()
    else:
      tick.set(to_timestamp(due))
    self._state_bytes.inc(layers.nbytes - before)
    self._live.inc(shard.live_delta)
    self._pending_now.inc(shard.pending_delta)
    self._early.inc(shard.early_settles)
    if shard.answers:
      held = self._answers.setdefault(window, [timestamp, []])
      held[0] = min(held[0], timestamp)
      held[1].extend(shard.answers)


def verdict_shard(doc_id: str, shards: int) -> int:
  """The verdict shard of a document id (stable across runs and
  workers)."""
  return zlib.crc32(doc_id.encode("utf-8")) % shards


def _progress_batches(answers, shards: int):
  """Answers ``(doc id, band, kind, judge id, judge ms, similarity)`` →
  one ``(verdict shard, ProgressBatch)`` per shard: each document's
  answers gathered into one :class:`Progress`."""
  by_doc = {}
  for doc_id, band, kind, other_id, other_ms, similarity in answers:
    by_doc[doc_id] = _gather(by_doc.get(doc_id, _NO_PROGRESS), Answer(
        band, kind, other_id, other_ms, similarity))
  return _progress_batches_of(by_doc.items(), shards)


class Verdicts(beam.PTransform):
  """``{"answers", "signed"}`` → one :class:`Verdict` per document
  (main output; ``late`` tagged), from a stateful DoFn keyed by shard of
  document ids that merges each document's :class:`Arrival` and its b
  answers."""

  def __init__(self, config: StreamConfig):
    super().__init__()
    self._config = config

  def expand(self, inputs):
    arrivals = inputs["signed"] | "Arrivals" >> beam.ParDo(
        _ArrivalsFn(self._config)).with_output_types(
            Tuple[int, ProgressBatch])
    return ((inputs["answers"], arrivals)
            | "Gather" >> beam.Flatten()
            | "Decide" >> beam.ParDo(_VerdictFn(self._config)).with_outputs(
                LATE, main="verdicts"))


class _ArrivalsFn(_PerBundle):

  def __init__(self, config: StreamConfig):
    self._bands = config.dedup.bands
    self._shards = config.key_shards

  def _group(self, elements):
    now = int(time.time() * 1000)
    return _progress_batches_of(
        [(s.member.doc_id, Progress(arrival=Arrival(
            s.member.event_ms, self._bands if s.status == "signed" else 0,
            s.status, s.record, now))) for s in elements], self._shards)


def _progress_batches_of(items, shards: int):
  """``(doc id, Progress)`` pairs → one ``(verdict shard, ProgressBatch)``
  per shard they fall in."""
  by_shard = {}
  for doc_id, progress in items:
    ids, progresses = by_shard.setdefault(verdict_shard(doc_id, shards),
                                          ([], []))
    ids.append(doc_id)
    progresses.append(progress)
  for shard, (ids, progresses) in sorted(by_shard.items()):
    yield shard, ProgressBatch(tuple(ids), tuple(progresses))


class _VerdictFn(beam.DoFn):
  """One shard of document ids: the :class:`Progress` of each document
  whose verdict is not out yet, or whose answers are not all in yet (a
  ``progress_table`` cell, read and rewritten in proportion to the
  documents an invocation touches, see
  :mod:`transforms.kernels.stream_table`), merged with every arrival and
  partial answer; emits a verdict once it is decided. A document's state
  goes once its verdict is out and all its answers came: :class:`Admit`
  keeps redeliveries out, so nothing else arrives for it. The ``progress``
  cell of the graph before (all progress in one batch) is read once and
  moved into the table."""

  PROGRESS = ReadModifyWriteStateSpec("progress", ProgressBatchCoder())
  TABLE = ReadModifyWriteStateSpec("progress_table", BlobTableCoder())

  def __init__(self, config: StreamConfig):
    self._config = config

  def setup(self):
    self._counters = {name: metrics.counter(name) for name in (
        metrics.STREAM_KEPT, metrics.STREAM_DUPLICATES, metrics.STREAM_LATE,
        metrics.STREAM_REDELIVERED)}
    self._latency = metrics.distribution(metrics.STREAM_VERDICT_LATENCY)
    self._coder = ProgressCoder()

  def process(self, element, legacy=beam.DoFn.StateParam(PROGRESS),
              cell=beam.DoFn.StateParam(TABLE)):
    _, batch = element
    table = cell.read() or table_kernels.empty_table()
    progress = {}
    held = legacy.read()
    if held:
      progress.update(zip(held.ids, held.items))
      legacy.clear()
    touched = [i for i in dict.fromkeys(batch.ids) if i not in progress]
    rows = table_kernels.find(table, touched)
    for doc_id, row in zip(touched, rows.tolist()):
      if row >= 0:
        progress[doc_id] = self._coder.decode(table.blob(row))
    for doc_id, report in zip(batch.ids, batch.items):
      before = progress.get(doc_id, _NO_PROGRESS)
      if report.arrival is not None and before.arrival is not None:
        self._counters[metrics.STREAM_REDELIVERED].inc()
        continue
      now = _merge(before, report)
      if not now.done:
        verdict = _verdict(doc_id, now)
        if verdict is not None:
          now = now._replace(done=True)
          yield self._emit(verdict, now.arrival)
      if now.done and _complete(now):
        progress.pop(doc_id, None)
      else:
        progress[doc_id] = now
    table = table_kernels.updated(
        table, rows[rows >= 0], list(progress),
        [self._coder.encode(p) for p in progress.values()])
    if len(table):
      cell.write(table)
    else:
      cell.clear()

  def _emit(self, verdict, arrival):
    self._latency.update(max(0, int(time.time() * 1000) - arrival.arrived_ms))
    if verdict.verdict == LATE:
      self._counters[metrics.STREAM_LATE].inc()
      return beam.pvalue.TaggedOutput(LATE, verdict)
    self._counters[metrics.STREAM_KEPT if verdict.verdict == "kept"
                   else metrics.STREAM_DUPLICATES].inc()
    return verdict


_NO_PROGRESS = Progress()


def _complete(progress: Progress) -> bool:
  """Whether every answer a document expects came (then nothing more
  does)."""
  arrival = progress.arrival
  return arrival is not None and bin(progress.bands).count("1") >= (
      arrival.expect)


def _merge(progress: Progress, report: Progress) -> Progress:
  """``progress`` with a report: the arrival, or the answers of some bands
  (bands already answered change nothing)."""
  if report.arrival is not None:
    return progress._replace(arrival=report.arrival)
  new = report.bands & ~progress.bands
  if not new:
    return progress
  progress = progress._replace(bands=progress.bands | new)
  for answer in (report.late, report.best):
    if answer is not None and (1 << answer.band) & new:
      progress = _gather(progress._replace(bands=progress.bands & ~(
          1 << answer.band)), answer)
  return progress


def _match_order(answer: Answer):
  """Best match first: the highest similarity, then the earliest, then
  the lowest band, so the verdict never depends on the answers' order."""
  return (-answer.similarity, answer.other_ms,
          answer.other_id.encode("utf-8"), answer.band)


def _gather(progress: Progress, answer: Answer) -> Progress:
  """``progress`` with one more answer (a repeated band changes nothing)."""
  bit = 1 << answer.band
  if progress.bands & bit:
    return progress
  progress = progress._replace(bands=progress.bands | bit)
  if answer.kind == stream_kernels.LATE and (
      progress.late is None or answer.band < progress.late.band):
    return progress._replace(late=answer)
  if answer.kind == stream_kernels.MATCH and (
      progress.best is None or _match_order(answer) < _match_order(
          progress.best)):
    return progress._replace(best=answer)
  return progress


def _verdict(doc_id: str, progress: Progress):
  """The verdict once it is decided, else None: late at the first late
  answer; otherwise when every band answered, a duplicate of the best
  matching representative (:func:`_match_order`), or kept."""
  arrival = progress.arrival
  if arrival is None:
    return None
  if arrival.expect == 0:
    return Verdict(doc_id, arrival.event_ms, "kept", arrival.status, None,
                   None, None, arrival.record)
  late = progress.late
  if late is not None:
    return Verdict(
        doc_id, arrival.event_ms, LATE,
        f"event time {arrival.event_ms} ms is more than the allowed lateness"
        f" behind the watermark (at least {late.other_ms} ms in band"
        f" {late.band})", None, None, None, arrival.record)
  if bin(progress.bands).count("1") < arrival.expect:
    return None
  best = progress.best
  if best is None:
    return Verdict(doc_id, arrival.event_ms, "kept", "unique", None, None,
                   None, arrival.record)
  return Verdict(doc_id, arrival.event_ms, "duplicate",
                 f"band {best.band}", best.other_id, best.other_ms,
                 best.similarity, arrival.record)
