"""The kernels' two paths: pure (numpy, pyarrow, plain Python) for small
work, compiled (numba) once a process has enough of it. Both must give
bit-identical results, so each kernel is run on both and compared; a small
job must not start numba at all, and its outputs must not depend on it."""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from tests.corpus import tree_bytes
from transforms.kernels import compiled_signature, connected, dispatch
from transforms.kernels import jaccard, lsh, minhash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample", "*.jsonl")
TEXT = st.one_of(st.none(), st.text(
    alphabet=st.sampled_from(list("ab cd,EF.1 2\u00e9\u0301\ufb01\u00c5-\t")),
    max_size=40))


def _force(monkeypatch, path):
  """Makes every kernel call in this test take ``path``."""
  if path == "compiled":
    module = importlib.import_module("transforms.kernels.compiled")
    monkeypatch.setitem(dispatch._STATE, "compiled", module)
  else:
    monkeypatch.setitem(dispatch._STATE, "compiled", None)
    monkeypatch.setitem(dispatch._STATE, "pure_work", 0)
    monkeypatch.setattr(dispatch, "SMALL_WORK", 1 << 62)
    monkeypatch.setattr(dispatch, "PURE_BUDGET", 1 << 62)


def _both(fn, *args):
  """``fn(*args)`` on the pure path, then on the compiled one."""
  with pytest.MonkeyPatch.context() as m:
    _force(m, "pure")
    pure = fn(*args)
  with pytest.MonkeyPatch.context() as m:
    _force(m, "compiled")
    fast = fn(*args)
  return pure, fast


def _assert_same(pure, fast):
  if isinstance(pure, (tuple, list)):
    assert len(pure) == len(fast)
    for p, f in zip(pure, fast):
      _assert_same(p, f)
  elif isinstance(pure, np.ndarray):
    assert pure.dtype == fast.dtype and pure.shape == fast.shape
    np.testing.assert_array_equal(pure, fast)
  else:
    assert pure == fast


def test_small_work_runs_pure_until_the_budget_then_compiled(monkeypatch):
  monkeypatch.setitem(dispatch._STATE, "compiled", None)
  monkeypatch.setitem(dispatch._STATE, "pure_work", 0)
  monkeypatch.setattr(dispatch, "SMALL_WORK", 10)
  monkeypatch.setattr(dispatch, "PURE_BUDGET", 25)
  assert dispatch.compiled_kernels(10) is None
  assert dispatch.compiled_kernels(10) is None
  assert not dispatch.started()
  # 30 > the budget: this call and every later one run compiled.
  kernels = dispatch.compiled_kernels(10)
  assert kernels is importlib.import_module("transforms.kernels.compiled")
  assert dispatch.started() and dispatch.compiled_kernels(0) is kernels


def test_one_large_call_starts_the_compiled_path(monkeypatch):
  monkeypatch.setitem(dispatch._STATE, "compiled", None)
  monkeypatch.setitem(dispatch._STATE, "pure_work", 0)
  assert dispatch.compiled_kernels(dispatch.SMALL_WORK + 1) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(TEXT, max_size=12), st.sampled_from(["word", "char"]),
       st.integers(1, 4), st.sampled_from(["classic", "oph"]),
       st.booleans(), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([1, 16, 64]))
def test_signatures_and_shingle_sets_are_the_same_on_both_paths(
    texts, unit, ngram, sketch, nfkc, lowercase, strip, fold, k):
  a, b = minhash.permutations(k, 7)
  normalize = dict(nfkc=nfkc, lowercase=lowercase, strip_punctuation=strip,
                   fold_digits=fold)
  _assert_same(*_both(lambda: compiled_signature.signature_batch(
      texts, unit=unit, ngram=ngram, seed=7, a=a, b=b, sketch=sketch,
      **normalize)))
  _assert_same(*_both(lambda: compiled_signature.shingle_sets(
      texts, unit=unit, ngram=ngram, seed=7, **normalize)))


@pytest.mark.parametrize("oph", [False, True])
def test_sketches_of_many_documents_are_the_same_on_both_paths(oph,
                                                               monkeypatch):
  rng = np.random.default_rng(3)
  sizes = rng.integers(1, 60, 700)
  sizes[:5] = 1  # single-shingle documents densify almost every bin
  offsets = np.r_[0, np.cumsum(sizes)]
  shingles = rng.integers(0, 2**64, offsets[-1], dtype=np.uint64)
  a, b = minhash.permutations(128, 11)
  # Chunks of a few documents each on the pure classic path.
  monkeypatch.setattr(minhash, "_PURE_CHUNK", 4096)

  def run():
    out = np.empty((len(sizes), 128), dtype=np.uint32)
    minhash.sketch(shingles, offsets, 128, a, b, oph, 11, out)
    return out
  _assert_same(*_both(run))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 30), st.sampled_from([(16, 4, 4), (8, 3, 2), (5, 5, 1)]),
       st.integers(1, 70), st.integers(0, 2**20))
def test_band_entries_digests_and_repeated_keys_are_the_same_on_both_paths(
    docs, shape, shards, seed):
  width, bands, rows = shape
  rng = np.random.default_rng(seed)
  # Few distinct values, so that band keys repeat.
  sigs = rng.integers(0, 3, (docs, width)).astype(np.uint32)
  ids = np.sort(rng.choice(10**6, docs, replace=False))
  pure, fast = _both(lambda: list(lsh.band_entries(sigs, ids, bands, rows,
                                                   seed, shards)))
  assert [s for s, _ in pure] == [s for s, _ in fast]
  _assert_same([p for _, p in pure], [p for _, p in fast])
  keys = lsh.band_keys(sigs, bands, rows, seed).ravel()
  _assert_same(*_both(lsh.repeated, keys))


SETS = st.lists(st.lists(st.integers(0, 40), max_size=25), max_size=15)


@settings(max_examples=60, deadline=None)
@given(SETS, st.data())
def test_sets_and_intersections_are_the_same_on_both_paths(docs, data):
  offsets = np.r_[0, np.cumsum([len(d) for d in docs])].astype(np.int64)
  values = np.array([v for d in docs for v in d], dtype=np.uint64)
  pure, fast = _both(jaccard.sorted_sets, values, offsets)
  _assert_same(pure, fast)
  sets, set_offsets = fast
  n = len(docs)
  pairs = data.draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)),
                                       st.integers(0, max(n - 1, 0))),
                             max_size=20 if n else 0))
  left = np.array([p[0] for p in pairs], dtype=np.int64)
  right = np.array([p[1] for p in pairs], dtype=np.int64)
  _assert_same(*_both(jaccard.pair_intersections, sets, set_offsets, left,
                      right))
  # Unsorted or repeated input is refused on both paths alike.
  unsorted = [sorted(set(d), reverse=True) for d in docs]
  if any(len(d) > 1 for d in unsorted):
    flat = np.array([v for d in unsorted for v in d], dtype=np.uint64)
    flat_offsets = np.r_[0, np.cumsum([len(d) for d in unsorted])]
    for path in ("pure", "compiled"):
      with pytest.MonkeyPatch.context() as m:
        _force(m, path)
        with pytest.raises(ValueError, match="sorted and distinct"):
          jaccard.pair_intersections(flat, flat_offsets, left, right)


EDGES = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)),
                 max_size=60)


@settings(max_examples=60, deadline=None)
@given(EDGES, st.data())
def test_union_finds_are_the_same_on_both_paths(edges, data):
  a = np.array([e[0] for e in edges], dtype=np.int64)
  b = np.array([e[1] for e in edges], dtype=np.int64)
  _assert_same(*_both(connected.component_minima, a, b))
  weight = np.array(data.draw(st.lists(
      st.one_of(st.floats(0, 1), st.just(float("nan"))),
      min_size=len(edges), max_size=len(edges))), dtype=np.float64)
  _assert_same(*_both(connected.spanning_forest, a, b, weight))


@pytest.mark.e2e
def test_a_job_gives_the_same_outputs_on_both_paths(tmp_path, monkeypatch):
  trees = {}
  for path in ("pure", "compiled"):
    with pytest.MonkeyPatch.context() as m:
      _force(m, path)
      out = str(tmp_path / path)
      assert main(["--input", SAMPLE, "--output", out, "--keep", "longest",
                   "--chain_guard", "true", "--runner", "FnApiRunner"]) == 0
    trees[path] = tree_bytes(out)
  assert trees["pure"] == trees["compiled"]
  assert any(name.startswith("clusters") for name in trees["pure"])


@pytest.mark.e2e
def test_a_small_job_never_starts_numba(tmp_path):
  lines = [f'{{"id": {i}, "text": "the same few words again and again'
           f' {i % 3}"}}' for i in range(20)]
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  code = ("import runpy, sys\n"
          "sys.argv = ['pipeline'] + sys.argv[1:]\n"
          "try:\n"
          "  runpy.run_module('pipeline', run_name='__main__')\n"
          "except SystemExit as e:\n"
          "  assert e.code == 0, e.code\n"
          "print('numba' in sys.modules)\n")
  done = subprocess.run(
      [sys.executable, "-c", code, "--input", str(tmp_path / "in.jsonl"),
       "--output", str(tmp_path / "out"), "--runner", "FnApiRunner"],
      capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().splitlines()[-1] == "False"
  assert "kept 3, removed 17 as duplicates" in done.stdout


_NUMBA_START = (
    "import sys\n"
    "from transforms.kernels import dispatch, minhash\n"
    "a, b = minhash.permutations(16, 1)\n"
    "dispatch._STATE['pure_work'] = dispatch.PURE_BUDGET\n"
    "from transforms.kernels import compiled_signature as cs\n"
    "sigs, _ = cs.signature_batch(['a b c d', 'e f'], unit='word', ngram=2,\n"
    "                             seed=1, a=a, b=b)\n"
    "assert dispatch.started()\n"
    "import numba.np.arraymath as arraymath\n"
    "print(arraymath._HAVE_BLAS, 'scipy.linalg' in sys.modules,\n"
    "      sigs.sum())\n"
    "import scipy.linalg.cython_blas\n")


@pytest.mark.parametrize("blas", [None, "1"])
def test_numba_starts_without_scipy_unless_asked(blas):
  """SciPy's linear algebra (0.2 s to import) is not loaded for numba's
  BLAS check, and stays importable; NEARDUP_NUMBA_BLAS=1 keeps the check."""
  pytest.importorskip("scipy.linalg")
  env = {k: v for k, v in os.environ.items() if k != "NEARDUP_NUMBA_BLAS"}
  if blas:
    env["NEARDUP_NUMBA_BLAS"] = blas
  done = subprocess.run([sys.executable, "-c", _NUMBA_START], env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  have_blas, scipy_linalg, total = done.stdout.split()
  assert (have_blas, scipy_linalg) == (("True", "True") if blas
                                       else ("False", "False"))
  # The same signatures either way (here on the pure path).
  a, b = minhash.permutations(16, 1)
  sigs, _ = compiled_signature.signature_batch(
      ["a b c d", "e f"], unit="word", ngram=2, seed=1, a=a, b=b)
  assert int(total) == int(sigs.sum())
