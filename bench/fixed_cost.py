#!/usr/bin/env python3
"""Where a run's wall time goes: the fixed cost a 20-document job pays too.

Issue 31: a small job in 1.5 s, and the next regression of the fixed cost
visible. Usage (from the repository root)::

  python bench/fixed_cost.py --docs 20,100000 --runs 5 [--baseline-tree DIR]

generates ``bench/run.py``'s seed-style corpus at each size and runs
``python -m pipeline`` on it ``--runs`` times (pinned to one CPU unless
``--unpinned``), each in a child that times its phases from inside:

- ``start_exit``: the interpreter's start and exit (the wall the parent sees
  minus what the child measured);
- ``imports``: ``import pipeline.cli`` (Beam's modules and the project's);
- ``build``: ``pipeline.job.build``, the graph's construction;
- ``translation``: ``Pipeline.run`` outside the runner's stages (the graph to
  its portable form, fusion);
- ``stage_setup``: the SDK worker building each fused stage's operations;
- ``kernels``: numba's start and the compiled kernels' cache load (the first
  call of each);
- ``work``: the stages' bundles, less the two above;
- ``other``: the rest of ``main`` (options, preflight, claiming the output).

``--python PATH`` runs the children with another interpreter: a
virtualenv's with only ``requirements.txt`` installed times what a user who
installed as the README says pays (``import apache_beam`` also imports the
Pub/Sub, BigQuery and AWS clients where they are installed).

``--baseline-tree DIR`` (a checkout of an earlier commit, e.g. from ``git
worktree add``) runs the same children on that tree's code in the same
invocation: the table shows before and after. Medians over the runs;
``bench/run.py`` prints the same table. Only FnApiRunner is timed this way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PHASES = ("start_exit", "imports", "build", "translation", "stage_setup",
          "kernels", "work", "other")


# ------------------------------------------------------------------- child


def _timed(owner, name: str, total: Dict[str, float], key: str) -> None:
  """Wraps ``owner.name`` so that its calls add their wall time to
  ``total[key]`` (an inner call of the same wrapper is not counted twice)."""
  original = getattr(owner, name)
  depth = [0]

  def wrapper(*args, **kwargs):
    depth[0] += 1
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      depth[0] -= 1
      if not depth[0]:
        total[key] = total.get(key, 0.0) + time.perf_counter() - start

  setattr(owner, name, wrapper)


def child(tree: str, argv: List[str]) -> dict:
  """Runs ``python -m pipeline argv`` on ``tree``'s code in this process;
  returns the phases it measured (seconds) and the exit code."""
  entered = time.perf_counter()
  sys.path.insert(0, tree)
  import pipeline.cli as cli  # pylint: disable=import-outside-toplevel
  from pipeline import job  # pylint: disable=import-outside-toplevel
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.runners.portability.fn_api_runner import fn_runner
  from apache_beam.runners.worker import bundle_processor
  from transforms.kernels import dispatch
  t: Dict[str, float] = {}
  _timed(job, "build", t, "build")
  _timed(beam.Pipeline, "run", t, "run")
  _timed(fn_runner.FnApiRunner, "run_stages", t, "stages")
  _timed(bundle_processor.BundleProcessor, "__init__", t, "stage_setup")
  original_kernels = dispatch.compiled_kernels

  def compiled_kernels(work):
    """Times numba's start (the switch to the compiled kernels), then each
    compiled kernel's first call (its cache load)."""
    if dispatch.started():
      return original_kernels(work)
    begun = time.perf_counter()
    module = original_kernels(work)
    if module is not None:
      t["kernels"] = t.get("kernels", 0.0) + time.perf_counter() - begun
      from numba.core import dispatcher  # pylint: disable=import-outside-toplevel
      _timed(dispatcher._DispatcherBase, "_compile_for_args", t, "kernels")  # pylint: disable=protected-access
    return module

  dispatch.compiled_kernels = compiled_kernels
  sys.argv = ["pipeline"] + argv
  start = time.perf_counter()
  code = cli.run()
  main = time.perf_counter() - start
  stages = t.get("stages", 0.0)
  # The runner modules imported above are imported by every run anyway.
  phases = {"imports": start - entered, "build": t.get("build", 0.0),
            "translation": t.get("run", 0.0) - stages,
            "stage_setup": t.get("stage_setup", 0.0),
            "kernels": t.get("kernels", 0.0)}
  phases["work"] = stages - phases["stage_setup"] - phases["kernels"]
  phases["other"] = main - phases["build"] - t.get("run", 0.0)
  phases["measured"] = time.perf_counter() - entered
  return {"code": code, "phases": phases}


# ------------------------------------------------------------------ parent


def measure(tree: str, argv: List[str], pinned: bool = True,
            python: str = sys.executable) -> dict:
  """One child run (by the interpreter ``python``): its phases plus
  ``start_exit`` and ``wall``."""
  cpu = max(os.sched_getaffinity(0)) if pinned else None
  with tempfile.TemporaryFile() as out:
    start = time.perf_counter()
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--child", tree, "--"]
        + argv, cwd=tree, stdout=out, stderr=subprocess.PIPE, check=False,
        preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if pinned
        else None)
    wall = time.perf_counter() - start
    out.seek(0)
    lines = out.read().decode("utf-8", "replace").strip().splitlines()
  if proc.returncode != 0 or not lines:
    raise RuntimeError(f"the timed job failed ({proc.returncode}): "
                       + proc.stderr.decode("utf-8", "replace")[-2000:])
  result = json.loads(lines[-1])
  phases = result["phases"]
  phases["start_exit"] = wall - phases.pop("measured")
  return {"wall": wall, "phases": phases}


def breakdown(trees: Dict[str, str], corpus_dir: str, params: dict,
              runs: int, pinned: bool = True,
              python: str = sys.executable) -> Dict[str, dict]:
  """``{tree label: {"wall": median, "phases": {phase: median},
  "walls": [...]}}`` of ``runs`` runs of each tree on ``corpus_dir``
  (written by ``bench.corpora.write``), runs of the trees interleaved,
  after one uncounted run of each."""
  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, ROOT)
  from bench.jobs import pipeline_argv
  samples: Dict[str, List[dict]] = {label: [] for label in trees}
  with tempfile.TemporaryDirectory(prefix="neardup-fixed-") as out:
    argv = pipeline_argv(corpus_dir, out, params)
    # A first run per tree, not counted: it fills numba's cache of that
    # tree's kernels (a tree new to this machine compiles them: ~3 s).
    for tree in trees.values():
      measure(tree, argv, pinned, python)
    for _ in range(runs):
      for label, tree in trees.items():
        samples[label].append(measure(tree, argv, pinned, python))
  return {label: {
      "wall": statistics.median(s["wall"] for s in runs_),
      "walls": [round(s["wall"], 3) for s in runs_],
      "phases": {p: statistics.median(s["phases"][p] for s in runs_)
                 for p in PHASES}}
          for label, runs_ in samples.items()}


def table(rows: Dict[str, Dict[str, dict]]) -> List[str]:
  """Markdown: one line per (documents, tree), a column per phase."""
  lines = ["| documents | code | wall (s) | " + " | ".join(PHASES) + " |",
           "|---" * (3 + len(PHASES)) + "|"]
  for docs, by_tree in rows.items():
    for label, r in by_tree.items():
      lines.append(f"| {int(docs):,} | {label} | {r['wall']:.2f} | "
                   + " | ".join(f"{r['phases'][p]:.2f}" for p in PHASES)
                   + " |")
  return lines


def main(argv: Optional[List[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["--child"]:
    tree, job_argv = argv[1], argv[3:]
    result = child(tree, job_argv)
    print(json.dumps(result))
    return result["code"]
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--docs", default="20,100000",
                      help="corpus sizes, comma-separated")
  parser.add_argument("--runs", type=int, default=5)
  parser.add_argument("--baseline-tree", default=None,
                      help="a checkout of the code to compare with")
  parser.add_argument("--unpinned", action="store_true",
                      help="let the children use every CPU")
  parser.add_argument("--seed", type=int, default=42)
  parser.add_argument("--python", default=sys.executable,
                      help="the interpreter that runs the jobs, e.g. a "
                      "virtualenv's with only requirements.txt installed "
                      "(the README's install; Beam imports the cloud "
                      "clients it finds, which a development environment "
                      "has)")
  parser.add_argument("--out", default=None, help="results JSON")
  args = parser.parse_args(argv)
  sys.path.insert(0, ROOT)
  # pylint: disable=import-outside-toplevel
  from bench import corpora
  from bench.jobs import corpus_params
  trees = {"this tree": ROOT}
  if args.baseline_tree:
    trees = {"baseline": os.path.abspath(args.baseline_tree), **trees}
  params = corpus_params("seed-style", args.seed)
  rows = {}
  with tempfile.TemporaryDirectory(prefix="neardup-fixed-corpus-") as work:
    for docs in (int(d) for d in args.docs.split(",") if d):
      corpus_dir = os.path.join(work, str(docs))
      corpora.write(corpora.seed_style(docs, seed=args.seed), corpus_dir)
      rows[docs] = breakdown(trees, corpus_dir, params, args.runs,
                             pinned=not args.unpinned, python=args.python)
  print("\n".join(table(rows)))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({"load_avg_end": os.getloadavg(), "python": args.python,
                 "rows": rows}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
