"""Raw text to signatures for a batch: the whole per-document stage
(normalise, shingle, hash, MinHash or OPH) as one kernel call.

The result is bit-identical to ``reference_text.shingle_batch`` followed by
``minhash.minhash_batch`` / ``minhash.oph_batch``, which is the path small
batches take (see :mod:`~transforms.kernels.dispatch`). On the compiled path
no Python code runs per token or per shingle: the Arrow string buffer goes
straight to compiled code that lowercases, folds digits and splits through
per-code-point tables, hashes words with xxh3, folds n-grams and sketches.
Python's ``unicodedata`` NFKC runs only on documents that hold a code point
NFKC could change (pure-ASCII text never does).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from transforms.kernels import dispatch
from transforms.kernels.jaccard import sorted_sets
from transforms.kernels import minhash
from transforms.kernels import reference_text

SKETCHES = tuple(minhash.SKETCH_SCHEMES)


def signature_batch(texts: Sequence[Optional[str]], *, unit: str, ngram: int,
                    seed: int, a: np.ndarray, b: np.ndarray, nfkc: bool = True,
                    lowercase: bool = True, strip_punctuation: bool = True,
                    fold_digits: bool = False, sketch: str = "classic"
                    ) -> Tuple[np.ndarray, np.ndarray]:
  """Signatures of a batch of raw texts (normalise, shingle and sketch in
  one compiled pass; the same values as the reference path of
  :mod:`~transforms.kernels.reference_text` and
  :mod:`~transforms.kernels.minhash`).

  Args:
    texts: the raw documents (None counts as empty).
    unit: ``"word"`` or ``"char"``: what a shingle is made of.
    ngram: units per shingle (a shorter document yields one shingle).
    seed: the config's seed; keys the unit and shingle hashes (and OPH).
    a, b: the K permutations' coefficients (:func:`minhash.permutations`).
    nfkc, lowercase, strip_punctuation, fold_digits: the normalisation
      steps (:func:`transforms.sign.normalize_options` of a config).
    sketch: ``"classic"`` (K-permutation MinHash with ``(a, b)``) or
      ``"oph"`` (one-permutation hashing keyed by ``seed``; ``a`` and ``b``
      only give K).

  Returns:
    ``(signatures, unit_counts)``: uint32 ``(n_docs, K)`` with ``K =
    len(a)``, and the number of units of each normalised document. A
    document with no units has no shingles; its row is all ``0xFFFFFFFF``
    and must not be used.

  Raises:
    ValueError: an unknown ``unit`` or ``sketch``.
  """
  if unit not in ("word", "char"):
    raise ValueError(f"unknown shingle unit {unit!r}")
  if sketch not in SKETCHES:
    raise ValueError(f"unknown sketch {sketch!r}: use one of {SKETCHES}")
  arr = _string_array(texts)
  a = np.ascontiguousarray(a, np.uint64)
  b = np.ascontiguousarray(b, np.uint64)
  sigs = np.empty((len(arr), len(a)), dtype=np.uint32)
  normalize = dict(nfkc=nfkc, lowercase=lowercase,
                   strip_punctuation=strip_punctuation, fold_digits=fold_digits)
  kernels = dispatch.compiled_kernels(arr.nbytes * len(a))
  if kernels is None:
    shingles, offsets, unit_counts = reference_text.shingle_batch(
        arr, unit=unit, ngram=ngram, seed=seed, **normalize)
    minhash.sketch(shingles, offsets, len(a), a, b, sketch == "oph", seed,
                   sigs)
    return sigs, unit_counts
  units, offsets = _units(kernels, arr, unit == "word", seed, **normalize)
  kernels.sketch_rows(units, offsets, ngram, np.uint64(seed), sketch == "oph",
                      a, b, *minhash.oph_keys(seed), sigs)
  return sigs, np.diff(offsets)


def shingle_sets(texts: Sequence[Optional[str]], *, unit: str, ngram: int,
                 seed: int, nfkc: bool = True, lowercase: bool = True,
                 strip_punctuation: bool = True, fold_digits: bool = False
                 ) -> Tuple[np.ndarray, np.ndarray]:
  """The set of shingle hashes of each text on the compiled path:
  ``(values, offsets)``, document i's sorted distinct hashes being
  ``values[offsets[i]:offsets[i+1]]``; the same sets as
  ``reference_text.shingle_batch`` followed by ``reference_text.unique_per_document``."""
  if unit not in ("word", "char"):
    raise ValueError(f"unknown shingle unit {unit!r}")
  arr = _string_array(texts)
  normalize = dict(nfkc=nfkc, lowercase=lowercase,
                   strip_punctuation=strip_punctuation, fold_digits=fold_digits)
  kernels = dispatch.compiled_kernels(arr.nbytes)
  if kernels is None:
    shingles, offsets, _ = reference_text.shingle_batch(
        arr, unit=unit, ngram=ngram, seed=seed, **normalize)
  else:
    units, unit_offsets = _units(kernels, arr, unit == "word", seed,
                                 **normalize)
    shingles, offsets = reference_text.ngram_hashes(units, unit_offsets, ngram,
                                                    seed)
  return sorted_sets(shingles, offsets)


def _string_array(texts) -> pa.StringArray:
  """The texts as one string array, None as the empty string."""
  arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(
      texts, type=pa.string())
  if isinstance(arr, pa.ChunkedArray):
    arr = arr.combine_chunks()
  return pc.fill_null(arr, "")


def _units(kernels, arr, word, seed, *, nfkc, lowercase, strip_punctuation,
           fold_digits):
  """Unit hashes and offsets (``reference_text.unit_hashes``'s layout) of the
  texts normalised as ``reference_text.normalize_texts`` would, by the
  compiled ``kernels``."""
  if not len(arr):
    return np.zeros(0, dtype=np.uint64), np.zeros(1, dtype=np.int64)
  lower, props = reference_text.codepoint_tables()
  data, starts, ends = _buffers(arr)
  # Only documents with non-ASCII text need the tables extended or NFKC.
  scan = ~pc.string_is_ascii(arr).to_numpy(zero_copy_only=False)
  if scan.any():
    check = scan & nfkc
    unstable = np.zeros(len(arr), dtype=bool)
    unknown = np.empty(len(data) + 1, dtype=np.int64)
    while True:
      n_unknown = kernels.scan_codepoints(data, starts, ends, scan, check,
                                          lower, props, lowercase, unstable,
                                          unknown)
      if n_unknown:
        reference_text.learn_codepoints(unknown[:n_unknown])
      elif unstable.any():
        # NFKC could change these: normalise them in Python, check again
        # only for code points the tables have not seen.
        fixed = pa.array(unstable)
        arr = pc.replace_with_mask(arr, fixed,
                                   reference_text.nfkc_array(arr.filter(fixed)))
        data, starts, ends = _buffers(arr)
        unknown = np.empty(len(data) + 1, dtype=np.int64)
        check &= ~unstable
        unstable[:] = False
      else:
        break
  norm = np.empty(2 * len(data) + 8 if word else 1, dtype=np.uint8)
  # Words are separated by at least one byte: at most (length + 1) // 2 per
  # document; characters at most one per byte.
  units = np.empty(len(data) // 2 + len(arr) + 1 if word else len(data) + 1,
                   dtype=np.uint64)
  unit_offsets = np.empty(len(arr) + 1, dtype=np.int64)
  long_tokens = np.empty((len(norm) // (kernels.XXH3_MAX_LEN + 1) + 1, 3),
                         dtype=np.int64)
  n_long = kernels.text_units(data, starts, ends, lower, props, word,
                              lowercase, strip_punctuation, fold_digits,
                              np.uint64(seed), norm, units, unit_offsets,
                              long_tokens)
  for u, start, end in long_tokens[:n_long].tolist():
    units[u] = xxhash.xxh3_64_intdigest(norm[start:end].tobytes(), seed)
  return units[:unit_offsets[-1]], unit_offsets


def _buffers(arr):
  """``(utf8 bytes, starts, ends)`` of a string array, without copying the
  bytes."""
  _, offset_buffer, data_buffer = arr.buffers()
  offset_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
  bounds = np.frombuffer(offset_buffer, dtype=offset_type)[
      arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
  data = (np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None
          else np.zeros(0, dtype=np.uint8))
  return data, bounds[:-1].copy(), bounds[1:].copy()
