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

* ``{"kind": "script", "system", "corpus", "docs", "params", "output"}``: the
  peer as a user's script on the corpus file
  (:func:`~bench.systems.dedup_jsonl`): the parent times the whole process
  (interpreter start, imports, reading, clustering, writing the kept lines);
  ``seconds`` here is the part inside. Only for the whole corpus
  (``docs`` its size).

Reading the corpus is not timed (but by the script kind's parent). ``rss_before_mb`` is the process's peak RSS
after loading it, so the system's own footprint is the difference to the
peak the parent reads with ``wait4``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

from bench import corpora
from bench import systems

WARMUP_DOCS = 256


class TreeRssSampler:
  """Peak of the summed RSS of a process and all its descendants (a runner
  such as Prism is a separate process the job starts), sampled from /proc
  every ``interval_s`` in a background thread until ``stop()``."""

  def __init__(self, pid: int, interval_s: float = 0.05):
    self.pid = pid
    self.peak_mb = 0.0
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._loop, args=(interval_s,),
                                    daemon=True)
    self._thread.start()

  def _loop(self, interval_s: float) -> None:
    while not self._done.wait(interval_s):
      self.peak_mb = max(self.peak_mb, round(self._tree_rss_kb() / 1024, 1))

  def _tree_rss_kb(self) -> int:
    children = {}
    for entry in os.listdir("/proc"):
      if entry.isdigit():
        try:
          with open(f"/proc/{entry}/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces: split after it.
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
          continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [self.pid]
    while todo:
      pid = todo.pop()
      todo.extend(children.get(pid, ()))
      try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
          total += int(f.read().split()[1]) * _PAGE_KB
      except (OSError, ValueError, IndexError):
        pass
    return total

  def stop(self) -> None:
    self._done.set()
    self._thread.join()


_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(spec: dict) -> dict:
  if spec["kind"] == "script":
    return _script(spec)
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


def _script(spec: dict) -> dict:
  start = time.perf_counter()
  counts = systems.dedup_jsonl(
      spec["system"], os.path.join(spec["corpus"], "corpus.jsonl"),
      spec["output"], spec["params"])
  if counts["docs"] != spec["docs"]:
    raise ValueError(f"the script kind reads the whole corpus: {counts['docs']}"
                     f" documents, not {spec['docs']}")
  return {"kind": "script", "system": spec["system"],
          "seconds": time.perf_counter() - start, **counts,
          "peak_rss_mb": round(_peak_rss_mb(), 1)}


if __name__ == "__main__":
  print(json.dumps(run(json.loads(sys.argv[1]))))
