"""Checkpointed streaming on the Flink session cluster through a TaskManager
kill (issue 28, item 6): ``python -m pipeline --streaming`` watching a
folder (``--watch_interval``) with ``--checkpointing_interval``, EXTERNAL SDK
workers at parallelism 2, files added while the job runs; once verdicts are
being written the TaskManager's process group is SIGKILLed and a new
TaskManager joins (the cluster's fixed-delay restart strategy of
``tests/test_flink_faults.py``). After the job has recovered from its last
checkpoint, every document has exactly one verdict line (none lost, none
written twice by the replay), and the verdicts are the
BundleBasedDirectRunner's over the same documents in one file: each file's
documents carry event times just ahead of the folder's watermark (as a live
feed's do), so ``event_time`` mode decides every bucket in (event time, id)
order, however the restore's replay reorders the lines.

A checkpointed Flink job runs until cancelled: the test cancels it through
Flink's REST API and stops every process it started by its group, also when
it fails. The figures printed (``pytest -s``) are those of
``templates/flink/README.md``."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipeline import engines
from tests import engines as engine_tier
from tests import services
from tests.corpus import seed_corpus
from tests.stream_harness import read_rows, wait_for_rows
from tests.test_flink_cluster import (CLUSTER_SETTINGS, SLOTS,
                                      START_TIMEOUT_S, TASKMANAGER_SETTINGS)
from tests.test_flink_faults import (FAULT_ENVIRONMENT_CACHE_MS,
                                     RESTART_SETTINGS)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.engine, pytest.mark.extended, pytest.mark.slow]
CHECKPOINT_MS = 2000
DOCS_PER_FILE = 40
# Seconds between two new files in the watched folder.
FILE_EVERY_S = 1.0
# The kill comes once this share of the documents has its verdict.
KILL_AT = 0.3
STREAM_ARGS = ["--event_time_field", "ts", "--settle", "1s",
               "--output_window", "1m"]
# A file's documents are stamped this many seconds after it is written: the
# watched folder's watermark is the time of the poll that matches the file
# (at most --watch_interval later), so they are never behind it. Documents
# further behind the watermark than --settle are decided in arrival order
# (the README's Modes table), which a restore's replay changes (measured
# with event times 30 s behind: 2 of 5 runs kept both copies of a pair).
AHEAD_S = 2
JOB_TIMEOUT_S = 240


def _checkpoint_settings(work_dir):
  """Checkpoints in files under ``work_dir``: the JobManager's memory
  storage takes at most 5 MB of state per task (measured: 1,000 documents'
  buckets were 10 MB, every checkpoint failed and the job restarted until
  the restart strategy gave up)."""
  return {"state.checkpoint-storage": "filesystem",
          "state.checkpoints.dir": f"file://{work_dir}/checkpoints"}


def _documents():
  """(file name, rows) of the watched folder: seed-style documents with
  planted near-duplicate pairs, ``DOCS_PER_FILE`` a file (event times are
  given when a file is written)."""
  texts, _ = seed_corpus(n_base=300, edit_frac=0.02, seed=5)
  rows = [{"id": f"d{i:04d}", "text": t} for i, t in enumerate(texts)]
  return [(f"part-{k:03d}.jsonl", rows[k:k + DOCS_PER_FILE])
          for k in range(0, len(rows), DOCS_PER_FILE)]


def _write(path, rows):
  """Writes ``rows`` as JSONL under a hidden name, then renames it into
  place (so a poll never matches a half-written file)."""
  temp = os.path.join(os.path.dirname(path), "." + os.path.basename(path))
  with open(temp, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  os.rename(temp, path)


def _pairs(rows):
  """The unordered duplicate pairs and the ids of ``rows`` (verdicts):
  which copy of a pair is kept depends on arrival order, the pair does
  not."""
  return ({frozenset((r["id"], r["duplicate_of"])) for r in rows
           if r["verdict"] == "duplicate"}, sorted(r["id"] for r in rows))


def _direct_verdicts(folder, rows):
  """The BundleBasedDirectRunner's verdicts for ``rows`` in one file."""
  _write(str(folder / "all.jsonl"), rows)
  done = subprocess.run(
      [sys.executable, "-m", "pipeline", "--streaming", "--input",
       str(folder / "all.jsonl"), *STREAM_ARGS, "--output",
       str(folder / "direct")], cwd=ROOT, capture_output=True, text=True,
      timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return read_rows(folder / "direct" / "verdicts")


def _verdicts(rows):
  """id -> (verdict, duplicate_of) of verdict rows."""
  return {r["id"]: (r["verdict"], r.get("duplicate_of")) for r in rows}


def _running_job(cluster, cli, timeout_s):
  """The job's id once Flink runs all its tasks; raises if the CLI exits
  first."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if cli.poll() is not None:
      raise AssertionError(f"CLI exited with {cli.returncode}")
    for job in cluster.rest("/jobs/overview")["jobs"]:
      tasks = job["tasks"]
      if job["state"] == "RUNNING" and tasks["running"] == tasks["total"]:
        return job["jid"]
    time.sleep(0.2)
  raise TimeoutError(f"no running job after {timeout_s}s")


def test_taskmanager_killed_mid_stream_leaves_one_verdict_per_document(
    tmp_path):
  home = engine_tier.require_flink_cluster()
  files = _documents()
  n_docs = sum(len(rows) for _, rows in files)
  written = []
  inbox, out = tmp_path / "in", tmp_path / "out"
  inbox.mkdir()
  cluster = services.FlinkSessionCluster(
      home, str(tmp_path / "cluster"), SLOTS,
      {**CLUSTER_SETTINGS, **RESTART_SETTINGS,
       **_checkpoint_settings(str(tmp_path))},
      lib_jars=engines.flink_taskmanager_jars(),
      taskmanager_settings=TASKMANAGER_SETTINGS)
  figures = {}
  stop_writing = threading.Event()

  def add_files():
    for name, rows in files:
      if stop_writing.wait(FILE_EVERY_S):
        return
      stamped = [dict(r, ts=int(time.time()) + AHEAD_S) for r in rows]
      _write(str(inbox / name), stamped)
      written.extend(stamped)

  writer = threading.Thread(target=add_files)
  began = time.monotonic()
  with cluster.start(START_TIMEOUT_S):
    figures["cluster_start_s"] = time.monotonic() - began
    pool = services.worker_pool(ROOT, cluster.log_dir)
    cli = None
    try:
      pool.wait_listening(60)
      cli_log = open(os.path.join(cluster.log_dir, "cli.log"), "wb")
      began = time.monotonic()
      cli = subprocess.Popen(
          [sys.executable, "-m", "pipeline", "--streaming", "--input",
           str(inbox / "*.jsonl"), "--watch_interval", "1",
           "--watch_stop_after", "30m", *STREAM_ARGS, "--output", str(out),
           "--runner", "FlinkRunner", "--flink_master",
           f"localhost:{cluster.rest_port}", "--flink_submit_uber_jar",
           "--environment_type", "EXTERNAL", "--environment_config",
           f"localhost:{pool.port}", "--parallelism", str(SLOTS),
           "--sdk_worker_parallelism", str(SLOTS),
           "--environment_cache_millis", str(FAULT_ENVIRONMENT_CACHE_MS),
           "--checkpointing_interval", str(CHECKPOINT_MS)],
          cwd=ROOT, stdin=subprocess.DEVNULL, stdout=cli_log,
          stderr=subprocess.STDOUT, start_new_session=True)
      jid = _running_job(cluster, cli, JOB_TIMEOUT_S)
      figures["job_running_s"] = time.monotonic() - began
      writer.start()
      alive = lambda: cli.poll() is None  # pylint: disable=unnecessary-lambda-assignment
      figures["first_verdicts_s"] = figures["job_running_s"] + wait_for_rows(
          out / "verdicts", int(n_docs * KILL_AT), JOB_TIMEOUT_S, alive)
      figures["before_kill"] = len(read_rows(out / "verdicts"))
      killed_at = time.monotonic()
      figures["killed_pid"] = cluster.taskmanager.proc.pid
      cluster.kill_taskmanager()
      cluster.start_taskmanager(START_TIMEOUT_S)
      figures["new_taskmanager_s"] = time.monotonic() - killed_at
      _running_job(cluster, cli, JOB_TIMEOUT_S)
      figures["recovered_s"] = time.monotonic() - killed_at
      figures["all_verdicts_s"] = time.monotonic() - killed_at + (
          wait_for_rows(out / "verdicts", n_docs, JOB_TIMEOUT_S, alive,
                        hold_s=3 * CHECKPOINT_MS / 1000))
      job = cluster.rest(f"/jobs/{jid}")
      checkpoints = cluster.rest(f"/jobs/{jid}/checkpoints")
      cluster.cancel_job(jid)
    except BaseException:
      print(cluster.log_tails() + pool.log_tail())
      raise
    finally:
      stop_writing.set()
      if writer.is_alive():
        writer.join()
      if cli is not None:
        if cli.poll() is None:
          os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()
        cli_log.close()
      pool.stop()
  left = {s.name: services.wait_group_gone(s.proc.pid)
          for s in (*cluster.all_taskmanagers, cluster.jobmanager, pool)}
  left["cli"] = services.wait_group_gone(cli.pid)
  assert all(pids == [] for pids in left.values()), left
  rows = read_rows(out / "verdicts")
  ids = [r["id"] for r in rows]
  assert len(ids) == len(set(ids)) == n_docs
  assert len(written) == n_docs
  direct = _direct_verdicts(tmp_path, written)
  ours, theirs = _pairs(rows)[0], _pairs(direct)[0]
  figures["missed_pairs"] = sorted(map(sorted, theirs - ours))
  figures["extra_pairs"] = sorted(map(sorted, ours - theirs))
  # The same verdict for every document, the same copy of each pair kept.
  assert _verdicts(rows) == _verdicts(direct), figures
  assert not read_rows(out / "late") and not read_rows(out / "rejected")
  kept = sorted(r["id"] for r in rows if r["verdict"] == "kept")
  assert sorted(r["id"] for r in read_rows(out / "deduped")) == kept
  # The job restarted from a checkpoint (not from scratch).
  assert checkpoints["counts"]["restored"] >= 1, checkpoints["counts"]
  assert checkpoints["latest"]["restored"] is not None
  print(f"\nstreaming TaskManager SIGKILL: {n_docs} docs in {len(files)}"
        f" files, one every {FILE_EVERY_S} s; checkpoint every"
        f" {CHECKPOINT_MS} ms; cluster start {figures['cluster_start_s']:.1f}"
        f" s; CLI to job running {figures['job_running_s']:.1f} s;"
        f" {figures['before_kill']} verdicts at the kill"
        f" ({figures['first_verdicts_s']:.1f} s); new TaskManager"
        f" {figures['new_taskmanager_s']:.1f} s, job running again"
        f" {figures['recovered_s']:.1f} s, every verdict"
        f" {figures['all_verdicts_s']:.1f} s after the kill; restored from"
        f" checkpoint {checkpoints['latest']['restored']['id']};"
        f" checkpoints completed {checkpoints['counts']['completed']};"
        f" job {job['duration'] / 1000:.1f} s; duplicate pairs"
        f" {len(ours)}, the direct runner's {len(theirs)}")
