"""Plain-pytest tests of the banding kernels (transforms/kernels/lsh.py)."""

import collections
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.kernels.lsh import (band_keys, bucket_pairs, choose_bands_rows,
                                    repeated,
                                    collision_probability, false_negative_area,
                                    false_positive_area, shard_of)
from transforms.kernels import lsh
from transforms.kernels.minhash import minhash_batch, permutations


# --- collision rate (acceptance criterion) ----------------------------------

@pytest.mark.parametrize("target", [0.3, 0.5, 0.7, 0.85])
def test_band_collision_rate_follows_s_curve(target):
  bands, rows = 20, 5
  k = bands * rows
  shared = 700
  unique = round(shared * (1 - target) / (2 * target))
  jaccard = shared / (shared + 2 * unique)
  rng = np.random.default_rng(int(target * 100))
  values = rng.integers(0, 2**64, size=shared + 2 * unique, dtype=np.uint64)
  assert len(np.unique(values & np.uint64(0xFFFFFFFF))) == len(values)
  doc_a = values[:shared + unique]
  doc_b = np.concatenate([values[:shared], values[shared + unique:]])
  flat = np.concatenate([doc_a, doc_b])
  offsets = np.array([0, len(doc_a), len(flat)], dtype=np.int64)

  n_seeds, chunk = 1000, 50
  hits = 0
  for lo in range(0, n_seeds, chunk):
    # Many independent permutation families at once: one wide signature.
    families = [permutations(k, 5000 + s) for s in range(lo, lo + chunk)]
    a = np.concatenate([f[0] for f in families])
    b = np.concatenate([f[1] for f in families])
    sigs = minhash_batch(flat, offsets, a, b).reshape(2, chunk, k)
    keys_a = band_keys(sigs[0], bands, rows, seed=42)
    keys_b = band_keys(sigs[1], bands, rows, seed=42)
    hits += int(np.any(keys_a == keys_b, axis=1).sum())
  expected = float(collision_probability(jaccard, bands, rows))
  assert abs(hits / n_seeds - expected) < 0.05


# --- S-curve and parameter choice -------------------------------------------

def test_collision_probability_values():
  assert collision_probability(0.0, 20, 5) == 0.0
  assert collision_probability(1.0, 20, 5) == 1.0
  assert collision_probability(0.5, 1, 1) == pytest.approx(0.5)
  assert collision_probability(0.5, 20, 5) == pytest.approx(
      1 - (1 - 0.5**5)**20)
  s = np.linspace(0, 1, 101)
  p = collision_probability(s, 9, 13)
  assert p.shape == s.shape
  assert np.all(np.diff(p) >= 0)
  assert np.all((p >= 0) & (p <= 1))


def test_error_areas():
  # One band of one row: P(s) = s, so the areas are triangles of 1/2 * t^2
  # below and 1/2 * (1 - t)^2 above the threshold.
  assert false_positive_area(0.6, 1, 1) == pytest.approx(0.18, abs=1e-6)
  assert false_negative_area(0.6, 1, 1) == pytest.approx(0.08, abs=1e-6)
  assert false_positive_area(0.0, 9, 13) == 0.0
  assert false_negative_area(1.0, 9, 13) == 0.0
  for t in (0.3, 0.5, 0.8):
    fp, fn = false_positive_area(t, 9, 13), false_negative_area(t, 9, 13)
    assert 0 <= fp <= t and 0 <= fn <= 1 - t
  # More bands (same rows): more false positives, fewer false negatives.
  assert false_positive_area(0.8, 20, 5) > false_positive_area(0.8, 5, 5)
  assert false_negative_area(0.8, 20, 5) < false_negative_area(0.8, 5, 5)


@pytest.mark.parametrize("threshold,num_perm",
                         [(0.8, 128), (0.5, 128), (0.9, 64), (0.7, 16)])
def test_choose_bands_rows_fits_num_perm(threshold, num_perm):
  bands, rows = choose_bands_rows(threshold, num_perm)
  assert isinstance(bands, int) and isinstance(rows, int)
  assert bands >= 1 and rows >= 1
  assert bands * rows <= num_perm


def test_choose_bands_rows_threshold_near_target():
  bands, rows = choose_bands_rows(0.8, 128)
  assert abs((1.0 / bands) ** (1.0 / rows) - 0.8) < 0.1


def test_lower_threshold_more_bands():
  by_threshold = [choose_bands_rows(t, 128)[0] for t in (0.9, 0.8, 0.5, 0.3)]
  assert by_threshold == sorted(by_threshold)
  assert by_threshold[0] < by_threshold[-1]


def test_choose_bands_rows_weights():
  # Penalising false negatives more pushes the S-curve threshold down.
  b0, r0 = choose_bands_rows(0.8, 128)
  b1, r1 = choose_bands_rows(0.8, 128, fp_weight=0.1, fn_weight=0.9)
  assert (1 / b1) ** (1 / r1) < (1 / b0) ** (1 / r0)


# --- band keys --------------------------------------------------------------

def _random_signatures(seed, n, k):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 2**32, size=(n, k), dtype=np.uint32)


def test_band_keys_shape_and_determinism():
  sigs = _random_signatures(0, 7, 128)
  keys = band_keys(sigs, 9, 13, seed=42)
  assert keys.shape == (7, 9)
  assert keys.dtype == np.uint64
  np.testing.assert_array_equal(keys, band_keys(sigs.copy(), 9, 13, seed=42))
  # Row-wise: a document's keys do not depend on the rest of the batch.
  np.testing.assert_array_equal(keys[3:4], band_keys(sigs[3:4], 9, 13, seed=42))
  assert not np.array_equal(keys, band_keys(sigs, 9, 13, seed=43))
  assert len(np.unique(keys)) == keys.size


def test_equal_band_values_in_different_bands_get_different_keys():
  sigs = np.tile(np.arange(5, dtype=np.uint32), (1, 4))  # 4 equal bands
  keys = band_keys(sigs, 4, 5, seed=1)
  assert len(np.unique(keys[0])) == 4
  zeros = band_keys(np.zeros((1, 20), dtype=np.uint32), 4, 5, seed=1)
  assert len(np.unique(zeros[0])) == 4


def test_band_keys_match_in_a_band_iff_band_values_match():
  sigs = _random_signatures(1, 2, 20)
  sigs[1, 5:10] = sigs[0, 5:10]  # only band 1 is shared
  keys = band_keys(sigs, 4, 5, seed=3)
  assert (keys[0] == keys[1]).tolist() == [False, True, False, False]


def test_only_first_bands_times_rows_columns_matter():
  sigs = _random_signatures(2, 5, 128)
  other = sigs.copy()
  other[:, 117:] = _random_signatures(3, 5, 11)
  np.testing.assert_array_equal(band_keys(sigs, 9, 13, seed=42),
                                band_keys(other, 9, 13, seed=42))
  other[:, 116] ^= 1
  assert np.all(band_keys(sigs, 9, 13, seed=42)[:, 8]
                != band_keys(other, 9, 13, seed=42)[:, 8])


def test_shard_of_in_range():
  keys = band_keys(_random_signatures(4, 1000, 100), 20, 5, seed=42).ravel()
  for shards in (1, 7, 64):
    s = shard_of(keys, shards)
    assert s.dtype == np.int64
    assert s.min() >= 0 and s.max() < shards
  s = shard_of(keys, 64)
  assert len(np.unique(s)) == 64  # 20,000 mixed keys reach every shard
  np.testing.assert_array_equal(shard_of(keys[:10], 64), s[:10])


# --- bucket pairs -----------------------------------------------------------

def _pairs(found):
  return list(zip(found.src.tolist(), found.dst.tolist()))


def test_bucket_pairs_hand_example():
  keys = np.array([7, 3, 7, 3, 7, 9, 5, 5], dtype=np.uint64)
  ids = np.array([12, 4, 10, 2, 11, 1, 6, 6], dtype=np.int64)
  found = bucket_pairs(keys, ids, 64)
  # Bucket 3: {2, 4}; bucket 7: {10, 11, 12}, all three pairs; bucket 9:
  # {1}; bucket 5: {6} twice, which counts once.
  assert _pairs(found) == [(2, 4), (10, 11), (10, 12), (11, 12)]
  assert found.anchor.tolist() == [2, 10, 10, 10]
  assert sorted(found.sizes.tolist()) == [2, 3] and found.large == 0


def test_bucket_pairs_deduplicated_per_anchor_across_buckets():
  keys = np.array([1, 1, 2, 2, 3, 3, 3, 4, 4, 4], dtype=np.uint64)
  ids = np.array([5, 8, 8, 5, 5, 8, 9, 8, 9, 7], dtype=np.int64)
  found = bucket_pairs(keys, ids, 64)
  # (8, 9) comes from the buckets anchored at 5 and at 7: once per anchor.
  assert list(zip(found.anchor.tolist(), _pairs(found))) == [
      (5, (5, 8)), (5, (5, 9)), (5, (8, 9)), (7, (7, 8)), (7, (7, 9)),
      (7, (8, 9))]


def test_bucket_pairs_duplicate_entries_counted_once():
  keys = np.array([4, 4, 4, 4, 4], dtype=np.uint64)
  ids = np.array([3, 1, 3, 1, 3], dtype=np.int64)
  found = bucket_pairs(keys, ids, 64)
  assert _pairs(found) == [(1, 3)] and found.sizes.tolist() == [2]
  # The same document twice, alone in its bucket: no pair, no bucket.
  found = bucket_pairs(np.array([8, 8], dtype=np.uint64),
                       np.array([5, 5], dtype=np.int64), 64)
  assert len(found.src) == len(found.sizes) == 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 5, 2**63, 2**64 - 1, 1 << 58,
                                 (1 << 58) + 1]) | st.integers(0, 2**64 - 1),
                max_size=60))
def test_repeated_marks_exactly_the_values_seen_twice(values):
  counts = collections.Counter(values)
  got = repeated(np.array(values, dtype=np.uint64))
  assert got.dtype == bool
  assert got.tolist() == [counts[v] > 1 for v in values]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), max_size=40))
def test_bucket_pairs_are_every_pair_of_every_bucket(entries):
  # Buckets below the exhaustive size: all their pairs, once per anchor.
  keys = np.array([k for k, _ in entries], dtype=np.uint64) * np.uint64(
      0x9E3779B97F4A7C15)
  ids = np.array([i for _, i in entries], dtype=np.int64)
  found = bucket_pairs(keys, ids, 64)
  buckets = collections.defaultdict(set)
  for key, doc in zip(keys.tolist(), ids.tolist()):
    buckets[key].add(doc)
  want = sorted({(min(docs), a, b) for docs in buckets.values()
                 for a, b in itertools.combinations(sorted(docs), 2)})
  assert list(zip(found.anchor.tolist(), found.src.tolist(),
                  found.dst.tolist())) == want
  assert found.sizes.tolist() == [len(buckets[k]) for k in sorted(buckets)
                                  if len(buckets[k]) > 1]


@pytest.mark.parametrize("docs,width,bands,rows,shards", [
    (300, 128, 32, 4, 64), (7, 16, 3, 5, 1), (0, 128, 32, 4, 64),
    (50, 64, 9, 7, 1000)])
def test_band_entries_are_the_split_band_keys_and_ids(
    docs, width, bands, rows, shards):
  rng = np.random.default_rng(docs)
  sigs = rng.integers(0, 2**32, (docs, width)).astype(np.uint32)
  ids = np.sort(rng.integers(0, 2**40, docs))
  keys = band_keys(sigs, bands, rows, 42).ravel()
  want = list(lsh.split_by_shard(
      shard_of(keys, shards), keys, np.repeat(ids, bands)))
  got = list(lsh.band_entries(sigs, ids, bands, rows, 42, shards))
  assert [s for s, _ in got] == [s for s, _ in want]
  for (_, got_parts), (_, want_parts) in zip(got, want):
    for g, w in zip(got_parts, want_parts):
      assert g.dtype == w.dtype and np.array_equal(g, w)


def test_bucket_pairs_empty_and_single():
  for n in (0, 1):
    found = bucket_pairs(np.arange(n, dtype=np.uint64),
                         np.arange(n, dtype=np.int64), 64)
    assert len(found.src) == len(found.dst) == len(found.sizes) == 0
    assert len(found.large_ids) == found.large == 0


def test_a_large_bucket_yields_its_members_not_pairs():
  n = 100_000
  rng = np.random.default_rng(5)
  ids = rng.permutation(np.arange(1000, 1000 + n, dtype=np.int64))
  found = bucket_pairs(np.full(n, 0xDEADBEEF, dtype=np.uint64), ids, 64)
  # No pair: the bucket's members, once each, with its key and smallest id
  # (verification finds its components, see test_bucket_components.py).
  assert len(found.src) == 0 and found.large == 1
  assert found.sizes.tolist() == [n]
  assert sorted(found.large_ids.tolist()) == list(range(1000, 1000 + n))
  assert np.all(found.large_anchors == 1000)
  assert np.all(found.large_keys == 0xDEADBEEF)


def test_large_buckets_are_listed_bucket_by_bucket_beside_small_ones():
  # Bucket 1: 70 documents (large at 64), bucket 2: 3 of them plus doc 500
  # (small), bucket 3: 66 others (large).
  keys = np.r_[np.full(70, 1), np.full(3, 2), [2], np.full(66, 3)].astype(
      np.uint64)
  ids = np.r_[np.arange(70), [3, 4, 5], [500],
              np.arange(100, 166)].astype(np.int64)
  found = bucket_pairs(keys, ids, 64)
  assert found.large == 2 and sorted(found.sizes.tolist()) == [4, 66, 70]
  assert _pairs(found) == [(3, 4), (3, 5), (3, 500), (4, 5), (4, 500),
                           (5, 500)]
  members = collections.defaultdict(set)
  for key, anchor, doc in zip(found.large_keys.tolist(),
                              found.large_anchors.tolist(),
                              found.large_ids.tolist()):
    members[(key, anchor)].add(doc)
  assert members == {(1, 0): set(range(70)), (3, 100): set(range(100, 166))}


def test_bucket_pairs_sorted_src_less_than_dst_all_pairs_of_small_buckets():
  rng = np.random.default_rng(6)
  keys = rng.integers(0, 50, size=2000).astype(np.uint64)
  ids = rng.integers(0, 500, size=2000).astype(np.int64)
  found = bucket_pairs(keys, ids, 4096)
  assert np.all(found.src < found.dst)
  members = {}
  for k, i in zip(keys.tolist(), ids.tolist()):
    members.setdefault(k, set()).add(i)
  expected = {(min(m), (x, y)) for m in members.values() for x in m
              for y in m if x < y}
  got = list(zip(found.anchor.tolist(), _pairs(found)))
  assert len(got) == len(set(got)) and set(got) == expected
  assert sorted(found.sizes.tolist()) == sorted(
      len(m) for m in members.values() if len(m) >= 2)


def test_run_pairs_of_several_runs():
  values = np.array([4, 5, 6, 7, 8, 9])
  first, second = lsh.run_pairs(values, np.array([0, 3]), np.array([3, 2]))
  assert list(zip(first.tolist(), second.tolist())) == [
      (4, 5), (4, 6), (5, 6), (7, 8)]


def test_node_shard_spreads_consecutive_ids_and_is_stable():
  ids = np.arange(1 << 16, dtype=np.int64)
  shards = lsh.node_shard(ids, 8)
  assert shards.min() == 0 and shards.max() == 7
  counts = np.bincount(shards, minlength=8)
  assert counts.min() > 0.9 * len(ids) / 8
  np.testing.assert_array_equal(shards, lsh.node_shard(ids, 8))


@pytest.mark.parametrize("base", [0, (1 << 16) - 2, 1 << 19])
def test_split_by_shard_keeps_rows_together_and_in_order(base):
  # Shard numbers below 2**16 take the 16-bit sort, the others do not.
  shards = np.array([2, 0, 2, 1, 0]) + base
  values = np.array([10, 11, 12, 13, 14])
  names = np.array(list("abcde"))
  parts = list(lsh.split_by_shard(shards, values, names))
  assert [s for s, _ in parts] == [base, base + 1, base + 2]
  assert [(v.tolist(), n.tolist()) for _, (v, n) in parts] == [
      ([11, 14], ["b", "e"]), ([13], ["d"]), ([10, 12], ["a", "c"])]
  assert not list(lsh.split_by_shard(np.zeros(0, dtype=np.int64),
                                     np.zeros(0)))


def test_distinct_edges_sorts_and_drops_repeats():
  src, dst = lsh.distinct_edges(np.array([5, 1, 5, 1, 1]),
                                np.array([9, 3, 9, 2, 3]))
  assert list(zip(src.tolist(), dst.tolist())) == [(1, 2), (1, 3), (5, 9)]


def test_rows_of_finds_positions_and_names_a_missing_id():
  ids = np.array([3, 8, 20], dtype=np.int64)
  np.testing.assert_array_equal(lsh.rows_of(ids, np.array([20, 3, 3])),
                                [2, 0, 0])
  assert len(lsh.rows_of(ids[:0], np.zeros(0, dtype=np.int64))) == 0
  with pytest.raises(KeyError, match="document id 9 "):
    lsh.rows_of(ids, np.array([3, 9]))
  with pytest.raises(KeyError, match="document id 4 "):
    lsh.rows_of(ids[:0], np.array([4]))
