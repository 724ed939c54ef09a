"""Exact-substring deduplication kernels: the positions a suffix array over
the whole corpus would mark, found from fingerprints that shard.

Definitions (byte units, threshold ``T``). A byte position p of a document is
*duplicated* iff some substring of length >= T that contains p occurs at two
or more places of the corpus (never across a document boundary). Every
substring of length >= T is the union of its T-byte windows, and each of them
occurs wherever the substring does, so p is duplicated iff a T-byte *window*
containing p occurs at least twice; ``later`` strikes p iff a window
containing p also occurs at an earlier place in input order (document id,
then byte offset), which strikes every later occurrence of every repeated
substring and keeps each one's first (:func:`struck_positions` states both
in a few lines; the tests check them against a suffix array).

Why fingerprints find every repeated window (the sharded route):

* k-gram hashes (``k = T - w + 1`` bytes) depend only on the k-gram's
  bytes. Winnowing selects, in each run of ``w`` consecutive k-grams, the
  smallest hash (the rightmost on ties). A T-byte window holds exactly
  ``w`` k-grams, so every occurrence of the same window selects the same
  k-gram at the same offset in it: the *anchor* of that window.
* So all occurrences of a repeated window share an anchor hash and land in
  one group, where the window is compared byte for byte
  (:func:`repeated_windows`): a hash collision only adds a candidate that
  this comparison rejects, and the text around an anchor (``T - k`` bytes
  before it, ``T`` from it) holds every window that contains the anchor, so
  each match is extended over every window it shares, as far as it goes.
* A group also sees windows through anchors that are not their own; what
  it strikes there is still justified by an equal earlier (``later``) or
  other (``all``) occurrence it holds, so the union over groups is exact.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

import numpy as np

STRIKE_MODES = ("later", "all")
_MULT = np.uint64(0x100000001B3)  # odd, so invertible modulo 2**64
_MULT_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
# Offsets within a document share the winnowing key with the hash's high
# bits: documents up to 2**28 bytes (256 MiB).
OFFSET_BITS = 28
MAX_DOC_BYTES = 1 << OFFSET_BITS


def anchor_length(threshold: int) -> int:
  """The k-gram length used for threshold ``T``: a quarter of it (at least
  1), so that the winnowing window ``w = T - k + 1`` is long and few
  anchors (about ``2 / (w + 1)`` of the positions) cross the shuffle."""
  return max(1, threshold // 4)


def _mix(h: np.ndarray) -> np.ndarray:
  """splitmix64's finalizer: a bijection of uint64, so mixed hashes are
  equal iff the polynomial ones are, with every bit well distributed."""
  with np.errstate(over="ignore"):
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _powers(n: int, base: np.uint64) -> np.ndarray:
  out = np.full(n, base, dtype=np.uint64)
  if n:
    out[0] = 1
  with np.errstate(over="ignore"):
    return np.cumprod(out, dtype=np.uint64)


def gram_hashes(data: np.ndarray, k: int) -> np.ndarray:
  """The mixed polynomial hash (mod 2**64) of every k-byte gram of ``data``
  (uint8[n]), uint64[max(n - k + 1, 0)]: ``hash[i]`` depends only on
  ``data[i:i + k]``."""
  n = len(data)
  if n < k:
    return np.zeros(0, dtype=np.uint64)
  with np.errstate(over="ignore"):
    prefix = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(data.astype(np.uint64) * _powers(n, _MULT), out=prefix[1:])
    # sum_j data[i+j] * MULT**j = (prefix[i+k] - prefix[i]) / MULT**i.
    return _mix((prefix[k:] - prefix[:n - k + 1])
                * _powers(n - k + 1, _MULT_INV))


def _sliding_min(values: np.ndarray, w: int) -> np.ndarray:
  """``min(values[i:i + w])`` for every i (van Herk / Gil-Werman)."""
  n = len(values)
  blocks = -(-n // w)
  padded = np.full(blocks * w + w, np.iinfo(np.uint64).max, dtype=np.uint64)
  padded[:n] = values
  shaped = padded.reshape(-1, w)
  prefix = np.minimum.accumulate(shaped, axis=1).ravel()
  suffix = np.minimum.accumulate(shaped[:, ::-1], axis=1)[:, ::-1].ravel()
  return np.minimum(suffix[:n - w + 1], prefix[w - 1:n])


class Anchors(NamedTuple):
  """Winnowed anchors of a batch of documents: the k-gram ``hashes``
  uint64[m], the ``rows`` (index of the document in the batch) int64[m]
  and ``offsets`` (byte offset of the k-gram in it) int64[m]."""
  hashes: np.ndarray
  rows: np.ndarray
  offsets: np.ndarray


def winnow(data: np.ndarray, starts: np.ndarray, threshold: int,
           k: int) -> Anchors:
  """The anchors of every T-byte window of the documents
  ``data[starts[i]:starts[i + 1]]`` (``data`` uint8, ``starts`` int64[n + 1]):
  for each window, its smallest k-gram hash, the rightmost on ties.

  Raises:
    ValueError: a document is longer than :data:`MAX_DOC_BYTES`.
  """
  starts = np.asarray(starts, dtype=np.int64)
  lengths = np.diff(starts)
  if len(lengths) and lengths.max() > MAX_DOC_BYTES:
    raise ValueError(f"a document of {int(lengths.max())} bytes exceeds"
                     f" the {MAX_DOC_BYTES} bytes exact-substring"
                     " deduplication handles; split it.")
  w = threshold - k + 1
  hashes = gram_hashes(data, k)
  empty = Anchors(np.zeros(0, np.uint64), np.zeros(0, np.int64),
                  np.zeros(0, np.int64))
  if len(hashes) < w:
    return empty
  row_of = np.repeat(np.arange(len(lengths)), lengths)[:len(hashes)]
  offset = np.arange(len(hashes), dtype=np.int64) - starts[row_of]
  # Key: high bits of the hash, then the reversed offset, so the minimum
  # is the smallest hash and, among equal ones, the rightmost k-gram. Only
  # windows of one document are kept, so offsets of two documents never
  # share a window.
  low = np.uint64((1 << OFFSET_BITS) - 1)
  keys = (hashes & ~low) | (low - offset.astype(np.uint64))
  window_min = _sliding_min(keys, w)
  first = np.arange(len(window_min))
  inside = (first + threshold <= starts[row_of[first] + 1])
  chosen = np.unique(first[inside]
                     + (low - (window_min[inside] & low)).astype(np.int64)
                     - offset[first[inside]])
  return Anchors(hashes[chosen], row_of[chosen], offset[chosen])


def repeated_hashes(hashes: np.ndarray) -> np.ndarray:
  """bool[m]: whether each anchor's hash occurs at least twice among
  ``hashes`` (the anchors that may share a window with another)."""
  _, inverse, counts = np.unique(hashes, return_inverse=True,
                                 return_counts=True)
  return counts[inverse] >= 2


class Contexts(NamedTuple):
  """The text around anchors: ``hashes`` uint64[m], the documents'
  ``doc_ids`` int64[m], the anchor ``offsets`` int64[m], and ``text``
  uint8[m, 2T - k]: the document's bytes ``offsets - (T - k)`` to
  ``offsets + T``, valid from ``lo`` to ``hi`` (int32[m]; zero outside)."""
  hashes: np.ndarray
  doc_ids: np.ndarray
  offsets: np.ndarray
  lo: np.ndarray
  hi: np.ndarray
  text: np.ndarray


def contexts(data: np.ndarray, starts: np.ndarray, doc_ids: np.ndarray,
             anchors: Anchors, threshold: int, k: int) -> Contexts:
  """The :class:`Contexts` of ``anchors`` in the batch ``(data, starts)``
  (as :func:`winnow` takes it) whose documents have ids ``doc_ids``.

  Its peak memory is about three times the contexts' text, output
  included (a strided view of the padded batch is copied row by row), not
  the eight bytes of an index per context byte a fancy-indexed gather
  would take (15 times)."""
  width = 2 * threshold - k
  lead = threshold - k
  starts = np.asarray(starts, dtype=np.int64)
  rows, offsets = anchors.rows, anchors.offsets
  lengths = np.diff(starts)[rows]
  begin = offsets - lead
  lo = np.maximum(0, -begin)
  hi = np.minimum(width, lengths - begin)
  # ``width`` zero bytes on each side, so a context may start before its
  # batch's first byte or end after its last.
  padded = np.zeros(len(data) + 2 * width, dtype=np.uint8)
  padded[width:width + len(data)] = data
  text = np.lib.stride_tricks.sliding_window_view(padded, width)[
      starts[rows] + begin + width]
  # Bytes outside the document (its neighbours' or the padding) are zeroed,
  # only in the contexts that reach past one of its ends.
  cut = np.nonzero((lo > 0) | (hi < width))[0]
  if len(cut):
    cols = np.arange(width)
    text[cut] *= ((cols >= lo[cut, None]) & (cols < hi[cut, None]))
  return Contexts(anchors.hashes, np.asarray(doc_ids)[rows], offsets,
                  lo.astype(np.int32), hi.astype(np.int32), text)


def context_hashes(text: np.ndarray, k: int) -> np.ndarray:
  """uint64[m]: the anchor hash of each context row of ``text``
  (uint8[m, 2T - k], as :func:`contexts` cuts them): its k-gram's
  :func:`gram_hashes`, at column T - k, recomputed from the bytes."""
  lead = (text.shape[1] - k) // 2
  with np.errstate(over="ignore"):
    # sum_j gram[j] * MULT**j mod 2**64, as gram_hashes' prefix sums give.
    polynomial = (text[:, lead:lead + k].astype(np.uint64)
                  * _powers(k, _MULT)).sum(axis=1, dtype=np.uint64)
  return _mix(polynomial)


class Spans(NamedTuple):
  """Struck byte ranges ``[starts, ends)`` int64[s] of documents
  ``doc_ids`` int64[s], each with where the first occurrence of its leading
  T bytes is (``first_doc_ids``, ``first_starts`` int64[s])."""
  doc_ids: np.ndarray
  starts: np.ndarray
  ends: np.ndarray
  first_doc_ids: np.ndarray
  first_starts: np.ndarray


def _empty_struck() -> Spans:
  return Spans(*(np.zeros(0, np.int64) for _ in Spans._fields))


def _window_hashes(text: np.ndarray, threshold: int, entry_u: np.ndarray,
                   entry_r: np.ndarray, rows_per_chunk: int = 4096
                   ) -> np.ndarray:
  """The :func:`gram_hashes` of the T-byte windows ``text[u, r:r + T]`` of
  the entries ``(entry_u, entry_r)`` (sorted by u), rolled along each row
  (a chunk of rows at a time, to bound memory) rather than per window."""
  u, width = text.shape
  out = np.empty(len(entry_u), dtype=np.uint64)
  bounds = np.searchsorted(entry_u, np.arange(0, u + rows_per_chunk,
                                              rows_per_chunk))
  for c, first in enumerate(range(0, u, rows_per_chunk)):
    lo, hi = bounds[c], bounds[c + 1]
    if lo == hi:
      continue
    rolled = gram_hashes(text[first:first + rows_per_chunk].ravel(),
                         threshold)
    out[lo:hi] = rolled[(entry_u[lo:hi] - first) * width + entry_r[lo:hi]]
  return out


def _classes(text: np.ndarray, threshold: int, entry_u: np.ndarray,
             entry_r: np.ndarray) -> np.ndarray:
  """Class ids of the windows ``text[u, r:r + T]`` of the entries (sorted by
  u): equal iff the windows' bytes are equal.

  Windows are grouped by a 64-bit hash, then each is compared byte for byte
  with its group's head. The comparison goes by runs: entries of one row
  whose heads lie at one shift in one other row, at consecutive r, are one
  stretch of ``run + T - 1`` bytes on each side, compared once (a repeat of
  L bytes costs about L + T compared bytes, not L x T). Groups where any
  byte differs (a hash collision) are split by their bytes."""
  n = len(entry_u)
  if n == 0:
    return np.zeros(0, dtype=np.int64)
  width = text.shape[1]
  hashes = _window_hashes(text, threshold, entry_u, entry_r)
  order = np.argsort(hashes, kind="stable")
  sorted_hashes = hashes[order]
  head = np.ones(n, dtype=bool)
  head[1:] = sorted_hashes[1:] != sorted_hashes[:-1]
  group = np.empty(n, dtype=np.int64)
  group[order] = np.cumsum(head) - 1
  heads = order[head]
  head_u, head_r = entry_u[heads[group]], entry_r[heads[group]]
  shift = entry_r - head_r
  # Runs: same row, same head row, same shift, consecutive r.
  by_run = np.argsort(_pack((entry_u, width), (head_u, width),
                             (shift + width, 2 * width), (entry_r, width)),
                       kind="stable")
  ru, rh, rs, rr = (entry_u[by_run], head_u[by_run], shift[by_run],
                    entry_r[by_run])
  new = np.ones(n, dtype=bool)
  new[1:] = ((ru[1:] != ru[:-1]) | (rh[1:] != rh[:-1]) | (rs[1:] != rs[:-1])
             | (rr[1:] != rr[:-1] + 1))
  run = np.cumsum(new) - 1
  run_first = np.nonzero(new)[0]
  run_len = np.diff(np.append(run_first, n)) + threshold - 1
  total = int(run_len.sum())
  within = np.arange(total) - np.repeat(np.cumsum(run_len) - run_len,
                                        run_len)
  flat = text.ravel()
  mine = np.repeat(ru[run_first] * width + rr[run_first], run_len) + within
  theirs = np.repeat(rh[run_first] * width + rr[run_first] - rs[run_first],
                     run_len) + within
  bad_run = np.add.reduceat((flat[mine] != flat[theirs]).astype(np.int64),
                            np.cumsum(run_len) - run_len) > 0
  if bad_run.any():
    # Split the colliding groups by their bytes (exact).
    bad = np.isin(group, np.unique(group[by_run[bad_run[run]]]))
    windows = np.lib.stride_tricks.sliding_window_view(
        text, threshold, axis=1)[entry_u[bad], entry_r[bad]]
    keyed = np.ascontiguousarray(windows).view(
        np.dtype((np.void, threshold))).ravel()
    _, exact = np.unique(keyed, return_inverse=True)
    group[bad] = len(heads) + exact.ravel()
  return group


def repeated_windows(found: Contexts, threshold: int, k: int,
                     strike: str = "later") -> Spans:
  """The struck ranges that ``found`` (the contexts of one or more anchor
  groups) proves: every window occurrence held in its contexts that an
  equal window, at another place held there too, precedes (``later``) or
  that has such an equal window anywhere (``all``). Windows are compared by
  their bytes; occurrences reached through several anchors count once.

  Args:
    found: :class:`Contexts`.
    threshold: T, the window length in bytes.
    k: the anchors' k-gram length (:func:`anchor_length`).
    strike: ``later`` or ``all``.
  """
  if strike not in STRIKE_MODES:
    raise ValueError(f"strike={strike!r}: use one of {STRIKE_MODES}")
  m = len(found.doc_ids)
  if m == 0:
    return _empty_struck()
  lead = threshold - k
  span = lead + 1  # windows per context: r = 0 .. T - k
  # Identical contexts (copies of boilerplate) are compared once.
  rows = np.concatenate([found.text, found.lo[:, None].view(np.uint8)
                         .reshape(m, -1), found.hi[:, None].view(np.uint8)
                         .reshape(m, -1)], axis=1)
  _, first_row, inverse = np.unique(
      np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1])))
      .ravel(), return_index=True, return_inverse=True)
  inverse = inverse.ravel()
  unique_text, lo, hi = (found.text[first_row], found.lo[first_row],
                         found.hi[first_row])
  u = len(first_row)
  r = np.arange(span)
  valid = (r[None, :] >= lo[:, None]) & (r[None, :] + threshold
                                         <= hi[:, None])
  entry_u, entry_r = np.nonzero(valid)
  cls = _classes(unique_text, threshold, entry_u, entry_r)
  # Each unique context's first and last member in input order.
  member_order = np.lexsort((found.offsets, found.doc_ids))
  by_u = inverse[member_order]
  first_member = np.full(u, -1, dtype=np.int64)
  last_member = np.full(u, -1, dtype=np.int64)
  first_member[by_u[::-1]] = member_order[::-1]
  last_member[by_u] = member_order
  # Occurrence (document, window start) of an entry's first / last member.
  def occurrence(member):
    return (found.doc_ids[member[entry_u]],
            found.offsets[member[entry_u]] - lead + entry_r)
  lo_doc, lo_start = occurrence(first_member)
  hi_doc, hi_start = occurrence(last_member)
  # Each class's first occurrence (smallest (doc, start)) and last, as
  # entries: occurrences packed as (rank of the document, start).
  ranks = np.unique(found.doc_ids, return_inverse=True)[1].ravel()
  n_cls = int(cls.max()) + 1
  width = len(found.text[0]) + int(found.offsets.max()) + 1
  def extreme(member, start, pick, fill):
    keys = _pack((ranks[member[entry_u]], m), (start, width))
    best = np.full(n_cls, fill, dtype=np.int64)
    pick.at(best, cls, keys)
    at = np.full(n_cls, -1, dtype=np.int64)
    hit = keys == best[cls]
    at[cls[hit]] = np.nonzero(hit)[0]
    return at
  cls_first = extreme(first_member, lo_start, np.minimum,
                      np.iinfo(np.int64).max)
  cls_last = extreme(last_member, hi_start, np.maximum, -1)
  f = cls_first[cls]
  first_doc, first_start = lo_doc[f], lo_start[f]
  if strike == "all":
    l = cls_last[cls]
    struck_entry = (first_doc != hi_doc[l]) | (first_start != hi_start[l])
  else:
    struck_entry = np.ones(len(cls), dtype=bool)
  # Per (unique context, r): struck for all its members; the member that is
  # its class's first occurrence keeps it in ``later`` mode.
  grid = np.zeros((u, span), dtype=bool)
  grid[entry_u, entry_r] = struck_entry
  ref_doc = np.zeros((u, span), dtype=np.int64)
  ref_start = np.zeros((u, span), dtype=np.int64)
  ref_doc[entry_u, entry_r] = first_doc
  ref_start[entry_u, entry_r] = first_start
  struck = grid[inverse]
  if strike == "later":
    member_start = (found.offsets[:, None] - lead + r[None, :])
    keeps = ((found.doc_ids[:, None] == ref_doc[inverse])
             & (member_start == ref_start[inverse]))
    struck &= ~keeps
  return _runs(struck, found.doc_ids, found.offsets - lead, threshold,
               ref_doc[inverse], ref_start[inverse])


# Contexts compared at once by :func:`compare_windows`: the comparison's
# peak memory is some 40 times the contexts' bytes (265 MB for 30,015
# contexts at T = 100, so about 70 MB for this many).
MAX_CONTEXTS_AT_ONCE = 8192


def compare_windows(found: Contexts, threshold: int, k: int,
                    strike: str = "later",
                    max_contexts: int = MAX_CONTEXTS_AT_ONCE) -> Spans:
  """:func:`repeated_windows` of ``found``, a bounded number of contexts at a
  time, so that a shard's memory does not grow with the corpus. Contexts
  are taken by anchor hash and a hash's group is never split: every
  occurrence of a window is in its own anchor's group, and whatever a part
  strikes is proved by an occurrence it holds, so the parts' ranges strike
  the same positions as one call would. A group larger than
  ``max_contexts`` is compared whole.

  Args:
    found: :class:`Contexts` of whole anchor-hash groups.
    threshold: T, the window length in bytes.
    k: the anchors' k-gram length.
    strike: ``later`` or ``all``.
    max_contexts: the most contexts a part holds, unless one group is
      larger.
  """
  m = len(found.doc_ids)
  if m <= max_contexts:
    return repeated_windows(found, threshold, k, strike)
  order = np.argsort(found.hashes, kind="stable")
  hashes = found.hashes[order]
  heads = np.flatnonzero(np.concatenate([[True], hashes[1:] != hashes[:-1]]))
  # A part starts at the first group that starts in each stretch of
  # ``max_contexts`` positions.
  stretch = heads // max_contexts
  first = np.concatenate([[True], stretch[1:] != stretch[:-1]])
  cuts = np.append(heads[first], m)
  parts = [repeated_windows(Contexts(*(column[order[lo:hi]]
                                       for column in found)),
                            threshold, k, strike)
           for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
  return Spans(*(np.concatenate(columns) for columns in zip(*parts)))


def _pack(*columns) -> np.ndarray:
  """One int64 key per row that orders like the tuples of ``columns``, each
  given as ``(non-negative values, bound above them)``.

  Raises:
    ValueError: the bounds' product does not fit in 63 bits.
  """
  key, room = np.zeros(len(columns[0][0]), dtype=np.int64), 1
  for values, bound in columns:
    room *= int(bound)
    key = key * int(bound) + values
  if room >= 1 << 63:
    raise ValueError("too many anchors in one shard to order them: raise"
                     " the number of shards.")
  return key


def _runs(struck: np.ndarray, doc_ids, base, threshold, ref_doc,
          ref_start) -> Spans:
  """Each row's runs of struck window starts ``base + r`` as byte ranges
  (a run of windows r0..r1 covers ``base + r0`` to ``base + r1 + T``)."""
  m, span = struck.shape
  padded = np.zeros((m, span + 2), dtype=np.int8)
  padded[:, 1:-1] = struck
  edges = np.diff(padded, axis=1)
  row_up, r_up = np.nonzero(edges == 1)
  row_down, r_down = np.nonzero(edges == -1)
  return Spans(doc_ids[row_up], base[row_up] + r_up,
                base[row_down] + r_down - 1 + threshold,
                ref_doc[row_up, r_up], ref_start[row_up, r_up])


def merge_ranges(struck: Spans) -> Spans:
  """Disjoint spans sorted by (document, start): the union of ``struck``'s
  ranges per document (ranges that overlap or touch join); each span keeps
  the earliest first-occurrence reference of the ranges it starts with."""
  if len(struck.doc_ids) == 0:
    return Spans(*struck)
  # Ranges that start together share their leading window; each one's
  # reference is an occurrence of it, so the smallest is its first.
  order = np.lexsort((struck.first_starts, struck.first_doc_ids,
                      struck.starts, struck.doc_ids))
  doc, start, end = (struck.doc_ids[order], struck.starts[order],
                     struck.ends[order])
  new_doc = np.ones(len(doc), dtype=bool)
  new_doc[1:] = doc[1:] != doc[:-1]
  # Running maximum of ends within each document.
  doc_index = np.cumsum(new_doc) - 1
  shift = (doc_index * (int(end.max()) + 1)).astype(np.int64)
  reach = np.maximum.accumulate(end + shift) - shift
  head = new_doc.copy()
  head[1:] |= start[1:] > reach[:-1]
  group = np.cumsum(head) - 1
  heads = np.nonzero(head)[0]
  ends = np.zeros(len(heads), dtype=np.int64)
  np.maximum.at(ends, group, end)
  return Spans(doc[heads], start[heads], ends,
               struck.first_doc_ids[order][heads],
               struck.first_starts[order][heads])


def continuation_bytes(data: np.ndarray) -> np.ndarray:
  """bool[n]: which bytes of UTF-8 ``data`` continue a code point (all
  that :func:`narrow_to_code_points` needs of the text)."""
  return (np.asarray(data, dtype=np.uint8) & 0xC0) == 0x80


def narrow_to_code_points(continuation: np.ndarray, starts,
                          ends) -> Tuple[np.ndarray, np.ndarray]:
  """Byte ranges ``[starts, ends)`` of valid UTF-8 text (a document or a
  batch of them back to back, given by its :func:`continuation_bytes`)
  narrowed to whole code points: a start inside a code point moves on to
  the next one's first byte, an end inside one back to that code point's
  first byte, so only struck bytes are removed and never part of a code
  point. A narrowed range may be empty."""
  def inside_code_point(pos):
    cont = np.zeros(len(pos), dtype=bool)
    within = pos < len(continuation)
    cont[within] = continuation[pos[within]]
    return cont
  starts, ends = np.array(starts, np.int64), np.array(ends, np.int64)
  for _ in range(3):  # a code point has at most 3 continuation bytes
    starts = np.where(inside_code_point(starts), starts + 1, starts)
    ends = np.where(inside_code_point(ends), ends - 1, ends)
  return starts, np.maximum(ends, starts)


def find_spans(texts, doc_ids, threshold: int, strike: str = "later",
               shards: int = 1,
               max_contexts: int = MAX_CONTEXTS_AT_ONCE) -> Spans:
  """The whole computation in one process, as the sharded transform does it
  with one shard: winnow, keep repeated anchor hashes, take their contexts,
  compare windows shard by shard (of the anchor hash), merge (byte ranges,
  not yet narrowed).

  Args:
    texts: the documents' bytes, in input order.
    doc_ids: their int64 ids, increasing in input order.
    threshold: T, in bytes.
    strike: ``later`` or ``all``.
    shards: how many anchor shards to compare one after the other.
    max_contexts: the most contexts compared at once
      (:func:`compare_windows`).
  """
  k = anchor_length(threshold)
  data, starts = concatenate(texts)
  anchors = winnow(data, starts, threshold, k)
  keep = repeated_hashes(anchors.hashes)
  anchors = Anchors(*(column[keep] for column in anchors))
  found = contexts(data, starts, np.asarray(doc_ids, np.int64), anchors,
                   threshold, k)
  shard = found.hashes % np.uint64(shards)
  parts = [compare_windows(Contexts(*(column[shard == s] for column in
                                      found)), threshold, k, strike,
                           max_contexts)
           for s in range(shards)]
  return merge_ranges(Spans(*(np.concatenate(columns)
                              for columns in zip(*parts))))


def concatenate(texts) -> Tuple[np.ndarray, np.ndarray]:
  """``(data uint8, starts int64[n + 1])`` of byte strings back to back."""
  lengths = np.array([len(t) for t in texts], dtype=np.int64)
  starts = np.zeros(len(texts) + 1, dtype=np.int64)
  np.cumsum(lengths, out=starts[1:])
  data = np.frombuffer(b"".join(texts), dtype=np.uint8)
  return data, starts
