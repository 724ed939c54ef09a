"""The clustering contract, against a brute-force oracle.

For every LSH bucket of at most ``exhaustive_bucket_size`` documents, the
clusters are exactly the connected components of the graph of *all* pairs of
that bucket whose similarity passes verification. The oracle computes that
by brute force (signatures and band keys from the kernels, every pair of
every bucket, a plain union-find) on randomized corpora with template
families, sliding-window chains and many mixed buckets, and the pipeline
must give identical clusters for ``exact`` and ``signature`` verification.
"""

import dataclasses

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.test_components import reference_labels
from transforms import DedupConfig, NearDedup
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import minhash as minhash_kernels
from transforms.kernels import compiled_signature as signature_kernels
from transforms.sign import normalize_options

pytestmark = pytest.mark.extended

# Word 2-grams, K=64, 8 bands of 2 rows: the S-curve's midpoint (~0.35) is
# far below the threshold, so most buckets mix similar and dissimilar
# documents.
CONFIG = DedupConfig(ngram=2, num_perm=64, bands=8, rows=2, threshold=0.6,
                     lsh_shards=4)


def mixed_corpus(seed):
  """Template families (a base and variants with 5-30% of words replaced),
  sliding-window chains and unrelated documents, in shuffled order."""
  rng = np.random.default_rng(seed)
  vocab = [f"w{i}" for i in range(300)]
  texts = []
  for _ in range(5):
    base = rng.choice(vocab, size=40)
    texts.append(base)
    for _ in range(rng.integers(3, 9)):
      variant = base.copy()
      edits = rng.choice(40, size=int(40 * rng.uniform(0.05, 0.3)),
                         replace=False)
      variant[edits] = rng.choice(vocab, size=len(edits))
      texts.append(variant)
  for _ in range(2):
    stream = rng.choice(vocab, size=60)
    texts.extend(stream[i:i + 30] for i in range(0, 30, 2))
  texts.extend(rng.choice(vocab, size=40) for _ in range(15))
  order = rng.permutation(len(texts))
  return [" ".join(texts[i]) for i in order]


def oracle_clusters(texts, config, star=False, hubs=None):
  """``{doc: component minimum}`` for documents in components of two or
  more, by brute force over every pair of every bucket (``star``: only the
  pairs with each bucket's smallest id, the old candidate rule; ``hubs``:
  in buckets above the exhaustive size, only the pairs with its ``hubs``
  smallest ids, the rule before the large-bucket search)."""
  a, b = minhash_kernels.permutations(config.num_perm, config.seed)
  opts = dict(unit=config.shingle_unit, ngram=config.ngram, seed=config.seed,
              **normalize_options(config))
  sigs, _ = signature_kernels.signature_batch(texts, a=a, b=b,
                                              sketch=config.sketch, **opts)
  flat, offsets = signature_kernels.shingle_sets(texts, **opts)
  keys = lsh_kernels.band_keys(sigs, config.bands, config.rows, config.seed)
  buckets = {}
  for doc in range(len(texts)):
    for key in keys[doc].tolist():
      buckets.setdefault(key, []).append(doc)
  edges = []
  for members in buckets.values():
    large = len(set(members)) > config.exhaustive_bucket_size
    for i, x in enumerate(members):
      for y in members[i + 1:]:
        if (star and i) or (hubs and large and i >= hubs):
          break
        if _passes(x, y, sigs, flat, offsets, config):
          edges.append((x, y))
  return reference_labels(edges)


def _passes(x, y, sigs, flat, offsets, config):
  if config.verify == "signature":
    equal = int(np.count_nonzero(sigs[x] == sigs[y]))
    return equal >= lsh_kernels.min_equal_entries(config.threshold,
                                                  config.num_perm)
  inter, union = jaccard_kernels.jaccard(flat[offsets[x]:offsets[x + 1]],
                                         flat[offsets[y]:offsets[y + 1]])
  return bool(jaccard_kernels.meets_threshold(inter, union, config.threshold))


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("verify", ["exact", "signature"])
def test_clusters_equal_components_of_all_passing_bucket_pairs(seed, verify):
  config = dataclasses.replace(CONFIG, verify=verify)
  texts = mixed_corpus(seed)
  expected = oracle_clusters(texts, config)
  # The corpus is one where the old star edges lose true pairs, so the
  # test can fail.
  assert oracle_clusters(texts, config, star=True) != expected
  with TestPipeline(runner="FnApiRunner") as p:
    out = p | beam.Create(list(enumerate(texts))) | NearDedup(config)
    assert_that(out["clusters"] | beam.Map(
        lambda kv: (kv[0], kv[1].cluster_id)),
                equal_to(sorted(expected.items())))


@pytest.mark.parametrize("verify", ["exact", "signature"])
def test_large_buckets_give_the_components_of_all_their_pairs(verify):
  # An exhaustive size of 3 puts most buckets of the mixed corpus (families,
  # drifting chains, strays) above it: their components must still be
  # those of all their passing pairs; comparing each member with the
  # bucket's smallest id only (the former rule with one hub) loses some.
  config = dataclasses.replace(CONFIG, verify=verify,
                               exhaustive_bucket_size=3)
  texts = mixed_corpus(5)
  expected = oracle_clusters(texts, config)
  assert oracle_clusters(texts, config, hubs=1) != expected
  with TestPipeline(runner="FnApiRunner") as p:
    out = p | beam.Create(list(enumerate(texts))) | NearDedup(config)
    assert_that(out["clusters"] | beam.Map(
        lambda kv: (kv[0], kv[1].cluster_id)),
                equal_to(sorted(expected.items())))


def test_large_buckets_cost_about_k_per_component():
  # 300 copies of one text and 100 distinct variants of another share
  # buckets far above an exhaustive size of 8: one cluster, from about one
  # comparison per member and bucket, not k^2 = 160,000 per bucket.
  rng = np.random.default_rng(5)
  vocab = [f"w{i}" for i in range(2000)]
  base = rng.choice(vocab, size=200)
  texts = [" ".join(base)] * 300
  for _ in range(100):
    variant = base.copy()
    variant[rng.choice(200, size=2, replace=False)] = rng.choice(vocab, 2)
    texts.append(" ".join(variant))
  config = DedupConfig(ngram=3, threshold=0.8, exhaustive_bucket_size=8,
                       lsh_shards=4)
  with TestPipeline(runner="FnApiRunner") as p:
    out = p | beam.Create(list(enumerate(texts))) | NearDedup(config)
    assert_that(out["clusters"] | beam.Map(
        lambda kv: (kv[1].cluster_id, kv[1].cluster_size)),
                equal_to([(0, len(texts))] * len(texts)), label="Clusters")
    counts = (out["counts"]
              | beam.Flatten()
              | beam.Filter(lambda kv: kv[0] in ("candidate_edges",
                                                 "buckets_large"))
              | beam.CombinePerKey(sum)
              | beam.Map(lambda kv: (kv[0], kv[1] <= {
                  "candidate_edges": 2 * len(texts) * config.bands,
                  "buckets_large": config.bands}[kv[0]])))
    assert_that(counts, equal_to([("candidate_edges", True),
                                  ("buckets_large", True)]), label="Bounded")
