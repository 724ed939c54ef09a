"""Large-bucket component search (transforms/kernels/bucket_components.py)
against brute force: every pair of the bucket verified, a plain union-find.

Buckets: large template families, drifting chains (sliding windows, whose
ends share nothing), many small components in one bucket, arbitrary sets
(hypothesis); both verification measures, indexed members, both paths. The
old rule (each member compared with the 8 lowest ids only) and a loop that
never searches its second representative's cover are mutants the oracle
must reject.
"""

import inspect
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_components import reference_labels
from transforms.kernels import bucket_components as bc
from transforms.kernels import jaccard as jaccard_kernels
from transforms.kernels import dispatch


def _sets(docs):
  """The set layout of lists of ints."""
  values = [np.unique(np.asarray(d, dtype=np.uint64)) for d in docs]
  offsets = np.zeros(len(values) + 1, dtype=np.int64)
  np.cumsum([len(v) for v in values], out=offsets[1:])
  return (np.concatenate(values) if values else np.zeros(0, np.uint64),
          offsets)


def _brute_force(n, passes, first_new=0):
  """Components (frozensets of positions, size >= 2) of all passing pairs."""
  edges = [(i, j) for i in range(n) for j in range(i + 1, n)
           if j >= first_new and passes(i, j)]
  return _partition(reference_labels(edges))


def _partition(labels):
  groups = {}
  for node, label in labels.items():
    groups.setdefault(label, set()).add(node)
  return {frozenset(g) for g in groups.values() if len(g) > 1}


def _set_passes(values, offsets, members, threshold):
  def passes(i, j):
    a, b = members[i], members[j]
    inter, union = jaccard_kernels.jaccard(values[offsets[a]:offsets[a + 1]],
                                           values[offsets[b]:offsets[b + 1]])
    return bool(union) and bool(jaccard_kernels.meets_threshold(
        inter, union, threshold))
  return passes


def _check_forest(forest, n, passes, first_new=0):
  """The forest's edges all pass, and its components are brute force's."""
  for a, b in zip(forest.src.tolist(), forest.dst.tolist()):
    assert a < b and passes(a, b) and b >= first_new
  assert len(forest.src) == len(set(zip(forest.src.tolist(),
                                        forest.dst.tolist())))
  got = _partition(reference_labels(zip(forest.src.tolist(),
                                        forest.dst.tolist())))
  assert got == _brute_force(n, passes, first_new)
  assert forest.passed <= forest.comparisons <= n * (n - 1) // 2


def families(rng, n_families, size, length=200, edit=(0.02, 0.12)):
  """Templates (distinct vocabularies) and variants with a share of their
  words replaced, shuffled."""
  docs = []
  for f in range(n_families):
    base = rng.integers(0, 10**6, size=length) + f * 10**7
    for _ in range(size):
      variant = base.copy()
      edits = rng.choice(length, size=int(length * rng.uniform(*edit)),
                         replace=False)
      variant[edits] = rng.integers(10**9, 2 * 10**9, size=len(edits))
      docs.append(variant)
  return [docs[i] for i in rng.permutation(len(docs))]


def chain(rng, n, window=100, step=3):
  """Sliding windows over one stream: neighbours overlap, ends do not."""
  stream = rng.integers(0, 10**9, size=window + n * step)
  return [stream[i * step:i * step + window] for i in range(n)]


def hub_only(values, offsets, members, threshold, hubs=8):
  """Mutant (the former rule): each member compared with the ``hubs``
  lowest positions only (and those with each other)."""
  passes = _set_passes(values, offsets, members, threshold)
  src, dst = [], []
  for j in range(1, len(members)):
    for i in range(min(j, hubs)):
      if passes(i, j):
        src.append(i)
        dst.append(j)
  return bc.BucketForest(np.array(src, dtype=np.int64),
                         np.array(dst, dtype=np.int64), np.zeros(len(src)),
                         len(src), len(src))


CASES = {
    # 600 members, 3 families of variants at Jaccard ~0.6-0.95 to each other.
    "families": lambda rng: families(rng, 3, 200),
    # 300 windows, consecutive Jaccard 0.94, drifting far from the start.
    "chain": lambda rng: chain(rng, 300),
    # 120 components of 4 (and strays) in one bucket.
    "small": lambda rng: families(rng, 120, 4) + [
        rng.integers(0, 10**9, size=200) for _ in range(30)],
    "mixed": lambda rng: (families(rng, 4, 60, edit=(0.05, 0.3))
                          + chain(rng, 120, step=5)
                          + [rng.integers(0, 10**9, size=200)
                             for _ in range(40)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("finder", ["forest", "hub-only"])
def test_set_forest_equals_all_pairs(case, finder):
  rng = np.random.default_rng(7)
  docs = CASES[case](rng)
  if case == "mixed":
    docs = [docs[i] for i in rng.permutation(len(docs))]
  values, offsets = _sets(docs)
  members = np.arange(len(docs))
  threshold = 0.8
  passes = _set_passes(values, offsets, members, threshold)
  if finder == "hub-only":
    with pytest.raises(AssertionError):
      _check_forest(hub_only(values, offsets, members, threshold), len(docs),
                    passes)
    return
  forest = bc.set_forest(values, offsets, members, threshold)
  _check_forest(forest, len(docs), passes)
  found = _brute_force(len(docs), passes)
  k = len(docs)
  # Work near k x components (singletons included; measured 0.16-0.37 k
  # per component), far below the k(k-1)/2 pairs; the chain, one component
  # drifting away from its start, costs about k x its representatives
  # (measured 11.6 k).
  components = len(found) + k - sum(len(c) for c in found)
  bound = 12 * k if case == "chain" else k * components // 2
  assert forest.comparisons <= bound, (forest.comparisons, k, components)
  assert forest.comparisons < k * (k - 1) // 2 * 0.4


def test_members_index_a_larger_set_layout_and_indexed_members():
  # Members are rows of a shard's sets, in any subset; the first
  # ``first_new`` are indexed documents, never paired with each other.
  rng = np.random.default_rng(3)
  docs = families(rng, 3, 40) + chain(rng, 60)
  values, offsets = _sets(docs)
  members = np.sort(rng.choice(len(docs), size=120, replace=False))
  passes = _set_passes(values, offsets, members, 0.75)
  for first_new in (0, 50, 119):
    forest = bc.set_forest(values, offsets, members, 0.75, first_new)
    _check_forest(forest, len(members), passes, first_new)


def test_row_forest_equals_all_pairs():
  # Signatures of 64 entries: families (entries replaced at random) and a
  # drifting chain (a few entries changed per step).
  rng = np.random.default_rng(11)
  rows = []
  for _ in range(4):
    base = rng.integers(0, 2**32, size=64, dtype=np.uint64)
    for _ in range(50):
      row = base.copy()
      edits = rng.choice(64, size=rng.integers(0, 20), replace=False)
      row[edits] = rng.integers(0, 2**32, size=len(edits))
      rows.append(row)
  row = rng.integers(0, 2**32, size=64, dtype=np.uint64)
  for _ in range(150):
    row = row.copy()
    edits = rng.choice(64, size=3, replace=False)
    row[edits] = rng.integers(0, 2**32, size=3)
    rows.append(row)
  signatures = np.array([rows[i] for i in rng.permutation(len(rows))],
                        dtype=np.uint32)
  members = np.arange(len(rows))
  min_equal = 52  # threshold 0.8 of 64 entries
  def passes(i, j):
    return int(np.count_nonzero(signatures[i] == signatures[j])) >= min_equal
  for first_new in (0, 100):
    forest = bc.row_forest(signatures, members, min_equal, first_new)
    _check_forest(forest, len(rows), passes, first_new)
  assert forest.comparisons < len(rows) ** 2 // 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 24), min_size=0, max_size=12),
                min_size=2, max_size=40),
       st.sampled_from([0.3, 0.5, 0.6, 0.8, 1.0]),
       st.sampled_from([0.0, 0.05, 0.2, 0.6]), st.integers(0, 40))
def test_arbitrary_sets(docs, threshold, spread, first_new):
  values, offsets = _sets(docs)
  members = np.arange(len(docs))
  forest = bc.set_forest(values, offsets, members, threshold,
                         min(first_new, len(docs)), spread)
  _check_forest(forest, len(docs), _set_passes(values, offsets, members,
                                               threshold),
                min(first_new, len(docs)))


def test_compiled_and_pure_paths_agree(monkeypatch):
  rng = np.random.default_rng(5)
  docs = CASES["mixed"](rng)
  values, offsets = _sets(docs)
  members = np.arange(len(docs))
  compiled = bc.set_forest(values, offsets, members, 0.8)
  assert dispatch.started()
  monkeypatch.setattr(dispatch, "compiled_kernels", lambda work: None)
  pure = bc.set_forest(values, offsets, members, 0.8)
  for a, b in zip(compiled, pure):
    np.testing.assert_array_equal(a, b)


def test_twins_are_the_first_equal_member():
  values, offsets = _sets([[1, 2, 3], [4], [1, 2, 3], [], [], [4],
                           [1, 2, 3, 5]])
  # Equal non-empty sets map to their first row; empty sets never pass.
  assert bc.set_twins(values, offsets, np.arange(7)).tolist() == [
      0, 1, 0, 3, 4, 1, 6]
  assert bc.set_twins(values, offsets, np.array([1, 2, 5, 6])).tolist() == [
      1, 2, 1, 6]
  signatures = np.array([[1, 2], [3, 4], [1, 2], [3, 4], [5, 6]],
                        dtype=np.uint32)
  assert bc.row_twins(signatures, np.arange(5)).tolist() == [0, 1, 0, 1, 4]
  assert bc.row_twins(signatures, np.array([1, 3, 4])).tolist() == [1, 1, 4]


def test_twins_survive_fingerprint_collisions(monkeypatch):
  # Every set fingerprinted alike: only the intersection decides.
  monkeypatch.setattr(bc, "fmix64", lambda v: np.zeros(len(v), np.uint64))
  values, offsets = _sets([[1, 2], [3, 4], [1, 2], [5, 6]])
  assert bc.set_twins(values, offsets, np.arange(4)).tolist() == [0, 1, 0, 3]


def _mutated_loop(old: str, new: str):
  """:func:`bc.forest_loop` with one source line changed (a mutant the
  oracle must reject), compiled in the kernel module's namespace."""
  source = textwrap.dedent(inspect.getsource(bc.forest_loop))
  assert source.count(old) == 1, old
  namespace = dict(vars(bc))
  exec(compile(source.replace(old, new), bc.__file__, "exec"), namespace)  # pylint: disable=exec-used
  return namespace["forest_loop"]


# A representative's cover never searched: members similar only to a
# non-representative member of the second representative's cover (the
# second family; the second stretch of a drifting chain) stay apart.
SECOND_REPRESENTATIVE_SKIPPED = (
    "          d = rep_distance[q]\n",
    "          d = rep_distance[q]\n          if q == 1:\n            continue\n")


@pytest.mark.parametrize("case", ["chain", "mixed"])
def test_oracle_rejects_a_skipped_second_representative(case, monkeypatch):
  rng = np.random.default_rng(7)
  docs = CASES[case](rng)
  values, offsets = _sets(docs)
  members = np.arange(len(docs))
  passes = _set_passes(values, offsets, members, 0.8)
  # The pure path runs the loop as Python, so the mutant replaces it.
  monkeypatch.setattr(dispatch, "compiled_kernels", lambda work: None)
  _check_forest(bc.set_forest(values, offsets, members, 0.8), len(docs),
                passes)
  monkeypatch.setattr(bc, "forest_loop",
                      _mutated_loop(*SECOND_REPRESENTATIVE_SKIPPED))
  with pytest.raises(AssertionError):
    _check_forest(bc.set_forest(values, offsets, members, 0.8), len(docs),
                  passes)
