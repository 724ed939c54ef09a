"""Both cores (issue 28, item 5): the batch job on a Flink session cluster
with 2 slots and 2 Python SDK workers against FnApiRunner on one core, in
one run, on the same seed-style corpus.

``python bench/flink_cores.py --docs 1000000`` writes the corpus as
``--files`` JSONL files (the stages keyed by input file run one file per
worker), runs ``python -m pipeline`` on FnApiRunner pinned to one CPU, then
starts Flink 1.19.0 (``scripts/install_flink.sh cluster``: a JobManager and
a TaskManager process, the TaskManager with 2 slots) and an SDK worker pool,
submits the same job with ``--flink_submit_uber_jar --environment_type
EXTERNAL --parallelism 2 --sdk_worker_parallelism 2``, and stops every
process it started. ``--runs N`` alternates the two N times on one cluster,
after a warm-up job of ``--warmup-docs`` documents on it (a session cluster
that has run a job before: the first job's JVM work was nearly twice the
second's, TaskManager 70.6 against 37.4 CPU seconds at 1M), whose figures are
reported too.

``--flink-setting KEY=VALUE`` changes the cluster's configuration (its JVM
flags are the cluster tests' ``CLUSTER_SETTINGS``; ``--flink-setting
env.java.opts.jobmanager=`` measures Flink's defaults), ``--flink-option``
adds a pipeline option to the Flink job.

It prints, and writes to ``--out`` as JSON, each run's CLI wall, the ratio
Flink ÷ FnApiRunner against the issue's targets (must <= 1.0, aim <= 0.6),
Flink's own job time and vertex count, the CPU seconds of each JVM and of
the SDK workers, peak RSS, where the Flink job's time went (its longest
vertices, and every vertex's start and end from the job's start:
``timeline``), and whether the two output trees are byte-identical (timing
fields aside).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# pylint: disable=wrong-import-position
from bench import corpora
from bench.measure import TreeRssSampler
from pipeline import engines
from tests import services
from tests.corpus import tree_bytes, write_jsonl
from tests.test_flink_cluster import CLUSTER_SETTINGS, TASKMANAGER_SETTINGS

SLOTS = 2
JOB_ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold",
            "0.4"]
# 1M documents need more than the 2 GB TaskManager of the cluster test: with
# it the job failed with "OutOfMemoryError: Direct buffer memory" (the gRPC
# data plane's buffers).
MEMORY_SETTINGS = {
    "taskmanager.memory.process.size": "6g",
    "taskmanager.memory.task.off-heap.size": "1536m",
    "taskmanager.memory.framework.off-heap.size": "512m",
}
ENVIRONMENT_CACHE_MS = 60000
MUST, AIM = 1.0, 0.6


def cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process ``pid`` so far."""
  with open(f"/proc/{pid}/stat", encoding="ascii") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
  """CPU seconds of the live processes of group ``pgid`` (the worker pool
  and the SDK workers it started)."""
  total = 0.0
  for pid in services.group_members(pgid):
    try:
      total += cpu_seconds(pid)
    except OSError:
      pass
  return total


def write_corpus(folder: str, docs: int, files: int, seed: int) -> str:
  """``docs`` seed-style documents as ``files`` JSONL files; their glob."""
  texts = corpora.seed_style(docs, seed=seed).texts
  for k in range(files):
    lo, hi = k * len(texts) // files, (k + 1) * len(texts) // files
    write_jsonl(os.path.join(folder, f"part-{k:03d}.jsonl"), texts[lo:hi],
                [f"doc-{i}" for i in range(lo, hi)])
  return os.path.join(folder, "part-*.jsonl")


def run_cli(argv: List[str], pinned_cpu: Optional[int] = None) -> dict:
  """``python -m pipeline ARGV``: its wall seconds and the peak RSS of its
  process tree (pinned to CPU ``pinned_cpu`` if given)."""
  began = time.monotonic()
  proc = subprocess.Popen(
      [sys.executable, "-m", "pipeline", *argv], cwd=ROOT,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=(lambda: os.sched_setaffinity(0, {pinned_cpu}))
      if pinned_cpu is not None else None)
  sampler = TreeRssSampler(proc.pid, interval_s=0.2)
  _, err = proc.communicate()
  wall = time.monotonic() - began
  sampler.stop()
  if proc.returncode != 0:
    raise RuntimeError(f"pipeline exited {proc.returncode}:\n{err[-4000:]}")
  return {"wall_s": round(wall, 2), "peak_rss_mb": sampler.peak_mb}


def flink_job(cluster: services.FlinkSessionCluster) -> dict:
  """The newest job on ``cluster``: duration, vertex count, whether Flink
  reused objects between chained operators (what ``--object_reuse`` asks
  for) and the vertices that ran longest."""
  jobs = sorted(cluster.rest("/jobs/overview")["jobs"],
                key=lambda j: j["start-time"])
  job = cluster.rest(f"/jobs/{jobs[-1]['jid']}")
  config = cluster.rest(f"/jobs/{jobs[-1]['jid']}/config")
  vertices = sorted(job["vertices"], key=lambda v: -v["duration"])
  began = job["start-time"]
  return {"state": job["state"], "job_s": job["duration"] / 1000,
          "object_reuse": config["execution-config"]["object-reuse-mode"],
          "vertices": len(job["vertices"]),
          "start_time": job["start-time"] / 1000,
          "end_time": job["end-time"] / 1000,
          "longest_vertices": [
              {"name": v["name"][:120], "seconds": v["duration"] / 1000,
               "read_mb": round(v["metrics"]["read-bytes"] / 1e6, 1)}
              for v in vertices[:8]],
          # Every vertex's span from the job's start: which ran together,
          # and how long the job waited on one vertex alone.
          "timeline": [
              {"name": v["name"][:160], "start_s": (v["start-time"] - began)
               / 1000, "end_s": (v["end-time"] - began) / 1000,
               "read_mb": round(v["metrics"]["read-bytes"] / 1e6, 1),
               "read_records": v["metrics"]["read-records"]}
              for v in sorted(job["vertices"],
                              key=lambda v: v["start-time"])]}


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--docs", type=int, default=1_000_000)
  parser.add_argument("--files", type=int, default=4,
                      help="input files (one file is read by one worker)")
  parser.add_argument("--runs", type=int, default=1,
                      help="FnApiRunner and Flink alternated this many times")
  parser.add_argument("--warmup-docs", type=int, default=20_000,
                      help="documents of the unmeasured first job on the"
                           " cluster (0: none)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--flink-option", action="append", default=[],
                      metavar="OPTION",
                      help="a pipeline option for the Flink job only, e.g."
                           " --flink-option=--object_reuse=true (repeatable;"
                           " Beam's uber-jar submission passes options it"
                           " does not know to the Java runner)")
  parser.add_argument("--flink-setting", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="a Flink configuration entry for both JVMs, on"
                           " top of the cluster's, e.g. --flink-setting"
                           " 'env.java.opts.jobmanager=-XX:+UseSerialGC'"
                           " (repeatable)")
  parser.add_argument("--out", default=None, help="results JSON file")
  parser.add_argument("--work", default=None,
                      help="folder for the corpus, outputs and the cluster"
                           " (default: a temporary one, removed)")
  args = parser.parse_args(argv)
  bad = [s for s in args.flink_setting
         if "=" not in s or s.startswith("=")]
  if bad:
    parser.error(f"--flink-setting takes KEY=VALUE, got {bad[0]!r}")
  home = engines.find_flink_home()
  if home is None or engines.find_flink_submit_jar() is None:
    print(f"error: {engines.missing_flink_reason(cluster=True)}",
          file=sys.stderr)
    return 2
  work = args.work or tempfile.mkdtemp(prefix="neardup-flink-cores-")
  os.makedirs(work, exist_ok=True)
  try:
    return _bench(args, home, work)
  finally:
    if args.work is None:
      shutil.rmtree(work, ignore_errors=True)


def _bench(args, home: str, work: str) -> int:
  corpus = os.path.join(work, "corpus")
  os.makedirs(corpus, exist_ok=True)
  pattern = write_corpus(corpus, args.docs, args.files, args.seed)
  cluster = services.FlinkSessionCluster(
      home, os.path.join(work, "cluster"), SLOTS,
      {**CLUSTER_SETTINGS, **MEMORY_SETTINGS,
       **_settings(args.flink_setting)},
      lib_jars=engines.flink_taskmanager_jars(),
      taskmanager_settings=TASKMANAGER_SETTINGS)
  results: Dict[str, object] = {
      "docs": args.docs, "files": args.files, "job_args": JOB_ARGS,
      "flink_options": args.flink_option,
      "flink_settings": _settings(args.flink_setting),
      "load_before": os.getloadavg()[0], "runs": []}
  with cluster.start(180):
    results["cluster_start_s"] = round(cluster.startup_s, 1)
    pool = services.worker_pool(ROOT, cluster.log_dir)
    try:
      pool.wait_listening(60)
      if args.warmup_docs:
        warm = os.path.join(work, "warmup")
        os.makedirs(warm)
        results["warmup"] = _one_run(
            "warmup", write_corpus(warm, args.warmup_docs, args.files,
                                   args.seed), work, cluster, pool,
            args.flink_option)
      for run in range(args.runs):
        results["runs"].append(_one_run(run, pattern, work, cluster, pool,
                                        args.flink_option))
    finally:
      pool.stop()
  results["load_after"] = os.getloadavg()[0]
  median = {k: round(statistics.median(r[k]["wall_s"]
                                       for r in results["runs"]), 2)
            for k in ("fnapi", "flink")}
  ratio = median["flink"] / median["fnapi"]
  results.update(median_wall_s=median, ratio=round(ratio, 3),
                 must=ratio <= MUST, aim=ratio <= AIM)
  for line in _report(results):
    print(line)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)
  return 0


def _settings(entries: List[str]) -> Dict[str, str]:
  return dict(e.split("=", 1) for e in entries)


def _one_run(run, pattern: str, work: str,
             cluster: services.FlinkSessionCluster,
             pool: services.Service, flink_options: List[str]) -> dict:
  ref = os.path.join(work, f"fnapi-{run}")
  out = os.path.join(work, f"flink-{run}")
  fnapi = run_cli(["--input", pattern, "--output", ref, *JOB_ARGS,
                   "--runner", "FnApiRunner"], pinned_cpu=0)
  jvm_before = {s.name: cpu_seconds(s.proc.pid)
                for s in (cluster.jobmanager, cluster.taskmanager)}
  workers_before = group_cpu_seconds(pool.proc.pid)
  submitted = time.time()
  flink = run_cli([
      "--input", pattern, "--output", out, *JOB_ARGS,
      "--runner", "FlinkRunner", "--flink_master",
      f"localhost:{cluster.rest_port}", "--flink_submit_uber_jar",
      "--environment_type", "EXTERNAL", "--environment_config",
      f"localhost:{pool.port}", "--parallelism", str(SLOTS),
      "--sdk_worker_parallelism", str(SLOTS), "--environment_cache_millis",
      str(ENVIRONMENT_CACHE_MS), *flink_options])
  ended = time.time()
  flink.update(flink_job(cluster))
  flink["cli_to_job_start_s"] = round(flink.pop("start_time") - submitted, 1)
  flink["job_end_to_cli_exit_s"] = round(ended - flink.pop("end_time"), 1)
  flink["cpu_s"] = {name: round(cpu_seconds(s.proc.pid) - jvm_before[name], 1)
                    for name, s in (("jobmanager", cluster.jobmanager),
                                    ("taskmanager", cluster.taskmanager))}
  # Workers started for this job are in the pool's group; those of an
  # earlier job may have gone, so this is a lower bound when they did.
  flink["cpu_s"]["sdk_workers"] = round(
      max(0.0, group_cpu_seconds(pool.proc.pid) - workers_before), 1)
  ours, theirs = tree_bytes(out), tree_bytes(ref)
  identical = sorted(ours) == sorted(theirs) and all(
      ours[n] == theirs[n] for n in theirs)
  shutil.rmtree(ref)
  shutil.rmtree(out)
  return {"fnapi": fnapi, "flink": flink, "identical_outputs": identical,
          "ratio": round(flink["wall_s"] / fnapi["wall_s"], 3)}


def _report(results: dict) -> List[str]:
  lines = [f"{results['docs']:,} seed-style documents in {results['files']}"
           f" files; load average {results['load_before']:.1f} before,"
           f" {results['load_after']:.1f} after; cluster start"
           f" {results['cluster_start_s']} s"]
  runs = [("warm-up", results["warmup"])] if "warmup" in results else []
  runs += [(f"run {k + 1}", run) for k, run in enumerate(results["runs"])]
  for name, run in runs:
    fl = run["flink"]
    lines.append(
        f"{name}: FnApiRunner (1 CPU) {run['fnapi']['wall_s']} s,"
        f" {run['fnapi']['peak_rss_mb']:.0f} MB; Flink (2 slots, 2 workers)"
        f" {fl['wall_s']} s (CLI to job start {fl['cli_to_job_start_s']} s,"
        f" job {fl['job_s']:.1f} s, {fl['vertices']} vertices, job end to"
        f" exit {fl['job_end_to_cli_exit_s']} s); ratio {run['ratio']};"
        f" CPU s {fl['cpu_s']}; outputs"
        f" {'identical' if run['identical_outputs'] else 'DIFFER'}")
  ratio = results["ratio"]
  lines.append(f"median: Flink {results['median_wall_s']['flink']} s ÷"
               f" FnApiRunner {results['median_wall_s']['fnapi']} s = {ratio}")
  lines.append(f"target must (<= {MUST}x): "
               f"{'PASS' if results['must'] else 'FAIL'}; aim (<= {AIM}x): "
               f"{'PASS' if results['aim'] else 'FAIL'}")
  lines.append("longest Flink vertices (last run): " + "; ".join(
      f"{v['seconds']:.1f} s {v['name'][:60]}"
      for v in results["runs"][-1]["flink"]["longest_vertices"][:5]))
  return lines


if __name__ == "__main__":
  sys.exit(main())
