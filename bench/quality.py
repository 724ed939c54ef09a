#!/usr/bin/env python3
"""Document-level quality of near-duplicate detection on real text.

Usage: ``python bench/quality.py [--corpus
licence|families|committed|pypi|npm] [--threshold 0.8] [--max_files N]
[--modes exact,signature,none,...] [--baseline DIR] [--datasketch]``

Builds the corpus (``licence``: tests/corpus.py's real-text corpus, licence
and copyright texts of this machine cut into chunks with planted variants;
``families``: bench/families.py's template-family corpus, every paragraph of
those files, verbatim copies included; ``committed``, ``pypi``, ``npm``: the
corpora frozen in tests/data/), computes the exact truth
(pipeline.tools.truth's kernel: all pairs with Jaccard >= t over word 5-grams),
runs the job once per mode through pipeline.cli.main and reports pairwise
and document-level precision, recall and F1 (pipeline.tools.evaluate), the
candidate, verified and graph edges, candidates per document, LSH buckets
above the exhaustive size and the wall time. Modes are verify modes, plus
``exhaustive`` (exact, every bucket compared in full: what the bounded work
above ``--exhaustive_bucket_size`` costs in recall) and ``star`` (exact with
``--exhaustive_bucket_size 2``: every bucket searched for its components).
``--baseline DIR`` also runs every mode with the code of the checkout DIR
(e.g. a ``git worktree`` of an older commit), alternating with this one;
then both run as subprocesses (``python -m pipeline``), so their wall times
compare. ``--datasketch`` adds plain MinHashLSH + union-find (no
verification) over the same shingle sets as the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# pylint: disable=wrong-import-position
from pipeline import cli  # noqa: E402
from pipeline.tools import evaluate, truth  # noqa: E402
from bench.families import template_family_corpus  # noqa: E402
from tests.corpus import (COMMITTED_CORPORA, committed_corpus,  # noqa
                          real_text_corpus, stats_of, write_jsonl)
from transforms.config import DedupConfig  # noqa: E402
from transforms.kernels import connected as graph  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--corpus", choices=sorted(_CORPORA), default="licence")
  parser.add_argument("--threshold", type=float, default=0.8)
  parser.add_argument("--max_files", type=int, default=0)
  parser.add_argument("--modes", default="exact,signature,none")
  parser.add_argument("--extra", default="",
                      help="More job flags, e.g. '--bands 9 --rows 13'.")
  parser.add_argument("--baseline", default=None, metavar="DIR",
                      help="Also run each mode with the code of this"
                      " checkout (as subprocesses, alternating).")
  parser.add_argument("--repeat", type=int, default=1,
                      help="Runs of each (mode, code), alternating; the"
                      " median wall time counts.")
  parser.add_argument("--datasketch", action="store_true")
  args = parser.parse_args(argv)

  ids, texts = _CORPORA[args.corpus](args.max_files)
  config = DedupConfig(threshold=args.threshold)
  start = time.time()
  a, b, similarity = truth.exact_pairs(texts, config)
  truth_s = time.time() - start
  pairs = [(ids[i], ids[j]) for i, j in zip(a.tolist(), b.tolist())]
  labels = graph.union_find_labels(pairs)
  true = evaluate.Truth({k: str(v) for k, v in labels.items()}, pairs,
                        similarity)
  print(f"corpus: {len(texts):,} documents, {sum(len(t.split()) for t in texts):,}"
        f" words; truth: {len(pairs):,} pairs >= {args.threshold}, "
        f"{len(labels):,} duplicate documents ({truth_s:.1f} s)")
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "corpus.jsonl")
    write_jsonl(path, texts, ids)
    runs = [(mode, code) for mode in args.modes.split(",") if mode
            for code in ([None] if args.baseline is None
                         else [args.baseline, ROOT])]
    walls = {}
    if args.baseline is not None:
      # numba compiles each checkout's kernels on first use (tens of
      # seconds): one untimed run of each first.
      for i, code in enumerate((args.baseline, ROOT)):
        for verify in ("signature", "exact"):
          subprocess.run([sys.executable, "-m", "pipeline", "--input", path,
                          "--output", os.path.join(tmp, f"warm{i}{verify}"),
                          "--threshold", str(args.threshold), "--verify",
                          verify], cwd=code, check=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for repeat, (mode, code) in [(r, run) for r in range(args.repeat)
                                 for run in runs]:
      name = mode if code in (None, ROOT) else f"{mode}@baseline"
      out = os.path.join(tmp, name)
      argv = (["--input", path, "--output", out, "--threshold",
               str(args.threshold)] + _MODES.get(mode, ["--verify", mode])
              + args.extra.split())
      start = time.time()
      if code is None:
        assert cli.main(argv + ["--overwrite", "true"]) == 0
      else:
        subprocess.run([sys.executable, "-m", "pipeline", *argv,
                        "--overwrite", "true"], cwd=code, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      walls.setdefault(name, []).append(time.time() - start)
      if repeat < args.repeat - 1:
        continue
      wall = sorted(walls[name])[len(walls[name]) // 2]
      stats = stats_of(out)
      report = evaluate.evaluate(evaluate.read_clusters(out), true,
                                 stats["docs_in"] - stats["rejected"],
                                 stats["params"])
      results[name] = report
      p = stats["params"]
      report["run"] = {
          "wall_s": round(wall, 1),
          "walls_s": [round(w, 1) for w in walls[name]], "bands_rows": f"{p['bands']}x{p['rows']}",
          "candidates_per_doc": round(stats["candidate_edges"] / len(texts),
                                      3),
          **{k: stats[k] for k in ("candidate_edges", "verified_edges",
                                   "graph_edges", "verify_removed_edges",
                                   "buckets_multi", "buckets_large",
                                   "chain_docs", "clusters")}}
      print(f"\n{name}: {p['bands']}x{p['rows']} (S-curve "
            f"~{p['lsh_threshold']:.3f}), candidates "
            f"{stats['candidate_edges']:,} "
            f"({stats['candidate_edges'] / len(texts):.2f} per document), "
            f"verified {stats['verified_edges']:,}, graph edges "
            f"{stats['graph_edges']:,}, buckets above "
            f"{p['exhaustive_bucket_size']}: {stats['buckets_large']:,} of "
            f"{stats['buckets_multi']:,}, {wall:.1f} s")
      print(evaluate.format_report(report))
  if args.datasketch:
    results["datasketch"] = _datasketch(ids, texts, config, true)
  print(json.dumps({m: {"doc_f1": r["documents"]["f1"],
                        "doc_recall": r["documents"]["recall"],
                        "doc_precision": r["documents"]["precision"],
                        "pair_recall": r["pairs"]["recall"],
                        "pair_precision": r["pairs"]["precision"],
                        **r.get("run", {})}
                    for m, r in results.items()}, indent=1))
  return 0


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CORPORA = {
    "licence": real_text_corpus,
    "families": lambda max_files: template_family_corpus(),
    **{("committed" if name == "licence" else name):
       (lambda max_files, name=name: committed_corpus(name))
       for name in COMMITTED_CORPORA},
}
_MODES = {
    "exhaustive": ["--verify", "exact", "--exhaustive_bucket_size", "4096"],
    "star": ["--verify", "exact", "--exhaustive_bucket_size", "2"],
}


def _datasketch(ids, texts, config, true):
  """Plain MinHashLSH + union-find over our shingle sets (the reference)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from datasketch import MinHash, MinHashLSH  # pylint: disable=import-outside-toplevel
  values, offsets = truth.shingle_sets(texts, config)
  lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm)
  edges = []
  for i in range(len(texts)):
    doc = values[offsets[i]:offsets[i + 1]]
    if not len(doc):
      continue
    m = MinHash(num_perm=config.num_perm, seed=1)
    m.update_batch([x.tobytes() for x in doc.view(np.uint64)])
    edges.extend((j, i) for j in lsh.query(m))
    lsh.insert(i, m)
  labels = graph.union_find_labels(edges)
  predicted = {ids[k]: v for k, v in labels.items()}
  report = evaluate.evaluate(predicted, true, len(texts), None)
  print(f"\ndatasketch MinHashLSH(threshold={config.threshold}) "
        f"{lsh.b}x{lsh.r} + union-find, no verification")
  print(evaluate.format_report(report))
  return report


if __name__ == "__main__":
  sys.exit(main())
