"""The streaming job: ``python -m pipeline --streaming ...``.

Reads a Pub/Sub subscription (``--input_subscription``), Kafka topics
(``--input_topic``, brokers ``--bootstrap_servers``) or files (``--input``, read
once, or watched with ``--watch_interval``), decides each document online
with :class:`~transforms.stream.dedup.DeduplicateStream`, and writes
verdicts to a Pub/Sub or Kafka topic (``--output_topic``) or windowed files
(``--output``). Every DedupConfig flag of the batch job applies unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import uuid
from typing import List, Optional

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.portability import common_urns
from apache_beam.options.pipeline_options import (DebugOptions,
                                                  PipelineOptions,
                                                  PrismRunnerOptions,
                                                  StandardOptions)
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from pipeline.engines import (INSTALL_FLINK, INSTALL_PRISM, configure_flink,
                              find_prism, kafka_expansion_service)
from pipeline.options import CLI_ONLY, DedupOptions, config_from_options
from transforms.config import (STREAM_MODES, ConfigError, DedupConfig,
                               StreamConfig, parse_duration_ms)
from transforms.read import COLUMNAR_FORMATS, detect_format, iter_lines
from transforms.stream.dedup import PRISM_NO_SPLIT, DeduplicateStream
from transforms.stream.kafka import (TIMESTAMP_POLICIES, ReadKafkaRecords,
                                     WriteKafkaRecords, check_topic,
                                     parse_config)
from transforms.stream.messages import (END_EVENT_MS, FIRST_EVENT_MS,
                                        REJECTED, ParseRecords, RawRecord,
                                        rejected_json, verdict_json)

# Local runs: the one local runner that runs Pub/Sub I/O natively and holds
# real watermarks without anything installed (never the FnApiRunner, which
# fires event-time timers early and busy-polls a watched folder).
DEFAULT_RUNNER = "BundleBasedDirectRunner"
PUBLISH = ("verdicts", "kept")
# Runners that may be Prism (a PortableRunner's job server can be): they get
# PRISM_NO_SPLIT, which other runners ignore.
_MAYBE_PRISM = ("PrismRunner", "PortableRunner")
# Output folders under --output.
VERDICTS_DIR, DEDUPED_DIR, LATE_DIR, REJECTED_DIR = (
    "verdicts", "deduped", "late", "rejected")
_DEFAULTS = StreamConfig(DedupConfig(bands=1, rows=1))
# Flink refuses checkpoint intervals under 10 ms.
MIN_CHECKPOINT_MS = 10
# Flink, or a portable job server that may be Flink's: the runners that take
# checkpoints and that run KafkaIO's Java steps with the expansion service
# the job starts (an EMBEDDED environment: Flink's own JVM).
_FLINK_RUNNERS = ("FlinkRunner", "PortableRunner")
STREAM_EPILOG = """\
Kafka (Beam's Java KafkaIO; scripts/install_flink.sh kafka installs it,
scripts/kafka.sh starts a local broker):
  --input_topic docs --output_topic verdicts --bootstrap_servers HOST:PORT
  (Beam's flag, default localhost:9092) runs on FlinkRunner (the default
  runner then: --flink_master [local] or host:port), or on any runner with
  --expansion_service HOST:PORT. An --output_topic not under projects/ is
  a Kafka topic.
runner flags (Beam's; taken as well, not listed above):
  --runner NAME             BundleBasedDirectRunner (default for files and
                            Pub/Sub), PrismRunner (default with
                            --watch_interval), FlinkRunner, DataflowRunner
  --flink_master, --parallelism, --environment_type, --checkpointing_interval
                            Flink (templates/flink/README.md)
  --project, --region, --temp_location, --enable_streaming_engine
                            Dataflow (templates/dataflow-streaming/)
"""


class StreamingOptions(PipelineOptions):
  """Options of the streaming job, next to :class:`DedupOptions`."""

  @classmethod
  def _add_argparse_args(cls, parser):
    io = parser.add_argument_group("streaming input and output")
    io.add_argument("--input_subscription",
                    help="Pub/Sub subscription to read, projects/P/"
                    "subscriptions/S; JSON messages with the text and id"
                    " fields (instead of --input).")
    io.add_argument("--timestamp_attribute",
                    help="Pub/Sub message attribute holding the event time"
                    " (epoch ms or RFC 3339); default: the publish time.")
    io.add_argument("--id_label",
                    help="Pub/Sub attribute with a unique message id that"
                    " Dataflow uses to drop redeliveries (not supported by"
                    " the local runners; verdicts are one per document"
                    " anyway).")
    io.add_argument("--event_time_field",
                    help="JSON field with the event time (epoch seconds or"
                    " RFC 3339); overrides the source's timestamps.")
    io.add_argument("--output_topic",
                    help="Pub/Sub topic to publish to, projects/P/topics/T,"
                    " or a Kafka topic (any other name; see"
                    " --bootstrap_servers) (instead of --output).")
    io.add_argument("--input_topic",
                    help="Kafka topics to read (comma-separated; brokers:"
                    " --bootstrap_servers); JSON values with the text and id"
                    " fields (instead of --input). Without --id_field a"
                    " record's id is kafka:<topic>/<partition>/<offset>.")
    io.add_argument("--kafka_timestamp_policy", default="CreateTime",
                    choices=TIMESTAMP_POLICIES,
                    help="Event time of a Kafka record (unless"
                    " --event_time_field): its CreateTime or LogAppendTime"
                    " timestamp (the watermark follows them, and the wall"
                    " clock once the reader has caught up), or the time it"
                    " is read.")
    io.add_argument("--consumer_config", action="append", metavar="KEY=VALUE",
                    help="Kafka consumer setting (repeat the flag); reads"
                    " start at the earliest offset unless auto.offset.reset"
                    " says otherwise; with group.id, offsets are committed"
                    " at checkpoints.")
    io.add_argument("--producer_config", action="append", metavar="KEY=VALUE",
                    help="Kafka producer setting (repeat the flag).")
    io.add_argument("--expansion_service", metavar="HOST:PORT",
                    help="A running expansion service with Beam's KafkaIO;"
                    " default: one started for the job from the jar of"
                    f" {INSTALL_FLINK} kafka.")
    io.add_argument("--publish", default="verdicts", choices=PUBLISH,
                    help="verdicts: one JSON verdict per document (kept,"
                    " duplicate, late, rejected); kept: the kept documents'"
                    " original messages (late and rejected ones then go to"
                    " --dead_letter_topic).")
    io.add_argument("--dead_letter_topic",
                    help="Topic (Pub/Sub or Kafka, as --output_topic) for late"
                    " and rejected records' JSON verdicts; required with"
                    " --publish kept.")
    io.add_argument("--watch_interval", type=float, default=0.0,
                    help="Seconds between polls of --input for new files; 0"
                    " reads the matching files once and finishes.")
    io.add_argument("--watch_stop_after", default="1h",
                    help="Stop watching --input this long after the start"
                    " (e.g. 30m); the job then finishes once every document"
                    " seen has its verdict.")
    io.add_argument("--output_window", default="60s",
                    help="Event-time window of the files written under"
                    " --output (one set of files per window).")

    dedup = parser.add_argument_group("online near-duplicate filtering")
    dedup.add_argument("--mode", default=_DEFAULTS.mode, choices=STREAM_MODES,
                       help="arrival: decide each document at once (lowest"
                       " latency, depends on arrival order); event_time:"
                       " wait until the watermark passes event time +"
                       " --settle, then decide in (event time, id) order.")
    dedup.add_argument("--settle", default="10s",
                       help="event_time mode: how long after a document's"
                       " event time its undecided buckets wait.")
    dedup.add_argument("--dedup_window", default="7d",
                       help="A kept document suppresses near-copies whose"
                       " event time is at most this much later.")
    dedup.add_argument("--allowed_lateness", default="1h",
                       help="Documents further behind the watermark go to"
                       " the late output; state is held for window + this.")
    dedup.add_argument("--max_pending", type=int,
                       default=_DEFAULTS.max_pending,
                       help="Most entries one bucket buffers in event_time"
                       " mode before deciding them at once.")
    dedup.add_argument("--key_shards", type=int,
                       default=_DEFAULTS.key_shards,
                       help="Shards of the band keys and document ids, one"
                       " key of state each: the most workers the stateful"
                       " steps use (not changeable across an update).")


_FILE_ONLY = ("input", "output", "input_format", "overwrite",
              "watch_interval", "watch_stop_after", "output_window",
              "annotate", "removal_list", "output_compression") + CLI_ONLY
# Incremental dedup is batch only (README, "Incremental dedup against an
# index", says how streaming would warm-start from an index).
_BATCH_ONLY = ("index_out", "against")
TEMPLATE_REQUIRED = ("input_subscription", "output_topic")
# Flags that mean something only to a job that reads or writes Kafka.
_KAFKA_SETTINGS = ("consumer_config", "producer_config", "expansion_service")
# The Dataflow template reads Pub/Sub only: Kafka there would need an
# expansion service whose Java environment Dataflow starts (not tested).
_KAFKA_ONLY = ("input_topic", "kafka_timestamp_policy") + _KAFKA_SETTINGS
PUBSUB_PREFIX = "projects/"
_PUBSUB_INPUT_ONLY = ("timestamp_attribute", "id_label")


class TemplateOptions:
  """The parameters of the Dataflow streaming Flex Template: every option of
  the streaming job except the file-only and Kafka ones (not a
  PipelineOptions class, so it registers nothing)."""

  @classmethod
  def _add_argparse_args(cls, parser):
    # pylint: disable=protected-access
    scratch = argparse.ArgumentParser(add_help=False)
    DedupOptions._add_argparse_args(scratch)
    StreamingOptions._add_argparse_args(scratch)
    for action in scratch._actions:
      if action.dest not in _FILE_ONLY + _BATCH_ONLY + _KAFKA_ONLY:
        parser._add_action(action)


def stream_config(options: PipelineOptions) -> StreamConfig:
  """The validated StreamConfig of these options (raises ConfigError)."""
  view = options.view_as(StreamingOptions)
  return StreamConfig(
      config_from_options(options), mode=view.mode,
      settle_ms=parse_duration_ms(view.settle),
      dedup_window_ms=parse_duration_ms(view.dedup_window),
      allowed_lateness_ms=parse_duration_ms(view.allowed_lateness),
      max_pending=view.max_pending, key_shards=view.key_shards)


def _kafka_out(view) -> bool:
  """Whether ``--output_topic`` names a Kafka topic (a Pub/Sub one is a
  path under ``projects/``, which a Kafka name cannot be)."""
  return bool(view.output_topic) and not view.output_topic.startswith(
      PUBSUB_PREFIX)


def uses_kafka(options: PipelineOptions) -> bool:
  """Whether the job reads or writes Kafka."""
  view = options.view_as(StreamingOptions)
  return bool(view.input_topic) or _kafka_out(view)


def bootstrap_servers(options: PipelineOptions) -> str:
  """The Kafka brokers: Beam's own ``--bootstrap_servers`` flag (its Kafka
  Streams runner's, default ``localhost:9092``), which the job shares
  rather than defining a second one."""
  return options.get_all_options()["bootstrap_servers"]


def check_kafka(options: PipelineOptions) -> None:
  """Raises ValueError naming the flags when the Kafka ones do not make a
  job on this runner."""
  view = options.view_as(StreamingOptions)
  if not uses_kafka(options):
    given = [f"--{name}" for name in _KAFKA_SETTINGS if getattr(view, name)]
    if given:
      raise ValueError(f"{', '.join(given)}: Kafka flags, and neither"
                       " --input_topic nor --output_topic is a Kafka topic.")
    return
  if view.input_topic:
    for topic in view.input_topic.split(","):
      check_topic(topic.strip(), "--input_topic")
    given = [f"--{name}" for name in _PUBSUB_INPUT_ONLY
             if getattr(view, name)]
    if given:
      raise ValueError(f"{', '.join(given)}: Pub/Sub flags; a Kafka record's"
                       " event time is --kafka_timestamp_policy or"
                       " --event_time_field.")
  if _kafka_out(view):
    check_topic(view.output_topic, "--output_topic")
    if view.dead_letter_topic:
      check_topic(view.dead_letter_topic, "--dead_letter_topic")
  parse_config(view.consumer_config, "--consumer_config")
  parse_config(view.producer_config, "--producer_config")
  runner = options.view_as(StandardOptions).runner or default_runner(options)
  if not view.expansion_service and not runner.endswith(_FLINK_RUNNERS):
    raise ValueError(
        f"Kafka I/O on {runner}: Beam's KafkaIO is Java, run here by Flink"
        " (--runner FlinkRunner, the default with Kafka); on another runner"
        " give --expansion_service host:port of a service whose environment"
        " that runner can start.")


def check_io(options: PipelineOptions) -> None:
  """Raises ValueError naming the flags when the sources or sinks given do
  not make one job."""
  files, view = options.view_as(DedupOptions), options.view_as(
      StreamingOptions)
  inputs = [bool(files.input), bool(view.input_subscription),
            bool(view.input_topic)]
  if sum(inputs) != 1:
    raise ValueError("give exactly one of --input (files),"
                     " --input_subscription (Pub/Sub) and --input_topic"
                     " (Kafka).")
  if bool(files.output) == bool(view.output_topic):
    raise ValueError("give exactly one of --output (folder) and"
                     " --output_topic (Pub/Sub or Kafka).")
  check_kafka(options)
  if view.publish == "kept" and view.output_topic and not (
      view.dead_letter_topic):
    raise ValueError("--publish kept needs --dead_letter_topic for the late"
                     " and rejected records (they are never dropped).")
  if files.input and "," in files.input:
    raise ValueError("--input takes one file pattern in streaming mode.")
  for name in _BATCH_ONLY:
    if getattr(files, name):
      raise ValueError(f"--{name} is batch only: run the batch job (without"
                       " --streaming) to build or use an index.")
  input_format = (detect_format(files.input, files.input_format)
                  if files.input else "jsonl")
  if input_format in COLUMNAR_FORMATS:
    raise ValueError("streaming reads JSONL or text lines; convert Parquet"
                     " or Arrow inputs or use the batch job.")
  if view.event_time_field and input_format != "jsonl":
    raise ValueError("--event_time_field names a JSON field, so it needs"
                     f" JSONL input; --input is read as {input_format} lines"
                     " (see --input_format).")
  if files.annotate or files.removal_list or (
      files.output_compression != "auto"):
    raise ValueError("--annotate, --removal_list and --output_compression"
                     " are batch-job flags; streaming writes verdicts.")
  runner = options.view_as(StandardOptions).runner or default_runner(options)
  if view.watch_interval > 0 and runner.endswith("DirectRunner"):
    raise ValueError(
        "--watch_interval needs a runner with splittable DoFns"
        " (MatchContinuously): --runner PrismRunner (the default when"
        f" {INSTALL_PRISM} has built it), Flink or Dataflow; the"
        " BundleBasedDirectRunner cannot run it.")
  if view.watch_interval < 0:
    raise ValueError("--watch_interval must be >= 0 seconds.")
  parse_duration_ms(view.watch_stop_after)
  if parse_duration_ms(view.output_window) <= 0:
    raise ValueError("--output_window must be positive, e.g. 60s.")


def default_runner(options: PipelineOptions) -> str:
  """The runner when none is given: FlinkRunner for Kafka (unless an
  expansion service is given), Prism to watch a folder where it is
  installed, else ``DEFAULT_RUNNER``."""
  view = options.view_as(StreamingOptions)
  if uses_kafka(options) and not view.expansion_service:
    return "FlinkRunner"
  if view.watch_interval > 0 and find_prism():
    return "PrismRunner"
  return DEFAULT_RUNNER


def checkpointing_flags(options: PipelineOptions) -> List[str]:
  """The Flink runner flags that a ``--checkpointing_interval`` job also
  needs (none without one); raises ValueError for an interval Flink would
  not take or a runner that has no checkpoints.

  Measured on Beam's 2.62 Flink runner: a stage's bundle still open at a
  checkpoint is finished into the checkpoint's state and its outputs are
  sent on the stage's next element or watermark, which a file source (one
  impulse, then the final watermark) never sends, so nothing was read; with
  ``--finish_bundle_before_checkpointing`` the outputs go downstream before
  the checkpoint barrier. Such a job runs until cancelled, as Beam keeps its
  sources when checkpointing: a stopped source ends the input of the
  stable-input file sink (:class:`WriteWindowedLines`), whose lines wait for
  a checkpoint that a finishing task no longer takes (measured: the job
  spun in its sink's end of input)."""
  given = options.get_all_options(retain_unknown_options=True)
  interval = given.get("checkpointing_interval")
  if interval is None:
    return []
  runner = options.view_as(StandardOptions).runner or default_runner(options)
  if not runner.endswith(_FLINK_RUNNERS):
    raise ValueError(
        f"--checkpointing_interval is a Flink runner option; {runner} has no"
        " checkpoints (use --runner FlinkRunner, or drop the flag).")
  if not (isinstance(interval, str) and interval.isdigit()
          and int(interval) >= MIN_CHECKPOINT_MS):
    raise ValueError(
        f"--checkpointing_interval {interval!r}: give the milliseconds"
        f" between checkpoints, an integer >= {MIN_CHECKPOINT_MS} (Flink's"
        " least), e.g. --checkpointing_interval 10000.")
  if "shutdown_sources_after_idle_ms" in given:
    raise ValueError(
        "--shutdown_sources_after_idle_ms with --checkpointing_interval: a"
        " checkpointed job runs until cancelled (its file sink commits at"
        " checkpoints, which stop with the sources); drop the flag.")
  if "finish_bundle_before_checkpointing" in given:
    return []
  return ["--finish_bundle_before_checkpointing"]


def checkpointed(options: PipelineOptions) -> bool:
  """Whether the job takes Flink checkpoints (``--checkpointing_interval``)."""
  return "checkpointing_interval" in options.get_all_options(
      retain_unknown_options=True)


def build(p: beam.Pipeline, options: PipelineOptions, config: StreamConfig):
  """Adds the whole streaming job to ``p``."""
  files, view = options.view_as(DedupOptions), options.view_as(
      StreamingOptions)
  expansion = (kafka_expansion_service(view.expansion_service)
               if uses_kafka(options) else None)
  if view.input_subscription:
    records = read_pubsub(p, view)
    input_format = "jsonl"
  elif view.input_topic:
    records = p | "ReadKafkaRecords" >> ReadKafkaRecords(
        bootstrap_servers(options),
        [t.strip() for t in view.input_topic.split(",")], expansion,
        parse_config(view.consumer_config, "--consumer_config"),
        view.kafka_timestamp_policy)
    input_format = "jsonl"
  else:
    input_format = detect_format(files.input, files.input_format)
    records = read_files(p, files.input, view)
  parsed = records | "ParseRecords" >> ParseRecords(
      input_format, files.text_field, files.id_field, view.event_time_field)
  out = parsed.documents | "DeduplicateStream" >> DeduplicateStream(config)
  rejected = ((parsed[REJECTED], out[REJECTED])
              | "AllRejected" >> beam.Flatten())
  if _kafka_out(view):
    publish_kafka(out["verdicts"], out["late"], rejected, view,
                  bootstrap_servers(options), expansion)
  elif view.output_topic:
    publish(out["verdicts"], out["late"], rejected, view)
  else:
    write_files(out["verdicts"], out["late"], rejected, files.output,
                parse_duration_ms(view.output_window), checkpointed(options))


def publish(verdicts, late, rejected, view):
  """JSON verdicts (or the kept records) to the Pub/Sub topics."""
  late_json = late | "LateJson" >> beam.Map(verdict_json)
  rejected_json_ = rejected | "RejectedJson" >> beam.Map(rejected_json)
  if view.publish == "kept":
    kept = (verdicts
            | "KeptOnly" >> beam.Filter(lambda v: v.verdict == "kept")
            | "KeptRecords" >> beam.Map(lambda v: v.record))
    _ = kept | "PublishKept" >> beam.io.WriteToPubSub(view.output_topic)
    dead = (late_json, rejected_json_) | "DeadLetters" >> beam.Flatten()
    _ = dead | "PublishDeadLetters" >> beam.io.WriteToPubSub(
        view.dead_letter_topic)
    return
  everything = ((verdicts | "VerdictJson" >> beam.Map(verdict_json),
                 late_json, rejected_json_)
                | "AllVerdicts" >> beam.Flatten())
  _ = everything | "PublishVerdicts" >> beam.io.WriteToPubSub(
      view.output_topic)


def publish_kafka(verdicts, late, rejected, view, servers: str, expansion):
  """As :func:`publish`, to Kafka topics: each record keyed by its
  document's id (a rejection's by its source), so that one document's
  records share a partition (at least once: KafkaIO's writer)."""
  keyed = {
      "Verdict": verdicts | "KafkaVerdictJson" >> beam.Map(
          lambda v: (v.doc_id.encode("utf-8"), verdict_json(v))),
      "Late": late | "KafkaLateJson" >> beam.Map(
          lambda v: (v.doc_id.encode("utf-8"), verdict_json(v))),
      "Rejected": rejected | "KafkaRejectedJson" >> beam.Map(
          lambda r: (r.source.encode("utf-8"), rejected_json(r))),
  }
  config = parse_config(view.producer_config, "--producer_config")

  def sink(topic):
    return WriteKafkaRecords(servers, topic, expansion, config)

  if view.publish == "kept":
    kept = (verdicts
            | "KafkaKeptOnly" >> beam.Filter(lambda v: v.verdict == "kept")
            | "KafkaKeptRecords" >> beam.Map(
                lambda v: (v.doc_id.encode("utf-8"), v.record)))
    _ = kept | "KafkaPublishKept" >> sink(view.output_topic)
    dead = ((keyed["Late"], keyed["Rejected"])
            | "KafkaDeadLetters" >> beam.Flatten())
    _ = dead | "KafkaPublishDeadLetters" >> sink(view.dead_letter_topic)
    return
  everything = tuple(keyed.values()) | "KafkaAllVerdicts" >> beam.Flatten()
  _ = everything | "KafkaPublishVerdicts" >> sink(view.output_topic)


def write_files(verdicts, late, rejected, output: str, window_ms: int,
                stable_input: bool = False):
  """verdicts/, late/, rejected/ (JSON) and deduped/ (the kept records)
  under ``output``, in files per event-time window (``stable_input``: see
  :class:`WriteWindowedLines`)."""
  outputs = {
      VERDICTS_DIR: verdicts | "TimedVerdicts" >> beam.Map(
          lambda v: (v.event_ms, verdict_json(v))),
      LATE_DIR: late | "TimedLate" >> beam.Map(
          lambda v: (v.event_ms, verdict_json(v))),
      REJECTED_DIR: rejected | "TimedRejected" >> beam.Map(
          lambda r, ts=beam.DoFn.TimestampParam: (ts.micros // 1000,
                                                  rejected_json(r))),
      DEDUPED_DIR: (verdicts
                    | "KeptFiles" >> beam.Filter(lambda v: v.verdict == "kept")
                    | "KeptLines" >> beam.Map(
                        lambda v: (v.event_ms, v.record))),
  }
  for name, lines in outputs.items():
    _ = lines | f"Write_{name}" >> WriteWindowedLines(
        os.path.join(output, name), window_ms, stable_input)


def read_pubsub(p, view):
  messages = p | "ReadPubSub" >> beam.io.ReadFromPubSub(
      subscription=view.input_subscription, with_attributes=True,
      timestamp_attribute=view.timestamp_attribute, id_label=view.id_label)
  source = view.input_subscription
  return messages | "MessageRecords" >> beam.Map(
      lambda m: RawRecord(source, 0, f"pubsub:{m.message_id}", m.data)
  ).with_output_types(RawRecord)


def read_files(p, pattern: str, view):
  """Lines of the matching files, stamped with their file's modification
  time; watched for new files when ``--watch_interval`` > 0 (until
  ``--watch_stop_after``)."""
  if view.watch_interval > 0:
    stop = Timestamp.of(time.time() + parse_duration_ms(
        view.watch_stop_after) / 1000)
    matches = p | "WatchFiles" >> fileio.MatchContinuously(
        pattern, interval=view.watch_interval, stop_timestamp=stop)
  else:
    matches = p | "MatchFiles" >> fileio.MatchFiles(pattern)
  return matches | "ReadLines" >> beam.FlatMap(_file_records).with_output_types(
      RawRecord)


def _file_records(metadata):
  """Every line of a file as a :class:`RawRecord`; ids ``path:row`` with the
  row zero-padded, so id order is row order."""
  stamp = Timestamp.of(metadata.last_updated_in_seconds)
  for row, line in iter_lines(metadata.path):
    yield TimestampedValue(
        RawRecord(metadata.path, row, f"{metadata.path}:{row + 1:012d}",
                  line), stamp)


class WriteWindowedLines(beam.PTransform):
  """``(event_ms, bytes line)`` → ``<folder>/part-<window start>-<hash>.jsonl``:
  each bundle writes one file per fixed event-time window of ``window_ms``
  that its lines fall in, its lines sorted and its name a digest of them
  (written under a temporary name, then renamed over any file of that
  name), so a bundle written twice leaves one file.

  Not Beam windows: a windowed file sink groups by window and drops what
  arrives after the window closed, and verdicts decided by timers, or
  documents older than a watched folder's processing-time watermark,
  arrive that late (measured: their files were never finalised). This sink
  never drops a line.

  With ``stable_input`` (a checkpointed Flink job) the writes are exactly
  once: the ParDo requires stable input, so Flink hands it the lines that a
  checkpoint holds only once that checkpoint is complete, in one bundle,
  and after a restore hands the same bundle again; it writes the same
  files. Without it, a retried bundle can write its lines twice (ids tell
  them apart)."""

  def __init__(self, folder: str, window_ms: int, stable_input: bool = False):
    super().__init__()
    self._folder = folder
    self._window_ms = window_ms
    self._stable_input = stable_input

  def expand(self, lines):
    write = _WriteBundleFn(self._folder, self._window_ms)
    if not self._stable_input:
      return lines | "WriteBundles" >> beam.ParDo(write)
    # The shuffle keeps the writes out of the stateful stages: Flink runs a
    # keyed stage's stable input holding the state lock that the SDK
    # worker's state requests wait for (measured: the job hung at its first
    # completed checkpoint).
    return (lines
            | "StableLines" >> beam.Reshuffle()
            | "WriteBundles" >> _StableInputParDo(write))


class _StableInputParDo(beam.ParDo):
  """A ParDo whose runner API form requires stable input (Java's
  ``@RequiresStableInput``; Beam's Python SDK has no way to ask for it)."""

  def to_runner_api_parameter(self, context, **extra_kwargs):
    urn, payload = super().to_runner_api_parameter(context, **extra_kwargs)
    payload.requires_stable_input = True
    context.add_requirement(
        common_urns.requirements.REQUIRES_STABLE_INPUT.urn)
    return urn, payload


class _WriteBundleFn(beam.DoFn):

  def __init__(self, folder: str, window_ms: int):
    self._folder = folder
    self._window_ms = window_ms

  def start_bundle(self):
    self._lines = {}

  def process(self, element):
    event_ms, line = element
    start = event_ms - event_ms % self._window_ms
    self._lines.setdefault(start, []).append(line)

  def finish_bundle(self):
    for start, lines in sorted(self._lines.items()):
      # Outside years 1 to 9999 (a window opening before year 1, a rejected
      # record's source time) there is no RFC 3339 name: the nearest one.
      named = min(max(start, FIRST_EVENT_MS), END_EVENT_MS - 1)
      stamp = Timestamp(micros=named * 1000).to_rfc3339().replace(":", "")
      data = b"".join(line + b"\n" for line in sorted(lines))
      digest = hashlib.sha256(data).hexdigest()[:16]
      final = FileSystems.join(self._folder, f"part-{stamp}-{digest}.jsonl")
      # The temporary name is this attempt's own.
      temp = FileSystems.join(
          self._folder, f".part-{stamp}-{digest}-{uuid.uuid4().hex[:8]}.tmp")
      with FileSystems.create(temp) as f:
        f.write(data)
      FileSystems.rename([temp], [final])
    self._lines = {}


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the streaming job; returns the exit code (0 ok, 2 bad arguments).
  Returns when the input is exhausted (files), the watch stops, or, with
  ``--no_wait_until_finish`` (templates), once the job is submitted; a
  checkpointed Flink job (``--checkpointing_interval``) runs until
  cancelled."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--help" in argv or "-h" in argv:
    # pylint: disable=protected-access
    parser = argparse.ArgumentParser(
        description="Online near-duplicate filtering (see README,"
        " Streaming); also takes Beam's runner options.")
    DedupOptions._add_argparse_args(parser)
    StreamingOptions._add_argparse_args(parser)
    parser.epilog = STREAM_EPILOG
    parser.prog += " --streaming"
    parser.print_help()
    return 0
  try:
    options = PipelineOptions(argv)
    options.view_as(StreamingOptions)
    options.view_as(DedupOptions)
    try:
      extra = checkpointing_flags(options)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    if extra:
      options = PipelineOptions(argv + extra)
  except SystemExit as e:
    return 0 if e.code is None else int(e.code)
  options.view_as(StandardOptions).streaming = True
  kafka = uses_kafka(options)
  if options.view_as(StandardOptions).runner is None:
    options.view_as(StandardOptions).runner = default_runner(options)
    if options.view_as(StandardOptions).runner == "PrismRunner":
      options.view_as(PrismRunnerOptions).prism_location = find_prism()
  if options.view_as(StandardOptions).runner.endswith(_MAYBE_PRISM):
    options.view_as(DebugOptions).add_experiment(PRISM_NO_SPLIT)
  try:
    config = stream_config(options)
    check_io(options)
    # After the flags' own checks: a wrong flag is the first thing to fix.
    if options.view_as(StandardOptions).runner.endswith("FlinkRunner"):
      configure_flink(options, kafka=kafka)
    files = options.view_as(DedupOptions)
    if files.input and not FileSystems.match([files.input])[0].metadata_list \
        and not options.view_as(StreamingOptions).watch_interval:
      raise ValueError(f"No input files match {files.input!r}; check"
                       " --input.")
  except (ConfigError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  with beam.Pipeline(options=options) as p:
    build(p, options, config)
  return 0
