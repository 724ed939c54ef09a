"""Decisions of one streaming LSH bucket: which document represents it and
what each arriving band entry is told.

A *member* is anything with ``doc_id`` (str), ``event_ms`` (int),
``signature`` (uint32[K]) and ``shingles`` (sorted distinct uint64, used by
exact verification) attributes. Documents are ordered by (event time, id as
UTF-8 bytes): a document is only ever a duplicate of one ordered before it,
so two documents can never each drop the other, whatever the arrival order.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import numpy as np

from transforms.kernels import jaccard
from transforms.kernels.lsh import min_equal_entries

# What a bucket answers for an entry.
REP = 0     # the entry is (now) the bucket's representative
MATCH = 1   # the entry near-duplicates the representative (verified)
MISS = 2    # it collides with the representative but fails verification
LATE = 3    # it is later than the allowed lateness: not judged here
KINDS = ("rep", "match", "miss", "late")


def order_key(member) -> Tuple[int, bytes]:
  """The total order of documents: event time, then id bytes."""
  return member.event_ms, member.doc_id.encode("utf-8")


def precedes(a, b) -> bool:
  return order_key(a) < order_key(b)


def represents(rep, member, window_ms: int) -> bool:
  """True when ``rep`` is a valid representative to judge ``member`` by:
  ordered before it and at most ``window_ms`` older."""
  return (rep is not None and precedes(rep, member)
          and member.event_ms - rep.event_ms <= window_ms)


def needs_order(rep, member, window_ms: int) -> bool:
  """In event-time mode an entry can be decided at once when the bucket's
  representative already represents it: no entry still to come can change
  that answer. Otherwise it waits to be decided in order."""
  return member.doc_id != getattr(rep, "doc_id", None) and not represents(
      rep, member, window_ms)


def compare(a, b, verify: str, threshold: float) -> Tuple[bool, float]:
  """``(passes, similarity)`` of two members: ``signature`` counts equal
  entries against ``min_equal_entries`` (as batch ``--verify signature``);
  ``exact`` compares the true Jaccard of the shingle sets with the
  threshold; ``none`` passes every collision (similarity estimated)."""
  if verify == "exact":
    inter, union = jaccard.jaccard(a.shingles, b.shingles)
    passed = bool(jaccard.meets_threshold(inter, union, threshold))
    return passed, inter / union if union else 1.0
  k = len(a.signature)
  equal = int(np.count_nonzero(a.signature == b.signature))
  if verify == "none":
    return True, equal / k
  return equal >= min_equal_entries(threshold, k), equal / k


def decide(rep, member, window_ms: int, verify: str, threshold: float
           ) -> Tuple[object, int, Optional[object], float]:
  """One entry against the bucket's representative.

  Returns ``(new_rep, kind, judged_by, similarity)``: the member becomes the
  representative when there is none, when the current one is ordered after
  it or is more than ``window_ms`` older; the same document again (a
  redelivery) is told ``REP`` if it is the representative; otherwise it is
  verified against the representative (``MATCH`` or ``MISS``).
  """
  if rep is not None and member.doc_id == rep.doc_id:
    return rep, REP, None, 1.0
  if not represents(rep, member, window_ms):
    return member, REP, None, 1.0
  passed, similarity = compare(rep, member, verify, threshold)
  return rep, MATCH if passed else MISS, rep, similarity


def decide_in_order(rep, members: Iterable, window_ms: int, verify: str,
                    threshold: float) -> Tuple[object, List[tuple]]:
  """Decides ``members`` one after the other in (event time, id) order;
  returns the final representative and ``(member, kind, judged_by,
  similarity)`` per member."""
  answers = []
  for member in sorted(members, key=order_key):
    rep, kind, judged_by, similarity = decide(rep, member, window_ms, verify,
                                              threshold)
    answers.append((member, kind, judged_by, similarity))
  return rep, answers
