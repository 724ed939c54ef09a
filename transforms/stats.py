"""The stats vocabulary: every name a ``(stat, n)`` count or a Beam counter
carries, how it is built and how it is read back, and ``stats.json`` made of
the summed counts. Pure Python (no Beam import): the report renderer reads
the same names.

Names are ``<count>`` (one of :data:`COUNTS`), ``rejected_<reason>``,
``shuffle_bytes_<step>``, ``<histogram>_<log2 bin:02d>``,
``cc_changed_round_<round:03d>`` and ``worker_ms_<stage>`` (timings, kept
out of ``stats.json`` so that it stays byte-identical run to run).
"""

from __future__ import annotations

from typing import NamedTuple, Union

import numpy as np

# The plain counts; stats.json holds each of them, 0 when never counted.
COUNTS = (
    "docs_in", "kept", "removed", "rejected", "clusters", "clustered_docs",
    "candidate_edges", "verified_edges", "docs_empty", "docs_too_short",
    "docs_signed", "buckets_multi", "verify_removed_edges", "buckets_large",
    "graph_edges", "chain_docs", "chain_kept", "cc_residual_edges",
    "cc_residual_nodes")
REJECTED_PREFIX = "rejected_"
SHUFFLE_PREFIX = "shuffle_bytes_"
ROUND_PREFIX = "cc_changed_round_"
TIMING_PREFIX = "worker_ms_"
BUCKET_SIZES = "bucket_size_log2"
CLUSTER_SIZES = "cluster_size_log2"
HISTOGRAMS = (BUCKET_SIZES, CLUSTER_SIZES)

COUNT, REJECTED, SHUFFLE, ROUND, TIMING, HISTOGRAM = (
    "count", "rejected", "shuffle", "round", "timing", "histogram")


def rejected_stat(reason: str) -> str:
  """Stat name of the records rejected for ``reason`` (a reason code)."""
  return REJECTED_PREFIX + reason


def shuffle_stat(step: str) -> str:
  """Stat name of the payload bytes ``step`` sends into a shuffle."""
  return SHUFFLE_PREFIX + step


def round_stat(index: int) -> str:
  """Stat name of the edges re-pointed by connected-component round i."""
  return f"{ROUND_PREFIX}{index:03d}"


def timing_stat(stage: str) -> str:
  """Stat name of a stage's summed worker milliseconds."""
  return TIMING_PREFIX + stage


def size_bin_stat(histogram: str, log2_bin: int) -> str:
  """Stat name of bin k (sizes 2^k .. 2^(k+1)-1) of a size histogram."""
  return f"{histogram}_{log2_bin:02d}"


def log2_bins(sizes) -> np.ndarray:
  """floor(log2(size)) of each positive integer size, exactly."""
  return np.frexp(np.asarray(sizes, dtype=np.float64))[1].astype(np.int64) - 1


class StatName(NamedTuple):
  """A stat name read back: its ``kind`` (``count``, ``rejected``,
  ``shuffle``, ``round``, ``timing`` or ``histogram``) and ``key`` (the
  count, reason, step, round number, stage or ``(histogram, log2 bin)``)."""
  kind: str
  key: Union[str, int, tuple]


def parse_stat(name: str) -> StatName:
  """The kind and key of a stat name, the inverse of the ``*_stat`` builders.

  >>> parse_stat(round_stat(7))
  StatName(kind='round', key=7)
  >>> parse_stat(size_bin_stat(BUCKET_SIZES, 3))
  StatName(kind='histogram', key=('bucket_size_log2', 3))
  >>> parse_stat(rejected_stat("malformed_json"))
  StatName(kind='rejected', key='malformed_json')
  >>> parse_stat("kept")
  StatName(kind='count', key='kept')
  """
  histogram, _, log2_bin = name.rpartition("_")
  if histogram in HISTOGRAMS:
    return StatName(HISTOGRAM, (histogram, int(log2_bin)))
  for kind, prefix in ((ROUND, ROUND_PREFIX), (TIMING, TIMING_PREFIX),
                       (SHUFFLE, SHUFFLE_PREFIX), (REJECTED, REJECTED_PREFIX)):
    if name.startswith(prefix):
      key = name[len(prefix):]
      return StatName(kind, int(key) if kind == ROUND else key)
  return StatName(COUNT, name)


def is_timing(name: str) -> bool:
  return name.startswith(TIMING_PREFIX)


class NoTextFieldError(ValueError):
  """No record of the run holds the configured text field."""


def finalize_stats(counts: dict, params: dict) -> dict:
  """The ``stats.json`` document of the summed ``counts`` (stat name -> n)
  and the run's ``params``; see the README for each field.

  Args:
    counts: summed counts by stat name, timings included (left out).
    params: the run's parameters; ``max_cc_rounds`` sizes
      ``cc_changes_per_round``.

  Returns:
    The stats document (a dict of JSON values).

  Raises:
    RuntimeError: documents in != kept + removed + rejected (a bug).
    NoTextFieldError: every record lacks the text field.
  """
  stats = {name: 0 for name in COUNTS}
  by_kind = {REJECTED: {}, SHUFFLE: {}, ROUND: {}, TIMING: {}}
  histograms = {histogram: {} for histogram in HISTOGRAMS}
  for name, value in counts.items():
    kind, key = parse_stat(name)
    if kind == HISTOGRAM:
      histograms[key[0]][key[1]] = value
    elif kind == COUNT:
      stats[key] = value
    else:
      by_kind[kind][key] = value
  rounds = params.get("max_cc_rounds", 0)
  changes = [by_kind[ROUND].get(i, 0) for i in range(1, rounds + 1)]
  rejected_by_reason = by_kind[REJECTED]
  stats["rejected_by_reason"] = rejected_by_reason
  stats["shuffle_bytes"] = by_kind[SHUFFLE]
  for histogram, bins in histograms.items():
    # Entry k: sizes 2^k .. 2^(k+1)-1.
    stats[histogram] = [bins.get(k, 0)
                        for k in range(max(bins, default=-1) + 1)]
  stats["cc_changes_per_round"] = changes
  # Rounds that changed something, plus the one that confirmed convergence.
  busy = [i for i, c in enumerate(changes, 1) if c]
  stats["cc_rounds_used"] = min(busy[-1] + 1, rounds) if busy else (
      1 if stats["verified_edges"] else 0)
  stats["cc_converged"] = not changes or changes[-1] == 0
  stats["params"] = params
  accounted = stats["kept"] + stats["removed"] + stats["rejected"]
  stats["balanced"] = accounted == stats["docs_in"]
  if not stats["balanced"]:
    raise RuntimeError(
        f"Document accounting is off: {stats['docs_in']} in, but kept "
        f"{stats['kept']} + removed {stats['removed']} + rejected "
        f"{stats['rejected']} = {accounted}. This is a bug; please report it.")
  missing = rejected_by_reason.get("missing_text_field", 0)
  if missing and missing == stats["docs_in"]:
    # Then the text field's name is wrong: fail before the outputs are
    # finalized rather than succeed with an empty deduped/.
    raise NoTextFieldError(
        f"All {missing} records lack the text field: check --text_field "
        "(the rejected/ rows of this run, left under _temporary/, show the "
        "fields there are).")
  return stats
