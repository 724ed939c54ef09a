"""The one parameter object shared by every dedup transform, batch and streaming.

Pure Python (no Beam import) so kernels, tests and option parsing can use it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from transforms.kernels.lsh import (choose_bands_rows, collision_probability,
                                   false_positive_area)

SHINGLE_UNITS = ("word", "char")
SKETCHES = ("classic", "oph")
VERIFY_MODES = ("exact", "signature", "none")
KEEP_POLICIES = ("first", "longest")
# With verification on, the chosen banding makes a pair at the threshold (or
# above) a candidate with at least this probability.
MIN_CANDIDATE_PROBABILITY = 0.99


class ConfigError(ValueError):
  """An invalid parameter combination; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class DedupConfig:
  """Near-duplicate detection parameters, validated on construction.

  When neither ``bands`` nor ``rows`` is given they are chosen from
  ``threshold`` and ``num_perm`` by minimising ``fp_weight`` x (area under the
  banding S-curve below the threshold) + ``fn_weight`` x (area above it where
  pairs are missed); explicit values always win. With verification on
  (``exact`` or ``signature``) a false candidate costs one comparison while
  nothing recovers a missed pair, so only bandings with P(candidate | J >=
  ``threshold``) >= ``MIN_CANDIDATE_PROBABILITY`` (0.99) are eligible and
  the weighted areas pick the cheapest of them: 16x6 for 0.8 and K=128
  (P = 0.992), whose expected candidates per document are bounded by its
  :attr:`mean_false_candidate` (0.274) per dissimilar neighbour, against
  0.173 for the unconstrained 16x8 (P = 0.947). With ``verify`` none the
  weights alone decide (the default 0.05 and 0.95 over-generate candidates).
  ``sketch`` picks how the ``num_perm`` signature entries are computed
  (classic K-permutation MinHash or one-permutation hashing); everything
  downstream treats both alike. An
  edge joins the duplicate graph only if verification passes: ``exact``
  (default) the true Jaccard of the two shingle sets is >= ``threshold``;
  ``signature`` the fraction of equal signature entries is; ``none`` keeps
  every candidate.

  Within every LSH bucket all pairs count, so the clusters are the
  connected components of all pairs of a bucket that pass verification: a
  bucket of at most ``exhaustive_bucket_size`` documents has all its pairs
  verified, a larger one of k documents the pairs that the triangle
  inequality cannot rule out (about k x its components; at worst all
  k(k-1)/2, see :mod:`~transforms.kernels.bucket_components`). ``chain_guard`` removes a clustered document
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
  max_cc_rounds: int = 4
  max_residual_edges: int = 1_000_000
  lsh_shards: int = 64
  exhaustive_bucket_size: int = 64
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
      bands, rows = choose_bands_rows(
          self.threshold, self.num_perm, self.fp_weight, self.fn_weight,
          None if self.verify == "none" else MIN_CANDIDATE_PROBABILITY)
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
    _check(isinstance(self.chain_guard, bool),
           f"chain_guard={self.chain_guard!r}: use true or false"
           " (--chain_guard).")

  @property
  def lsh_threshold(self) -> float:
    """Similarity where the banding S-curve crosses about one half."""
    return (1.0 / self.bands) ** (1.0 / self.rows)

  @property
  def candidate_probability(self) -> float:
    """P(candidate) of a pair at the threshold: a lower bound for every pair
    above it (the S-curve rises)."""
    return float(collision_probability(self.threshold, self.bands, self.rows))

  @property
  def mean_false_candidate(self) -> float:
    """Mean P(candidate) of a pair below the threshold, its similarity
    uniform on [0, threshold): the expected false candidates per document
    per such neighbour, each costing one verification."""
    return false_positive_area(self.threshold, self.bands,
                               self.rows) / self.threshold


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise ConfigError(message)


STREAM_MODES = ("arrival", "event_time")
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000,
                      "d": 86_400_000}


def parse_duration_ms(text) -> int:
  """Milliseconds of a duration such as ``500ms``, ``10s``, ``15m``, ``2h``
  or ``7d`` (a bare number is seconds); raises :class:`ConfigError`."""
  value = str(text).strip().lower()
  for unit in sorted(_DURATION_UNITS_MS, key=len, reverse=True):
    if value.endswith(unit):
      number, scale = value[:-len(unit)], _DURATION_UNITS_MS[unit]
      break
  else:
    number, scale = value, 1000
  try:
    amount = float(number)
  except ValueError:
    amount = -1.0
  if not amount >= 0 or amount * scale >= 2**62:
    raise ConfigError(f"duration {text!r}: use a non-negative number with a"
                      " unit ms, s, m, h or d, e.g. 10s or 7d.")
  return int(round(amount * scale))


@dataclasses.dataclass(frozen=True)
class StreamConfig:
  """Parameters of the streaming path, around the shared :class:`DedupConfig`
  (same kernels, seed, bands and threshold as batch), validated on
  construction. Durations are in milliseconds of event time.

  * ``mode``: ``arrival`` decides each band entry when it reaches its bucket;
    ``event_time`` holds entries of buckets without a valid representative
    until the watermark passes ``event time + settle_ms`` and decides them in
    (event time, id) order, so reorderings within ``settle_ms`` and replays
    give the same verdicts.
  * ``dedup_window_ms``: a representative suppresses documents whose event
    time is at most this much after its own.
  * ``allowed_lateness_ms``: how far behind the watermark a document may be
    and still be judged against complete state; representatives are held
    until the watermark passes their event time + window + this. Documents
    found later than this go to the ``late`` output.
  * ``max_pending``: most entries one bucket buffers in ``event_time`` mode
    before it decides them at once (bounded state for hot buckets).
  * ``key_shards``: the buckets' band keys, and the verdicts' document ids,
    are split into this many shards, each one key of keyed state (the
    parallelism of those stages). Changing it changes where state lives:
    not across an update of a running job.
  """

  dedup: DedupConfig
  mode: str = "event_time"
  settle_ms: int = 10_000
  dedup_window_ms: int = 7 * 86_400_000
  allowed_lateness_ms: int = 3_600_000
  max_pending: int = 10_000
  key_shards: int = 8

  def __post_init__(self):
    _check(isinstance(self.dedup, DedupConfig),
           "dedup must be a DedupConfig.")
    _check(self.mode in STREAM_MODES,
           f"mode={self.mode!r}: use one of {STREAM_MODES} (--mode).")
    for name in ("settle_ms", "dedup_window_ms", "allowed_lateness_ms"):
      value = getattr(self, name)
      _check(_is_int(value) and 0 <= value < 2**62,
             f"{name}={value!r}: use a non-negative integer of milliseconds.")
    _check(self.dedup_window_ms > 0,
           "dedup_window_ms=0: a representative would suppress nothing; use"
           " e.g. --dedup_window 7d.")
    _check(self.allowed_lateness_ms > self.settle_ms,
           f"allowed_lateness={self.allowed_lateness_ms} ms must exceed"
           f" settle={self.settle_ms} ms: a document is only decided after"
           " the watermark passes its event time + settle, so raise"
           " --allowed_lateness or lower --settle.")
    _check(_is_int(self.max_pending) and self.max_pending >= 1,
           f"max_pending={self.max_pending!r}: use an integer >= 1"
           " (--max_pending).")
    _check(_is_int(self.key_shards) and 1 <= self.key_shards <= 1 << 16,
           f"key_shards={self.key_shards!r}: use an integer from 1 to 2**16.")

  @property
  def timer_tick_ms(self) -> int:
    """The grid event-time timers are rounded up to (a quarter of the
    settle time, at least 1 ms): a timer fires up to this much later, and
    one firing serves every bucket of a shard due by then."""
    return max(1, self.settle_ms // 4)

  @property
  def expire_tick_ms(self) -> int:
    """The grid that garbage-collection timers (ids Admit remembers, the
    clocks of buckets whose representative expired) are rounded up to: a
    64th of the retention, in whole timer ticks. They only free state, so
    a coarse grid holds it up to 1/64 longer and saves runner firings when
    the watermark passes many of them at once (a bounded input's end)."""
    tick = self.timer_tick_ms
    return tick * max(1, self.retention_ms // 64 // tick)

  @property
  def retention_ms(self) -> int:
    """How long after its event time a representative's state is held."""
    return self.dedup_window_ms + self.allowed_lateness_ms


SUBSTRING_STRIKES = ("later", "all")


@dataclasses.dataclass(frozen=True)
class SubstringsConfig:
  """Exact-substring deduplication (:mod:`transforms.substrings`), validated
  on construction: ``threshold`` T bytes (0: off), ``strike`` ``later``
  (keep each repeated substring's first occurrence) or ``all``, and the
  number of anchor ``shards``."""

  threshold: int = 0
  strike: str = "later"
  shards: int = 64

  def __post_init__(self):
    _check(_is_int(self.threshold) and 0 <= self.threshold <= 1 << 20,
           f"substrings={self.threshold!r}: use a length in bytes from 1 to"
           " 2**20 (--substrings; 100 is what common tools use), or 0 for"
           " off.")
    _check(self.strike in SUBSTRING_STRIKES,
           f"substrings_strike={self.strike!r}: use one of"
           f" {SUBSTRING_STRIKES} (--substrings_strike).")
    _check(_is_int(self.shards) and 1 <= self.shards <= 1 << 20,
           f"substrings_shards={self.shards!r}: use an integer from 1 to"
           " 2**20 (--substrings_shards).")

  @property
  def enabled(self) -> bool:
    return self.threshold > 0
