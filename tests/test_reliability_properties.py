"""Property-based tests (hypothesis) of Normalize, Shingle, MinHash and
BandKey on arbitrary Unicode: combining marks, right-to-left scripts, astral
planes, NUL and other controls, and lone surrogates arriving as JSON
escapes. No input raises, the output is deterministic and the compiled path
equals the reference path bit for bit.

Examples per property: 150 (NEARDUP_FULL=1: 2,000); derandomized, so CI
sees the same examples every run.
"""

import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms.read import Document, InputFile, Rejected, read_file
from transforms.kernels import lsh, minhash, reference_text
from transforms.kernels.hashing import fmix64
from transforms.kernels.compiled_signature import shingle_sets, signature_batch

pytestmark = pytest.mark.extended

FULL = os.environ.get("NEARDUP_FULL") == "1"
PROPERTY = settings(max_examples=2000 if FULL else 150, deadline=None,
                    derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15

# Characters from every category but surrogates (a Python str may hold
# them, UTF-8 cannot: they reach the kernels only if the reader let them).
CHARACTERS = st.characters(codec="utf-8")
# Weighted towards what breaks tokenizers: marks, RTL, astral, controls.
SPECIAL = st.sampled_from(
    ["\u0301", "\u0308", "\u05d0", "\u0627", "\u200f", "\u200e", "\u0000",
     "\u0085", "\u2028", "\ufeff", "\U0001f600", "\U0001d400", "\U00020000",
     "\ufb01", "\uff21", "\u0130", "\u03a3", "\u00df", "\u0663", " ", "\t",
     "\r", "\n", "-", "a", "A"])
TEXTS = st.lists(st.text(st.one_of(CHARACTERS, SPECIAL), max_size=60),
                 min_size=1, max_size=8)
OPTIONS = st.fixed_dictionaries({
    "nfkc": st.booleans(), "lowercase": st.booleans(),
    "strip_punctuation": st.booleans(), "fold_digits": st.booleans()})


def reference_signatures(texts, unit, ngram, seed, k, sketch, options):
  """Reference kernels: shingle_batch, then the matching MinHash kernel."""
  shingles, offsets, counts = reference_text.shingle_batch(
      texts, unit=unit, ngram=ngram, seed=seed, **options)
  sigs = np.full((len(counts), k), 0xFFFFFFFF, dtype=np.uint32)
  signed = np.flatnonzero(counts)
  if len(signed):
    flat = np.concatenate([shingles[offsets[i]:offsets[i + 1]]
                           for i in signed])
    bounds = np.zeros(len(signed) + 1, dtype=np.int64)
    np.cumsum(np.diff(offsets)[signed], out=bounds[1:])
    sigs[signed] = (
        minhash.oph_batch(flat, bounds, k, seed) if sketch == "oph" else
        minhash.minhash_batch(flat, bounds, *minhash.permutations(k, seed)))
  return sigs, counts


@PROPERTY
@given(texts=TEXTS, options=OPTIONS, unit=st.sampled_from(["word", "char"]),
       ngram=st.integers(1, 4), sketch=st.sampled_from(["classic", "oph"]),
       seed=st.integers(0, 2**32))
def test_compiled_signatures_equal_the_reference_on_any_unicode(
    texts, options, unit, ngram, sketch, seed):
  a, b = minhash.permutations(16, seed)
  first = signature_batch(texts, unit=unit, ngram=ngram, seed=seed, a=a, b=b,
                          sketch=sketch, **options)
  again = signature_batch(list(texts), unit=unit, ngram=ngram, seed=seed, a=a,
                          b=b, sketch=sketch, **options)
  expected = reference_signatures(texts, unit, ngram, seed, 16, sketch,
                                  options)
  for got in (first, again):
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


@PROPERTY
@given(texts=TEXTS, options=OPTIONS, unit=st.sampled_from(["word", "char"]),
       ngram=st.integers(1, 4))
def test_normalize_and_shingle_sets_are_deterministic_and_match(
    texts, options, unit, ngram):
  normalized = reference_text.normalize_texts(texts, **options).to_pylist()
  assert normalized == reference_text.normalize_texts(list(texts), **options).to_pylist()
  # Whitespace is collapsed and trimmed whatever the options.
  assert all(n == " ".join(n.split(" ")) and n == n.strip(" ")
             for n in normalized)
  values, offsets = shingle_sets(texts, unit=unit, ngram=ngram, seed=7,
                                 **options)
  shingles, shingle_offsets, _ = reference_text.shingle_batch(
      texts, unit=unit, ngram=ngram, seed=7, **options)
  expected = reference_text.unique_per_document(shingles, shingle_offsets)
  assert len(offsets) == len(texts) + 1
  for i, want in enumerate(expected):
    np.testing.assert_array_equal(values[offsets[i]:offsets[i + 1]], want)


def _fmix64(h):
  h ^= h >> 33
  h = (h * 0xFF51AFD7ED558CCD) & MASK64
  h ^= h >> 33
  h = (h * 0xC4CEB9FE1A85EC53) & MASK64
  return h ^ (h >> 33)


def reference_band_key(signature, band, rows, seed):
  """The documented band key in Python integers."""
  h = _fmix64(((band * GOLDEN) & MASK64) ^ seed)
  for value in signature[band * rows:(band + 1) * rows]:
    h = _fmix64(((h ^ int(value)) * GOLDEN) & MASK64)
  return h


SIGNATURES = st.integers(1, 6).flatmap(lambda n: st.lists(
    st.lists(st.integers(0, 2**32 - 1), min_size=12, max_size=12),
    min_size=n, max_size=n))


@PROPERTY
@given(signatures=SIGNATURES, shape=st.sampled_from([(1, 12), (2, 6), (3, 4),
                                                     (4, 3), (5, 2)]),
       seed=st.integers(0, 2**63 - 1))
def test_band_keys_equal_the_reference_formula(signatures, shape, seed):
  bands, rows = shape
  sigs = np.array(signatures, dtype=np.uint32)
  keys = lsh.band_keys(sigs, bands, rows, seed)
  np.testing.assert_array_equal(keys, lsh.band_keys(sigs.copy(), bands, rows,
                                                    seed))
  for i, signature in enumerate(signatures):
    for band in range(bands):
      assert int(keys[i, band]) == reference_band_key(signature, band, rows,
                                                      seed)
  values = np.array([s[0] for s in signatures], dtype=np.uint64)
  assert [int(v) for v in fmix64(values)] == [_fmix64(int(v)) for v in values]


@PROPERTY
@given(value=st.text(st.one_of(st.characters(), SPECIAL), max_size=40),
       ensure_ascii=st.booleans())
def test_jsonl_reader_never_raises_and_rejects_lone_surrogates(value,
                                                               ensure_ascii):
  # Lone surrogates can only arrive escaped (\ud800): raw UTF-8 has none.
  line = json.dumps({"id": 1, "text": value}, ensure_ascii=True) if (
      ensure_ascii or _has_surrogate(value)) else json.dumps(
          {"id": 1, "text": value}, ensure_ascii=False)
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "in.jsonl")
    with open(path, "wb") as f:
      f.write(line.encode("utf-8") + b"\n")
    records = list(read_file(InputFile(0, path, "jsonl",
                                       os.path.getsize(path))))
  assert len(records) == 1
  record = records[0]
  if _has_surrogate(value):
    assert isinstance(record, Rejected)
    assert record.reason == "invalid_utf8" and record.detail
  else:
    assert isinstance(record, Document) and record.text == value


def _has_surrogate(value):
  return any(0xD800 <= ord(c) < 0xE000 for c in value)
