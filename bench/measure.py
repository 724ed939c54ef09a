"""One measurement, meant to run in a fresh process pinned to one CPU.

``python -m bench.measure '<spec as JSON>'`` prints the result as one JSON
line. Specs:

* ``{"kind": "signatures", "system", "corpus", "docs", "params", "repeats"}``:
  raw texts -> signatures; the best of ``repeats`` timed passes after an
  untimed warm-up pass over the first 256 documents (JIT compilation, caches).
* ``{"kind": "clusters", "system", "corpus", "docs", "params"}``: raw texts ->
  signatures -> LSH -> union-find in memory, timed once, plus pairwise
  precision/recall against the planted groups (and recall over the planted
  pairs whose exact Jaccard reaches the threshold).

Reading the corpus is not timed. ``rss_before_mb`` is the process's peak RSS
after loading it, so the system's own footprint is the difference to the
peak the parent reads with ``wait4``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from bench import corpora
from bench import systems

WARMUP_DOCS = 256


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(spec: dict) -> dict:
  corpus = corpora.read(spec["corpus"])
  texts = corpus.texts[:spec["docs"]]
  groups = [g for g in ([i for i in g if i < len(texts)] for g in corpus.groups)
            if len(g) > 1]
  params = spec["params"]
  result = {"kind": spec["kind"], "system": spec["system"],
            "corpus": corpus.name, "docs": len(texts),
            "bytes": sum(len(t.encode("utf-8")) for t in texts),
            "rss_before_mb": round(_peak_rss_mb(), 1),
            "cpus": sorted(os.sched_getaffinity(0))}
  if spec["kind"] == "signatures":
    sign = systems.signer(spec["system"], params)
    sign(texts[:WARMUP_DOCS])
    times = []
    for _ in range(spec["repeats"]):
      start = time.perf_counter()
      sign(texts)
      times.append(time.perf_counter() - start)
    result["seconds"] = min(times)
    result["all_seconds"] = times
  elif spec["kind"] == "clusters":
    start = time.perf_counter()
    labels = systems.CLUSTERERS[spec["system"]](texts, params)
    result["seconds"] = time.perf_counter() - start
    strong = systems.pairs_at_least(texts, groups, params["ngram"],
                                    params["threshold"])
    result.update(systems.pair_metrics(labels, groups, strong))
  else:
    raise ValueError(f"unknown measurement kind {spec['kind']!r}")
  result["peak_rss_mb"] = round(_peak_rss_mb(), 1)
  return result


if __name__ == "__main__":
  print(json.dumps(run(json.loads(sys.argv[1]))))
