#!/usr/bin/env python3
"""Where a job's samples go: Beam's machinery, the project's code, imports.

Issue 12's target 4: in a 100k-document profile, Beam's machinery takes under
30% of the samples and no PickleCoder is on a hot path. Usage (from the
repository root)::

  python bench/beam_share.py --docs 100000 --runs 5

generates the seed-style corpus of ``bench/run.py``'s end-to-end run, profiles
``python -m pipeline`` on it ``--runs`` times with py-spy (100 Hz, the job
pinned to one CPU, py-spy and this process on another where there are two or
more), prints a table and the median Beam share against the bound, and writes
the results as JSON (``--out``, default ``bench/results/<date>-profile.json``).
``bench/run.py --profile-runs N`` runs the same profiles as target 12.4.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterable, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bench import corpora, jobs  # noqa: E402  (needs ROOT on sys.path)
from transforms.finalize import SUCCESS_FILE  # noqa: E402

BEAM_LIMIT = 30.0  # % of the non-idle samples (issue 12, target 4)
RATE = 100  # samples per second
POLL_S = 0.05  # period of the per-thread CPU readings
PHASES = ("construction", "stage_setup", "grouping", "data_plane",
          "translation", "other")
TOP_LEAVES = 15
UNSEEN = "(between readings)"
_THREAD = re.compile(r"thread \((\w+)\)(?::\s*(.*))?$")
_FRAME = re.compile(r"(.*) \((.*?)(?::(\d+))?\)$")
_IDLE_WAITS = ("Condition.wait", "Event.wait")
_CLK_TCK = os.sysconf("SC_CLK_TCK")

Frame = Tuple[str, str]  # (function, path)


# ------------------------------------------------------------- classifying


def parse_line(line: str
               ) -> Optional[Tuple[str, Optional[str], List[Frame], int]]:
  """(thread id, thread name, frames outermost first, samples) of one line
  of ``py-spy record --format raw --threads``; None for a blank line. The
  name is None where py-spy had none (a thread's samples before the
  threading module names it). Raises ValueError on a line of another
  shape."""
  line = line.strip()
  if not line:
    return None
  stack, count = line.rsplit(" ", 1)
  thread, *fields = stack.split(";")
  match = _THREAD.match(thread)
  if match is None:
    raise ValueError(f"not a py-spy --threads line: {line[:200]!r}")
  tid, name = match.groups()
  frames = []
  for field in fields:
    frame = _FRAME.match(field)
    # A frame without a location (none in py-spy's Python frames) keeps its
    # text as the function name.
    frames.append(frame.group(1, 2) if frame else (field, ""))
  return tid, name or None, frames, int(count)


def _is_idle(frames: List[Frame]) -> bool:
  # A thread blocked in C (a pool worker in SimpleQueue.get, a thread in
  # lock.acquire) shows as its innermost Python frame, which py-spy takes for
  # running. An empty stack (the interpreter starting or exiting) runs.
  if not frames:
    return False
  if frames[-1][0] in _IDLE_WAITS:
    return True
  return all(path in ("threading.py", "queue.py")
             or path.startswith("concurrent/") for _, path in frames)


def _owner(frames: List[Frame]) -> Tuple[str, Optional[Frame]]:
  """("beam" | "project" | "other", the deciding frame)."""
  for frame in reversed(frames):
    path = frame[1]
    if path.startswith("apache_beam/"):
      return "beam", frame
    # pipeline/__main__.py is the command's entry: on every stack.
    if (path.startswith(("transforms/", "pipeline/"))
        and path != "pipeline/__main__.py"):
      return "project", frame
  return "other", None


def _is_pickle(frame: Frame) -> bool:
  # PickleCoder's and FastPrimitivesCoder's fallback callbacks are Python
  # functions of coders.py (the rest of the coders is compiled).
  func, path = frame
  return path == "apache_beam/coders/coders.py" and (
      "dumps" in func or "loads" in func or "_create_impl.<locals>" in func)


def _phase(frames: List[Frame]) -> str:
  funcs = [f for f, _ in frames]
  paths = [p for _, p in frames]
  if "Pipeline.apply" in funcs:
    return "construction"
  if any("create_execution_tree" in f or f == "BundleProcessor.__init__"
         for f in funcs):
    return "stage_setup"
  if any("GroupingBuffer" in f for f in funcs):
    return "grouping"
  if ("apache_beam/runners/worker/data_plane.py" in paths
      or any(f.startswith(("DataInputOperation.", "DataOutputOperation."))
             for f in funcs)):
    return "data_plane"
  if (any("to_runner_api" in f for f in funcs)
      or any(p.endswith("fn_api_runner/translations.py") for p in paths)):
    return "translation"
  return "other"


def classify(lines: Iterable[str]) -> dict:
  """Counts and shares (%) of the samples of a raw py-spy profile.

  Idle samples (innermost frame ``Condition.wait``/``Event.wait``, or only
  threading, queue and concurrent frames) are left out of ``total``. Of the
  rest, a sample with a frame of ``importlib`` counts as ``imports``, else the
  innermost frame of Beam (``apache_beam/``) or of the project
  (``transforms/``, ``pipeline/`` but ``pipeline/__main__.py``) decides
  ``beam`` or ``project``, else ``other``: these four add up to ``total``.
  ``pickle`` counts the non-idle samples in coders.py's pickling callbacks.
  Beam's samples are also counted by ``beam_phases`` (the first of PHASES
  whose frame is on the stack, so a stage's data plane includes the work
  under its input operation that is no other phase's) and by their deciding
  function (``beam_leaves``, top 15). ``idle_by_thread`` gives the idle
  samples per thread name. Shares are None when there is no sample."""
  counts = dict.fromkeys(("total", "idle", "beam", "project", "imports",
                          "other", "pickle"), 0)
  phases = dict.fromkeys(PHASES, 0)
  leaves = collections.Counter()
  idle = collections.Counter()
  for line in lines:
    sample = parse_line(line)
    if sample is None:
      continue
    tid, name, frames, n = sample
    if _is_idle(frames):
      counts["idle"] += n
      idle[name or f"({tid})"] += n
      continue
    counts["total"] += n
    if any(_is_pickle(f) for f in frames):
      counts["pickle"] += n
    if any("importlib" in path for _, path in frames):
      counts["imports"] += n
      continue
    owner, leaf = _owner(frames)
    counts[owner] += n
    if owner == "beam":
      phases[_phase(frames)] += n
      leaves[f"{leaf[0]} ({leaf[1]})"] += n
  total = counts["total"]
  out = dict(counts)
  for key in ("beam", "project", "imports", "other"):
    out[("import" if key == "imports" else key) + "_share"] = (
        100.0 * counts[key] / total if total else None)
  out["beam_phases"] = phases
  out["beam_leaves"] = dict(sorted(leaves.items(),
                                   key=lambda kv: (-kv[1], kv[0]))[:TOP_LEAVES])
  out["idle_by_thread"] = dict(idle.most_common())
  return out


# --------------------------------------------------------------- profiling


def _child_of(ppid: int) -> Optional[int]:
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat", encoding="ascii") as f:
          # The command name (field 2) may hold spaces: split after it.
          if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
            return int(entry)
      except (OSError, ValueError, IndexError):
        continue
  return None


def _pin_tasks(pid: int, cpu: int) -> None:
  """Every thread of ``pid`` onto ``cpu`` (affinity is per thread)."""
  try:
    tids = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return
  for tid in tids:
    try:
      os.sched_setaffinity(int(tid), {cpu})
    except OSError:  # the thread has ended
      pass


def _cpu_ticks(stat_path: str) -> int:
  """utime + stime of a /proc stat file (raises OSError once it is gone)."""
  with open(stat_path, encoding="ascii") as f:
    # The command name (field 2) may hold spaces: split after it.
    fields = f.read().rsplit(")", 1)[1].split()
  return int(fields[11]) + int(fields[12])


def _read_cpu(pid: int, ticks: dict, comm: dict) -> None:
  """CPU ticks of each thread of ``pid`` into ``ticks`` (the last value read
  per tid) and of the whole process, with the threads that have ended, under
  None; a thread's /proc name into ``comm`` when first seen."""
  try:
    ticks[None] = _cpu_ticks(f"/proc/{pid}/stat")
    tids = os.listdir(f"/proc/{pid}/task")
  except (OSError, ValueError, IndexError):  # the job has ended
    return
  for tid in tids:
    try:
      ticks[int(tid)] = _cpu_ticks(f"/proc/{pid}/task/{tid}/stat")
      if int(tid) not in comm:
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8") as f:
          comm[int(tid)] = f.read().strip()
    except (OSError, ValueError, IndexError):  # the thread has ended
      continue


def _mtime_ns(path: Optional[str]) -> Optional[int]:
  try:
    return None if path is None else os.stat(path).st_mtime_ns
  except OSError:
    return None


def _tail(data: bytes, limit: int = 2000) -> str:
  return data.decode("utf-8", "replace")[-limit:]


def profile_job(argv: List[str], raw_path: str, rate: int = RATE) -> dict:
  """Profiles ``python -m pipeline ARGV`` (in the repository root) with
  ``py-spy record --format raw --threads``, the raw profile in ``raw_path``.

  The job runs pinned to the last CPU of this process's affinity; py-spy and
  the readings of /proc run on the first (another, where there are two or
  more). Returns classify()'s dict plus ``wall_s`` (py-spy's whole run),
  ``cpu_s`` (the job's CPU seconds as last read), ``thread_cpu_s`` (CPU
  seconds per thread name, read from /proc every 50 ms; a thread py-spy never
  named goes by its /proc comm; "(between readings)" is the rest of
  ``cpu_s``: threads that started and ended between two readings, and what
  threads used after their last), ``cpus`` and ``returncode`` (py-spy's; None
  when it could not be started). Never raises: a job that fails (it wrote
  no new ``_SUCCESS`` in its ``--output``), a py-spy that is missing or
  cannot attach (ptrace not permitted), or an unreadable profile give an
  ``error`` entry with the output's tail instead.
  """
  cpus = sorted(os.sched_getaffinity(0))
  job_cpu = cpus[-1]
  spy_cpu = cpus[0]
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep
             + os.environ.get("PYTHONPATH", ""))
  env.pop("RUST_LOG", None)
  # py-spy does not pass on the job's exit status (it reaps the job itself),
  # and a job that succeeds may still print to stderr (gRPC's epoll warnings
  # at exit): the job succeeded when it wrote its output folder's _SUCCESS
  # anew (written last, only by a successful run). --capture keeps the
  # job's output off the terminal.
  cmd = ["py-spy", "record", "--format", "raw", "--threads", "--capture",
         "--rate", str(rate), "-o", raw_path, "--",
         sys.executable, "-m", "pipeline"] + list(argv)
  result = {"cpus": {"job": job_cpu, "py-spy": spy_cpu}, "returncode": None}
  # Dirty pages of an earlier run being written back slow the next one's
  # start (see bench/run.py's Runner._spawn).
  os.sync()
  success = (os.path.join(argv[argv.index("--output") + 1], SUCCESS_FILE)
             if "--output" in argv else None)
  before = _mtime_ns(success)
  mask = os.sched_getaffinity(0)
  ticks, comm = {}, {}
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    # The readings below run on py-spy's CPU, not the job's.
    os.sched_setaffinity(0, {spy_cpu})
    try:
      start = time.perf_counter()
      # py-spy starts pinned to the job's CPU, so that the job it starts is
      # pinned from its first instruction; py-spy moves once the job is up.
      spy = subprocess.Popen(
          cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
          stderr=err, preexec_fn=lambda: os.sched_setaffinity(0, {job_cpu}))
    except OSError as e:  # py-spy not installed, or not runnable
      os.sched_setaffinity(0, mask)
      return dict(result, error=f"py-spy could not be started: {e}")
    job = None
    while spy.poll() is None:
      if job is None:
        job = _child_of(spy.pid)
      if job is not None:
        if spy_cpu != job_cpu:
          _pin_tasks(spy.pid, spy_cpu)  # also threads started since
        _read_cpu(job, ticks, comm)
      try:
        spy.wait(POLL_S if job is not None else 0.001)
      except subprocess.TimeoutExpired:
        pass
    result["wall_s"] = time.perf_counter() - start
    os.sched_setaffinity(0, mask)
    result["returncode"] = spy.returncode
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
  written = _mtime_ns(success)
  if spy.returncode != 0 or written is None or written == before:
    what = ("py-spy failed" if spy.returncode else
            f"the job failed (no new {SUCCESS_FILE} in its output)")
    return dict(result, error=f"{what}: {_tail(stderr or stdout)}")
  try:
    with open(raw_path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    result.update(classify(lines))
  except (OSError, ValueError) as e:
    return dict(result, error=f"unreadable profile {raw_path}: {e}")
  if not result["total"]:
    return dict(result, error=f"no samples in {raw_path}: "
                f"{_tail(stdout)}")
  names = {}
  for line in lines:
    sample = parse_line(line)
    if sample is not None and sample[1]:
      names[int(sample[0], 0)] = sample[1]
  process = ticks.pop(None, 0)
  cpu = collections.Counter()
  for tid, t in ticks.items():
    cpu[names.get(tid) or comm.get(tid, f"({tid})")] += t
  cpu[UNSEEN] = max(0, process - sum(ticks.values()))
  result["cpu_s"] = round(process / _CLK_TCK, 2)
  result["thread_cpu_s"] = {k: round(v / _CLK_TCK, 2)
                            for k, v in cpu.most_common()}
  return result


# ---------------------------------------------------------------- reporting


def summary(runs: List[dict]) -> dict:
  """Target 12.4's measure of several profiles: the median Beam share (%),
  every run's, and the most PickleCoder samples of a run. Needs runs
  without errors."""
  shares = [r["beam_share"] for r in runs]
  return {"beam_share": round(statistics.median(shares), 1),
          "runs": [round(s, 1) for s in shares],
          "pickle_samples": max(r["pickle"] for r in runs)}


def passes(measured: dict) -> bool:
  return (measured["beam_share"] < BEAM_LIMIT
          and measured["pickle_samples"] == 0)


def table(runs: List[dict]) -> List[str]:
  """A markdown table of the runs, then each run's CPU seconds by thread."""
  lines = ["| run | samples | Beam % | project % | imports % | other % |"
           " PickleCoder samples | wall s |",
           "|---|---|---|---|---|---|---|---|"]
  for i, r in enumerate(runs, 1):
    if "error" in r:
      lines.append(f"| {i} | error: {r['error'].strip().splitlines()[-1][:120]}"
                   " | | | | | | |")
      continue
    lines.append(f"| {i} | {r['total']:,} | {r['beam_share']:.1f} |"
                 f" {r['project_share']:.1f} | {r['import_share']:.1f} |"
                 f" {r['other_share']:.1f} | {r['pickle']} |"
                 f" {r['wall_s']:.2f} |")
  lines.append("")
  for i, r in enumerate(runs, 1):
    if "thread_cpu_s" in r:
      lines.append(f"- run {i}, CPU s by thread: " + ", ".join(
          f"{k} {v:.2f}" for k, v in r["thread_cpu_s"].items())
                   + f" (idle samples: {r['idle']:,})")
  return lines


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--docs", type=int, default=jobs.TARGET_E2E_DOCS,
                      help="seed-style documents (default %(default)s)")
  parser.add_argument("--runs", type=int, default=5,
                      help="profiles; the median counts (default %(default)s)")
  parser.add_argument("--seed", type=int, default=42,
                      help="seed of the corpus and of every hash function")
  parser.add_argument("--workdir", default=None,
                      help="where the corpus, outputs and raw profiles go"
                      " (default: a temporary directory, removed afterwards)")
  parser.add_argument("--out", default=None,
                      help="results JSON (default"
                      " bench/results/<date>-profile.json)")
  args = parser.parse_args(argv)
  if args.docs <= 0 or args.runs <= 0:
    raise SystemExit("--docs and --runs must be positive")
  now = datetime.datetime.now(datetime.timezone.utc)
  workdir = args.workdir or tempfile.mkdtemp(prefix="neardup-profile-")
  params = jobs.corpus_params("seed-style", args.seed)
  try:
    corpus_dir = os.path.join(workdir, "corpus")
    print(f"[profile] generating seed-style corpus of {args.docs:,} docs ...",
          file=sys.stderr, flush=True)
    corpora.write(corpora.seed_style(args.docs, seed=args.seed), corpus_dir)
    job_argv = jobs.pipeline_argv(corpus_dir, os.path.join(workdir, "out"),
                                 params)
    runs = []
    for i in range(1, args.runs + 1):
      print(f"[profile] run {i} of {args.runs} ...", file=sys.stderr,
            flush=True)
      runs.append(profile_job(job_argv, os.path.join(workdir,
                                                     f"profile-{i}.txt")))
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  results = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "docs": args.docs,
             "params": params, "argv": job_argv, "machine": jobs.machine_info(),
             "runs": runs}
  print(f"Profile of `python -m pipeline` on {args.docs:,} seed-style docs"
        f" (py-spy {RATE} Hz):\n")
  print("\n".join(table(runs)))
  if any("error" in r for r in runs):
    results["verdict"] = "ERROR"
    print("\nERROR: a profile failed")
  else:
    results["measured"] = summary(runs)
    results["verdict"] = "PASS" if passes(results["measured"]) else "FAIL"
    m = results["measured"]
    print(f"\n{results['verdict']}: Beam's share {m['beam_share']:.1f}%"
          f" (median of {', '.join(f'{s:.1f}' for s in m['runs'])}) against"
          f" < {BEAM_LIMIT:.0f}%; PickleCoder samples {m['pickle_samples']}"
          " (at most 0)")
  out = args.out or os.path.join(ROOT, "bench", "results",
                                 now.strftime("%Y-%m-%d") + "-profile.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(f"[profile] results written to {out}", file=sys.stderr)
  return 1 if results["verdict"] == "ERROR" else 0


if __name__ == "__main__":
  sys.exit(main())
