"""The one parameter object shared by every dedup transform, batch and streaming.

Pure Python (no Beam import) so kernels, tests and option parsing can use it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from transforms.kernels.lsh import choose_bands_rows

SHINGLE_UNITS = ("word", "char")
SKETCHES = ("classic", "oph")
VERIFY_MODES = ("exact", "signature", "none")
KEEP_POLICIES = ("first", "longest")


class ConfigError(ValueError):
  """An invalid parameter combination; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class DedupConfig:
  """Near-duplicate detection parameters, validated on construction.

  When neither ``bands`` nor ``rows`` is given they are chosen from
  ``threshold`` and ``num_perm`` by minimising ``fp_weight`` x (area under the
  banding S-curve below the threshold) + ``fn_weight`` x (area above it where
  pairs are missed); explicit values always win. The default weights 0.05 and
  0.95 over-generate candidates (S-curve threshold below ``threshold``: 16x8,
  ~0.71, for 0.8 and K=128) because verification removes false candidates
  while nothing recovers a missed pair. ``sketch`` picks how the
  ``num_perm`` signature entries are computed (classic K-permutation MinHash
  or one-permutation hashing); everything downstream treats both alike. An
  edge joins the duplicate graph only if verification passes: ``exact``
  (default) the true Jaccard of the two shingle sets is >= ``threshold``;
  ``signature`` the fraction of equal signature entries is; ``none`` keeps
  every candidate.

  Within every LSH bucket of at most ``exhaustive_bucket_size`` documents
  all pairs are candidates, so the clusters are the connected components of
  all pairs of such buckets that pass verification. A larger bucket of k
  documents costs at most k x ``bucket_hubs`` pairs: identical signatures
  are joined first, then every distinct one is compared with the
  ``bucket_hubs`` lowest ids. ``chain_guard`` removes a clustered document
  only if its exact Jaccard to the kept one reaches ``threshold``.
  """

  shingle_unit: str = "word"
  ngram: int = 5
  num_perm: int = 128
  sketch: str = "classic"
  bands: Optional[int] = None
  rows: Optional[int] = None
  threshold: float = 0.8
  fp_weight: float = 0.05
  fn_weight: float = 0.95
  verify: str = "exact"
  seed: int = 42
  nfkc: bool = True
  lowercase: bool = True
  strip_punctuation: bool = True
  fold_digits: bool = False
  min_tokens: int = 1
  keep: str = "first"
  max_cc_rounds: int = 20
  max_residual_edges: int = 1_000_000
  lsh_shards: int = 64
  exhaustive_bucket_size: int = 64
  bucket_hubs: int = 8
  chain_guard: bool = False

  def __post_init__(self):
    _check(self.shingle_unit in SHINGLE_UNITS,
           f"shingle_unit={self.shingle_unit!r}: use one of {SHINGLE_UNITS}"
           " (--shingle_unit).")
    _check(_is_int(self.ngram) and 1 <= self.ngram <= 64,
           f"ngram={self.ngram!r}: use an integer n-gram size from 1 to 64"
           " (--ngram); 5 for word shingles of web text is typical.")
    _check(_is_int(self.num_perm) and 1 <= self.num_perm <= 8192,
           f"num_perm={self.num_perm!r}: use an integer from 1 to 8192"
           " (--num_perm); 128 is typical.")
    _check(self.sketch in SKETCHES,
           f"sketch={self.sketch!r}: use classic (K-permutation MinHash) or"
           " oph (one-permutation hashing, faster, same estimator) with"
           " --sketch.")
    _check(isinstance(self.threshold, (int, float))
           and 0.0 < self.threshold <= 1.0,
           f"threshold={self.threshold!r}: use a Jaccard similarity in (0, 1]"
           " (--threshold), e.g. 0.8.")
    _check(self.fp_weight >= 0 and self.fn_weight >= 0
           and self.fp_weight + self.fn_weight > 0,
           "fp_weight and fn_weight must be non-negative and not both zero"
           " (--fp_weight/--fn_weight).")
    if (self.bands is None) != (self.rows is None):
      raise ConfigError(
          f"bands={self.bands!r}, rows={self.rows!r}: give both --bands and"
          " --rows, or neither and let --threshold choose them.")
    if self.bands is None:
      bands, rows = choose_bands_rows(self.threshold, self.num_perm,
                                      self.fp_weight, self.fn_weight)
      object.__setattr__(self, "bands", bands)
      object.__setattr__(self, "rows", rows)
    _check(_is_int(self.bands) and self.bands >= 1
           and _is_int(self.rows) and self.rows >= 1,
           f"bands={self.bands!r}, rows={self.rows!r}: both must be positive"
           " integers.")
    _check(self.bands * self.rows <= self.num_perm,
           f"bands*rows = {self.bands}*{self.rows} = {self.bands * self.rows}"
           f" exceeds num_perm={self.num_perm}: lower --bands or --rows, or"
           f" raise --num_perm to at least {self.bands * self.rows}.")
    _check(self.verify in VERIFY_MODES,
           f"verify={self.verify!r}: use one of {VERIFY_MODES} (--verify).")
    _check(_is_int(self.seed) and 0 <= self.seed < 2**63,
           f"seed={self.seed!r}: use a non-negative integer below 2**63"
           " (--seed).")
    _check(_is_int(self.min_tokens) and self.min_tokens >= 1,
           f"min_tokens={self.min_tokens!r}: use an integer >= 1"
           " (--min_tokens); documents with fewer tokens are kept unclustered.")
    _check(self.keep in KEEP_POLICIES,
           f"keep={self.keep!r}: use one of {KEEP_POLICIES} (--keep).")
    _check(_is_int(self.max_cc_rounds) and 1 <= self.max_cc_rounds <= 200,
           f"max_cc_rounds={self.max_cc_rounds!r}: use an integer from 1 to"
           " 200 (--max_cc_rounds).")
    _check(_is_int(self.max_residual_edges) and self.max_residual_edges >= 0,
           f"max_residual_edges={self.max_residual_edges!r}: use an integer"
           " >= 0 (--max_residual_edges).")
    _check(_is_int(self.lsh_shards) and 1 <= self.lsh_shards <= 1 << 20,
           f"lsh_shards={self.lsh_shards!r}: use an integer from 1 to 2**20"
           " (--lsh_shards).")
    _check(_is_int(self.exhaustive_bucket_size)
           and 2 <= self.exhaustive_bucket_size <= 4096,
           f"exhaustive_bucket_size={self.exhaustive_bucket_size!r}: use an"
           " integer from 2 to 4096 (--exhaustive_bucket_size); a bucket of"
           " k documents up to it costs k(k-1)/2 candidate pairs.")
    _check(_is_int(self.bucket_hubs)
           and 1 <= self.bucket_hubs <= self.exhaustive_bucket_size,
           f"bucket_hubs={self.bucket_hubs!r}: use an integer from 1 to"
           f" exhaustive_bucket_size={self.exhaustive_bucket_size}"
           " (--bucket_hubs).")
    _check(isinstance(self.chain_guard, bool),
           f"chain_guard={self.chain_guard!r}: use true or false"
           " (--chain_guard).")

  @property
  def lsh_threshold(self) -> float:
    """Similarity where the banding S-curve crosses about one half."""
    return (1.0 / self.bands) ** (1.0 / self.rows)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise ConfigError(message)
