"""Plain-pytest tests of the MinHash kernel (transforms/kernels/minhash.py)."""

import numpy as np
import pytest

from transforms.kernels import minhash
from transforms.kernels.minhash import (estimate_jaccard, minhash_batch,
                                        permutations)

_MASK64 = (1 << 64) - 1


def _pair_with_jaccard(shared, unique, seed):
  """Two sets of uint64 values (full range) with exact Jaccard
  shared / (shared + 2 * unique); returns (flat, offsets, jaccard)."""
  rng = np.random.default_rng(seed)
  values = rng.integers(0, 2**64, size=shared + 2 * unique, dtype=np.uint64)
  # The kernel keys on the low 32 bits: make sure the sets stay exact there.
  assert len(np.unique(values & np.uint64(0xFFFFFFFF))) == len(values)
  a = values[:shared + unique]
  b = np.concatenate([values[:shared], values[shared + unique:]])
  flat = np.concatenate([a, b])
  offsets = np.array([0, len(a), len(a) + len(b)], dtype=np.int64)
  return flat, offsets, shared / (shared + 2 * unique)


def _reference_signature(values, a, b):
  """The documented scheme in pure Python integers."""
  out = []
  for ai, bi in zip(a.tolist(), b.tolist()):
    out.append(min(((ai * (int(x) & 0xFFFFFFFF) + bi) & _MASK64) >> 32
                   for x in values))
  return np.array(out, dtype=np.uint32)


# --- estimator (acceptance criterion) ---------------------------------------

@pytest.mark.parametrize("k", [64, 256, 1024])
def test_estimator_unbiased_with_binomial_standard_error(k):
  flat, offsets, jaccard = _pair_with_jaccard(300, 350, seed=2024)
  assert jaccard == pytest.approx(0.30)
  seeds = range(1000, 1400)
  estimates = np.empty(len(seeds))
  for i, seed in enumerate(seeds):
    sigs = minhash_batch(flat, offsets, *permutations(k, seed))
    estimates[i] = estimate_jaccard(sigs[0], sigs[1])
  expected_se = np.sqrt(jaccard * (1 - jaccard) / k)
  assert abs(estimates.mean() - jaccard) < 0.01
  assert estimates.std(ddof=1) == pytest.approx(expected_se, rel=0.15)


# --- minhash_batch ----------------------------------------------------------

def _random_batch(seed, n_docs=12, max_len=80):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len, size=n_docs)
  offsets = np.zeros(n_docs + 1, dtype=np.int64)
  np.cumsum(lengths, out=offsets[1:])
  flat = rng.integers(0, 2**64, size=offsets[-1], dtype=np.uint64)
  return flat, offsets


def test_batch_equals_one_document_at_a_time():
  flat, offsets = _random_batch(1)
  a, b = permutations(128, 7)
  batch = minhash_batch(flat, offsets, a, b)
  assert batch.shape == (len(offsets) - 1, 128)
  assert batch.dtype == np.uint32
  for i in range(len(offsets) - 1):
    doc = flat[offsets[i]:offsets[i + 1]]
    single = minhash_batch(doc, np.array([0, len(doc)]), a, b)
    np.testing.assert_array_equal(batch[i], single[0])


def test_matches_documented_scheme():
  flat, offsets = _random_batch(2, n_docs=3, max_len=20)
  a, b = permutations(16, 3)
  batch = minhash_batch(flat, offsets, a, b)
  for i in range(3):
    np.testing.assert_array_equal(
        batch[i], _reference_signature(flat[offsets[i]:offsets[i + 1]], a, b))


def test_matches_vectorised_reference_on_a_large_batch():
  flat, offsets = _random_batch(3, n_docs=300, max_len=400)
  a, b = permutations(128, 11)
  x = flat & np.uint64(0xFFFFFFFF)
  hashed = (a[:, None] * x[None, :] + b[:, None]) >> np.uint64(32)
  expected = np.minimum.reduceat(hashed, offsets[:-1], axis=1).T
  np.testing.assert_array_equal(minhash_batch(flat, offsets, a, b), expected)


def test_empty_document_raises():
  a, b = permutations(8, 0)
  flat = np.arange(1, 6, dtype=np.uint64)
  with pytest.raises(ValueError):
    minhash_batch(flat, np.array([0, 2, 2, 5]), a, b)
  with pytest.raises(ValueError):
    minhash_batch(np.zeros(0, dtype=np.uint64), np.array([0, 0]), a, b)


def test_no_documents_gives_empty_result():
  a, b = permutations(8, 0)
  out = minhash_batch(np.zeros(0, dtype=np.uint64), np.array([0]), a, b)
  assert out.shape == (0, 8)


def test_duplicate_shingles_do_not_change_signature():
  a, b = permutations(32, 5)
  doc = np.array([5, 9, 13, 21], dtype=np.uint64)
  doubled = np.concatenate([doc, doc[::-1], doc[:2]])
  np.testing.assert_array_equal(
      minhash_batch(doc, np.array([0, 4]), a, b),
      minhash_batch(doubled, np.array([0, len(doubled)]), a, b))


def test_permutations_deterministic_and_seed_dependent():
  a1, b1 = permutations(64, 42)
  a2, b2 = permutations(64, 42)
  np.testing.assert_array_equal(a1, a2)
  np.testing.assert_array_equal(b1, b2)
  assert a1.dtype == np.uint64 and b1.dtype == np.uint64
  assert a1.shape == (64,) and b1.shape == (64,)
  a3, b3 = permutations(64, 43)
  assert not np.array_equal(a1, a3)
  assert not np.array_equal(b1, b3)
  assert not np.array_equal(a1, b1)
  # A shorter family is a prefix of a longer one with the same seed.
  a4, b4 = permutations(16, 42)
  np.testing.assert_array_equal(a4, a1[:16])
  np.testing.assert_array_equal(b4, b1[:16])


def test_golden_signature():
  a, b = permutations(16, 42)
  assert a[:2].tolist() == [14637540996126288189, 4537136404690122302]
  assert b[:2].tolist() == [5340497649745024426, 17561239735070821267]
  shingles = np.array(
      [(0x0123456789ABCDEF * i) & _MASK64 for i in range(1, 21)],
      dtype=np.uint64)
  sig = minhash_batch(shingles, np.array([0, 20]), a, b)
  assert sig[0, :8].tolist() == [1185446822, 102870260, 213942715, 1112831857,
                                 604483376, 28130261, 160175667, 329566311]
  assert minhash.MINHASH_SCHEME == "multiply-add-shift-u32-v1"


def test_identical_sets_estimate_one():
  rng = np.random.default_rng(9)
  doc = rng.integers(0, 2**64, size=500, dtype=np.uint64)
  shuffled = rng.permutation(doc)
  flat = np.concatenate([doc, shuffled])
  sigs = minhash_batch(flat, np.array([0, 500, 1000]), *permutations(256, 1))
  assert estimate_jaccard(sigs[0], sigs[1]) == 1.0


def test_disjoint_sets_estimate_near_zero():
  flat, offsets, jaccard = _pair_with_jaccard(0, 2000, seed=10)
  assert jaccard == 0.0
  sigs = minhash_batch(flat, offsets, *permutations(512, 2))
  assert estimate_jaccard(sigs[0], sigs[1]) < 0.02


def test_estimate_jaccard_broadcasts():
  sigs = np.array([[1, 2, 3, 4], [1, 2, 0, 0], [9, 9, 9, 9]], dtype=np.uint32)
  np.testing.assert_allclose(estimate_jaccard(sigs, sigs[0]), [1.0, 0.5, 0.0])


# --- one-permutation hashing ------------------------------------------------

def _fmix64(h):
  h ^= h >> 33
  h = (h * 0xFF51AFD7ED558CCD) & _MASK64
  h ^= h >> 33
  h = (h * 0xC4CEB9FE1A85EC53) & _MASK64
  return h ^ (h >> 33)


def _reference_oph(values, k, seed):
  """The documented OPH scheme in pure Python integers."""
  key, probe_key = (int(v) for v in minhash.oph_keys(seed))
  bins = [None] * k
  for x in values:
    h = _fmix64(int(x) ^ key)
    slot = ((h >> 32) * k) >> 32
    value = h & 0xFFFFFFFF
    if bins[slot] is None or value < bins[slot]:
      bins[slot] = value
  out = []
  for i in range(k):
    attempt, source = 1, i
    while bins[source] is None:
      probe = _fmix64(probe_key ^ ((i << 32) | attempt))
      source = ((probe >> 32) * k) >> 32
      attempt += 1
    out.append(bins[source])
  return np.array(out, dtype=np.uint32)


@pytest.mark.parametrize("shared,unique,k", [
    (300, 350, 64), (300, 350, 256), (300, 350, 1024),  # dense: few empty bins
    (100, 50, 128), (30, 15, 128),  # union 200 / 60 items in 128 bins
    (10, 5, 128), (2, 1, 128),  # short documents: most bins are empty
    (1, 3, 128)])
def test_oph_estimator_unbiased_with_bounded_standard_error(shared, unique, k):
  # Without densification two short documents would agree on every bin that
  # both leave empty (estimate near 1 for J=0.5 with 4 shingles); optimal
  # densification keeps the estimate unbiased at every set size, with a
  # standard error within 1.35x of K-permutation MinHash's binomial one
  # (measured: 0.90x for dense sets, up to 1.25x for a 4-shingle union).
  flat, offsets, jaccard = _pair_with_jaccard(shared, unique, seed=2024)
  seeds = range(1000, 1400)
  estimates = np.empty(len(seeds))
  for i, seed in enumerate(seeds):
    sigs = minhash.oph_batch(flat, offsets, k, seed)
    estimates[i] = estimate_jaccard(sigs[0], sigs[1])
  binomial_se = np.sqrt(jaccard * (1 - jaccard) / k)
  assert abs(estimates.mean() - jaccard) < 0.01
  assert 0.75 * binomial_se < estimates.std(ddof=1) < 1.35 * binomial_se


def test_oph_matches_documented_scheme():
  # 3 shingles in 16 bins densify 13 bins; 40 fill most of them.
  flat, offsets = _random_batch(4, n_docs=3, max_len=40)
  flat[:3] = [1, 2, 3]
  offsets[1] = 3
  for seed in (0, 5):
    sigs = minhash.oph_batch(flat, offsets, 16, seed)
    for i in range(3):
      np.testing.assert_array_equal(
          sigs[i], _reference_oph(flat[offsets[i]:offsets[i + 1]], 16, seed))


def test_oph_golden_signature():
  assert minhash.OPH_SCHEME == "oph-fmix64-optimal-densification-v1"
  assert minhash.SKETCH_SCHEMES == {"classic": minhash.MINHASH_SCHEME,
                                    "oph": minhash.OPH_SCHEME}
  shingles = np.array(
      [(0x0123456789ABCDEF * i) & _MASK64 for i in range(1, 21)],
      dtype=np.uint64)
  sig = minhash.oph_batch(shingles, np.array([0, 20]), 16, 42)
  assert sig[0, :8].tolist() == _reference_oph(shingles, 16, 42)[:8].tolist()
  # 20 shingles leave bins 0, 11 and 12 empty; bin 0 copies bin 7.
  assert sig[0, :8].tolist() == [1805656096, 363704404, 2359229609, 1091379602,
                                 3817280619, 430866230, 2012478421, 1805656096]


def test_oph_single_shingle_fills_every_bin_with_its_value():
  sig = minhash.oph_batch(np.array([77], dtype=np.uint64), np.array([0, 1]),
                          128, 3)
  assert len(set(sig[0].tolist())) == 1


def test_oph_batch_properties():
  flat, offsets = _random_batch(5)
  batch = minhash.oph_batch(flat, offsets, 64, 7)
  assert batch.shape == (len(offsets) - 1, 64) and batch.dtype == np.uint32
  for i in range(len(offsets) - 1):
    doc = flat[offsets[i]:offsets[i + 1]]
    alone = minhash.oph_batch(doc, np.array([0, len(doc)]), 64, 7)
    np.testing.assert_array_equal(batch[i], alone[0])
    # Order and repeats do not matter (a set sketch).
    shuffled = np.concatenate([doc[::-1], doc[:3]])
    np.testing.assert_array_equal(
        minhash.oph_batch(shuffled, np.array([0, len(shuffled)]), 64, 7)[0],
        alone[0])
  np.testing.assert_array_equal(minhash.oph_batch(flat, offsets, 64, 7), batch)
  assert not np.array_equal(minhash.oph_batch(flat, offsets, 64, 8), batch)
  with pytest.raises(ValueError):
    minhash.oph_batch(flat[:2], np.array([0, 2, 2]), 64, 7)


def test_oph_identical_and_disjoint_sets():
  rng = np.random.default_rng(9)
  doc = rng.integers(0, 2**64, size=500, dtype=np.uint64)
  flat = np.concatenate([doc, rng.permutation(doc)])
  sigs = minhash.oph_batch(flat, np.array([0, 500, 1000]), 256, 1)
  assert estimate_jaccard(sigs[0], sigs[1]) == 1.0
  flat, offsets, _ = _pair_with_jaccard(0, 2000, seed=10)
  sigs = minhash.oph_batch(flat, offsets, 512, 2)
  assert estimate_jaccard(sigs[0], sigs[1]) < 0.02
