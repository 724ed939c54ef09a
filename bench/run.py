#!/usr/bin/env python3
"""Speed and quality benchmark of ours against rensa, datasketch and the
method document's from-scratch numpy code, on the same documents with the
same K=128, seed and LSH bands/rows.

Usage (from the repository root)::

  python bench/run.py --quick        # ~2-3 minutes on 2 cores
  python bench/run.py                # full: 100k and 1M documents end to end

The issue 12 run (README, "Benchmarks") adds ``--profile-runs 5``: five
py-spy profiles of ours on the end-to-end seed-style corpus (target 12.4,
``bench/beam_share.py``); the default and ``--quick`` profile nothing.
The issue 31 run adds ``--e2e-web 100000 --e2e-peers rensa
--fixed-cost-runs 5 --baseline-tree DIR`` (the phase timing of
``bench/fixed_cost.py`` before and after), once pinned and once
``--unpinned``; ``--peer-scripts`` also times each peer as a user's script
on the corpus file (read, cluster, write the kept lines: the whole process,
as ours is timed).

Every measurement runs in a fresh process pinned to one CPU, so throughput
is per core and the peak RSS (read with ``wait4``) is per system.
Signatures: raw text -> K=128 signatures (best of ``--repeats``), docs/s and
MB/s of UTF-8 text. End to end: ours is ``python -m pipeline`` on the JSONL
corpus (default runner, process start and output writing included); the
peers run signatures + LSH + union-find in memory on the loaded texts.
Precision/recall are pairwise against the planted duplicate groups.
Writes the results as JSON (``--out``, default
``bench/results/<date>.json``) and prints a markdown report with PASS/FAIL
lines for the targets of issue 3.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bench import corpora  # noqa: E402  (needs ROOT on sys.path)
from bench import measure  # noqa: E402
from bench import beam_share  # noqa: E402
from bench import fixed_cost  # noqa: E402
from bench.jobs import (CORPUS_PARAMS, TARGET_E2E_DOCS,  # noqa: E402
                        corpus_params, machine_info, pipeline_argv)
from bench import systems  # noqa: E402
from pipeline.cli import DEFAULT_RUNNER  # noqa: E402
from pipeline.engines import find_prism, missing_prism_reason  # noqa: E402

GENERATORS = {"seed-style": corpora.seed_style, "web-like": corpora.web_like}
SIG_CORPORA = (("sig_seed", "seed-style"), ("sig_web", "web-like"))
E2E_CORPORA = (("e2e_seed", "seed-style"), ("e2e_web", "web-like"))
PEERS = ("rensa", "rensa-matrix", "datasketch", "seed-numpy", "py-shingles")
E2E_PEERS = ("rensa", "datasketch", "seed-numpy")
# Peers also run on the scale corpus (issue 12 compares at 1M documents).
SCALE_PEERS = ("rensa",)
SIZES = {
    "quick": {"sig_seed": 5000, "sig_web": 2000, "e2e_seed": 20_000,
              "e2e_web": 0, "scale": 0, "runners_tiny": 20},
    "full": {"sig_seed": 20_000, "sig_web": 10_000, "e2e_seed": 100_000,
             "e2e_web": 20_000, "scale": 1_000_000, "runners_tiny": 20},
}
# Local runners compared on the seed-style corpus at runners_tiny, e2e_seed
# and scale documents (the last two reuse the default runner's run).
LOCAL_RUNNERS = ("FnApiRunner", "PrismRunner")
# A tiny run lasts a few seconds, so one noisy run decides its target: the
# median of this many runs is its figure (all of them are kept).
TINY_RUNS = 5
TARGET_SCALE_DOCS = 1_000_000
# Shuffle bytes per document at 100k seed-style when issue 12 was filed: the
# restructuring must not raise it.
ISSUE_12_SHUFFLE_B_PER_DOC = 1_070


# --------------------------------------------------------------- children


class Runner:
  """Runs measurements in pinned child processes (or in this process)."""

  def __init__(self, in_process: bool, pinned: bool = True):
    self.in_process = in_process
    self.cpu = (max(os.sched_getaffinity(0)) if pinned and not in_process
                else None)

  def _spawn(self, cmd: List[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    cpu = self.cpu
    # The last run's output still being written back to disk slowed the
    # next one's start: a 20-document run after the 1M ones took 11.9 s,
    # alone 7.3 s.
    os.sync()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
      start = time.perf_counter()
      proc = subprocess.Popen(
          cmd, cwd=ROOT, env=env, stdout=out, stderr=err,
          preexec_fn=(lambda: os.sched_setaffinity(0, {cpu}))
          if cpu is not None else None)
      tree = measure.TreeRssSampler(proc.pid)
      # wait4 (not communicate) so that the child's own rusage comes back.
      _, status, usage = os.wait4(proc.pid, 0)
      wall = time.perf_counter() - start
      tree.stop()
      proc.returncode = os.waitstatus_to_exitcode(status)
      out.seek(0)
      err.seek(0)
      return {"returncode": proc.returncode, "wall_s": wall,
              "peak_rss_mb": round(usage.ru_maxrss / 1024.0, 1),
              "tree_peak_rss_mb": tree.peak_mb,
              "stdout": out.read().decode("utf-8", "replace"),
              "stderr": err.read().decode("utf-8", "replace")}

  def measure(self, spec: dict) -> dict:
    label = f"{spec['kind']} {spec['system']} on {spec['docs']:,} docs"
    print(f"[bench] {label} ...", file=sys.stderr, flush=True)
    if self.in_process:
      try:
        return measure.run(spec)
      except Exception:  # reported like a failed child, the run goes on
        return {"kind": spec["kind"], "system": spec["system"],
                "docs": spec["docs"], "error": traceback.format_exc()}
    child = self._spawn([sys.executable, "-m", "bench.measure",
                         json.dumps(spec)])
    if child["returncode"] != 0:
      return {"kind": spec["kind"], "system": spec["system"],
              "docs": spec["docs"], "error": child["stderr"][-2000:]}
    result = json.loads(child["stdout"].strip().splitlines()[-1])
    result["peak_rss_mb"] = child["peak_rss_mb"]
    if spec["kind"] == "script":
      # The whole process, as ours is timed.
      result["inside_s"], result["seconds"] = (result["seconds"],
                                               child["wall_s"])
    return result

  def pipeline(self, spec: dict, out_dir: str,
               runner: Optional[str] = None) -> dict:
    """Ours end to end: ``python -m pipeline`` on the corpus JSONL (on
    ``runner``, else the CLI's default)."""
    corpus_dir, params, docs = spec["corpus"], spec["params"], spec["docs"]
    print(f"[bench] end to end ours (python -m pipeline) on {docs:,} docs"
          f" ({runner or 'default runner'}) ...", file=sys.stderr, flush=True)
    argv = pipeline_argv(corpus_dir, out_dir, params, runner)
    result = {"kind": "clusters", "system": "ours", "docs": docs,
              "runner": runner or DEFAULT_RUNNER}
    if self.in_process:
      from pipeline.cli import main
      start = time.perf_counter()
      code = main(argv)
      result["seconds"] = time.perf_counter() - start
      if code != 0:
        return dict(result, error=f"pipeline exited with {code}")
    else:
      child = self._spawn([sys.executable, "-m", "pipeline"] + argv)
      if child["returncode"] != 0:
        return dict(result, error=child["stderr"][-2000:])
      result["seconds"] = child["wall_s"]
      result["peak_rss_mb"] = child["peak_rss_mb"]
      result["tree_peak_rss_mb"] = child["tree_peak_rss_mb"]
    corpus = corpora.read(corpus_dir)
    result["corpus"] = corpus.name
    result["bytes"] = sum(len(t.encode("utf-8")) for t in corpus.texts)
    strong = systems.pairs_at_least(corpus.texts, corpus.groups,
                                    params["ngram"], params["threshold"])
    result.update(read_pipeline_output(out_dir, corpus.groups, strong))
    return result


SCRIPT = " script"


def run_script(runner: Runner, spec: dict, workdir: str) -> dict:
  """``spec``'s peer as a user's script on the corpus file
  (:func:`bench.systems.dedup_jsonl`), as the row of system ``"<peer>
  script"``."""
  out = os.path.join(workdir, f"{spec['system']}-script-{spec['docs']}.jsonl")
  r = runner.measure(dict(spec, kind="script", output=out))
  return dict(r, system=spec["system"] + SCRIPT)


def read_pipeline_output(out_dir: str, groups, strong_pairs) -> dict:
  """Pairwise metrics from ``clusters/`` and the shuffle volume from
  ``stats.json`` (one input file, so position - 1 is the corpus index)."""
  labels = {}
  for path in sorted(glob.glob(os.path.join(out_dir, "clusters", "*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      for line in f:
        row = json.loads(line)
        labels[row["position"] - 1] = row["cluster_id"]
  with open(os.path.join(out_dir, "stats.json"), encoding="utf-8") as f:
    stats = json.load(f)
  out = systems.pair_metrics(labels, groups, strong_pairs)
  out["stats"] = {k: stats[k] for k in (
      "docs_in", "kept", "removed", "rejected", "candidate_edges",
      "verified_edges", "clusters", "cc_rounds_used") if k in stats}
  shuffle = stats.get("shuffle_bytes")
  if shuffle:
    out["shuffle_bytes"] = shuffle
    out["shuffle_bytes_per_doc"] = sum(shuffle.values()) / stats["docs_in"]
    out["shuffle_bytes_per_doc_by_shuffle"] = {
        k: v / stats["docs_in"] for k, v in shuffle.items()}
  return out


def compare_runners(runner: Runner, names: str, sizes: dict, e2e_rows,
                    scale, corpus, params: dict, workdir: str) -> List[dict]:
  """Ours on each local runner, seed-style corpus, at ``runners_tiny``,
  ``e2e_seed`` and ``scale`` documents; the default runner's rows at the
  last two sizes are those of the end-to-end and scale runs."""
  rows = []
  for name in (n.strip() for n in names.split(",") if n.strip()):
    for key in ("runners_tiny", "e2e_seed", "scale"):
      if not sizes[key]:
        continue
      if name == "PrismRunner" and find_prism() is None:
        rows.append({"runner": name, "docs": sizes[key],
                     "error": missing_prism_reason()})
        continue
      reuse = ([r for r in e2e_rows if r.get("corpus") == "seed-style"
                and r["system"] == "ours"] if key == "e2e_seed"
               else [scale] if key == "scale" else [])
      if name == DEFAULT_RUNNER and reuse and "seconds" in reuse[0]:
        rows.append(dict(reuse[0], runner=name))
        continue
      spec = {"kind": "clusters", "system": "ours", "docs": sizes[key],
              "corpus": corpus(key, "seed-style"),
              "params": params["seed-style"]}
      out_dir = os.path.join(workdir, f"{key}-{name}-out")
      runs = [runner.pipeline(spec, out_dir, runner=name)
              for _ in range(TINY_RUNS if key == "runners_tiny" else 1)]
      rows.append(dict(median_run(runs), corpus="seed-style"))
  return rows


def median_run(runs: List[dict]) -> dict:
  """The run of median wall time (the first failed one, if any failed),
  with every run's seconds as ``seconds_runs`` when there are several."""
  failed = [r for r in runs if "seconds" not in r]
  if failed:
    return failed[0]
  ordered = sorted(runs, key=lambda r: r["seconds"])
  middle = dict(ordered[(len(ordered) - 1) // 2])
  if len(runs) > 1:
    middle["seconds_runs"] = [round(r["seconds"], 3) for r in runs]
  return middle


# ----------------------------------------------------------------- report




def ratios(sig: List[dict], e2e: List[dict]) -> dict:
  """docs/s ours / peer for signatures; wall time ours / peer end to end."""
  out = {"signatures_docs_per_s_ours_over_peer": {},
         "end_to_end_wall_ours_over_peer": {}}
  for corpus in sorted({r.get("corpus") for r in sig if "seconds" in r}):
    rows = {r["system"]: r for r in sig
            if r.get("corpus") == corpus and "seconds" in r}
    table = {}
    for ours in (s for s in rows if s.startswith("ours-")):
      for peer in (s for s in rows if not s.startswith("ours-")):
        table[f"{ours}/{peer}"] = (rows[ours]["docs_per_s"]
                                   / rows[peer]["docs_per_s"])
    out["signatures_docs_per_s_ours_over_peer"][corpus] = table
  for key in sorted({(r.get("corpus"), r["docs"]) for r in e2e
                     if "seconds" in r and r["system"] == "ours"}):
    rows = {r["system"]: r for r in e2e
            if (r.get("corpus"), r["docs"]) == key and "seconds" in r}
    out["end_to_end_wall_ours_over_peer"][f"{key[0]}@{key[1]}"] = {
        f"ours/{p}": rows["ours"]["seconds"] / rows[p]["seconds"]
        for p in rows if p != "ours"}
  return out


def _find(rows, **match):
  for r in rows:
    if all(r.get(k) == v for k, v in match.items()) and "seconds" in r:
      return r
  return None


def _target(tid, text, measured, ok, note="") -> dict:
  """One target's row: ERROR when the note is an error, SKIP when not
  measured (``ok`` None), else PASS or FAIL."""
  status = ("ERROR" if note.startswith("error") else "SKIP" if ok is None
            else "PASS" if ok else "FAIL")
  return {"id": tid, "target": text, "measured": measured, "status": status,
          "note": note}


def evaluate_targets(sig, e2e, scale, sizes) -> List[dict]:
  targets = []

  def add(*args, **kwargs):
    targets.append(_target(*args, **kwargs))

  def failed(rows, **match):
    return [r["error"].strip().splitlines()[-1] for r in rows
            if all(r.get(k) == v for k, v in match.items()) and "error" in r]

  for tid, corpus, sketch, limit in (("1a", "web-like", "classic", 2.0),
                                     ("1b", "seed-style", "classic", 1.5),
                                     ("2", "web-like", "oph", 5.0)):
    ours = _find(sig, corpus=corpus, system=f"ours-{sketch}")
    peer = _find(sig, corpus=corpus, system="rensa")
    r = ours["docs_per_s"] / peer["docs_per_s"] if ours and peer else None
    errors = (failed(sig, corpus=corpus, system=f"ours-{sketch}")
              + failed(sig, corpus=corpus, system="rensa"))
    n = CORPUS_PARAMS[corpus]["ngram"]
    add(tid, f"{sketch} signatures >= {limit}x rensa docs/s, {corpus}"
        f" ({n}-grams)", None if r is None else round(r, 2),
        None if r is None else r >= limit,
        f"error: {errors[0]}" if errors else
        "" if r is not None else "not measured")

  n = sizes["e2e_seed"]
  ours = _find(e2e, corpus="seed-style", system="ours", docs=n)
  size_note = ("" if n == TARGET_E2E_DOCS else
               f"measured at {n:,} docs (target is stated for 100,000)")
  for tid, peer, text in (
      ("3a", "rensa", "ours wall <= 2x rensa in-memory signatures+LSH"),
      ("3b", "datasketch", "ours >= 5x faster than datasketch")):
    other = _find(e2e, corpus="seed-style", system=peer, docs=n)
    errors = (failed(e2e, corpus="seed-style", system="ours")
              + failed(e2e, corpus="seed-style", system=peer))
    r = None
    if ours and other:
      r = (ours["seconds"] / other["seconds"] if tid == "3a"
           else other["seconds"] / ours["seconds"])
    add(tid, f"end to end seed-style: {text}",
        None if r is None else round(r, 2),
        None if r is None else (r <= 2.0 if tid == "3a" else r >= 5.0),
        f"error: {errors[0]}" if errors else size_note)

  if not scale or "seconds" not in scale:
    add("4", "1,000,000 seed-style docs end to end < 300 s, peak RSS"
        " < 4 GB, time(1M)/time(100k) <= 12", None, None,
        "full mode only" if not scale else "error: " + scale.get("error", ""))
  else:
    small = ours["seconds"] if ours else None
    growth = scale["seconds"] / small if small else None
    rss = scale.get("peak_rss_mb")
    ok = (scale["seconds"] < 300 and rss is not None and rss < 4096
          and growth is not None and growth <= 12)
    note = ("" if scale["docs"] == TARGET_SCALE_DOCS and n == TARGET_E2E_DOCS
            else f"measured at {scale['docs']:,} vs {n:,} docs")
    add("4", "1,000,000 seed-style docs end to end < 300 s, peak RSS"
        " < 4 GB, time(1M)/time(100k) <= 12",
        {"seconds": round(scale["seconds"], 1), "peak_rss_mb": rss,
         "growth": None if growth is None else round(growth, 2)}, ok, note)
  return targets


def evaluate_issue_12(e2e, scale, scale_peers, runner_rows, sizes,
                      profiles: Optional[List[dict]] = None) -> List[dict]:
  """The targets of issue 12: the fixed cost of a tiny run, ours against
  rensa at 100k and 1M documents (wall and peak RSS), the growth from 100k
  to 1M, Beam's share of ``profiles`` (``bench.beam_share.profile_job``'s
  results at e2e_seed documents; SKIP when None or empty) and the shuffle
  volume per document."""
  targets = []

  def add(*args, **kwargs):
    targets.append(_target(*args, **kwargs))

  targets.append(_tiny_target("12.1", runner_rows, sizes, 3.0))
  n = sizes["e2e_seed"]
  ours = _find(e2e, corpus="seed-style", system="ours", docs=n)
  targets.append(_rensa_target("12.2", e2e, "seed-style", n, 1.5,
                               "not measured"))
  big = scale if scale and "seconds" in scale else None
  targets.append(_scale_target("12.3a", big, scale_peers, 0.7, 0.5))
  growth = big["seconds"] / ours["seconds"] if big and ours else None
  add("12.3b", "time(scale)/time(e2e-seed) <= 10",
      growth and round(growth, 2), growth and growth <= 10,
      "" if growth else "needs --scale")
  text = (f"Beam machinery < {beam_share.BEAM_LIMIT:.0f}% of a {n:,}-doc"
          f" profile (median of {len(profiles or ())}) and no PickleCoder"
          " samples")
  errors = [r["error"] for r in profiles or () if "error" in r]
  if errors:
    add("12.4", text, None, None,
        "error: " + errors[0].strip().splitlines()[-1])
  elif profiles:
    measured = beam_share.summary(profiles)
    add("12.4", text, measured, beam_share.passes(measured))
  else:
    add("12.4", text, None, None, "needs --profile-runs")
  per_doc = ours.get("shuffle_bytes_per_doc") if ours else None
  add("12.5", f"shuffle bytes/doc at {n:,} <= {ISSUE_12_SHUFFLE_B_PER_DOC:,}"
      " (when issue 12 was filed)", per_doc and round(per_doc),
      per_doc and per_doc <= ISSUE_12_SHUFFLE_B_PER_DOC,
      "" if per_doc else "not measured")
  return targets


def evaluate_issue_31(e2e, scale, scale_peers, runner_rows, sizes
                      ) -> List[dict]:
  """The targets of issue 31: a tiny run's wall, ours against rensa at
  e2e_seed documents on both corpora (wall) and at the scale size (wall
  and peak RSS)."""
  targets = [_tiny_target("31.1", runner_rows, sizes, 1.5)]
  for tid, corpus, key in (("31.2", "seed-style", "e2e_seed"),
                           ("31.3", "web-like", "e2e_web")):
    targets.append(_rensa_target(
        tid, e2e, corpus, sizes[key], 1.0,
        f"needs --{key.replace('_', '-')} and rensa"))
  big = scale if scale and "seconds" in scale else None
  targets.append(_scale_target("31.4", big, scale_peers, 0.5, 0.35))
  return targets


def _tiny_target(tid, runner_rows, sizes, limit_s) -> dict:
  """The tiny run's median wall on the default runner, at most ``limit_s``."""
  tiny = _find(runner_rows, runner=DEFAULT_RUNNER, docs=sizes["runners_tiny"])
  return _target(tid, f"a {sizes['runners_tiny']:,}-document run <="
                 f" {limit_s:g} s wall ({DEFAULT_RUNNER}, median of"
                 f" {TINY_RUNS} runs)", tiny and round(tiny["seconds"], 2),
                 tiny and tiny["seconds"] <= limit_s,
                 "" if tiny else "not measured")


def _rensa_target(tid, e2e, corpus, n, bound, missing) -> dict:
  """Ours' wall over rensa's (in memory) on ``n`` documents of ``corpus``,
  at most ``bound``; ``missing`` is the note when either was not run."""
  ours = _find(e2e, corpus=corpus, system="ours", docs=n)
  rensa = _find(e2e, corpus=corpus, system="rensa", docs=n)
  r = ours["seconds"] / rensa["seconds"] if ours and rensa else None
  return _target(tid, f"{n:,} {corpus} docs: ours wall <= {bound}x rensa's",
                 r and round(r, 2), r and r <= bound, "" if r else missing)


def _scale_target(tid, big, scale_peers, wall_bound, rss_bound) -> dict:
  """Ours at the scale size against rensa: wall and peak RSS ratios."""
  text = (f"{big['docs'] if big else 1_000_000:,} docs: ours wall <="
          f" {wall_bound}x rensa's and peak RSS <= {rss_bound}x")
  peer = _find(scale_peers, system="rensa")
  if not (big and peer):
    return _target(tid, text, None, None,
                   "needs --scale and rensa in --scale-peers")
  wall = big["seconds"] / peer["seconds"]
  rss = big["peak_rss_mb"] / peer["peak_rss_mb"]
  return _target(tid, text, {"wall": round(wall, 2), "rss": round(rss, 2)},
                 wall <= wall_bound and rss <= rss_bound)


def _fmt(x, digits=2):
  if x is None:
    return "-"
  if isinstance(x, dict):
    return ", ".join(f"{k} {_fmt(v)}" for k, v in x.items())
  if isinstance(x, float):
    return f"{x:,.{digits}f}"
  return f"{x:,}" if isinstance(x, int) else str(x)


def markdown(results: dict) -> str:
  m = results["machine"]
  pinning = ("pinned to one CPU" if results.get("pinned_cpu") is not None
             else "free to use every CPU (--unpinned)")
  lines = [f"### Benchmark {results['date']} ({results['mode']})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores; every measurement in a"
           f" fresh process {pinning}; load average at start"
           f" {', '.join(f'{x:.2f}' for x in m['load_avg_start'])}, at end"
           f" {', '.join(f'{x:.2f}' for x in m['load_avg_end'])}."
           f" Python {m['python']}, rensa {m['versions']['rensa']},"
           f" datasketch {m['versions']['datasketch']}, numpy"
           f" {m['versions']['numpy']}, numba {m['versions']['numba']}."
           f" Ours runs on {DEFAULT_RUNNER} with one in-process SDK worker"
           " (the CLI's default).", ""]
  for name, p in results["params"].items():
    lines.append(f"- {name}: word {p['ngram']}-grams, K={p['num_perm']},"
                 f" {p['bands']} bands x {p['rows']} rows ({p['chosen_by']}),"
                 f" threshold {p['threshold']} (ours verifies edges at it;"
                 f" rensa/datasketch/seed-numpy do not verify)")
  lines += ["", "Signatures (raw text -> K=128 signatures, one core):", "",
            "| corpus | system | docs | docs/s | MB/s | peak RSS MB |"
            " ours-classic ÷ this | ours-oph ÷ this |",
            "|---|---|---|---|---|---|---|---|"]
  sr = results["ratios"]["signatures_docs_per_s_ours_over_peer"]
  for r in results["signatures"]:
    c = r.get("corpus", "?")
    if "error" in r:
      lines.append(f"| {c} | {r['system']} | {_fmt(r['docs'])} | error | | |"
                   " | |")
      continue
    ratio = sr.get(c, {})
    lines.append(
        f"| {c} | {r['system']} | {_fmt(r['docs'])} |"
        f" {_fmt(r['docs_per_s'], 0)} | {_fmt(r['mb_per_s'])} |"
        f" {_fmt(r.get('peak_rss_mb'), 0)} |"
        f" {_fmt(ratio.get('ours-classic/' + r['system']))} |"
        f" {_fmt(ratio.get('ours-oph/' + r['system']))} |")
  lines += ["", "End to end (ours: `python -m pipeline`, process start and"
            " output files included; peers: in memory, signatures + LSH +"
            " union-find; `<peer> script`: the peer as a user's script on"
            " the corpus file, the whole process timed as ours is):", "",
            "| corpus | system | docs | wall s | peak RSS MB | precision |"
            " recall | recall at threshold | ours wall ÷ this |"
            " shuffle B/doc |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  er = results["ratios"]["end_to_end_wall_ours_over_peer"]
  for r in (results["end_to_end"]
            + ([results["scale"]] if results["scale"] else [])
            + results.get("scale_peers", [])):
    c = r.get("corpus", "?")
    if "error" in r:
      lines.append(f"| {c} | {r['system']} | {_fmt(r['docs'])} | error | | |"
                   " | | | |")
      continue
    ratio = er.get(f"{c}@{r['docs']}", {}).get("ours/" + r["system"])
    lines.append(
        f"| {c} | {r['system']} | {_fmt(r['docs'])} | {_fmt(r['seconds'])}"
        f" | {_fmt(r.get('peak_rss_mb'), 0)} |"
        f" {_fmt(r.get('precision'), 3)} |"
        f" {_fmt(r.get('recall'), 3)} | {_fmt(r.get('recall_at_threshold'), 3)} |"
        f" {_fmt(ratio)} |"
        f" {_fmt(r.get('shuffle_bytes_per_doc'), 0)} |")
  shuffled = [r for r in results["end_to_end"] + [results["scale"] or {}]
              if r.get("shuffle_bytes_per_doc_by_shuffle")]
  if shuffled:
    lines += ["", "Shuffle bytes per document (ours, from stats.json):", ""]
    for r in shuffled:
      parts = ", ".join(f"{k} {v:,.0f}" for k, v in
                        r["shuffle_bytes_per_doc_by_shuffle"].items())
      lines.append(f"- {r['corpus']} @ {r['docs']:,}: total"
                   f" {r['shuffle_bytes_per_doc']:,.0f} ({parts})")
  if results.get("runners"):
    lines += ["", "Local runners (ours end to end, seed-style, whole process"
              " tree's peak RSS sampled every 50 ms):", "",
              "| runner | docs | wall s | peak RSS MB (tree) |"
              " ÷ FnApiRunner wall |", "|---|---|---|---|---|"]
    base = {r["docs"]: r["seconds"] for r in results["runners"]
            if r["runner"] == "FnApiRunner" and "seconds" in r}
    for r in results["runners"]:
      if "error" in r:
        lines.append(f"| {r['runner']} | {_fmt(r['docs'])} | error:"
                     f" {r['error'].strip().splitlines()[-1][:120]} | | |")
        continue
      ratio = (r["seconds"] / base[r["docs"]] if r["docs"] in base else None)
      runs = (f" (median of {', '.join(_fmt(x) for x in r['seconds_runs'])})"
              if r.get("seconds_runs") else "")
      lines.append(f"| {r['runner']} | {_fmt(r['docs'])} |"
                   f" {_fmt(r['seconds'])}{runs} |"
                   f" {_fmt(r.get('tree_peak_rss_mb'), 0)} | {_fmt(ratio)} |")
  if results.get("profiles"):
    lines += ["", f"Profiles of ours on {results['sizes']['e2e_seed']:,}"
              f" seed-style docs (py-spy {beam_share.RATE} Hz, the job pinned"
              " to one CPU, py-spy on another; shares of the non-idle"
              " samples):", ""] + beam_share.table(results["profiles"])
  if results.get("fixed_cost"):
    lines += ["", "Fixed cost: where ours' wall goes (seconds, median of"
              f" {results['fixed_cost_runs']} runs of each tree, interleaved;"
              " `bench/fixed_cost.py`):", ""]
    lines += fixed_cost.table(results["fixed_cost"])
  lines += ["", "Targets (issues 3, 12 and 31):", ""]
  for t in results["targets"]:
    note = f" — {t['note']}" if t["note"] else ""
    lines.append(f"- {t['status']} {t['id']}: {t['target']}: measured"
                 f" {_fmt(t['measured'])}{note}")
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------- main


def parse_args(argv):
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--quick", action="store_true",
                      help="small sizes (~2-3 min on 2 cores): "
                      + json.dumps(SIZES["quick"]))
  for key in SIZES["full"]:
    parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None,
                        dest=key, help=f"documents for {key} (0 = skip;"
                        f" full {SIZES['full'][key]:,})")
  parser.add_argument("--repeats", type=int, default=3,
                      help="timed signature passes; the best counts")
  parser.add_argument("--sketches", default="classic,oph",
                      help="our sketches to measure (signature_batch's"
                      " sketch=), comma-separated")
  parser.add_argument("--runners", default=",".join(LOCAL_RUNNERS),
                      help="local runners to compare end to end (ours),"
                      " comma-separated; PrismRunner needs"
                      " scripts/install_prism.sh")
  parser.add_argument("--scale-peers", default=",".join(SCALE_PEERS),
                      help="peers also run on the --scale corpus,"
                      " comma-separated (empty: none)")
  parser.add_argument("--seed", type=int, default=42,
                      help="seed of the corpora and of every hash function")
  parser.add_argument("--out", default=None,
                      help="results JSON (default bench/results/<date>.json)")
  parser.add_argument("--workdir", default=None,
                      help="where corpora and pipeline outputs go (default: a"
                      " temporary directory, removed afterwards)")
  parser.add_argument("--profile-runs", type=int, default=0,
                      help="py-spy profiles of ours on the e2e seed-style"
                      " corpus, for target 12.4 (0 = none; the issue 12 run"
                      " uses 5)")
  parser.add_argument("--e2e-peers", default=",".join(E2E_PEERS),
                      help="peers run end to end beside ours on the e2e"
                      " corpora, comma-separated")
  parser.add_argument("--peer-scripts", action="store_true",
                      help="also run each end-to-end and scale peer as a"
                      " user's script on the corpus file (read the JSONL,"
                      " write the kept lines), timed as a whole process like"
                      " ours")
  parser.add_argument("--unpinned", action="store_true",
                      help="let every measured process use every CPU")
  parser.add_argument("--fixed-cost-runs", type=int, default=0,
                      help="runs of bench/fixed_cost.py's phase timing of"
                      " ours at --runners-tiny and --e2e-seed documents"
                      " (0 = none; the issue 31 run uses 5)")
  parser.add_argument("--baseline-tree", default=None,
                      help="a checkout of earlier code that the fixed-cost"
                      " timing also runs (before and after)")
  parser.add_argument("--in-process", action="store_true",
                      help="measure in this process (no pinning, no"
                      " per-system RSS); for tests")
  return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
  args = parse_args(argv)
  mode = "quick" if args.quick else "full"
  sizes = {k: (v if getattr(args, k) is None else getattr(args, k))
           for k, v in SIZES[mode].items()}
  if (min(sizes.values()) < 0 or not sizes["sig_seed"]
      or not sizes["e2e_seed"] or args.profile_runs < 0):
    raise SystemExit("--sig-seed and --e2e-seed must be positive; the other"
                     " sizes and --profile-runs must be >= 0")
  sketches = [s for s in args.sketches.split(",") if s]
  now = datetime.datetime.now(datetime.timezone.utc)
  workdir = args.workdir or tempfile.mkdtemp(prefix="neardup-bench-")
  runner = Runner(args.in_process, pinned=not args.unpinned)
  results = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "mode": mode,
             "sizes": sizes, "machine": machine_info(),
             "pinned_cpu": runner.cpu,
             "params": {name: corpus_params(name, args.seed)
                        for name in CORPUS_PARAMS}}
  corpus_dirs = {}

  def corpus(key, name):
    """The corpus of size ``sizes[key]``, generated once into the workdir."""
    if key not in corpus_dirs:
      print(f"[bench] generating {name} corpus of {sizes[key]:,} docs ...",
            file=sys.stderr, flush=True)
      corpus_dirs[key] = os.path.join(workdir, key)
      corpora.write(GENERATORS[name](sizes[key], seed=args.seed),
                    corpus_dirs[key])
    return corpus_dirs[key]

  sig_rows, e2e_rows, scale, scale_peers, profiles = [], [], None, [], []
  fixed = {}
  try:
    for key, name in SIG_CORPORA:
      for system in ([f"ours-{s}" for s in sketches] + list(PEERS)
                     if sizes[key] else ()):
        r = runner.measure({"kind": "signatures", "system": system,
                            "corpus": corpus(key, name), "docs": sizes[key],
                            "params": results["params"][name],
                            "repeats": args.repeats})
        r.setdefault("corpus", name)
        if "seconds" in r:
          r["docs_per_s"] = r["docs"] / r["seconds"]
          r["mb_per_s"] = r["bytes"] / r["seconds"] / 1e6
        sig_rows.append(r)
    e2e_peers = tuple(p for p in args.e2e_peers.split(",") if p)
    for key, name in E2E_CORPORA:
      for system in ("ours",) + e2e_peers if sizes[key] else ():
        spec = {"kind": "clusters", "system": system,
                "corpus": corpus(key, name), "docs": sizes[key],
                "params": results["params"][name]}
        r = (runner.pipeline(spec, os.path.join(workdir, key + "-out"))
             if system == "ours" else runner.measure(spec))
        e2e_rows.append(dict(r, corpus=name))
        if system != "ours" and args.peer_scripts:
          e2e_rows.append(dict(run_script(runner, spec, workdir), corpus=name))
    for i in range(1, args.profile_runs + 1):
      print(f"[bench] profile {i} of {args.profile_runs} of ours on"
            f" {sizes['e2e_seed']:,} docs ...", file=sys.stderr, flush=True)
      # A child even with --in-process: py-spy samples from outside.
      argv = pipeline_argv(corpus("e2e_seed", "seed-style"),
                           os.path.join(workdir, "e2e_seed-profile-out"),
                           results["params"]["seed-style"])
      profiles.append(beam_share.profile_job(
          argv, os.path.join(workdir, f"profile-{i}.txt")))
    if sizes["scale"]:
      spec = {"kind": "clusters", "system": "ours",
              "corpus": corpus("scale", "seed-style"), "docs": sizes["scale"],
              "params": results["params"]["seed-style"]}
      scale = dict(runner.pipeline(spec, os.path.join(workdir, "scale-out")),
                   corpus="seed-style")
      for system in (p.strip() for p in args.scale_peers.split(",")):
        if system:
          scale_peers.append(dict(runner.measure(dict(spec, system=system)),
                                  corpus="seed-style"))
          if args.peer_scripts:
            scale_peers.append(dict(run_script(
                runner, dict(spec, system=system), workdir),
                corpus="seed-style"))
    runner_rows = compare_runners(runner, args.runners, sizes, e2e_rows,
                                  scale, corpus, results["params"], workdir)
    if args.fixed_cost_runs:
      trees = {"this tree": ROOT}
      if args.baseline_tree:
        trees = {"baseline": os.path.abspath(args.baseline_tree), **trees}
      for key in ("runners_tiny", "e2e_seed"):
        if sizes[key]:
          print(f"[bench] fixed cost at {sizes[key]:,} docs ...",
                file=sys.stderr, flush=True)
          fixed[sizes[key]] = fixed_cost.breakdown(
              trees, corpus(key, "seed-style"), results["params"]["seed-style"],
              args.fixed_cost_runs, pinned=not args.unpinned)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)

  results["signatures"] = sig_rows
  results["end_to_end"] = e2e_rows
  results["scale"] = scale
  results["scale_peers"] = scale_peers
  results["runners"] = runner_rows
  results["profiles"] = profiles
  results["fixed_cost"] = fixed
  results["fixed_cost_runs"] = args.fixed_cost_runs
  results["ratios"] = ratios(sig_rows, e2e_rows + ([scale] if scale else [])
                             + scale_peers)
  results["targets"] = (
      evaluate_targets(sig_rows, e2e_rows, scale, sizes)
      + evaluate_issue_12(e2e_rows, scale, scale_peers, runner_rows, sizes,
                          profiles=profiles)
      + evaluate_issue_31(e2e_rows, scale, scale_peers, runner_rows, sizes))
  results["machine"]["load_avg_end"] = os.getloadavg()
  out = args.out or os.path.join(ROOT, "bench", "results",
                                 now.strftime("%Y-%m-%d") + ".json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(markdown(results))
  print(f"[bench] results written to {out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
