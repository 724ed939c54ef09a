"""Validation of DedupConfig (transforms/config.py)."""

import dataclasses

import pytest

from transforms.config import (MIN_CANDIDATE_PROBABILITY, ConfigError,
                               DedupConfig)
from transforms.kernels.lsh import choose_bands_rows


def test_defaults_valid():
  c = DedupConfig()
  assert c.shingle_unit == "word" and c.ngram == 5 and c.num_perm == 128
  assert c.threshold == 0.8 and c.verify == "exact" and c.keep == "first"
  assert c.bands * c.rows <= c.num_perm


def test_default_choice_over_generates_candidates():
  # With verification on (the default), a pair at the threshold must be a
  # candidate with P >= 0.99: 16x8 (P 0.947) is not eligible, 16x6 is the
  # cheapest that is. Without verification the weights alone decide.
  c = DedupConfig()
  assert (c.fp_weight, c.fn_weight) == (0.05, 0.95)
  assert (c.bands, c.rows) == (16, 6)
  assert c.candidate_probability == pytest.approx(1 - (1 - 0.8**6)**16)
  assert c.candidate_probability >= MIN_CANDIDATE_PROBABILITY
  assert c.mean_false_candidate == pytest.approx(0.274, abs=1e-3)
  assert c.lsh_threshold < c.threshold - 0.05
  unverified = DedupConfig(verify="none")
  assert (unverified.bands, unverified.rows) == (16, 8)
  assert unverified.candidate_probability < MIN_CANDIDATE_PROBABILITY
  balanced = DedupConfig(fp_weight=0.5, fn_weight=0.5, verify="none")
  assert (balanced.bands, balanced.rows) == (9, 13)
  assert balanced.lsh_threshold > unverified.lsh_threshold
  assert (DedupConfig(verify="signature").bands,
          DedupConfig(fp_weight=0.5, fn_weight=0.5).rows) == (16, 6)


def test_bands_rows_chosen_from_threshold():
  c = DedupConfig(threshold=0.7, num_perm=64)
  assert (c.bands, c.rows) == choose_bands_rows(0.7, 64, 0.05, 0.95,
                                                MIN_CANDIDATE_PROBABILITY)
  assert c.bands * c.rows <= 64
  assert 0.4 < c.lsh_threshold < 0.7  # 11x3: P(0.7) >= 0.99 with K=64
  assert c.lsh_threshold == pytest.approx((1 / c.bands) ** (1 / c.rows))
  weighted = DedupConfig(threshold=0.7, num_perm=64, fp_weight=0.2,
                         fn_weight=0.8)
  assert (weighted.bands, weighted.rows) == choose_bands_rows(
      0.7, 64, 0.2, 0.8, MIN_CANDIDATE_PROBABILITY)


def test_explicit_bands_rows_win():
  c = DedupConfig(bands=20, rows=5, threshold=0.8)
  assert (c.bands, c.rows) == (20, 5)
  assert c.lsh_threshold == pytest.approx((1 / 20) ** (1 / 5))


@pytest.mark.parametrize("kwargs", [{"bands": 10}, {"rows": 5}])
def test_only_one_of_bands_rows(kwargs):
  with pytest.raises(ConfigError) as err:
    DedupConfig(**kwargs)
  assert "--bands" in str(err.value) and "--rows" in str(err.value)


def test_bands_times_rows_exceeds_num_perm():
  with pytest.raises(ConfigError) as err:
    DedupConfig(bands=20, rows=10, num_perm=128)
  message = str(err.value)
  assert "--num_perm" in message
  assert "200" in message  # the num_perm that would fit
  assert "--bands" in message or "--rows" in message


def test_config_error_is_value_error():
  assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("kwargs,flag", [
    ({"shingle_unit": "sentence"}, "--shingle_unit"),
    ({"ngram": 0}, "--ngram"),
    ({"ngram": 2.5}, "--ngram"),
    ({"num_perm": 0}, "--num_perm"),
    ({"threshold": 0}, "--threshold"),
    ({"threshold": 0.0}, "--threshold"),
    ({"threshold": 1.5}, "--threshold"),
    ({"threshold": -0.2}, "--threshold"),
    ({"verify": "minhash"}, "--verify"),
    ({"sketch": "bottom-k"}, "--sketch"),
    ({"keep": "last"}, "--keep"),
    ({"seed": -1}, "--seed"),
    ({"min_tokens": 0}, "--min_tokens"),
    ({"max_cc_rounds": 0}, "--max_cc_rounds"),
    ({"lsh_shards": 0}, "--lsh_shards"),
    ({"fp_weight": 0, "fn_weight": 0}, "--fp_weight"),
    ({"bands": 0, "rows": 5}, None),
])
def test_invalid_values(kwargs, flag):
  with pytest.raises(ConfigError) as err:
    DedupConfig(**kwargs)
  if flag:
    assert flag in str(err.value)


def test_boundary_values_valid():
  DedupConfig(threshold=1.0)
  DedupConfig(ngram=1, shingle_unit="char")
  DedupConfig(bands=128, rows=1, num_perm=128)
  DedupConfig(verify="none", keep="longest")
  assert DedupConfig().sketch == "classic"
  assert DedupConfig(sketch="oph").sketch == "oph"


def test_frozen():
  c = DedupConfig()
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.threshold = 0.5
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.bands = 1


def test_equal_and_hashable():
  assert DedupConfig(threshold=0.7) == DedupConfig(threshold=0.7)
  assert hash(DedupConfig(threshold=0.7)) == hash(DedupConfig(threshold=0.7))
  assert dataclasses.replace(DedupConfig(), seed=7).seed == 7
