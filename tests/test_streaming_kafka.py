"""The streaming job with Kafka in and out (issue 29): flags checked before
the job starts, the record mapping, and end to end against a real broker on
embedded Flink and on a Flink session cluster.

The end-to-end test starts the broker with ``scripts/kafka.sh`` (its own
ports and state folder) and the job as ``python -m pipeline --streaming``
in its own process group; both are stopped by pid, also when the test
fails. Every record is produced with the same CreateTime, 30 s ahead, so
that ``event_time`` mode decides them in (event time, id) order, as the
BundleBasedDirectRunner does over the same documents in a file: the two
runs' verdicts must be equal, one per document, and the malformed record
comes back rejected. A second job on the same topic publishes the kept
documents' records (``--publish kept``) with the rejection on the dead-letter
topic.
"""

import collections
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions

from pipeline import engines, streaming
from tests import engines as engine_tier
from tests import services
from tests.corpus import seed_corpus
from tests.stream_harness import read_rows
from tests.test_flink_cluster import (CLUSTER_SETTINGS, ENVIRONMENT_CACHE_MS,
                                      SLOTS, START_TIMEOUT_S,
                                      TASKMANAGER_SETTINGS)
from transforms.stream.kafka import (check_topic, consumer_config,
                                     kafka_record, parse_config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KAFKA_SCRIPT = os.path.join(ROOT, "scripts", "kafka.sh")
STREAM_ARGS = ["--mode", "event_time", "--settle", "1s", "--ngram", "3",
               "--bands", "32", "--rows", "4", "--threshold", "0.4",
               "--verify", "signature"]
# The records' CreateTime is this far ahead of the time they are produced,
# so the job (started after) never sees them behind its watermark.
AHEAD_S = 30
RESULT_TIMEOUT_S = 240


def _main(argv):
  return streaming.main(["--streaming", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--input_topic", "docs", "--output", "out", "--runner",
      "BundleBasedDirectRunner"], "Kafka I/O on BundleBasedDirectRunner"),
    (["--input_topic", "a/b", "--output", "out"], "not a Kafka topic name"),
    (["--input", "x.jsonl", "--output_topic", "bad topic"],
     "not a Kafka topic name"),
    (["--input", "x.jsonl", "--output", "out", "--consumer_config", "a=b"],
     "--consumer_config: Kafka flags"),
    (["--input_topic", "docs", "--output", "out", "--consumer_config", "ab"],
     "give key=value"),
    (["--input_topic", "docs", "--output", "out", "--timestamp_attribute",
      "ts"], "--timestamp_attribute: Pub/Sub flags"),
    (["--input_topic", "docs", "--input", "x.jsonl", "--output", "out"],
     "give exactly one of --input"),
    (["--input_topic", "docs", "--output_topic", "verdicts", "--publish",
      "kept"], "--publish kept needs --dead_letter_topic"),
])
def test_kafka_flags_are_checked_before_the_job(argv, message, capsys):
  assert _main(argv) == 2
  assert message in capsys.readouterr().err


def test_kafka_on_flink_without_the_jars_names_the_script(
    monkeypatch, tmp_path, capsys):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path))
  assert _main(["--input_topic", "docs", "--output", str(tmp_path / "o"),
                "--runner", "FlinkRunner"]) == 2
  assert "scripts/install_flink.sh kafka" in capsys.readouterr().err


def _fake_kafka_cache(cache):
  """Empty jars where ``scripts/install_flink.sh kafka`` puts them, the Kafka
  job server's with a Class-Path of two job-server jars and two extras."""
  for path in (engines.kafka_expansion_jar_path(),
               engines.kafka_submit_jar_path()):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
  with zipfile.ZipFile(engines.kafka_job_server_path(), "w") as jar:
    jar.writestr("META-INF/MANIFEST.MF", (
        "Manifest-Version: 1.0\r\nClass-Path: ../server/jars/a.jar ../serv\r\n"
        " er/jars/b.jar jars/kafka-clients-3.9.1.jar jars/jamm-0.4.0.jar\r\n"
        "\r\n"))


def test_kafka_on_flink_picks_the_kafka_jars(monkeypatch, tmp_path):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path))
  _fake_kafka_cache(tmp_path)
  assert engines.kafka_taskmanager_jars() == [
      os.path.join(engines.kafka_io_path(), "jars", name)
      for name in ("kafka-clients-3.9.1.jar", "jamm-0.4.0.jar")]
  for extra, jar in (([], engines.kafka_job_server_path()),
                     (["--flink_submit_uber_jar"],
                      engines.kafka_submit_jar_path())):
    opts = streaming.PipelineOptions(["--runner", "FlinkRunner", *extra])
    engines.configure_flink(opts, kafka=True)
    assert opts.view_as(FlinkRunnerOptions).flink_job_server_jar == jar


def test_pubsub_paths_stay_pubsub():
  options = streaming.PipelineOptions([
      "--input_subscription", "projects/p/subscriptions/s",
      "--output_topic", "projects/p/topics/t"])
  assert not streaming.uses_kafka(options)
  options = streaming.PipelineOptions(["--input", "x", "--output_topic", "t"])
  assert streaming.uses_kafka(options)
  assert streaming.bootstrap_servers(options) == "localhost:9092"


def test_topic_names_and_configs():
  for name in ("docs", "a.b_c-1", "x" * 249):
    check_topic(name, "--input_topic")
  for name in ("", ".", "..", "x" * 250, "projects/p/topics/t", "é"):
    with pytest.raises(ValueError, match="not a Kafka topic name"):
      check_topic(name, "--input_topic")
  assert parse_config(["a=1", "b = x=y"], "--f") == {"a": "1", "b": " x=y"}
  assert parse_config(None, "--f") == {}
  with pytest.raises(ValueError, match="--f '=1'"):
    parse_config(["=1"], "--f")
  assert consumer_config("h:1", {"auto.offset.reset": "latest"}) == {
      "bootstrap.servers": "h:1", "auto.offset.reset": "latest"}


def test_kafka_record_ids_are_stable_and_null_values_are_empty():
  row = SimpleNamespace(topic="docs", partition=1, offset=42, value=b'{"a":1}')
  record = kafka_record(row)
  assert record == ("kafka:docs/1/42", 42, "kafka:docs/1/42", b'{"a":1}')
  assert kafka_record(SimpleNamespace(topic="d", partition=0, offset=0,
                                      value=None)).data == b""


def test_help_says_where_streaming_and_runner_flags_are(capsys):
  from pipeline import cli  # pylint: disable=import-outside-toplevel
  assert cli.main(["--help"]) == 0
  batch = capsys.readouterr().out
  assert "--streaming --help" in batch and "--runner" in batch
  assert "--flink_master" in batch and "--parallelism" in batch
  assert _main(["--help"]) == 0
  stream = capsys.readouterr().out
  assert "--input_topic" in stream and "--bootstrap_servers" in stream
  assert "--runner" in stream and "usage: " in stream


# --- end to end on embedded Flink -------------------------------------------


def _require_kafka():
  if engines.find_flink_job_server() is None:
    pytest.skip(engines.missing_flink_reason())
  reason = engines.missing_kafka_reason()
  if reason:
    pytest.skip(reason)
  if not os.path.isdir(engines.kafka_broker_jars()):
    pytest.skip(f"the Kafka broker's jars are not at"
                f" {engines.kafka_broker_jars()}; run"
                " scripts/install_flink.sh kafka")
  pytest.importorskip("kafka", reason="kafka-python is not installed")


@pytest.fixture(name="broker")
def fixture_broker(tmp_path):
  """``host:port`` of a broker that ``scripts/kafka.sh`` started (and
  stops)."""
  _require_kafka()
  port, controller, expansion = services.free_ports(3)
  env = dict(os.environ, KAFKA_STATE=str(tmp_path / "kafka"),
             KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(controller),
             EXPANSION_PORT=str(expansion))
  pids = []
  try:
    started = subprocess.run(["bash", KAFKA_SCRIPT, "start"], env=env,
                             capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"bootstrap_servers=127.0.0.1:{port}" in started.stdout
    pids = [int((tmp_path / "kafka" / f"{name}.pid").read_text())
            for name in ("broker", "expansion")]
    yield f"127.0.0.1:{port}"
  finally:
    stopped = subprocess.run(["bash", KAFKA_SCRIPT, "stop"], env=env,
                             capture_output=True, text=True, timeout=60)
  assert stopped.returncode == 0, stopped.stderr
  for pid in pids:
    assert not services.wait_group_gone(pid), f"group {pid} outlived stop"


def _documents():
  texts, _ = seed_corpus(n_base=60, edit_frac=0.02, seed=11)
  return [{"id": f"d{i:04d}", "text": t} for i, t in enumerate(texts)]


def _produce(servers, topic, rows, stamp_ms):
  # pylint: disable=import-outside-toplevel
  from kafka import KafkaProducer
  from kafka.admin import KafkaAdminClient, NewTopic
  admin = KafkaAdminClient(bootstrap_servers=servers)
  admin.create_topics([NewTopic(name, 2, 1) for name in (
      topic, "verdicts", "kept", "dead")])
  admin.close()
  producer = KafkaProducer(bootstrap_servers=servers)
  for row in rows:
    producer.send(topic, key=row["id"].encode(),
                  value=json.dumps(row).encode(), timestamp_ms=stamp_ms)
  producer.send(topic, value=b"{not json", timestamp_ms=stamp_ms)
  producer.flush()
  producer.close()


def _consume_until(servers, topic, count, alive, hold_s=3.0):
  """Records of ``topic`` until ``count`` came (then ``hold_s`` more, so
  that an extra copy would show); raises if the job exits or the time is
  up."""
  from kafka import KafkaConsumer  # pylint: disable=import-outside-toplevel
  consumer = KafkaConsumer(topic, bootstrap_servers=servers,
                           auto_offset_reset="earliest",
                           consumer_timeout_ms=500)
  got, deadline, full_at = [], time.monotonic() + RESULT_TIMEOUT_S, None
  try:
    while True:
      got += list(consumer)
      if len(got) >= count:
        full_at = full_at or time.monotonic()
        if time.monotonic() - full_at >= hold_s:
          return got
      elif not alive():
        raise AssertionError(f"the job exited with {len(got)} of {count}"
                             f" records on {topic}")
      elif time.monotonic() > deadline:
        raise TimeoutError(f"{len(got)} of {count} records on {topic} after"
                           f" {RESULT_TIMEOUT_S}s")
  finally:
    consumer.close()


EMBEDDED = ("--flink_master", "[local]", "--environment_type", "LOOPBACK")


def _run_job(servers, log_path, *extra, runner=EMBEDDED):
  """The streaming CLI on Flink (``runner``'s flags; embedded by default)
  as a process group of its own."""
  with open(log_path, "wb") as log:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--streaming", "--input_topic",
         "docs", "--bootstrap_servers", servers, *runner, *STREAM_ARGS,
         *extra],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)


def _stop(job):
  if job.poll() is None:
    os.killpg(job.pid, signal.SIGTERM)
    try:
      job.wait(timeout=30)
    except subprocess.TimeoutExpired:
      os.killpg(job.pid, signal.SIGKILL)
      job.wait(timeout=30)
  left = services.wait_group_gone(job.pid, 30)
  if left:
    os.killpg(job.pid, signal.SIGKILL)
  assert not left, f"the job's processes {left} outlived it"


def _check_verdicts(records, rows, stamp_ms, tmp_path):
  """Asserts that ``records`` (the output topic's) hold one verdict per
  document of ``rows``, keyed by its id, equal to the BundleBasedDirectRunner's
  over the same documents in a file, and the malformed record rejected.
  Returns the rejected verdict and the direct run's verdicts by id."""
  out = [json.loads(r.value) for r in records]
  rejected = [o for o in out if o["verdict"] == "rejected"]
  assert len(rejected) == 1
  assert rejected[0]["reason"].startswith("malformed_json")
  assert rejected[0]["source"].startswith("kafka:docs/")
  verdicts = [o for o in out if o["verdict"] != "rejected"]
  assert collections.Counter(o["id"] for o in verdicts) == {
      r["id"]: 1 for r in rows}
  assert all(r.key == o["id"].encode() for r, o in zip(records, out)
             if o["verdict"] != "rejected")
  with open(tmp_path / "all.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(dict(r, ts=stamp_ms // 1000)) + "\n" for r in rows)
  direct = subprocess.run(
      [sys.executable, "-m", "pipeline", "--streaming", "--input",
       str(tmp_path / "all.jsonl"), "--event_time_field", "ts", *STREAM_ARGS,
       "--output", str(tmp_path / "direct")], cwd=ROOT, capture_output=True,
      text=True, timeout=600)
  assert direct.returncode == 0, direct.stderr[-3000:]
  expected = {r["id"]: r for r in read_rows(tmp_path / "direct" / "verdicts")}
  assert {o["id"]: o for o in verdicts} == expected
  return rejected[0], expected


def _log_tail(path):
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()[-4000:]


@pytest.mark.extended
@pytest.mark.engine
def test_kafka_in_and_out_on_flink_gives_the_file_runs_verdicts(
    broker, tmp_path):
  rows = _documents()
  stamp_ms = (int(time.time()) + AHEAD_S) * 1000
  _produce(broker, "docs", rows, stamp_ms)
  job = _run_job(broker, tmp_path / "verdicts.log", "--output_topic",
                 "verdicts")
  try:
    records = _consume_until(broker, "verdicts", len(rows) + 1,
                             lambda: job.poll() is None)
  except BaseException:
    print(_log_tail(tmp_path / "verdicts.log"))
    raise
  finally:
    _stop(job)
  rejected, expected = _check_verdicts(records, rows, stamp_ms, tmp_path)
  kept = {i for i, o in expected.items() if o["verdict"] == "kept"}
  assert 0 < len(kept) < len(rows)

  job = _run_job(broker, tmp_path / "kept.log", "--output_topic", "kept",
                 "--publish", "kept", "--dead_letter_topic", "dead",
                 "--consumer_config", "group.id=kept-run")
  try:
    alive = lambda: job.poll() is None  # pylint: disable=unnecessary-lambda-assignment
    kept_records = _consume_until(broker, "kept", len(kept), alive)
    dead = _consume_until(broker, "dead", 1, alive, hold_s=0)
  except BaseException:
    print(_log_tail(tmp_path / "kept.log"))
    raise
  finally:
    _stop(job)
  by_id = {r["id"]: json.dumps(r).encode() for r in rows}
  assert sorted((r.key.decode(), r.value) for r in kept_records) == sorted(
      (i, by_id[i]) for i in kept)
  assert [json.loads(r.value)["source"] for r in dead] == [rejected["source"]]


# --- on the session cluster -------------------------------------------------


@pytest.mark.extended
@pytest.mark.engine
def test_kafka_on_the_session_cluster_gives_the_file_runs_verdicts(
    broker, tmp_path):
  """The same job submitted to a Flink session cluster (a JobManager and a
  TaskManager process, 2 slots, EXTERNAL SDK workers at parallelism 2) with
  ``--flink_submit_uber_jar``: the Kafka submission jar, and KafkaIO's jars
  in the TaskManager's lib/, where Flink runs the read and the write."""
  home = engine_tier.require_flink_cluster()
  rows = _documents()
  stamp_ms = (int(time.time()) + AHEAD_S) * 1000
  _produce(broker, "docs", rows, stamp_ms)
  cluster = services.FlinkSessionCluster(
      home, str(tmp_path / "cluster"), SLOTS, CLUSTER_SETTINGS,
      lib_jars=[*engines.flink_taskmanager_jars(),
                *engines.kafka_taskmanager_jars()],
      taskmanager_settings=TASKMANAGER_SETTINGS)
  log = tmp_path / "cluster-job.log"
  with cluster.start(START_TIMEOUT_S):
    pool = services.worker_pool(ROOT, cluster.log_dir)
    job = None
    try:
      pool.wait_listening(60)
      job = _run_job(broker, log, "--output_topic", "verdicts", runner=(
          "--runner", "FlinkRunner", "--flink_master",
          f"localhost:{cluster.rest_port}", "--flink_submit_uber_jar",
          "--environment_type", "EXTERNAL", "--environment_config",
          f"localhost:{pool.port}", "--parallelism", str(SLOTS),
          "--sdk_worker_parallelism", str(SLOTS),
          "--environment_cache_millis", str(ENVIRONMENT_CACHE_MS)))
      records = _consume_until(broker, "verdicts", len(rows) + 1,
                               lambda: job.poll() is None)
      jobs = cluster.rest("/jobs/overview")["jobs"]
      for running in jobs:
        cluster.cancel_job(running["jid"])
    except BaseException:
      print(_log_tail(log) + cluster.log_tails() + pool.log_tail())
      raise
    finally:
      if job is not None:
        _stop(job)
      pool.stop()
  left = {s.name: services.wait_group_gone(s.proc.pid)
          for s in (*cluster.all_taskmanagers, cluster.jobmanager, pool)}
  assert all(pids == [] for pids in left.values()), left
  assert [(j["state"], j["tasks"]["total"] > 0) for j in jobs] == [
      ("RUNNING", True)]
  _check_verdicts(records, rows, stamp_ms, tmp_path)
