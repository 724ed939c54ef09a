"""The compiled signature stage (transforms/kernels/compiled_signature.py, compiled.py)
against the reference kernels it must reproduce bit for bit."""

import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from transforms.kernels import compiled, minhash, reference_text
from transforms.kernels.compiled_signature import shingle_sets, signature_batch

OPTIONS = [{}, {"lowercase": False}, {"strip_punctuation": False},
           {"fold_digits": True}, {"nfkc": False},
           {"lowercase": False, "strip_punctuation": False,
            "fold_digits": True}]
# Code points that exercise NFKC (ligature, full width, decomposed accent,
# Hangul jamo, Kannada length mark, singleton, compatibility digits),
# lowercasing (Turkish dotted I, final sigma, a 2-byte letter whose lowercase
# takes 3 bytes), separators and digits of other scripts, astral letters.
SPECIAL = ("\ufb01\uff21\uff41\uff11\u3000\u0301\u0308\u1100\u1161\u11a8"
           "\u0cbf\u0cd5\u212b\u2460\u00b2\u0130\u03a3\u03c2\u023a\u2c65"
           "\u00df\u00e9\u00c9\u2014\u2019\u201c\u00a0\u2003\u2028\u0085"
           "\u0663\u0966\u4e2d\u6587\uac00\U0001d400\U0001f600\U00020000")


def _reference(texts, unit, ngram, seed, k, sketch, **options):
  """reference_text.shingle_batch followed by the matching minhash kernel."""
  shingles, offsets, counts = reference_text.shingle_batch(
      texts, unit=unit, ngram=ngram, seed=seed, **options)
  sigs = np.full((len(counts), k), 0xFFFFFFFF, dtype=np.uint32)
  signed = np.flatnonzero(counts)
  flat = np.concatenate([shingles[offsets[i]:offsets[i + 1]] for i in signed]
                        or [np.zeros(0, dtype=np.uint64)])
  bounds = np.zeros(len(signed) + 1, dtype=np.int64)
  np.cumsum(np.diff(offsets)[signed], out=bounds[1:])
  sigs[signed] = (minhash.oph_batch(flat, bounds, k, seed) if sketch == "oph"
                  else minhash.minhash_batch(flat, bounds,
                                             *minhash.permutations(k, seed)))
  return sigs, counts


def _random_texts(seed, n):
  rng = random.Random(seed)
  pools = [" abcdefABCDEF0123456789", ",.;:!?-_'\"()[]{}@#$%&*+=/\\|<>~`\t\n\r",
           SPECIAL, "".join(map(chr, range(128)))]
  texts = [None, "", "   ", "?!", "x" * 300 + " y", "A" * 241, "\u00e9" * 130]
  for _ in range(n):
    words = []
    for _ in range(rng.randint(0, 40)):
      pool = rng.choices(pools, weights=[8, 2, 1, 1])[0]
      words.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 9))))
    texts.append(rng.choice([" ", "  ", ", ", "\u3000"]).join(words))
  return texts


def test_xxh3_matches_xxhash_for_every_inline_length():
  rng = np.random.default_rng(0)
  for n in range(compiled.XXH3_MAX_LEN + 1):
    buf = rng.integers(0, 256, size=n + 11, dtype=np.uint8)
    for seed in (0, 42, 2**63 - 25, int(rng.integers(0, 2**63))):
      assert compiled.xxh3_64(buf, 5, n, np.uint64(seed)) == (
          xxhash.xxh3_64_intdigest(buf[5:5 + n].tobytes(), seed)), (n, seed)


@pytest.mark.parametrize("sketch", ["classic", "oph"])
@pytest.mark.parametrize("unit,ngram", [("word", 1), ("word", 3),
                                        ("char", 4)])
@pytest.mark.parametrize("options", OPTIONS)
def test_signature_batch_equals_reference(unit, ngram, options, sketch):
  texts = _random_texts(1, 150)
  a, b = minhash.permutations(32, 9)
  sigs, counts = signature_batch(texts, unit=unit, ngram=ngram, seed=9, a=a,
                                 b=b, sketch=sketch, **options)
  expected, expected_counts = _reference(texts, unit, ngram, 9, 32, sketch,
                                         **options)
  np.testing.assert_array_equal(counts, expected_counts)
  np.testing.assert_array_equal(sigs, expected)
  assert not counts[:3].any()  # None, "", whitespace
  kept_punctuation = 1 if unit == "word" else 2  # "?!"
  assert counts[3] == (0 if options.get("strip_punctuation", True)
                       else kept_punctuation)


@pytest.mark.parametrize("unit,ngram", [("word", 1), ("word", 3),
                                        ("char", 4)])
@pytest.mark.parametrize("options", OPTIONS[:3])
def test_shingle_sets_equal_the_reference_sets(unit, ngram, options):
  texts = _random_texts(2, 150) + ["a b a b a b", "x"]
  values, offsets = shingle_sets(texts, unit=unit, ngram=ngram, seed=9,
                                 **options)
  shingles, shingle_offsets, _ = reference_text.shingle_batch(
      texts, unit=unit, ngram=ngram, seed=9, **options)
  expected = reference_text.unique_per_document(shingles, shingle_offsets)
  assert len(offsets) == len(texts) + 1
  for i, want in enumerate(expected):
    np.testing.assert_array_equal(values[offsets[i]:offsets[i + 1]], want)
  # "a b a b a b": {a, b}, {a b a, b a b}, {"a b ", " b a", "b a ", " a b"}
  assert offsets[-2] - offsets[-3] == (4 if unit == "char" else 2)


@pytest.mark.parametrize("unit", ["word", "char"])
def test_every_code_point_normalises_like_the_reference(unit):
  # Each code point between letters, doubled, and next to another one; every
  # scalar value, in CI too (~50 s for both units on 2 cores).
  points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
  points += [ord(c) for c in SPECIAL]
  texts = [f"A{chr(c)}b \u00c9 {chr(points[(i * 7919) % len(points)])}"
           f"{chr(c)}" for i, c in enumerate(points)]
  a, b = minhash.permutations(4, 3)
  for options in OPTIONS[:4]:
    sigs, counts = signature_batch(texts, unit=unit, ngram=2, seed=3, a=a,
                                   b=b, **options)
    expected, expected_counts = _reference(texts, unit, 2, 3, 4, "classic",
                                           **options)
    bad = np.flatnonzero((counts != expected_counts)
                         | (sigs != expected).any(axis=1))
    assert not len(bad), [hex(points[i]) for i in bad[:10]]


def test_ascii_needs_no_scan():
  # The scan skips ASCII bytes: ASCII must be known, NFKC-stable and never
  # merge into a preceding character.
  lower, props = reference_text.codepoint_tables()
  assert np.all(props[:128] & compiled.KNOWN) and np.all(props[:128] & compiled.STABLE)
  assert np.all(lower[:128] < 128)
  assert min(reference_text._composition_seconds()) >= 0x80  # pylint: disable=protected-access


def test_arrow_input_and_empty_batch():
  a, b = minhash.permutations(8, 1)
  texts = ["Hello there, world", None, "caf\u00e9 au lait"]
  from_list = signature_batch(texts, unit="word", ngram=2, seed=1, a=a, b=b)
  chunked = pa.chunked_array([texts[:1], texts[1:]])
  from_arrow = signature_batch(chunked, unit="word", ngram=2, seed=1, a=a,
                               b=b)
  sliced = signature_batch(pa.array(["x"] + texts)[1:], unit="word", ngram=2,
                           seed=1, a=a, b=b)
  large = signature_batch(pa.array(texts, type=pa.large_string()),
                          unit="word", ngram=2, seed=1, a=a, b=b)
  for other in (from_arrow, sliced, large):
    np.testing.assert_array_equal(other[0], from_list[0])
    np.testing.assert_array_equal(other[1], from_list[1])
  sigs, counts = signature_batch([], unit="word", ngram=2, seed=1, a=a, b=b)
  assert sigs.shape == (0, 8) and counts.shape == (0,)


def test_unknown_sketch_or_unit_raises():
  a, b = minhash.permutations(8, 1)
  with pytest.raises(ValueError, match="sketch"):
    signature_batch(["a"], unit="word", ngram=2, seed=1, a=a, b=b,
                    sketch="bottom-k")
  with pytest.raises(ValueError, match="unit"):
    signature_batch(["a"], unit="sentence", ngram=2, seed=1, a=a, b=b)


def test_densest_batches():
  # One-byte words between one-byte separators: the most units per byte.
  texts = ["a b c d e f g", "x", "q,r", "1"] * 40
  a, b = minhash.permutations(16, 2)
  for unit in ("word", "char"):
    sigs, counts = signature_batch(texts, unit=unit, ngram=2, seed=2, a=a,
                                   b=b)
    expected, expected_counts = _reference(texts, unit, 2, 2, 16, "classic")
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(sigs, expected)
