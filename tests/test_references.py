"""Independent references for values the suite otherwise took from the code
under test: the (b, r) the optimizer chooses, P(edge) of each verify mode,
and the Flex Template entry point's argument handling. Each reference also
rejects a plausible wrong implementation (a mutant kept as a test case)."""

import itertools
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

import pipeline.cli
from pipeline.tools import params
from tests.corpus import seed_corpus, tree_bytes, write_jsonl
from transforms.config import MIN_CANDIDATE_PROBABILITY, DedupConfig
from transforms.kernels import lsh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE_MAIN = os.path.join(ROOT, "templates", "dataflow", "main.py")


# --- (b, r) choice: closed-form areas, every pair tried ---------------------

def _areas(threshold, bands, rows):
  """Exact false-positive and false-negative areas of the S-curve.

  With u = s^r, the integral of (1 - s^r)^b over [0, x] is
  (1/r) B(x^r; 1/r, b + 1), an incomplete beta function.
  """
  a, b = 1.0 / rows, bands + 1.0
  whole = special.beta(a, b) / rows
  below = whole * special.betainc(a, b, threshold ** rows)
  return threshold - below, whole - below


def brute_force_choice(threshold, num_perm, fp_weight, fn_weight,
                       products=None, min_candidate=None):
  """Every (b, r) with b*r <= K (or b*r in ``products``; with
  ``min_candidate``, only those whose 1-(1-t^r)^b reaches it) by exact
  error; ties to the smaller b*r, then fewer bands. Returns (error, b*r, b,
  r) rows, best first."""
  rows = []
  for bands in range(1, num_perm + 1):
    for r in range(1, num_perm // bands + 1):
      if products is not None and bands * r not in products:
        continue
      if (min_candidate is not None
          and 1 - (1 - threshold**r)**bands < min_candidate):
        continue
      fp, fn = _areas(threshold, bands, r)
      rows.append((fp_weight * fp + fn_weight * fn, bands * r, bands, r))
  return sorted(rows)


def _only_full_products(threshold, num_perm, fp_weight, fn_weight):
  """Mutant: searches only b*r = K (every permutation used)."""
  best = brute_force_choice(threshold, num_perm, fp_weight, fn_weight,
                            products={num_perm})[0]
  return best[2], best[3]


def _swapped_weights(threshold, num_perm, fp_weight, fn_weight):
  """Mutant: false-positive and false-negative weights exchanged."""
  return lsh.choose_bands_rows(threshold, num_perm, fn_weight, fp_weight)


# The optimizer integrates on a 2001-point grid; pairs closer than this in
# exact error may come out either way.
GRID_TOLERANCE = 1e-6
CASES = [(t, k, w) for t in (0.5, 0.7, 0.8, 0.9) for k in (32, 128)
         for w in ((0.05, 0.95), (0.5, 0.5), (0.9, 0.1))]


def _choice_failures(choose, min_candidate=None):
  failures = []
  for threshold, num_perm, (fp_w, fn_w) in CASES:
    ranked = brute_force_choice(threshold, num_perm, fp_w, fn_w,
                                min_candidate=min_candidate)
    bands, rows = choose(threshold, num_perm, fp_w, fn_w)
    err = next((e for e, _, b, r in ranked if (b, r) == (bands, rows)),
               None)
    if err is None or err > ranked[0][0] + GRID_TOLERANCE:
      failures.append(f"t={threshold} K={num_perm} w={fp_w}/{fn_w}: chose "
                      f"{bands}x{rows} (error {err}), best "
                      f"{ranked[0][2]}x{ranked[0][3]} ({ranked[0][0]:.6f})")
  return failures


@pytest.mark.parametrize("choose,accepted", [
    (lsh.choose_bands_rows, True), (_only_full_products, False),
    (_swapped_weights, False)], ids=["optimizer", "only-b*r=K", "swapped"])
def test_band_rows_choice_is_the_brute_force_optimum(choose, accepted):
  failures = _choice_failures(choose)
  if accepted:
    assert not failures, failures
  else:
    assert failures, "a wrong (b, r) search matched the brute force"


def _verified_choice(threshold, num_perm, fp_weight, fn_weight):
  return lsh.choose_bands_rows(threshold, num_perm, fp_weight, fn_weight,
                               MIN_CANDIDATE_PROBABILITY)


@pytest.mark.parametrize("choose,accepted", [
    (_verified_choice, True), (lsh.choose_bands_rows, False)],
    ids=["constrained", "unconstrained"])
def test_verified_choice_is_the_constrained_brute_force_optimum(choose,
                                                               accepted):
  # With verification on, only bandings with P(candidate | t) >= 0.99 are
  # eligible (every case here has one); the unconstrained optimum is not.
  failures = _choice_failures(choose, MIN_CANDIDATE_PROBABILITY)
  if accepted:
    assert not failures, failures
  else:
    assert failures, "the unconstrained choice met the P >= 0.99 bound"


def test_readme_choices_are_the_brute_force_optima():
  for weights, verify, want in (((0.05, 0.95), "none", (16, 8)),
                                ((0.5, 0.5), "none", (9, 13)),
                                ((0.05, 0.95), "exact", (16, 6)),
                                ((0.5, 0.5), "signature", (16, 6))):
    best = brute_force_choice(0.8, 128, *weights, min_candidate=(
        None if verify == "none" else MIN_CANDIDATE_PROBABILITY))[0]
    assert (best[2], best[3]) == want
    config = DedupConfig(threshold=0.8, fp_weight=weights[0],
                         fn_weight=weights[1], verify=verify)
    assert (config.bands, config.rows) == want


# --- P(edge): every pattern of equal signature entries ---------------------

def enumerated_edge_probability(s, config):
  """P(edge) by summing over all 2^K patterns of equal entries (each equal
  with probability s, independently): a candidate has some band of r equal
  entries; exact verification then keeps it iff s >= threshold, signature
  verification iff at least ceil(t K) entries are equal."""
  k, b, r = config.num_perm, config.bands, config.rows
  need = int(np.ceil(config.threshold * k - 1e-9))
  total = 0.0
  for pattern in itertools.product((0, 1), repeat=k):
    equal = sum(pattern)
    candidate = any(all(pattern[i * r:(i + 1) * r]) for i in range(b))
    if config.verify == "exact":
      kept = candidate and s >= config.threshold
    elif config.verify == "signature":
      kept = candidate and equal >= need
    else:
      kept = candidate
    if kept:
      total += s ** equal * (1 - s) ** (k - equal)
  return total


def _exact_without_threshold(s, config):
  """Mutant: the exact branch forgets the threshold (as verify=none)."""
  return params.edge_probability(
      s, DedupConfig(num_perm=config.num_perm, bands=config.bands,
                     rows=config.rows, threshold=config.threshold,
                     verify="none"))


def _exact_strictly_above(s, config):
  """Mutant: the exact branch keeps only pairs strictly above it."""
  s = np.atleast_1d(np.asarray(s, dtype=np.float64))
  return lsh.collision_probability(s, config.bands, config.rows) * (
      s > config.threshold)


SIMILARITIES = (0.0, 0.3, 0.49, 0.5, 0.5 + 1e-12, 0.625, 0.75, 0.9, 1.0)


@pytest.mark.parametrize("verify,function,accepted", [
    ("exact", params.edge_probability, True),
    ("signature", params.edge_probability, True),
    ("none", params.edge_probability, True),
    ("exact", _exact_without_threshold, False),
    ("exact", _exact_strictly_above, False)],
    ids=["exact", "signature", "none", "exact-no-threshold",
         "exact-strict"])
def test_edge_probability_matches_enumeration(verify, function, accepted):
  # K = 8 (2 bands of 3 rows and 2 unbanded entries), threshold 0.5 = 4 of
  # 8 entries; exactly at the threshold the pair is kept.
  config = DedupConfig(num_perm=8, bands=2, rows=3, threshold=0.5,
                       verify=verify)
  got = function(np.array(SIMILARITIES), config)
  want = [enumerated_edge_probability(s, config) for s in SIMILARITIES]
  if accepted:
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
  else:
    assert not np.allclose(got, want, rtol=1e-12, atol=1e-15)


def test_predicted_recall_is_the_mean_enumerated_edge_probability():
  from pipeline.tools import evaluate  # pylint: disable=import-outside-toplevel
  from pipeline.job import run_params  # pylint: disable=import-outside-toplevel
  similarity = np.array([0.5, 0.55, 0.7, 0.95])
  for verify in ("exact", "signature"):
    config = DedupConfig(num_perm=8, bands=2, rows=3, threshold=0.5,
                         verify=verify)
    assert evaluate.predicted_recall(similarity, run_params(config)) == (
        pytest.approx(np.mean([enumerated_edge_probability(s, config)
                               for s in similarity]), rel=1e-12))


# --- templates/dataflow/main.py --------------------------------------------

def _template_argv(monkeypatch, argv, code=0):
  """The argv main.py hands the CLI, and its exit status."""
  seen = []

  def fake_main(args):
    seen.append(list(args))
    return code

  monkeypatch.setattr(pipeline.cli, "main", fake_main)
  monkeypatch.setattr(sys, "argv", [TEMPLATE_MAIN, *argv])
  with pytest.raises(SystemExit) as exit_info:
    runpy.run_path(TEMPLATE_MAIN, run_name="__main__")
  (args,) = seen
  return args, exit_info.value.code


def test_template_main_never_waits_for_the_job(monkeypatch):
  flags = ["--runner=DataflowRunner", "--input=gs://b/*.jsonl",
           "--output=gs://b/out", "--threshold=0.7"]
  assert _template_argv(monkeypatch, flags) == (
      flags + ["--no_wait_until_finish"], 0)
  # Given already, it is not repeated; the CLI's exit status is the script's.
  with_flag = flags[:2] + ["--no_wait_until_finish"] + flags[2:]
  assert _template_argv(monkeypatch, with_flag, code=2) == (with_flag, 2)


@pytest.mark.e2e
def test_template_main_runs_the_job_as_a_script(tmp_path):
  # As the launcher does it (the file executed as a script, every parameter
  # as --name=value), on the local runner: the CLI's outputs, and its exit
  # status 2 with a message for a bad parameter.
  texts, _ = seed_corpus(n_base=150, seed=5)
  write_jsonl(tmp_path / "in.jsonl", texts)
  env = dict(os.environ, PYTHONPATH=ROOT)
  flags = [f"--input={tmp_path / 'in.jsonl'}", "--ngram=3",
           "--threshold=0.5", "--runner=FnApiRunner"]
  done = subprocess.run([sys.executable, TEMPLATE_MAIN, *flags,
                         f"--output={tmp_path / 'template'}"], env=env,
                        capture_output=True, text=True, check=False,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert pipeline.cli.main(flags + [f"--output={tmp_path / 'cli'}"]) == 0
  template = tree_bytes(str(tmp_path / "template"))
  assert template == tree_bytes(str(tmp_path / "cli"))
  assert any(name.startswith("deduped/") for name in template)
  bad = subprocess.run([sys.executable, TEMPLATE_MAIN, *flags,
                        f"--output={tmp_path / 'bad'}", "--bands=64",
                        "--rows=4"], env=env, capture_output=True, text=True,
                       check=False, timeout=300)
  assert bad.returncode == 2 and "--num_perm" in bad.stderr
