"""Exact-substring deduplication against the Rust suffix-array tool.

``python -m bench.substrings --docs 100000 [--docs 1000000] [--threshold 100]``

In one invocation, on the same corpus (web-like documents, a third of them
with licence paragraphs of tests/data/licence_corpus.jsonl.xz inserted, as
boilerplate), each system runs in its own child process pinned to one CPU
(as bench/run.py pins), timed by wall clock, its peak RSS from ``wait4``
(the process tree's, sampled, for the Beam job):

* ``rust``: google-research/deduplicate-text-datasets built by
  scripts/install_suffix_array.sh: ``make`` (suffix array), ``self-similar``
  (one thread) and ``collect``, over the documents back to back, each after
  its own separator ``\\xff\\xff`` + 4-byte index (as the tool's loaders
  write them), in ``all`` mode (it strikes every occurrence);
* ``kernel``: :func:`transforms.kernels.substrings.find_spans` in one
  process (the sharded computation, its 64 shards one after the other);
* ``beam``: ``python -m pipeline --near_dup false --substrings T
  --substrings_strike all`` on FnApiRunner with one worker, with its
  shuffle bytes per input byte from stats.json.

Struck bytes are compared position by position between ``rust`` (its
ranges clipped to the documents) and ``kernel`` (``struck``), and between
``rust`` and the Beam job's ``substrings/`` rows (``struck_beam``; its
spans are narrowed to code points); the tool's ranges may run into
separators, so it can strike the last bytes of a document that a repeat of
under T bytes plus separator bytes covers: those show up as ``rust_only``
positions (``kernel_only`` and ``beam_only`` must be 0). Prints one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench import corpora, measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENCES = os.path.join(ROOT, "tests", "data", "licence_corpus.jsonl.xz")
RUST = os.path.join(os.environ.get("NEARDUP_BENCH_CACHE", os.path.expanduser(
    "~/.cache/neardup-bench")), "deduplicate-text-datasets", "target",
                    "release", "dedup_dataset")


def corpus(n_docs: int, seed: int = 0):
  """Web-like documents (median 80 words); a third get one to three licence
  paragraphs (of the licence corpus, at least 200 characters) inserted at a
  random word boundary."""
  texts = corpora.web_like(n_docs, median_words=80, seed=seed).texts
  with lzma.open(LICENCES, "rt", encoding="utf-8") as f:
    paragraphs = [p for line in f for p in json.loads(line)["text"].split(
        "\n\n") if len(p) >= 200]
  rng = np.random.default_rng([seed, 27])
  out = []
  for text in texts:
    if rng.random() < 1 / 3:
      words = text.split(" ")
      for _ in range(rng.integers(1, 4)):
        at = int(rng.integers(0, len(words) + 1))
        words.insert(at, paragraphs[int(rng.integers(len(paragraphs)))])
      text = " ".join(words)
    out.append(text)
  return out


def _spawn(cmd, cpu, env=None):
  os.sync()
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
  tree = measure.TreeRssSampler(proc.pid)
  out, err = proc.communicate()
  wall = time.perf_counter() - start
  tree.stop()
  if proc.returncode:
    raise RuntimeError(f"{cmd[:3]} failed: {err.decode()[-2000:]}")
  return wall, tree.peak_mb, out.decode()


def run_rust(texts, threshold, cpu, work):
  data = os.path.join(work, "corpus.bin")
  starts = []
  with open(data, "wb") as f:
    at = 0
    for i, text in enumerate(texts):
      raw = text.encode("utf-8")
      f.write(b"\xff\xff" + struct.pack("<I", i) + raw)
      starts.append(at + 6)
      at += 6 + len(raw)
  cache = os.path.join(work, "cache")
  os.makedirs(cache)
  wall, peak, out = 0.0, 0.0, ""
  for step in (["make", "--data-file", data],
               ["self-similar", "--data-file", data, "--length-threshold",
                str(threshold), "--cache-dir", cache, "--num-threads", "1"],
               ["collect", "--data-file", data, "--cache-dir", cache,
                "--length-threshold", str(threshold)]):
    seconds, rss, out = _spawn([RUST] + step, cpu)
    wall, peak = wall + seconds, max(peak, rss)
  total = os.path.getsize(data)
  marks = np.zeros(total, dtype=bool)
  for line in out.split("out\n", 1)[-1].splitlines():
    lo, hi = map(int, line.split())
    marks[lo:hi] = True
  inside = np.zeros(total, dtype=bool)
  for start, text in zip(starts, texts):
    inside[start:start + len(text.encode("utf-8"))] = True
  return {"seconds": round(wall, 2), "peak_rss_mb": peak}, marks[inside]


def kernel_child(path, threshold, out):
  """In the pinned child: find_spans over the corpus; the struck marks of
  the documents back to back go to ``out`` (npy)."""
  from transforms.kernels import substrings  # pylint: disable=import-outside-toplevel
  with open(path, encoding="utf-8") as f:
    texts = [json.loads(line)["text"].encode("utf-8") for line in f]
  start = time.perf_counter()
  spans = substrings.find_spans(texts, np.arange(len(texts)), threshold,
                                "all", shards=64)
  seconds = time.perf_counter() - start
  data, starts = substrings.concatenate(texts)
  base = starts[spans.doc_ids]
  np.save(out, span_marks(len(data), [(base + spans.starts,
                                       base + spans.ends)]))
  print(json.dumps({"seconds": round(seconds, 2)}))


def read_marks(folder, texts):
  """The struck marks of the documents back to back, from the Beam job's
  ``substrings/`` rows (``id`` is the document's index in ``texts``)."""
  lengths = np.array([len(t.encode("utf-8")) for t in texts], np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths)])
  ranges = []
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
      spans = np.array([(r["id"], r["start"], r["end"]) for r in map(
          json.loads, f)], dtype=np.int64).reshape(-1, 3)
    base = starts[spans[:, 0]]
    ranges.append((base + spans[:, 1], base + spans[:, 2]))
  return span_marks(int(starts[-1]), ranges)


def span_marks(size: int, ranges) -> np.ndarray:
  """bool[size]: the positions inside any of the disjoint byte ranges
  ``(starts, ends)`` of ``ranges`` (pairs of int64 arrays)."""
  # Disjoint ranges keep the depth at 0 or 1, so int8 holds it: a byte per
  # corpus byte (at 1M documents, 1.3 GB; int32 sums and their int64 cumsum
  # took 15 GB and the run was killed for memory).
  depth = np.zeros(size + 1, dtype=np.int8)
  for starts, ends in ranges:
    np.add.at(depth, starts, 1)
    np.add.at(depth, ends, -1)
  return np.cumsum(depth, dtype=np.int8)[:-1] > 0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--docs", type=int, action="append")
  parser.add_argument("--threshold", type=int, default=100)
  parser.add_argument("--systems", default="rust,kernel,beam")
  parser.add_argument("--kernel_child", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.kernel_child:
    kernel_child(args.kernel_child[0], int(args.kernel_child[1]),
                 args.kernel_child[2])
    return
  if not os.path.exists(RUST):
    sys.exit(f"{RUST} is missing: run scripts/install_suffix_array.sh")
  cpu = max(os.sched_getaffinity(0))
  systems = args.systems.split(",")
  env = dict(os.environ, PYTHONPATH=ROOT)
  rows = []
  for n in args.docs or [100_000]:
    texts = corpus(n)
    with tempfile.TemporaryDirectory() as work:
      path = os.path.join(work, "corpus.jsonl")
      with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
          f.write(json.dumps({"id": i, "text": text}) + "\n")
      row = {"docs": n, "bytes": sum(len(t.encode("utf-8")) for t in texts),
             "threshold": args.threshold,
             "load_before": os.getloadavg()}
      rust_marks = kernel_marks = None
      if "rust" in systems:
        row["rust"], rust_marks = run_rust(texts, args.threshold, cpu, work)
      if "kernel" in systems:
        marks_path = os.path.join(work, "kernel.npy")
        wall, peak, out = _spawn(
            [sys.executable, "-m", "bench.substrings", "--kernel_child", path,
             str(args.threshold), marks_path], cpu, env)
        row["kernel"] = dict(json.loads(out.splitlines()[-1]),
                             wall_s=round(wall, 2), peak_rss_mb=peak)
        kernel_marks = np.load(marks_path)
      if "beam" in systems:
        out_dir = os.path.join(work, "out")
        wall, peak, _ = _spawn(
            [sys.executable, "-m", "pipeline", "--input", path, "--output",
             out_dir, "--near_dup", "false", "--substrings",
             str(args.threshold), "--substrings_strike", "all",
             "--direct_num_workers", "1"], cpu, env)
        with open(os.path.join(out_dir, "stats.json"), encoding="utf-8") as f:
          stats = json.load(f)
        shuffled = sum(stats["shuffle_bytes"].values())
        row["beam"] = {"seconds": round(wall, 2), "peak_rss_mb": peak,
                       "bytes_struck_narrowed": stats[
                           "substrings_bytes_struck"],
                       "shuffle_bytes": stats["shuffle_bytes"],
                       "shuffle_per_input_byte": round(
                           shuffled / row["bytes"], 3)}
        if rust_marks is not None:
          beam_marks = read_marks(os.path.join(out_dir, "substrings"),
                                  texts)
          row["struck_beam"] = {
              "rust": int(rust_marks.sum()), "beam": int(beam_marks.sum()),
              "rust_only": int((rust_marks & ~beam_marks).sum()),
              "beam_only": int((beam_marks & ~rust_marks).sum())}
      if rust_marks is not None and kernel_marks is not None:
        row["struck"] = {"rust": int(rust_marks.sum()),
                         "kernel": int(kernel_marks.sum()),
                         "rust_only": int((rust_marks & ~kernel_marks).sum()),
                         "kernel_only": int(
                             (kernel_marks & ~rust_marks).sum())}
        for name in ("kernel", "beam"):
          if name in row:
            row[f"{name}_time_ratio"] = round(
                row[name]["seconds"] / row["rust"]["seconds"], 2)
            row[f"{name}_rss_ratio"] = round(
                row[name]["peak_rss_mb"] / row["rust"]["peak_rss_mb"], 2)
      row["load_after"] = os.getloadavg()
      rows.append(row)
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
