"""Normalisation and shingling over batches of documents (pyarrow + numpy).

Shingle hashing scheme (stable across platforms, processes and versions of
this package that keep ``SHINGLE_SCHEME``):

* word unit: each distinct token is hashed once per batch with
  ``xxh3_64(token.encode('utf-8'), seed)``; char unit: each code point c is
  ``fmix64(c + seed)``.
* an n-gram over unit hashes t_0..t_{n-1} is
  ``fmix64(fold(L*GOLDEN ^ seed, t_0..t_{n-1}))`` with
  ``fold(h, t) = (h ^ t) * GOLDEN`` (mod 2**64), L the n-gram length.
* a document with fewer than n units yields exactly one shingle over all of
  its units (so it still has a non-empty set that only matches itself);
  a document with no units yields none and is never clustered.
"""

from __future__ import annotations

import threading
import unicodedata
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from transforms.kernels.hashing import GOLDEN, fmix64

SHINGLE_SCHEME = "xxh3-fold-fmix64-v1"

_NOT_WORD = r"[^\p{L}\p{M}\p{N}]+"
_SPACE = r"[\s\p{Z}\p{Cc}]+"
_DIGIT = r"\p{Nd}"
# Bits of the per-code-point property table (see codepoint_tables).
KNOWN, WORD, SPACE, DIGIT, STABLE = 1, 2, 4, 8, 16


def normalize_texts(texts: Sequence[Optional[str]], *, nfkc: bool = True,
                    lowercase: bool = True, strip_punctuation: bool = True,
                    fold_digits: bool = False) -> pa.StringArray:
  """Normalises a batch of strings; whitespace is always collapsed to single
  spaces and trimmed. ``None`` becomes the empty string.

  With ``strip_punctuation`` every run of characters that are not letters,
  combining marks or digits becomes one space; ``fold_digits`` maps every
  decimal digit to ``0`` (so changed dates and numbers still match).
  """
  arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(
      texts, type=pa.string())
  arr = pc.fill_null(arr, "")
  if nfkc:
    arr = nfkc_array(arr)
  if lowercase:
    arr = pc.utf8_lower(arr)
  if fold_digits:
    arr = pc.replace_substring_regex(arr, pattern=_DIGIT, replacement="0")
  arr = pc.replace_substring_regex(
      arr, pattern=_NOT_WORD if strip_punctuation else _SPACE, replacement=" ")
  return pc.utf8_trim_whitespace(arr)


def nfkc_array(arr: pa.StringArray) -> pa.StringArray:
  """NFKC of every string (Python's unicodedata)."""
  # Not pc.utf8_normalize: some pyarrow releases (25.0.1 among them) skip the
  # composition step and return NFKD for form="NFKC" (apache/arrow#51225).
  return pa.array([unicodedata.normalize("NFKC", s) for s in arr.to_pylist()],
                  type=arr.type)


# Per-code-point tables for compiled normalisation (compiled.text_units): the
# lowercase mapping and property bits of every code point seen so far in this
# process, each computed with the very functions normalize_texts applies.
_LOWER = np.arange(0x110000, dtype=np.int32)
_PROPS = np.zeros(0x110000, dtype=np.uint8)
_TABLES_LOCK = threading.Lock()
_COMPOSITION_SECONDS = []


def codepoint_tables() -> Tuple[np.ndarray, np.ndarray]:
  """``(lower, props)``: the lowercase code point and the ``compiled`` property
  bits (KNOWN, WORD, SPACE, DIGIT, STABLE) of every code point; ASCII is
  always known, others once :func:`learn_codepoints` has seen them."""
  if not _PROPS[0]:
    learn_codepoints(np.arange(128, dtype=np.int64))
  return _LOWER, _PROPS


def learn_codepoints(codepoints: np.ndarray) -> None:
  """Adds the given code points and their lowercase forms to the tables.

  WORD, SPACE and DIGIT come from the regular expressions of
  :func:`normalize_texts` and the lowercase form from ``pc.utf8_lower``, all
  evaluated on the single code point. STABLE means NFKC leaves any string of
  STABLE code points unchanged: the code point is its own NFKC form, has
  combining class 0 and is not the second half of a canonical composition.
  """
  with _TABLES_LOCK:
    todo = _unknown(codepoints)
    while len(todo):
      chars = [chr(c) for c in todo.tolist()]
      arr = pa.array(chars, type=pa.string())
      lowered = [ord(low) for low in pc.utf8_lower(arr).to_pylist()
                 if len(low) == 1]
      if len(lowered) != len(chars):
        raise RuntimeError("pyarrow's utf8_lower maps a code point to several")
      props = np.full(len(todo), KNOWN, dtype=np.uint8)
      flags = {WORD: pc.invert(pc.match_substring_regex(arr, _NOT_WORD)),
               SPACE: pc.match_substring_regex(arr, _SPACE),
               DIGIT: pc.match_substring_regex(arr, _DIGIT)}
      for bit, flag in flags.items():
        props[flag.to_numpy(zero_copy_only=False)] |= bit
      # NFKC is the identity on ASCII, and ASCII never composes.
      seconds = _composition_seconds() if todo[-1] >= 0x80 else frozenset()
      stable = [c < 0x80 or (unicodedata.is_normalized("NFKC", ch)
                             and not unicodedata.combining(ch)
                             and c not in seconds)
                for c, ch in zip(todo.tolist(), chars)]
      props[np.array(stable, dtype=bool)] |= STABLE
      # KNOWN goes in last: compiled readers in other threads trust an entry
      # once they see it.
      _LOWER[todo] = lowered
      _PROPS[todo] = props
      todo = _unknown(lowered)


def _unknown(codepoints) -> np.ndarray:
  """The distinct code points that the tables do not know yet, sorted."""
  codepoints = np.unique(np.asarray(codepoints, dtype=np.int64))
  return codepoints[(_PROPS[codepoints] & KNOWN) == 0]


def _composition_seconds() -> frozenset:
  """Code points that can merge into a preceding character under NFC: second
  halves of canonical pairs and Hangul medial/final jamo (computed once)."""
  if not _COMPOSITION_SECONDS:
    seconds = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for c in range(0x110000):
      parts = unicodedata.decomposition(chr(c)).split()
      if len(parts) == 2 and not parts[0].startswith("<"):
        seconds.add(int(parts[1], 16))
    _COMPOSITION_SECONDS.append(frozenset(seconds))
  return _COMPOSITION_SECONDS[0]


def unit_hashes(normalized: pa.StringArray, unit: str,
                seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """Hashes the shingle units of each normalised document.

  Returns ``(hashes, offsets)``: uint64 unit hashes of all documents
  concatenated, and int64 offsets of length ``len(normalized) + 1`` such that
  document i owns ``hashes[offsets[i]:offsets[i+1]]``.
  """
  if unit == "word":
    return _word_hashes(normalized, seed)
  if unit == "char":
    return _char_hashes(normalized, seed)
  raise ValueError(f"unknown shingle unit {unit!r}")


def _word_hashes(normalized, seed):
  tokens = pc.utf8_split_whitespace(normalized)
  if isinstance(tokens, pa.ChunkedArray):
    tokens = tokens.combine_chunks()
  offsets = _list_offsets(tokens)
  flat = tokens.flatten()
  # Arrow splits "" into [""] (and leading/trailing whitespace into empty
  # tokens); drop those so an empty document has no units.
  nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(
      zero_copy_only=False)
  if not nonempty.all():
    kept = np.zeros(len(nonempty) + 1, dtype=np.int64)
    np.cumsum(nonempty, out=kept[1:])
    offsets = kept[offsets]
    flat = flat.filter(pa.array(nonempty))
  if len(flat) == 0:
    return np.zeros(0, dtype=np.uint64), offsets
  encoded = flat.dictionary_encode()
  # Each distinct token is hashed once; the per-position hashes are a gather.
  table = np.fromiter(
      (xxhash.xxh3_64_intdigest(token.encode("utf-8"), seed)
       for token in encoded.dictionary.to_pylist()),
      dtype=np.uint64, count=len(encoded.dictionary))
  return table[encoded.indices.to_numpy(zero_copy_only=False)], offsets


def _char_hashes(normalized, seed):
  texts = normalized.to_pylist()
  lengths = np.fromiter((len(t) if t else 0 for t in texts), dtype=np.int64,
                        count=len(texts))
  offsets = np.zeros(len(texts) + 1, dtype=np.int64)
  np.cumsum(lengths, out=offsets[1:])
  joined = "".join(t for t in texts if t)
  codepoints = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
  return fmix64(codepoints.astype(np.uint64) + np.uint64(seed)), offsets


def _list_offsets(lists: pa.ListArray) -> np.ndarray:
  offsets = lists.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
  return offsets - offsets[0]


def ngram_hashes(units: np.ndarray, offsets: np.ndarray, n: int,
                 seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """Combines unit hashes into n-gram shingle hashes without crossing
  document boundaries.

  Returns ``(shingles, shingle_offsets)`` in the same layout as the input. A
  document with 1..n-1 units gets one shingle over all its units; one with
  zero units gets none. Duplicate shingles within a document are kept (MinHash
  is insensitive to them); use :func:`unique_per_document` for sets.
  """
  counts = np.diff(offsets)
  starts = offsets[:-1]
  full = counts >= n
  short = (counts > 0) & ~full
  per_doc = np.where(full, counts - n + 1, np.where(short, 1, 0))
  out_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
  np.cumsum(per_doc, out=out_offsets[1:])
  out = np.empty(out_offsets[-1], dtype=np.uint64)
  seed64 = np.uint64(seed)

  if full.any():
    # Window start positions of all full-length documents, as one vector.
    doc_idx = np.repeat(np.nonzero(full)[0], per_doc[full])
    local = _ranks_within_groups(doc_idx)
    out[out_offsets[doc_idx] + local] = _fold(
        units, starts[doc_idx] + local, n, seed64)

  if short.any():
    for length in np.unique(counts[short]):
      docs = np.nonzero(short & (counts == length))[0]
      out[out_offsets[docs]] = _fold(units, starts[docs], int(length), seed64)
  return out, out_offsets


def _ranks_within_groups(group_ids: np.ndarray) -> np.ndarray:
  """0, 1, 2, ... restarting wherever the (sorted) group id changes."""
  idx = np.arange(len(group_ids), dtype=np.int64)
  if len(group_ids) == 0:
    return idx
  change = np.ones(len(group_ids), dtype=bool)
  change[1:] = group_ids[1:] != group_ids[:-1]
  group_start = np.maximum.accumulate(np.where(change, idx, 0))
  return idx - group_start


def _fold(units, positions, length, seed64):
  start = ((length * int(GOLDEN)) & 0xFFFFFFFFFFFFFFFF) ^ int(seed64)
  h = np.full(len(positions), start, dtype=np.uint64)
  for j in range(length):
    h = (h ^ units[positions + j]) * GOLDEN
  return fmix64(h)


def unique_per_document(values: np.ndarray,
                        offsets: np.ndarray) -> List[np.ndarray]:
  """Splits a flat array into per-document sorted unique arrays."""
  return [np.unique(values[offsets[i]:offsets[i + 1]])
          for i in range(len(offsets) - 1)]


def shingle_batch(texts: Sequence[Optional[str]], *, unit: str, ngram: int,
                  seed: int, nfkc: bool = True, lowercase: bool = True,
                  strip_punctuation: bool = True, fold_digits: bool = False
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Normalise, split into units and hash n-gram shingles for a batch.

  Returns ``(shingles, offsets, unit_counts)`` in the flat layout of
  :func:`ngram_hashes`, plus the number of units (words or characters) of
  each normalised document.
  """
  normalized = normalize_texts(texts, nfkc=nfkc, lowercase=lowercase,
                               strip_punctuation=strip_punctuation,
                               fold_digits=fold_digits)
  units, unit_offsets = unit_hashes(normalized, unit, seed)
  shingles, offsets = ngram_hashes(units, unit_offsets, ngram, seed)
  return shingles, offsets, np.diff(unit_offsets)
