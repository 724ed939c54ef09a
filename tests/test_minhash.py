"""Plain-pytest tests of the MinHash kernel (transforms/kernels/minhash.py)."""

import functools

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
#
# A standard-error test compares the sample variance v of N_SEEDS estimates
# (one per seed) with the variance sigma^2 the scheme must have. Over N
# independent estimates, Var(v) = sigma^4 (2/(N-1) + kappa/N) with kappa the
# estimator's excess kurtosis (chi-square with N-1 degrees of freedom when
# kappa = 0), and v is close to normal at N = 400; a reference variance taken
# from R Monte Carlo draws adds sigma^4 (2/(R-1) + kappa/R). The test accepts
# |v - sigma^2| <= Z * sigma^2 * sqrt(those terms): for kappa ~ 0 that is an
# SE ratio within 0.85-1.13 (0.71-1.22 at kappa = 4), while a sketch with only
# K/2 independent entries has ~1.41x the SE and fails every case.

N_SEEDS = 400
Z = 4.0  # two-sided p = 6e-5 per case for a correct sketch


def _classic(flat, offsets, k, seed):
  return minhash_batch(flat, offsets, *permutations(k, seed))


def _half_independent(sketch):
  """Mutant: K/2 independent entries, each used twice."""
  def mutant(flat, offsets, k, seed):
    half = sketch(flat, offsets, k // 2, seed)
    return np.concatenate([half, half], axis=1)
  return mutant


def _estimates(sketch, flat, offsets, k):
  return np.array([estimate_jaccard(*sketch(flat, offsets, k, seed))
                   for seed in range(1000, 1000 + N_SEEDS)])


def _moment_failures(estimates, mean, var, kurtosis, draws=None):
  """What is wrong with the estimates' mean and variance against a reference
  (mean, variance, excess kurtosis; ``draws``: its Monte Carlo draws, None
  for a closed form); empty when nothing is."""
  n = len(estimates)
  extra = (1 / draws, 2 / (draws - 1) + kurtosis / draws) if draws else (0, 0)
  failures = []
  mean_tol = Z * np.sqrt(var * (1 / n + extra[0]))
  if abs(estimates.mean() - mean) > mean_tol:
    failures.append(f"mean {estimates.mean():.4f}, reference {mean:.4f} "
                    f"+- {mean_tol:.4f}")
  rel = Z * np.sqrt(2 / (n - 1) + kurtosis / n + extra[1])
  v = estimates.var(ddof=1)
  if abs(v - var) > rel * var:
    failures.append(f"SE {np.sqrt(v):.4f} = {np.sqrt(v / var):.3f}x the "
                    f"reference {np.sqrt(var):.4f}; accepted "
                    f"{np.sqrt(max(1 - rel, 0)):.3f}-{np.sqrt(1 + rel):.3f}x")
  return failures


def _check(failures, mutant):
  if mutant:
    assert failures, "the K/2-entry mutant passed the standard-error test"
  else:
    assert not failures, failures


@pytest.mark.parametrize("mutant", [False, True], ids=["kernel", "half-K"])
@pytest.mark.parametrize("k", [64, 256, 1024])
def test_estimator_unbiased_with_binomial_standard_error(k, mutant):
  # K permutations drawn independently per seed: the number of equal entries
  # is Binomial(K, J) (min-wise hashing), so mean J, variance J(1-J)/K and
  # excess kurtosis (1 - 6J(1-J)) / (K J(1-J)).
  flat, offsets, jaccard = _pair_with_jaccard(300, 350, seed=2024)
  assert jaccard == pytest.approx(0.30)
  sketch = _half_independent(_classic) if mutant else _classic
  estimates = _estimates(sketch, flat, offsets, k)
  pq = jaccard * (1 - jaccard)
  _check(_moment_failures(estimates, jaccard, pq / k,
                          (1 - 6 * pq) / (k * pq)), mutant)


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


OPH_DRAWS = 20_000


@functools.lru_cache(maxsize=None)
def _ideal_oph_moments(shared, unique, k):
  """Mean, variance and excess kurtosis of the OPH estimate with optimal
  densification under truly random hashing, by Monte Carlo from the scheme's
  definition (not from the kernel).

  Each of the ``shared`` + 2 ``unique`` items falls in a uniform bin; a
  non-empty bin's entries agree iff the union's minimum there (uniform among
  its items) is a shared item. A bin empty for both documents copies, in
  each, the first non-empty bin of one probe sequence: the first bin hit
  that is non-empty in either is uniform over those, and if it is empty in
  one document that one copies another bin, so the entries agree with
  probability (agreeing bins) / (bins non-empty in either). A bin empty in
  just one document never agrees (the other keeps its own minimum).
  """
  rng = np.random.default_rng(7)
  out = []
  for start in range(0, OPH_DRAWS, 4000):
    n = min(4000, OPH_DRAWS - start)
    base = (np.arange(n) * k)[:, None]

    def per_bin(items):
      bins = (rng.integers(k, size=(n, items)) + base).ravel()
      return np.bincount(bins, minlength=n * k).reshape(n, k)

    in_shared = per_bin(shared)
    in_either = in_shared + per_bin(unique) + per_bin(unique)
    agree = (rng.random((n, k)) * np.maximum(in_either, 1) < in_shared).sum(1)
    occupied = (in_either > 0).sum(1)
    out.append((agree + rng.binomial(k - occupied, agree / occupied)) / k)
  draws = np.concatenate(out)
  centred = draws - draws.mean()
  var = centred.var()
  return draws.mean(), var, (centred**4).mean() / var**2 - 3


def _oph(flat, offsets, k, seed):
  return minhash.oph_batch(flat, offsets, k, seed)


@pytest.mark.parametrize("mutant", [False, True], ids=["kernel", "half-K"])
@pytest.mark.parametrize("shared,unique,k", [
    (300, 350, 64), (300, 350, 256), (300, 350, 1024),  # dense: few empty bins
    (100, 50, 128), (30, 15, 128),  # union 200 / 60 items in 128 bins
    (10, 5, 128), (2, 1, 128),  # short documents: most bins are empty
    (1, 3, 128)])
def test_oph_estimator_unbiased_with_bounded_standard_error(shared, unique, k,
                                                            mutant):
  # Without densification two short documents would agree on every bin that
  # both leave empty (estimate near 1 for J=0.5 with 4 shingles). With it the
  # ideal scheme is unbiased at every set size, with an SE of 0.89-0.98x
  # K-permutation MinHash's binomial one for dense sets and up to 1.27x for
  # a 4-shingle union; the kernel's estimates must match its moments.
  flat, offsets, jaccard = _pair_with_jaccard(shared, unique, seed=2024)
  mean, var, kurtosis = _ideal_oph_moments(shared, unique, k)
  binomial_var = jaccard * (1 - jaccard) / k
  assert abs(mean - jaccard) < Z * np.sqrt(var / OPH_DRAWS)
  assert 0.85 < np.sqrt(var / binomial_var) < 1.3
  sketch = _half_independent(_oph) if mutant else _oph
  estimates = _estimates(sketch, flat, offsets, k)
  _check(_moment_failures(estimates, mean, var, kurtosis, OPH_DRAWS), mutant)


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
