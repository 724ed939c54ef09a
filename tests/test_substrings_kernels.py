"""Exact-substring kernels against a suffix-array oracle (pydivsufsort)."""

import functools
import lzma
import json
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydivsufsort import divsufsort, kasai

from transforms.kernels import substrings as sk

LICENCES = pathlib.Path(__file__).parent / "data" / "licence_corpus.jsonl.xz"


@functools.lru_cache(maxsize=2)
def suffix_array(texts):
  """The corpus for the oracle: the documents' bytes (0..255) back to back,
  each followed by its own separator (256 + its index), so no common prefix
  crosses a boundary; its suffix array, LCP array (``lcp[i]``: of suffixes
  ``sa[i]`` and ``sa[i + 1]``) and each document's start. Neither depends on
  the threshold or the mode, so one build serves every check of a corpus."""
  sizes = np.array([len(t) for t in texts], dtype=np.int64)
  starts = np.cumsum(sizes + 1) - (sizes + 1)
  s = np.empty(int((sizes + 1).sum()), dtype=np.int64)
  for d, text in enumerate(texts):
    s[starts[d]:starts[d] + sizes[d]] = np.frombuffer(text, dtype=np.uint8)
    s[starts[d] + sizes[d]] = 256 + d
  sa = divsufsort(s).astype(np.int64)
  lcp = kasai(s, sa)
  return sa, lcp, starts, sizes


def oracle(texts, threshold, strike):
  """Struck positions per document from the suffix array: suffixes whose
  LCP with a neighbour is >= T form the classes of equal T-byte windows;
  ``all`` strikes ``[s, s + T)`` of every member, ``later`` of every member
  but the one earliest in the text."""
  if not texts:
    return []
  sa, lcp, starts, sizes = suffix_array(tuple(texts))
  linked = lcp[:-1] >= threshold
  klass = np.concatenate([[0], np.cumsum(~linked)])
  member = np.zeros(len(sa), dtype=bool)
  member[:-1] |= linked
  member[1:] |= linked
  positions, klass = sa[member], klass[member]
  if strike == "later":
    order = np.lexsort((positions, klass))
    positions, klass = positions[order], klass[order]
    earliest = np.ones(len(klass), dtype=bool)
    earliest[1:] = klass[1:] != klass[:-1]
    positions = positions[~earliest]
  # A window of a class holds no separator, so [p, p + T) stays in p's
  # document.
  depth = np.zeros(len(sa) + 1, dtype=np.int64)
  np.add.at(depth, positions, 1)
  np.add.at(depth, positions + threshold, -1)
  covered = np.cumsum(depth[:-1]) > 0
  return [covered[a:a + n].copy()
          for a, n in zip(starts.tolist(), sizes.tolist())]


def kernel_marks(texts, threshold, strike):
  ids = np.arange(len(texts), dtype=np.int64) * 7 + 3
  # Few contexts compared at once, so that shards are cut into parts.
  spans = sk.find_spans(texts, ids, threshold, strike,
                        shards=1 + len(texts) % 3,
                        max_contexts=1 + len(texts) % 5)
  marks = [np.zeros(len(t), dtype=bool) for t in texts]
  for doc, start, end in zip(spans.doc_ids, spans.starts, spans.ends):
    marks[(int(doc) - 3) // 7][start:end] = True
  return marks, spans


def check(texts, threshold):
  for strike in sk.STRIKE_MODES:
    got, spans = kernel_marks(texts, threshold, strike)
    want = oracle(texts, threshold, strike)
    for d, (g, w) in enumerate(zip(got, want)):
      assert np.array_equal(g, w), (strike, d, np.nonzero(g != w)[0][:10])
    # Spans are disjoint, ordered and within their documents.
    assert np.all(spans.starts < spans.ends)
    lengths = np.array([len(t) for t in texts])
    if len(spans.doc_ids):
      assert np.all(spans.ends <= lengths[(spans.doc_ids - 3) // 7])
    check_references(texts, threshold, spans)


def check_references(texts, threshold, spans):
  """Every span starts with a repeated T-byte window and names its first
  occurrence in input order (documents, then positions): the smallest
  position of the window's class in the oracle's suffix array."""
  if not len(spans.doc_ids):
    return
  sa, lcp, starts, _ = suffix_array(tuple(texts))
  rank = np.empty_like(sa)
  rank[sa] = np.arange(len(sa))
  # Suffixes sharing >= T bytes are adjacent in the suffix array.
  new_class = np.concatenate([[True], lcp[:-1] < threshold])
  klass = np.cumsum(new_class) - 1
  heads = np.nonzero(new_class)[0]
  first = np.minimum.reduceat(sa, heads)
  size = np.diff(np.append(heads, len(sa)))
  doc = (spans.doc_ids - 3) // 7
  k = klass[rank[starts[doc] + spans.starts]]
  assert np.all(size[k] >= 2)
  first_doc = np.searchsorted(starts, first[k], side="right") - 1
  assert np.array_equal((spans.first_doc_ids - 3) // 7, first_doc)
  assert np.array_equal(spans.first_starts, first[k] - starts[first_doc])


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
small_alphabet = st.binary(max_size=120).map(lambda b: bytes(x % 3 for x in b))


@SETTINGS
@given(st.lists(st.binary(max_size=200), max_size=6), st.integers(1, 12))
def test_arbitrary_bytes(texts, threshold):
  check(texts, threshold)


@SETTINGS
@given(st.lists(small_alphabet, max_size=6), st.integers(1, 20))
def test_small_alphabet_many_repeats(texts, threshold):
  check(texts, threshold)


@SETTINGS
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=5),
                          st.integers(1, 60), st.binary(max_size=8)),
                min_size=1, max_size=5), st.integers(2, 30))
def test_periodic_runs(parts, threshold):
  """``aaaa...``, ``abab...`` and overlapping repeats within documents."""
  check([unit * times + tail for unit, times, tail in parts], threshold)


@SETTINGS
@given(st.binary(min_size=1, max_size=40), st.lists(
    st.tuples(st.binary(max_size=30), st.booleans()), min_size=1,
    max_size=6), st.integers(1, 40))
def test_repeats_at_document_ends(shared, docs, threshold):
  """A shared piece at the start or end of documents, or all of one."""
  texts = [(shared + own) if at_start else (own + shared)
           for own, at_start in docs] + [shared]
  check(texts, threshold)


@SETTINGS
@given(st.text(max_size=60), st.lists(st.text(max_size=40), max_size=5),
       st.integers(1, 30), st.integers(2, 12))
def test_unicode_many_copies(shared, others, threshold, copies):
  texts = [(o + shared + o).encode("utf-8") for o in others]
  texts += [shared.encode("utf-8")] * copies
  check(texts, threshold)


def test_exactly_t_bytes_repeated_once_in_one_document():
  """One repeat of exactly T bytes, inside one document: T - 1 finds a
  longer region, T + 1 none (the off-by-one mutant)."""
  text = b"xyz0123456789ABCuvw" + b"0123456789" + b"qrs"
  for strike, first in (("later", False), ("all", True)):
    marks, _ = kernel_marks([text], 10, strike)
    want = np.zeros(len(text), dtype=bool)
    want[19:29] = True
    want[3:13] = first
    assert np.array_equal(marks[0], want)
  # A repeat of T - 1 bytes is not struck.
  short = b"xyz012345678ABCuvw012345678qrs"
  for strike in sk.STRIKE_MODES:
    assert not kernel_marks([short], 10, strike)[0][0].any()


def test_match_extended_to_its_maximum():
  """A long repeat is struck over its whole length, not only near the
  anchors that found it."""
  body = bytes(range(40, 240))
  texts = [b"A" * 7 + body + b"B" * 5, b"C" * 3 + body]
  marks, spans = kernel_marks(texts, 16, "later")
  assert not marks[0].any()
  assert marks[1][3:].all() and not marks[1][:3].any()
  assert (spans.first_doc_ids.tolist(), spans.first_starts.tolist()) == (
      [3], [7])


def test_hash_collision_never_strikes(monkeypatch):
  """Windows with equal hashes but different bytes are not repeats: with
  every hash forced equal, the classes are still the windows' bytes."""
  text = np.frombuffer(b"abcabdabcxabc", dtype=np.uint8)[None, :]
  starts = np.arange(11)
  monkeypatch.setattr(sk, "_window_hashes", lambda text, t, u, r: np.zeros(
      len(u), dtype=np.uint64))
  classes = sk._classes(text, 3, np.zeros(11, dtype=np.int64), starts)
  windows = [bytes(text[0, s:s + 3]) for s in starts]
  for i in range(11):
    for j in range(11):
      assert (classes[i] == classes[j]) == (windows[i] == windows[j])


def test_merged_span_keeps_the_smallest_reference_of_its_first_ranges():
  # Two ranges start at 10 of document 5, the one naming the later
  # occurrence given first; a third overlaps them; document 6's range
  # stands alone.
  struck = sk.Spans(*(np.array(v, np.int64) for v in (
      [5, 5, 6, 5], [10, 10, 0, 14], [20, 18, 4, 30],
      [2, 1, 1, 1], [40, 70, 9, 0])))
  merged = sk.merge_ranges(struck)
  assert [a.tolist() for a in merged] == [
      [5, 6], [10, 0], [30, 4], [1, 1], [70, 9]]


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30),
                          st.integers(1, 8), st.integers(0, 3),
                          st.integers(0, 50)), max_size=30))
def test_merge_ranges_is_the_union_with_its_head_ranges_first_reference(
    ranges):
  """Property: per document, the spans cover exactly the ranges' union,
  are disjoint and do not touch, and each names the smallest reference of
  the ranges starting where it starts."""
  doc, start, length, first_doc, first_start = (
      np.array([r[i] for r in ranges], np.int64) for i in range(5))
  merged = sk.merge_ranges(
      sk.Spans(doc, start, start + length, first_doc, first_start))
  for d in range(3):
    want = np.zeros(40, dtype=bool)
    for s, n in zip(start[doc == d], length[doc == d]):
      want[s:s + n] = True
    got = np.zeros(40, dtype=bool)
    mine = merged.doc_ids == d
    for s, e in zip(merged.starts[mine], merged.ends[mine]):
      assert not got[max(s - 1, 0):e + 1].any()  # disjoint, not touching
      got[s:e] = True
    assert np.array_equal(got, want), d
  for d, s, fd, fs in zip(merged.doc_ids, merged.starts,
                          merged.first_doc_ids, merged.first_starts):
    heads = (doc == d) & (start == s)
    assert (fd, fs) == min(zip(first_doc[heads], first_start[heads]))


def test_narrow_to_code_points():
  data = np.frombuffer("aé€b".encode("utf-8"), dtype=np.uint8)  # 1,2,3,1
  starts, ends = sk.narrow_to_code_points(sk.continuation_bytes(data),
                                          [2, 0, 4], [5, 4, 5])
  assert starts.tolist() == [3, 0, 6] and ends.tolist() == [3, 3, 6]


def test_winnow_covers_every_window():
  rng = np.random.default_rng(5)
  data = rng.integers(0, 4, 3000, dtype=np.uint8)
  starts = np.array([0, 1000, 1001, 3000])
  for threshold in (1, 5, 40):
    k = sk.anchor_length(threshold)
    anchors = sk.winnow(data, starts, threshold, k)
    for d in range(3):
      length = starts[d + 1] - starts[d]
      offs = np.sort(anchors.offsets[anchors.rows == d])
      assert np.all(offs + k <= length)
      for s in range(0, length - threshold + 1, 7):
        assert np.any((offs >= s) & (offs <= s + threshold - k))


@SETTINGS
@given(st.lists(st.binary(max_size=150), max_size=5), st.integers(1, 40))
def test_context_hashes_are_the_anchors(texts, threshold):
  """The shards recompute each context's anchor hash from its text."""
  k = sk.anchor_length(threshold)
  data, starts = sk.concatenate(texts)
  anchors = sk.winnow(data, starts, threshold, k)
  found = sk.contexts(data, starts, np.arange(len(texts)), anchors,
                      threshold, k)
  assert np.array_equal(sk.context_hashes(found.text, k), anchors.hashes)


def licence_texts(limit=None):
  with lzma.open(LICENCES, "rt", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return [r["text"].encode("utf-8") for r in rows[:limit]]


def test_licence_corpus_sample():
  check(licence_texts(60), 100)


@pytest.mark.extended
def test_licence_corpus():
  texts = licence_texts()
  for threshold in (50, 100, 400):
    check(texts, threshold)
