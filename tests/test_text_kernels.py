"""Plain-pytest tests of normalisation and shingling
(transforms/kernels/reference_text.py)."""

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from transforms.kernels import reference_text
from transforms.kernels.hashing import fmix64
from transforms.kernels.reference_text import (ngram_hashes, normalize_texts,
                                     shingle_batch, unique_per_document,
                                     unit_hashes)

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _norm(texts, **kwargs):
  return normalize_texts(texts, **kwargs).to_pylist()


def _split(shingles, offsets):
  return [shingles[offsets[i]:offsets[i + 1]].tolist()
          for i in range(len(offsets) - 1)]


# --- normalize_texts --------------------------------------------------------

def test_nfkc_full_width_to_ascii():
  # "Ｈｅｌｌｏ　ＷＯＲＬＤ", with an ideographic space.
  full_width = "".join(chr(ord(c) + 0xFEE0) if c != " " else "\u3000"
                       for c in "Hello WORLD")
  assert _norm([full_width + " \uff11\uff12\uff13"]) == ["hello world 123"]
  assert _norm(["\ufb01ne"]) == ["fine"]  # compatibility ligature


def test_nfkc_composes():
  # NFKC is decomposition followed by canonical composition: precomposed and
  # decomposed input both come out precomposed (one code point per letter).
  assert _norm(["caf\u00e9", "cafe\u0301", "\u212b"]) == [
      "caf\u00e9", "caf\u00e9", "\u00e5"]
  assert _norm(["\uac00"]) == ["\uac00"]  # Hangul syllable stays whole
  assert _norm(["cafe\u0301"], nfkc=False) == ["cafe\u0301"]


def test_nfkc_off_keeps_full_width():
  out = _norm(["Ｈｅｌｌｏ １２３"], nfkc=False)
  assert out == ["ｈｅｌｌｏ １２３"]


def test_lowercase_switch():
  assert _norm(["MiXeD Case"]) == ["mixed case"]
  assert _norm(["MiXeD Case"], lowercase=False) == ["MiXeD Case"]


def test_punctuation_and_symbols_become_spaces():
  assert _norm(["Hi, there! A+B=C; $5 @home (ok) foo_bar 2023-10-12."]) == [
      "hi there a b c 5 home ok foo bar 2023 10 12"]
  # Letters with marks and non-Latin scripts are words, not punctuation.
  greek = "\u03bb\u03bb\u03ac\u03b4\u03b1"
  raw = "Caf\u00e9 \u2014 na\u00efve; Stra\u00dfe, \u0395" + greek + "!"
  assert _norm([raw]) == ["caf\u00e9 na\u00efve stra\u00dfe \u03b5" + greek]


def test_punctuation_switch_off_still_collapses_whitespace():
  assert _norm(["Hi,  there!\t A+B"], strip_punctuation=False) == [
      "hi, there! a+b"]


@pytest.mark.parametrize("strip", [True, False])
def test_whitespace_collapsed_and_trimmed(strip):
  raw = "  a\tb\n\nc\u00a0\u00a0d   e\r\n\u2003f  "
  assert _norm([raw], strip_punctuation=strip) == ["a b c d e f"]
  assert _norm([raw], strip_punctuation=strip, nfkc=False) == ["a b c d e f"]


def test_fold_digits():
  assert _norm(["Born 1987, aged 36."], fold_digits=True) == [
      "born 0000 aged 00"]
  assert _norm(["Born 1987"]) == ["born 1987"]
  # Full-width digits are folded too, with or without NFKC.
  assert _norm(["１２"], fold_digits=True) == ["00"]
  assert _norm(["１２"], fold_digits=True, nfkc=False) == ["00"]


def test_none_and_empty():
  assert _norm([None, "", "   ", "!!!", "\t\n"]) == ["", "", "", "", ""]
  assert _norm([]) == []


def test_accepts_arrow_arrays():
  arr = pa.array(["A b", None])
  assert _norm(arr) == ["a b", ""]
  chunked = pa.chunked_array([["A b"], ["C!"]])
  assert _norm(chunked) == ["a b", "c"]


def test_seed_example_pair_shares_most_tokens():
  a = ("The model achieved a 94.2% accuracy on the evaluation set, trained on"
       " 2023-10-12.")
  b = ("The model achieved a 94.2 percent accuracy on the eval set, trained on"
       " 2023-10-14.")
  na, nb = _norm([a, b])
  assert na == ("the model achieved a 94 2 accuracy on the evaluation set"
                " trained on 2023 10 12")
  ta, tb = set(na.split()), set(nb.split())
  assert len(ta & tb) / len(ta | tb) >= 0.7
  fa, fb = _norm([a, b], fold_digits=True)
  sa, sb = set(fa.split()), set(fb.split())
  # Folding digits makes the changed date match.
  assert len(sa & sb) / len(sa | sb) > len(ta & tb) / len(ta | tb)


# --- unit hashes, n-grams, shingle_batch -----------------------------------

def test_word_unit_hashes_are_xxh3():
  hashes, offsets = unit_hashes(normalize_texts(["the quick", "", "the"]),
                                "word", 42)
  assert offsets.tolist() == [0, 2, 2, 3]
  assert hashes.dtype == np.uint64
  assert hashes.tolist() == [xxhash.xxh3_64_intdigest(b"the", 42),
                             xxhash.xxh3_64_intdigest(b"quick", 42),
                             xxhash.xxh3_64_intdigest(b"the", 42)]
  assert hashes[0] == 18367100307197398661


def test_word_units_ignore_empty_tokens():
  # unit_hashes also accepts text that was not normalised: empty strings and
  # leading/trailing spaces must not turn into units.
  hashes, offsets = unit_hashes(pa.array(["", " a", "b ", "a  b", " "]),
                                "word", 42)
  assert offsets.tolist() == [0, 0, 1, 2, 4, 4]
  assert hashes.tolist() == [xxhash.xxh3_64_intdigest(w, 42)
                             for w in (b"a", b"b", b"a", b"b")]


def test_char_unit_hashes():
  hashes, offsets = unit_hashes(
      normalize_texts(["ab", "", "e\u0301"]), "char", 7)
  assert offsets.tolist() == [0, 2, 2, 3]
  expected = fmix64(np.array([ord("a") + 7, ord("b") + 7, 0xE9 + 7],
                             dtype=np.uint64))
  np.testing.assert_array_equal(hashes, expected)


def test_unknown_unit_raises():
  with pytest.raises(ValueError):
    unit_hashes(normalize_texts(["a"]), "sentence", 1)


@pytest.mark.parametrize("raw", ["", " ", "\t\n ", None, "  ...  !!"])
@pytest.mark.parametrize("unit", ["word", "char"])
def test_empty_document_has_no_units_and_no_shingles(raw, unit):
  shingles, offsets, counts = shingle_batch(
      ["alpha beta", raw, "gamma"], unit=unit, ngram=3, seed=1)
  assert counts[1] == 0
  assert offsets[2] == offsets[1]
  assert len(_split(shingles, offsets)[1]) == 0


def test_all_empty_batch():
  shingles, offsets, counts = shingle_batch(["", " "], unit="word", ngram=2,
                                            seed=1)
  assert len(shingles) == 0
  assert offsets.tolist() == [0, 0, 0]
  assert counts.tolist() == [0, 0]
  shingles, offsets, counts = shingle_batch([], unit="word", ngram=2, seed=1)
  assert len(shingles) == 0 and offsets.tolist() == [0] and len(counts) == 0


@pytest.mark.parametrize("unit,doc", [("word", "one two"), ("char", "ab"),
                                      ("word", "solo"), ("char", "x")])
def test_short_document_yields_exactly_one_shingle(unit, doc):
  shingles, offsets, counts = shingle_batch([doc], unit=unit, ngram=5, seed=3)
  assert offsets.tolist() == [0, 1]
  assert counts.tolist() == [len(doc.split()) if unit == "word" else len(doc)]


def test_short_documents_differ_by_content_and_length():
  shingles, offsets, _ = shingle_batch(["a", "b", "a b", "a b c"],
                                       unit="word", ngram=5, seed=3)
  assert offsets.tolist() == [0, 1, 2, 3, 4]
  assert len(set(shingles.tolist())) == 4


@pytest.mark.parametrize("unit,n", [("word", 1), ("word", 3), ("char", 4)])
def test_number_of_shingles(unit, n):
  docs = ["w1 w2 w3 w4 w5 w6 w7", "w1 w2", "w9"]
  shingles, offsets, counts = shingle_batch(docs, unit=unit, ngram=n, seed=5)
  expected = [max(c - n + 1, 1) if c else 0 for c in counts.tolist()]
  assert np.diff(offsets).tolist() == expected
  assert len(shingles) == offsets[-1]


@pytest.mark.parametrize("unit", ["word", "char"])
def test_batch_equals_each_document_alone(unit):
  rng = np.random.default_rng(8)
  words = ["w%d" % i for i in range(30)]
  docs = [" ".join(rng.choice(words, size=int(rng.integers(0, 25))))
          for _ in range(40)]
  docs += ["x", "", "x y", "x y z"]
  shingles, offsets, counts = shingle_batch(docs, unit=unit, ngram=4, seed=11)
  together = _split(shingles, offsets)
  for i, doc in enumerate(docs):
    alone, alone_offsets, alone_counts = shingle_batch(
        [doc], unit=unit, ngram=4, seed=11)
    assert together[i] == alone.tolist()
    assert counts[i] == alone_counts[0]


def test_no_window_crosses_document_boundary():
  # "a b" + "c d" must not produce the shingle of "b c" or "a b c".
  shingles, offsets, _ = shingle_batch(["a b", "c d"], unit="word", ngram=2,
                                       seed=2)
  crossing, _, _ = shingle_batch(["b c", "a b c d"], unit="word", ngram=2,
                                 seed=2)
  assert offsets.tolist() == [0, 1, 2]
  assert crossing[0] not in shingles.tolist()


def test_order_matters():
  fwd, _, _ = shingle_batch(["a b c"], unit="word", ngram=3, seed=4)
  rev, _, _ = shingle_batch(["c b a"], unit="word", ngram=3, seed=4)
  assert fwd.tolist() != rev.tolist()
  fwd, _, _ = shingle_batch(["abc"], unit="char", ngram=3, seed=4)
  rev, _, _ = shingle_batch(["cba"], unit="char", ngram=3, seed=4)
  assert fwd.tolist() != rev.tolist()


def test_normalisation_options_pass_through():
  raw = ["Hello, World 2023"]
  default, _, _ = shingle_batch(raw, unit="word", ngram=2, seed=4)
  same, _, _ = shingle_batch(["hello world 2023"], unit="word", ngram=2,
                             seed=4)
  assert default.tolist() == same.tolist()
  folded, _, _ = shingle_batch(raw, unit="word", ngram=2, seed=4,
                               fold_digits=True)
  assert folded.tolist() != default.tolist()
  cased, _, _ = shingle_batch(raw, unit="word", ngram=2, seed=4,
                              lowercase=False)
  assert cased.tolist() != default.tolist()


def _reference_ngrams(units, n, seed):
  """The documented fold in pure Python integers (fmix64 via numpy)."""
  units = [int(u) for u in units]
  windows = ([units[i:i + n] for i in range(len(units) - n + 1)]
             if len(units) >= n else ([units] if units else []))
  out = []
  for window in windows:
    h = ((len(window) * _GOLDEN) & _MASK64) ^ seed
    for t in window:
      h = ((h ^ t) * _GOLDEN) & _MASK64
    out.append(int(fmix64(np.array([h], dtype=np.uint64))[0]))
  return out


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ngram_hashes_match_documented_fold(n):
  rng = np.random.default_rng(12)
  units = rng.integers(0, 2**64, size=17, dtype=np.uint64)
  offsets = np.array([0, 7, 7, 9, 10, 17], dtype=np.int64)
  shingles, out_offsets = ngram_hashes(units, offsets, n, seed=99)
  got = _split(shingles, out_offsets)
  for i in range(len(offsets) - 1):
    assert got[i] == _reference_ngrams(units[offsets[i]:offsets[i + 1]], n, 99)


def test_golden_hashes():
  assert reference_text.SHINGLE_SCHEME == "xxh3-fold-fmix64-v1"
  shingles, offsets, counts = shingle_batch(
      ["The quick brown fox jumps over"], unit="word", ngram=3, seed=42)
  assert shingles.tolist() == [6360606798304997615, 17849846957961067636,
                               4485476641524027958, 2946567429223168698]
  assert offsets.tolist() == [0, 4] and counts.tolist() == [6]
  shingles, offsets, counts = shingle_batch(["Hello"], unit="char", ngram=3,
                                            seed=42)
  assert shingles.tolist() == [7409249615552466321, 11576514081195145113,
                               7091117569715594456]
  assert counts.tolist() == [5]


@pytest.mark.parametrize("unit", ["word", "char"])
def test_deterministic_and_seed_dependent(unit):
  doc = ["the quick brown fox jumps over the lazy dog"]
  first, _, _ = shingle_batch(doc, unit=unit, ngram=3, seed=42)
  again, _, _ = shingle_batch(doc, unit=unit, ngram=3, seed=42)
  other, _, _ = shingle_batch(doc, unit=unit, ngram=3, seed=43)
  assert first.tolist() == again.tolist()
  assert not set(first.tolist()) & set(other.tolist())


def test_unique_per_document():
  values = np.array([5, 3, 5, 1, 9, 9, 2, 2, 2], dtype=np.uint64)
  offsets = np.array([0, 4, 4, 6, 9], dtype=np.int64)
  out = unique_per_document(values, offsets)
  assert [o.tolist() for o in out] == [[1, 3, 5], [], [9], [2]]
  assert all(o.dtype == np.uint64 for o in out)


def test_repeated_text_has_duplicate_shingles_but_unique_set():
  shingles, offsets, _ = shingle_batch(["a b a b a b"], unit="word", ngram=2,
                                       seed=6)
  assert len(shingles) == 5
  (unique,) = unique_per_document(shingles, offsets)
  assert len(unique) == 2
  assert np.all(np.diff(unique.astype(np.float64)) > 0)
