"""Flink session cluster: the cached Flink 1.19.0 as a JobManager and a
TaskManager process of their own, the batch CLI submitted to it
(``--runner FlinkRunner --flink_master localhost:PORT --flink_submit_uber_jar``)
against an EXTERNAL SDK worker pool that the test starts, outputs
byte-identical to FnApiRunner's, the job as Flink's REST API reports it, and
every process stopped by its group.

The submission jar (``scripts/install_flink.sh cluster``) names the job
server's jars by absolute URL, so each job uploads its pipeline, not 152 MB
of jars. The TaskManager has Beam's runner in its lib/ and loads it
parent-first, so that ``--environment_cache_millis`` keeps one SDK worker
per slot for the whole job. The figures printed (``pytest -s``) are those of
``templates/flink/README.md``'s "Session cluster, as tested"."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import zipfile

import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions

from pipeline import cli, engines
from pipeline.options import DedupOptions
from tests import engines as engine_tier
from tests import services
from tests.corpus import tree_bytes

# The engine tests' corpus fixture and job flags, shared so every engine is
# checked on the same job.
from tests.test_engines import SEED_ARGS, corpus  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.engine, pytest.mark.extended]
SLOTS = 2
CLUSTER_SETTINGS = {
    "jobmanager.memory.process.size": "1g",
    "taskmanager.memory.process.size": "2g",
    # Beam's pipelined batch exchanges keep many of the job's 244 tasks'
    # buffers in use at once: with the default 10% (159 MB) it fails with
    # "Insufficient number of network buffers".
    "taskmanager.memory.network.min": "512m",
    "taskmanager.memory.network.max": "512m",
    # The Python workers hold the data, so 20% managed memory (317 MB) leaves
    # the tasks 500 MB of heap.
    "taskmanager.memory.managed.fraction": 0.2,
    # The JobManager loads Beam's runner anew for each job (the submission
    # jar's class loader), so the C2 compiler's work on it is never repaid:
    # C1 alone and the serial collector cut its CPU per 1M-document job from
    # 11.1 to 5 s (bench/flink_cores.py, 2 cores). On the TaskManager C1
    # alone and the parallel collector took 28.8 to 17-19 CPU s and the job
    # from 42.7 to 35-38 s; a long job on many cores may repay C2 there.
    "env.java.opts.jobmanager": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "env.java.opts.taskmanager": "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC",
}
# Beam's runner from the TaskManager's lib/, not the job's jar: only so does
# it keep an SDK environment past its task. The JobManager stays child-first:
# it runs the submission jar's main, which reads the pipeline from that jar.
TASKMANAGER_SETTINGS = {"classloader.resolve-order": "parent-first"}
# Longer than any gap between two tasks of the job.
ENVIRONMENT_CACHE_MS = 60000
START_TIMEOUT_S = 120
JOB_TIMEOUT_S = 240


def _run_cli(*argv):
  """``python -m pipeline ARGV`` and its wall seconds."""
  began = time.monotonic()
  done = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=ROOT,
                        capture_output=True, text=True,
                        timeout=JOB_TIMEOUT_S)
  return done, time.monotonic() - began


def _manifest(path):
  with zipfile.ZipFile(path) as jar:
    text = jar.read("META-INF/MANIFEST.MF").decode("utf-8")
  # Continuation lines start with one space.
  lines = text.replace("\r\n", "\n").replace("\n ", "").splitlines()
  return dict(line.split(": ", 1) for line in lines if line)


def test_submit_jar_names_the_job_servers_jars_by_absolute_url():
  engine_tier.require_flink_cluster()
  fields = _manifest(engines.find_flink_submit_jar())
  assert fields["Main-Class"] == (
      "org.apache.beam.runners.flink.FlinkPipelineRunner")
  paths = [urllib.parse.unquote(urllib.parse.urlparse(url).path)
           for url in fields["Class-Path"].split()]
  jars = os.path.join(os.path.dirname(engines.find_flink_job_server()),
                      "jars")
  assert paths == sorted(os.path.join(jars, n) for n in os.listdir(jars))
  # No "." either: for a remote master Beam stages the job server's
  # Class-Path, and a folder there fails the job.
  server = _manifest(engines.find_flink_job_server())
  assert "." not in server["Class-Path"].split()


def test_uber_jar_submission_gets_the_installed_submit_jar():
  engine_tier.require_flink_cluster()
  opts = DedupOptions(["--input", "x", "--output", "y", "--runner",
                       "FlinkRunner", "--flink_submit_uber_jar"])
  engines.configure_flink(opts)
  flink = opts.view_as(FlinkRunnerOptions)
  assert flink.flink_job_server_jar == engines.find_flink_submit_jar()
  assert flink.flink_version == engines.flink_minor()


def test_uber_jar_without_the_cluster_install_exits_2_naming_the_script(
    monkeypatch, tmp_path, capsys, corpus):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path / "empty"))
  code = cli.main(["--input", corpus, "--output", str(tmp_path / "out"),
                   "--runner", "FlinkRunner", "--flink_submit_uber_jar"])
  assert code == 2
  assert f"{engines.INSTALL_FLINK} cluster" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()


def test_session_cluster_job_is_byte_identical_to_fnapi_and_stops(
    corpus, tmp_path):
  home = engine_tier.require_flink_cluster()
  args = ["--input", corpus, *SEED_ARGS]
  ref, fnapi_s = _run_cli(*args, "--output", str(tmp_path / "ref"),
                          "--runner", "FnApiRunner")
  assert ref.returncode == 0, ref.stderr[-3000:]
  cluster = services.FlinkSessionCluster(
      home, str(tmp_path / "cluster"), SLOTS, CLUSTER_SETTINGS,
      lib_jars=engines.flink_taskmanager_jars(),
      taskmanager_settings=TASKMANAGER_SETTINGS)
  with cluster.start(START_TIMEOUT_S):
    pool = services.worker_pool(ROOT, cluster.log_dir)
    try:
      pool.wait_listening(60)
      submitted = time.time()
      done, flink_s = _run_cli(
          *args, "--output", str(tmp_path / "flink"), "--runner",
          "FlinkRunner", "--flink_master", f"localhost:{cluster.rest_port}",
          "--flink_submit_uber_jar", "--environment_type", "EXTERNAL",
          "--environment_config", f"localhost:{pool.port}",
          "--parallelism", str(SLOTS), "--sdk_worker_parallelism",
          str(SLOTS), "--environment_cache_millis", str(ENVIRONMENT_CACHE_MS))
      assert done.returncode == 0, (done.stderr[-3000:] + cluster.log_tails()
                                    + pool.log_tail())
      jobs = cluster.rest("/jobs/overview")["jobs"]
      job = cluster.rest(f"/jobs/{jobs[0]['jid']}")
      rss = {s.name: services.rss_mib(s.proc.pid)
             for s in (cluster.jobmanager, cluster.taskmanager)}
      workers = pool.log_tail(chars=10**8).count("started SDK worker")
    finally:
      pool.stop()
  left = {s.name: services.wait_group_gone(s.proc.pid)
          for s in (cluster.jobmanager, cluster.taskmanager, pool)}
  assert left == {"jobmanager": [], "taskmanager": [], "sdk-worker-pool": []}
  assert [j["state"] for j in jobs] == ["FINISHED"]
  assert job["jid"] == jobs[0]["jid"] and job["state"] == "FINISHED"
  assert job["vertices"]
  assert {v["parallelism"] for v in job["vertices"]} == {SLOTS}
  assert {v["status"] for v in job["vertices"]} == {"FINISHED"}
  # One worker per slot, each kept for the whole job.
  assert workers == SLOTS
  ours, theirs = tree_bytes(str(tmp_path / "flink")), tree_bytes(
      str(tmp_path / "ref"))
  assert sorted(ours) == sorted(theirs)
  assert [n for n in theirs if ours[n] != theirs[n]] == []
  assert any(name.startswith("clusters") for name in ours)
  print(f"\nsession cluster: start-up {cluster.startup_s:.1f} s; CLI to job"
        f" start {job['start-time'] / 1000 - submitted:.1f} s; job"
        f" {job['duration'] / 1000:.1f} s ({len(job['vertices'])} vertices,"
        f" {workers} SDK workers); job end to CLI exit"
        f" {submitted + flink_s - job['end-time'] / 1000:.1f} s; CLI"
        f" {flink_s:.1f} s (FnApiRunner {fnapi_s:.1f} s); RSS JobManager"
        f" {rss['jobmanager']:.0f} MiB, TaskManager"
        f" {rss['taskmanager']:.0f} MiB")


def test_flink_cores_bench_compares_both_runners_and_stops_its_cluster(
    tmp_path):
  """bench/flink_cores.py at a tiny size: both runners run on the same
  corpus, the outputs compare identical, the ratio is Flink's wall over
  FnApiRunner's, and no process of its cluster or worker pool is left."""
  engine_tier.require_flink_cluster()
  work = tmp_path / "work"
  out = tmp_path / "results.json"
  done = subprocess.run(
      [sys.executable, "bench/flink_cores.py", "--docs", "3000", "--files",
       "2", "--runs", "1", "--warmup-docs", "0", "--work", str(work),
       "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
      timeout=JOB_TIMEOUT_S + START_TIMEOUT_S)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(out.read_text())
  [run] = results["runs"]
  assert run["identical_outputs"] is True
  assert run["flink"]["state"] == "FINISHED"
  assert run["flink"]["vertices"] > 0 and run["flink"]["cpu_s"]["jobmanager"] > 0
  assert run["ratio"] == round(run["flink"]["wall_s"] / run["fnapi"]["wall_s"],
                               3)
  assert results["must"] == (results["ratio"] <= 1.0)
  assert "target must (<= 1.0x)" in done.stdout
  # Every process it started (JVMs, pool, SDK workers) logged under --work.
  left = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.readlink(f"/proc/{pid}/fd/1").startswith(str(work)):
        left.append(pid)
    except OSError:
      pass
  assert left == []
