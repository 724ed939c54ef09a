"""Throughput, shuffle bytes and state bytes of the streaming path, against
the single-process online baselines, in one invocation.

Each system runs in its own process pinned to one CPU (the last of this
process's affinity, as bench/run.py pins), over the same seed-style
documents (bench/corpora.py, 30% with a planted near-copy):

* ``ours``: DeduplicateStream of this tree on a TestStream (``--batch``
  documents per step, the watermark advanced after each, ``--event-gap-ms``
  of event time apart: 10 by default, a 100 documents/s feed replayed; 0.5
  is a 2,000 documents/s feed, the rate a run at that speed keeps up with) on the BundleBasedDirectRunner (the streaming CLI's default local
  runner) or Prism; wall time of the whole run, pipeline start included.
* ``ours-before``: the same graph from ``--baseline-tree`` (a worktree of an
  earlier commit), with the same invocation.
* ``cli`` / ``cli-before``: ``python -m pipeline --streaming`` of this tree
  and of the baseline tree on a JSONL file of the same documents (event
  times ``--event-gap-ms`` apart from a field; the default local runner), ``main()``'s
  wall time (pipeline construction included; a file's watermark jumps to
  the end at once, so every timer fires in one flush).
* ``flink``: the same CLI command on the Flink session cluster of the
  Flink issue (``scripts/install_flink.sh cluster``: a JobManager and a
  TaskManager with 2 slots, the cluster tests' JVM settings) with EXTERNAL
  SDK workers at parallelism 2, not pinned (both cores); documents/s over
  the CLI's wall time and over Flink's own job time; every process it
  starts is stopped by its group. Its verdicts are compared with ``cli``'s.
* ``rensa`` / ``datasketch``: each document signed, queried against an LSH
  of the kept documents, then inserted when it matched none
  (``RMinHashLSH`` / ``MinHashLSH``, same bands and rows).

It prints one JSON object: per system documents/s (wall time) and per
CPU second (the process's CPU time: steadier on a shared machine), verdict
counts; for
the graphs, shuffle bytes per document (the encoded input of every stateful
step, counted in a second, untimed run over ``--shuffle_docs`` documents),
state bytes per kept document in the buckets (the tree's own coders), and
whether both graphs gave the same verdicts.

  python bench/streaming.py --docs 5000 --baseline-tree /tmp/base29
"""

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

_HERE = os.path.dirname(os.path.abspath(__file__))
GRAPHS = ("ours", "ours-before")
CLIS = ("cli", "cli-before")
FLINK = ("flink",)
ONLINE = ("rensa", "datasketch")
CONFIG = dict(ngram=3, num_perm=128, bands=32, rows=4, threshold=0.4)


def events_of(texts, batch: int, gap_ms: float = 10.0):
  """TestStream events: ``batch`` documents per step (ids ``%08d``, event
  times ``gap_ms`` apart), the watermark advanced past each step."""
  events = []
  for start in range(0, len(texts), batch):
    stop = min(start + batch, len(texts))
    events.append(("add", [(f"{i:08d}", texts[i], 1000 + gap_ms * i)
                           for i in range(start, stop)]))
    events.append(("wm", 1000 + gap_ms * stop))
  return events


def verdict_digest(verdicts) -> str:
  """Order-free digest of (id, verdict, duplicate of) of every verdict."""
  rows = sorted(f"{v['id']}\t{v['verdict']}\t{v['of']}" for v in verdicts)
  return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def shuffle_per_doc(counts: dict, docs: int) -> dict:
  """Bytes per document of each stateful step's input, and their total."""
  per = {step: round(total / docs, 1) for step, total in sorted(
      counts.items())}
  per["total"] = round(sum(counts.values()) / docs, 1)
  return per


def ratios(results: dict, field: str = "docs_per_s") -> dict:
  """``field`` (docs/s) of ``ours`` over each other system's, where both
  ran."""
  ours = results.get("ours", {}).get(field)
  return {f"ours/{name}": round(ours / r[field], 2)
          for name, r in results.items()
          if name != "ours" and ours and r.get(field)}


# Issue 29, goal 1: documents/s on the default local runner and on the
# 2-slot Flink session cluster, each also >= datasketch's online loop.
GOAL_DOCS_PER_S = {"ours": 500, "cli": 500, "flink": 2000}


def goal_1(results: dict) -> dict:
  """Per system of :data:`GOAL_DOCS_PER_S` that ran: its documents/s, the
  floor, datasketch's documents/s of the same run, and whether it passes."""
  floor = results.get("datasketch", {}).get("docs_per_s")
  goals = {}
  for name, need in GOAL_DOCS_PER_S.items():
    rate = results.get(name, {}).get("docs_per_s")
    if rate is None:
      continue
    goals[name] = {"docs_per_s": rate, "need": need,
                   "datasketch_docs_per_s": floor,
                   "pass": rate >= need and floor is not None
                           and rate >= floor}
  return goals


# ---------------------------------------------------------------- workers


def _corpus(docs: int):
  sys.path.insert(0, os.path.dirname(_HERE))
  from bench import corpora  # pylint: disable=import-outside-toplevel
  corpus = corpora.seed_style(docs, seed=1)
  sys.path.pop(0)
  return corpus


def _graph_worker(args) -> dict:
  """Runs the graph of the tree on sys.path[0] (see main)."""
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.transforms import userstate

  from pipeline import introspection
  from pipeline.engines import find_prism, missing_prism_reason
  from tests.stream_harness import Collect, make_test_stream, read_collected
  from transforms.config import DedupConfig, StreamConfig
  from transforms.stream.dedup import PRISM_NO_SPLIT, DeduplicateStream

  texts = _corpus(args.docs).texts
  config = DedupConfig(verify=args.verify, **CONFIG)
  stream = StreamConfig(config, mode=args.mode, settle_ms=1000,
                        dedup_window_ms=10**9, allowed_lateness_ms=10**6)
  introspection.memoize_introspection()  # as the CLI does
  if args.runner == "prism":
    if find_prism() is None:
      sys.exit(missing_prism_reason())
    options = ["--runner", "PrismRunner", "--prism_location", find_prism(),
               f"--experiments={PRISM_NO_SPLIT}"]
  else:
    options = ["--runner", "BundleBasedDirectRunner"]

  class CountBytes(beam.DoFn):
    """Encoded bytes of a PCollection's elements, one file per bundle."""

    def __init__(self, folder, step, coder):
      self._folder, self._step, self._coder = folder, step, coder

    def start_bundle(self):
      self._bytes = 0

    def process(self, element):
      self._bytes += len(self._coder.encode(element))

    def finish_bundle(self):
      with open(os.path.join(self._folder, f"bytes-{uuid.uuid4().hex}"), "w",
                encoding="utf-8") as f:
        json.dump([self._step, self._bytes], f)

  def run(docs, count_shuffle):
    folder = tempfile.mkdtemp()
    p = beam.Pipeline(options=PipelineOptions(options + ["--streaming"]))
    out = p | make_test_stream(events_of(texts[:docs], args.batch,
                                                      args.event_gap_ms)) | (
        DeduplicateStream(stream))
    _ = out["verdicts"] | "CollectVerdicts" >> beam.ParDo(
        Collect(folder, "verdicts"))
    _ = out["late"] | "CollectLate" >> beam.ParDo(Collect(folder, "late"))
    if count_shuffle:
      stateful = []

      class Visitor(beam.pipeline.PipelineVisitor):

        def visit_transform(self, node):
          dofn = getattr(node.transform, "dofn", None)
          if dofn is not None and userstate.is_stateful_dofn(dofn):
            stateful.append(node)

      p.visit(Visitor())
      for node in stateful:
        pcoll = node.main_inputs[None] if None in node.main_inputs else list(
            node.main_inputs.values())[0]
        coder = beam.coders.registry.get_coder(pcoll.element_type)
        step = node.full_label.split("/", 1)[-1]
        _ = pcoll | f"Bytes[{step}]" >> beam.ParDo(
            CountBytes(folder, step, coder))
    started, cpu = time.perf_counter(), time.process_time()
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    counts = {}
    for path in glob.glob(os.path.join(folder, "bytes-*")):
      with open(path, encoding="utf-8") as f:
        step, n = json.load(f)
      counts[step] = counts.get(step, 0) + n
    verdicts = (read_collected(folder, "verdicts")
                + read_collected(folder, "late"))
    return (wall, cpu), verdicts, counts

  (wall, cpu), verdicts, _ = run(len(texts), False)
  shuffle_docs = min(args.shuffle_docs, len(texts))
  _, _, counts = run(shuffle_docs, True)
  return {
      "docs": len(texts), "wall_s": round(wall, 2),
      "docs_per_s": round(len(texts) / wall, 1), "cpu_s": round(cpu, 2),
      "docs_per_cpu_s": round(len(texts) / cpu, 1), "verdicts": len(verdicts),
      "distinct_docs_with_verdict": len({v["id"] for v in verdicts}),
      "duplicates": sum(v["verdict"] == "duplicate" for v in verdicts),
      "late": sum(v["verdict"] == "late" for v in verdicts),
      "verdict_digest": verdict_digest(verdicts),
      "shuffle_bytes_per_doc": shuffle_per_doc(counts, shuffle_docs),
      "state": bucket_state_bytes(texts[:args.state_docs], config)}


def bucket_state_bytes(texts, config) -> dict:
  """Encoded bytes the buckets hold per kept document, with the tree's own
  coders, after ``texts`` all arrived in one bundle per shard (arrival
  mode, nothing expired): the shard cells over the kept documents, or,
  for the layout before issue 29 (a cell per band key), each
  representative's cell and its 8-byte key in each of its b buckets."""
  # pylint: disable=import-outside-toplevel
  import numpy as np

  from transforms.kernels import compiled_signature as signature
  from transforms.kernels import lsh, minhash
  a, b = minhash.permutations(config.num_perm, config.seed)
  sigs, _ = signature.signature_batch(texts, unit=config.shingle_unit,
                                      ngram=config.ngram, seed=config.seed,
                                      a=a, b=b)
  keys = lsh.band_keys(sigs, config.bands, config.rows, config.seed)
  ids = [f"{i:08d}" for i in range(len(texts))]
  try:
    from transforms.kernels import stream_shard as ss
  except ImportError:
    from transforms.stream.elements import (BucketState, BucketStateCoder,
                                            Member)
    cell = np.mean([len(BucketStateCoder().encode(BucketState(
        Member(ids[i], 0, sigs[i]), clock=0))) for i in range(len(texts))])
    return {"layout": "cell per band key",
            "bucket_bytes_per_kept_doc": round(float(
                config.bands * (cell + 8)), 1)}
  from transforms.config import StreamConfig
  from transforms.stream.elements import MemberTableCoder, ShardStateCoder
  try:  # since the layers: the cold layer's timer index too
    from transforms.kernels.stream_layers import due_index
    from transforms.stream.elements import DueIndexCoder
  except ImportError:
    due_index = None
  stream = StreamConfig(config, mode="arrival")
  params = ss.Params(False, 0, 10**9, stream.allowed_lateness_ms, 10**9, 1,
                     config.verify, config.threshold, 1)
  shards = lsh.shard_of(keys.ravel(), stream.key_shards)
  total, kept = 0, set(range(len(texts)))
  table = ss.member_table(ids, np.zeros(len(texts), np.int64), sigs,
                          [np.zeros(0, np.uint64)] * len(texts))
  docs = np.repeat(np.arange(len(texts)), config.bands)
  bands = np.tile(np.arange(config.bands), len(texts))
  for s in range(stream.key_shards):
    at = np.flatnonzero(shards == s)
    shard = ss.Shard(ss.empty_state(), ss.empty_members(config.num_perm),
                     params)
    shard.add(keys.ravel()[at], bands[at], docs[at], table)
    kept -= {int(doc) for doc, _, kind, _, _, _ in shard.answers
             if kind == 1}
    state = shard.state()
    total += len(ShardStateCoder().encode(state))
    total += len(MemberTableCoder().encode(shard.table))
    if due_index is not None:
      total += len(DueIndexCoder().encode(due_index(state)))
  return {"layout": f"{stream.key_shards} shards"
                    + (", layered" if due_index is not None else ""),
          "bucket_bytes_per_kept_doc": round(total / len(kept), 1)}


def _write_feed(texts, folder: str, gap_ms: float) -> str:
  """The documents as one JSONL file (event times ``gap_ms`` apart in
  ``ts``)."""
  path = os.path.join(folder, "docs.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"id": f"{i:08d}", "text": text,
                          "ts": 1 + i * gap_ms / 1000}) + "\n")
  return path


def _cli_args(args, path: str, out: str) -> list:
  """The streaming CLI's flags for the feed ``path``, output to ``out``."""
  return ["--streaming", "--input", path, "--output", out,
          "--event_time_field", "ts", "--ngram", "3", "--bands", "32",
          "--rows", "4", "--threshold", "0.4", "--verify", args.verify,
          "--mode", args.mode, "--settle", "1s", "--allowed_lateness", "1h"]


def _verdict_summary(out: str) -> dict:
  """Counts and digest of the verdict lines under ``out`` (the digest is
  comparable with the graph's)."""
  verdicts = []
  for name in glob.glob(os.path.join(out, "verdicts", "*.jsonl")):
    with open(name, encoding="utf-8") as f:
      verdicts += [dict(v, of=v["duplicate_of"]) for v in map(json.loads, f)]
  return {"verdicts": len(verdicts),
          "distinct_docs_with_verdict": len({v["id"] for v in verdicts}),
          "duplicates": sum(v["verdict"] == "duplicate" for v in verdicts),
          "verdict_digest": verdict_digest(verdicts)}


def _cli_worker(args) -> dict:
  """The streaming CLI of the tree on sys.path[0], as a user runs it on a
  file (the default local runner; event times from a field):
  its wall time, from main() called to returned."""
  # pylint: disable=import-outside-toplevel
  texts = _corpus(args.docs).texts
  from pipeline.cli import main as cli_main
  folder = tempfile.mkdtemp()
  path = _write_feed(texts, folder, args.event_gap_ms)
  out = os.path.join(folder, "out")
  started, cpu = time.perf_counter(), time.process_time()
  code = cli_main(_cli_args(args, path, out))
  wall = time.perf_counter() - started
  cpu = time.process_time() - cpu
  return {"docs": len(texts), "exit_code": code, "wall_s": round(wall, 2),
          "docs_per_s": round(len(texts) / wall, 1), "cpu_s": round(cpu, 2),
          "docs_per_cpu_s": round(len(texts) / cpu, 1),
          **_verdict_summary(out)}


def _flink_system(args) -> dict:
  """The streaming CLI on a 2-slot Flink session cluster (see the module
  docstring); run from this process, which starts and stops the cluster."""
  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(_HERE)
  if root not in sys.path:
    sys.path.insert(0, root)
  from bench import flink_cores
  from pipeline import engines
  from tests import services
  from tests.test_flink_cluster import (CLUSTER_SETTINGS, SLOTS,
                                        TASKMANAGER_SETTINGS)
  home = engines.find_flink_home()
  if home is None or engines.find_flink_submit_jar() is None:
    return {"error": [engines.missing_flink_reason(cluster=True)]}
  texts = _corpus(args.docs).texts
  work = tempfile.mkdtemp(prefix="neardup-stream-flink-")
  try:
    path = _write_feed(texts, work, args.event_gap_ms)
    out = os.path.join(work, "out")
    cluster = services.FlinkSessionCluster(
        home, os.path.join(work, "cluster"), SLOTS,
        {**CLUSTER_SETTINGS, **flink_cores.MEMORY_SETTINGS},
        lib_jars=engines.flink_taskmanager_jars(),
        taskmanager_settings=TASKMANAGER_SETTINGS)
    with cluster.start(180):
      pool = services.worker_pool(root, cluster.log_dir,
                                  args.state_cache_mb)
      try:
        pool.wait_listening(60)
        jvms = {"jobmanager": cluster.jobmanager,
                "taskmanager": cluster.taskmanager}
        before = {n: flink_cores.cpu_seconds(s.proc.pid)
                  for n, s in jvms.items()}
        workers_before = flink_cores.group_cpu_seconds(pool.proc.pid)
        run = flink_cores.run_cli(_cli_args(args, path, out) + [
            "--runner", "FlinkRunner", "--flink_master",
            f"localhost:{cluster.rest_port}", "--flink_submit_uber_jar",
            "--environment_type", "EXTERNAL", "--environment_config",
            f"localhost:{pool.port}", "--parallelism", str(SLOTS),
            "--sdk_worker_parallelism", str(SLOTS),
            "--environment_cache_millis",
            str(flink_cores.ENVIRONMENT_CACHE_MS), *args.flink_option])
        job = flink_cores.flink_job(cluster)
        cpu = {n: round(flink_cores.cpu_seconds(s.proc.pid) - before[n], 1)
               for n, s in jvms.items()}
        cpu["sdk_workers"] = round(max(0.0, flink_cores.group_cpu_seconds(
            pool.proc.pid) - workers_before), 1)
      finally:
        pool.stop()
    return {"docs": len(texts), "wall_s": run["wall_s"],
            "docs_per_s": round(len(texts) / run["wall_s"], 1),
            "job_s": job["job_s"],
            "job_docs_per_s": round(len(texts) / job["job_s"], 1),
            "state_cache_mb": args.state_cache_mb,
            "cpu_s": cpu, "peak_rss_mb": run["peak_rss_mb"],
            "longest_vertices": job["longest_vertices"][:4],
            **_verdict_summary(out)}
  finally:
    shutil.rmtree(work, ignore_errors=True)


def _online_worker(args) -> dict:
  """Each document signed, queried against the kept ones, inserted when it
  matched none."""
  # pylint: disable=import-outside-toplevel
  texts = _corpus(args.docs).texts
  sys.path.insert(0, os.path.dirname(_HERE))
  from bench import systems
  params = dict(CONFIG, seed=42)
  if args.worker == "rensa":
    from rensa import RMinHash, RMinHashLSH
    lsh = RMinHashLSH(threshold=CONFIG["threshold"],
                      num_perm=CONFIG["num_perm"], num_bands=CONFIG["bands"])

    def sketch(shingles):
      m = RMinHash(num_perm=params["num_perm"], seed=params["seed"])
      m.update(list(shingles))
      return m
  else:
    from datasketch import MinHash, MinHashLSH
    lsh = MinHashLSH(num_perm=CONFIG["num_perm"],
                     params=(CONFIG["bands"], CONFIG["rows"]))

    def sketch(shingles):
      m = MinHash(num_perm=params["num_perm"], seed=params["seed"])
      m.update_batch([s.encode("utf-8") for s in shingles])
      return m
  started, cpu = time.perf_counter(), time.process_time()
  duplicates = 0
  for i, shingles in enumerate(systems.shingle_sets(texts, CONFIG["ngram"])):
    m = sketch(shingles)
    if lsh.query(m):
      duplicates += 1
    else:
      lsh.insert(i, m)
  wall = time.perf_counter() - started
  cpu = time.process_time() - cpu
  return {"docs": len(texts), "wall_s": round(wall, 2),
          "docs_per_s": round(len(texts) / wall, 1), "cpu_s": round(cpu, 2),
          "docs_per_cpu_s": round(len(texts) / cpu, 1),
          "duplicates": duplicates}


# ------------------------------------------------------------------ main


def _run_worker(args, system: str, tree: str, cpu) -> dict:
  worker = ("graph" if system in GRAPHS else "cli" if system in CLIS
            else system)
  command = [sys.executable, os.path.abspath(__file__), "--worker",
             worker, "--tree", tree,
             "--docs", str(args.docs), "--runner", args.runner, "--mode",
             args.mode, "--verify", args.verify, "--batch", str(args.batch),
             "--event-gap-ms", str(args.event_gap_ms), "--shuffle_docs",
             str(args.shuffle_docs), "--state_docs", str(args.state_docs)]
  done = subprocess.run(
      command, cwd=tree, capture_output=True, text=True, check=False,
      preexec_fn=(lambda: os.sched_setaffinity(0, {cpu}))
      if cpu is not None else None)
  if done.returncode:
    return {"error": done.stderr.strip().splitlines()[-1:]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runner", choices=("direct", "prism"),
                      default="direct")
  parser.add_argument("--docs", type=int, default=5000)
  parser.add_argument("--mode", choices=("arrival", "event_time"),
                      default="event_time")
  parser.add_argument("--verify", choices=("signature", "exact"),
                      default="signature")
  parser.add_argument("--batch", type=int, default=500,
                      help="documents per TestStream step")
  parser.add_argument("--event-gap-ms", dest="event_gap_ms", type=float,
                      default=10.0,
                      help="event time between consecutive documents, ms"
                      " (10: a feed of 100 documents/s replayed; 0.5: a"
                      " feed of 2,000/s); the graph's timer firings per"
                      " document follow the event time a document spans")
  parser.add_argument("--shuffle_docs", type=int, default=1000,
                      help="documents of the untimed run counting shuffle"
                      " bytes")
  parser.add_argument("--state_docs", type=int, default=1000,
                      help="documents the state estimate is made over")
  parser.add_argument("--baseline-tree", dest="baseline_tree",
                      help="worktree of the commit to compare with"
                      " (ours-before)")
  parser.add_argument("--systems", default=",".join(GRAPHS + CLIS + ONLINE),
                      help="comma-separated; also: flink (needs"
                      " scripts/install_flink.sh cluster)")
  parser.add_argument("--state-cache-mb", dest="state_cache_mb", type=int,
                      help="flink: the SDK workers' state cache (default:"
                      " pipeline.worker_pool's; 0 is Beam's worker pool)")
  parser.add_argument("--flink-option", action="append", default=[],
                      metavar="OPTION",
                      help="flink: a pipeline option for the Flink job, e.g."
                      " --flink-option=--max_bundle_size=5000 (repeatable)")
  parser.add_argument("--unpinned", action="store_true",
                      help="do not pin each system to one CPU")
  parser.add_argument("--out", help="also write the JSON here")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--tree", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    sys.path.insert(0, os.path.abspath(args.tree))
    out = {"graph": _graph_worker, "cli": _cli_worker}.get(
        args.worker, _online_worker)(args)
    print(json.dumps(out))
    return
  here = os.path.dirname(_HERE)
  cpu = None if args.unpinned else max(os.sched_getaffinity(0))
  trees = {"ours": here, "ours-before": args.baseline_tree, "cli": here,
           "cli-before": args.baseline_tree}
  results = {}
  load_before = os.getloadavg()
  for system in args.systems.split(","):
    if system.endswith("-before") and not args.baseline_tree:
      continue
    results[system] = (_flink_system(args) if system in FLINK else
                       _run_worker(args, system, trees.get(system, here), cpu))
  graphs = [results[g] for g in GRAPHS if "verdict_digest" in results.get(
      g, {})]
  report = {
      "runner": args.runner, "mode": args.mode, "verify": args.verify,
      "docs": args.docs, "batch": args.batch,
      "event_gap_ms": args.event_gap_ms, "flink_options": args.flink_option,
      "pinned_cpu": cpu,
      "load_average_before": [round(x, 2) for x in load_before],
      "load_average_after": [round(x, 2) for x in os.getloadavg()],
      "results": results, "ratios": ratios(results),
      "cpu_ratios": ratios(results, "docs_per_cpu_s"),
      "goal_1": goal_1(results),
      "same_verdicts": (len(graphs) == 2 and graphs[0]["verdict_digest"]
                        == graphs[1]["verdict_digest"]) if len(graphs) == 2
      else None,
      "flink_same_verdicts_as_cli": (
          results["flink"].get("verdict_digest")
          == results["cli"].get("verdict_digest"))
      if "flink" in results and "cli" in results else None}
  text = json.dumps(report, indent=1)
  print(text)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
