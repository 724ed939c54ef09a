"""Scale tests. CI runs their quick form; NEARDUP_FULL=1 runs full size."""

import json
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.cli import main
from tests.corpus import read_jsonl, stats_of
from transforms import DedupConfig, NearDedup
from transforms import write

FULL = os.environ.get("NEARDUP_FULL") == "1"


@pytest.mark.slow
def test_one_hot_bucket_of_identical_documents():
  """Every band of every document lands in one bucket of n members: the
  identical signatures collapse to one node, so the bucket yields n-1 star
  edges and one cluster, not n^2 pairs."""
  n = 100_000 if FULL else 5_000
  text = "the same boilerplate cookie banner text on every crawled page"
  config = DedupConfig(ngram=3)
  with TestPipeline(runner="FnApiRunner") as p:
    docs = p | beam.Create([(i, text) for i in range(n)], reshuffle=False)
    out = docs | NearDedup(config)
    summary = (out["clusters"]
               | beam.Map(lambda kv: (kv[1].cluster_id, kv[1].cluster_size,
                                      int(kv[1].kept)))
               | beam.combiners.Count.PerElement())
    assert_that(summary, equal_to([((0, n, 1), 1), ((0, n, 0), n - 1)]))
    edges = (out["counts"] | beam.Flatten() | beam.Filter(
        lambda kv: kv[0] in ("candidate_edges", "verified_edges",
                             "graph_edges", "buckets_large"))
             | beam.CombinePerKey(sum))
    assert_that(edges, equal_to([("candidate_edges", n - 1),
                                 ("verified_edges", n - 1),
                                 ("graph_edges", n - 1),
                                 ("buckets_large", config.bands)]),
                label="Edges")


@pytest.mark.slow
def test_big_bucket_of_distinct_near_copies_costs_k_times_hubs():
  """n distinct near-copies (one word of 200 changed) share buckets far
  above the exhaustive size: each bucket of k costs at most k * hubs pairs,
  so all bands together at most bands * n * hubs (n = 1,000: ~32 per
  document measured; n^2/2 would be 500 per document); still one
  cluster."""
  n = 10_000 if FULL else 1_000
  rng = np.random.default_rng(3)
  base = rng.integers(10**6, size=200)
  texts = []
  for i in range(n):
    copy = base.copy()
    copy[rng.integers(200)] = 10**6 + i
    texts.append(" ".join(f"w{t}" for t in copy))
  config = DedupConfig(ngram=3, lsh_shards=16)
  with TestPipeline(runner="FnApiRunner") as p:
    out = (p | beam.Create(list(enumerate(texts)), reshuffle=False)
           | NearDedup(config))
    sizes = (out["clusters"]
             | beam.Map(lambda kv: kv[1].cluster_size)
             | beam.Distinct())
    assert_that(sizes, equal_to([n]))
    # One component per bucket: about one comparison per member and band.
    bound = 2 * config.bands * n
    pairs = (out["counts"]
             | beam.Flatten()
             | beam.Filter(lambda kv: kv[0] == "candidate_edges")
             | beam.CombinePerKey(sum)
             | beam.Map(lambda kv: kv[1] <= bound))
    assert_that(pairs, equal_to([True]), label="Bounded")


@pytest.mark.slow
@pytest.mark.e2e
def test_outputs_cross_a_part_boundary(tmp_path, monkeypatch):
  """Rows on both sides of an output part boundary land in their parts, in
  order, with a cluster and a rejection that straddle it. The full form
  crosses the production size (2^20 rows per part); the quick form sets the
  writer's part size to 2^10 rows."""
  bits = write.PART_ROW_BITS if FULL else 10
  monkeypatch.setattr(write, "PART_ROW_BITS", bits)
  edge = 1 << bits
  n = edge + 300
  lines = [json.dumps({"id": i, "text": f"w{i} x{i * 7 % 1000003} y{i} z{i}"
                                        f" q{i}"}) for i in range(n)]
  # One cluster from the last rows of part 0 into part 1, kept at row
  # edge - 2, and a rejected row in part 1.
  text = "one two three four five six seven eight nine"
  for row in (edge - 2, edge - 1, edge + 1):
    lines[row] = json.dumps({"id": row, "text": text})
  lines[edge + 5] = '{"id": "cut", "text": "unterminated'
  path = tmp_path / "in.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  out = str(tmp_path / "out")
  assert main(["--input", str(path), "--output", out, "--lsh_shards",
               "8"]) == 0
  removed, rejected = {edge - 1, edge + 1}, edge + 5
  for part, rows in ((0, range(edge)), (1, range(edge, n))):
    with open(os.path.join(out, "deduped", f"part-00000-{part:05d}.jsonl"),
              encoding="utf-8") as f:
      assert f.read().splitlines() == [
          lines[r] for r in rows if r not in removed and r != rejected]
  clusters = {name: [(r["position"], r["kept"]) for r in read_jsonl(
      os.path.join(out, "clusters", name))]
              for name in os.listdir(os.path.join(out, "clusters"))}
  # Positions are 1-based lines.
  assert clusters == {"part-00000-00000.jsonl": [(edge - 1, True),
                                                 (edge, False)],
                      "part-00000-00001.jsonl": [(edge + 2, False)]}
  assert [r["position"] for r in read_jsonl(os.path.join(
      out, "rejected", "part-00000-00001.jsonl"))] == [edge + 6]
  assert sorted(os.listdir(os.path.join(out, "rejected"))) == [
      "part-00000-00001.jsonl"]
  stats = stats_of(out)
  assert (stats["kept"], stats["removed"], stats["rejected"]) == (n - 3, 2, 1)
