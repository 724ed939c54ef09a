"""Scale tests. CI runs their quick form; NEARDUP_FULL=1 runs full size."""

import os

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms import DedupConfig, NearDedup

FULL = os.environ.get("NEARDUP_FULL") == "1"


@pytest.mark.slow
def test_one_hot_bucket_of_identical_documents():
  """Every band of every document lands in one bucket of n members: the
  bucket yields n-1 star edges and one cluster, not n^2 pairs."""
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
    edges = (out["counts"] | beam.Filter(
        lambda kv: kv[0] in ("candidate_edges", "verified_edges"))
             | beam.CombinePerKey(sum))
    assert_that(edges, equal_to([("candidate_edges", n - 1),
                                 ("verified_edges", n - 1)]), label="Edges")
