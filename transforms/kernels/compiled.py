"""Every compiled hot loop of the kernels (numba, ``cache=True``), each
compiled once per process (or loaded from numba's on-disk cache). Only
:mod:`~transforms.kernels.dispatch` imports this module, once a process has
enough work to pay numba's start; the callers' pure paths give the same
results (tests compare them).

The signature stage: :func:`scan_codepoints` (which documents need NFKC or
new table entries), :func:`text_units` (normalise, split and hash units) and
:func:`sketch_rows` (fold units into n-gram shingles, then classic MinHash or
one-permutation hashing), reproducing the schemes documented in
``reference_text.py`` and ``minhash.py`` bit for bit. Then the band entries
(:func:`band_entries`), repeated keys (:func:`occurs_in`), sets and their
intersections (:func:`sorted_sets`, :func:`are_sets`,
:func:`merge_intersections`) and the union-find of
:mod:`~transforms.kernels.union_find` (:func:`unite`). All release the GIL.
"""

from __future__ import annotations

import types

import numba
import numpy as np

from transforms.kernels import bucket_components, jaccard, union_find
from transforms.kernels.hashing import FMIX_M1, FMIX_M2, GOLDEN
# Property bits of the code point tables (see reference_text.codepoint_tables).
from transforms.kernels.reference_text import (DIGIT, KNOWN, SPACE, STABLE,
                                               WORD)

_U64 = np.uint64
_S33 = np.uint64(33)
_MASK32 = np.uint64(0xFFFFFFFF)
_EMPTY = np.uint64(1 << 32)  # above every 32-bit value: marks an empty bin

# xxHash 0.8 (XXH3) constants and its default 192-byte secret.
_P64_1 = np.uint64(0x9E3779B185EBCA87)
_P64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P64_3 = np.uint64(0x165667B19E3779F9)
_PMX1 = np.uint64(0x165667919E3779F9)
_PMX2 = np.uint64(0x9FB21C651E98DF25)
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
# The secret read as little-endian 64-bit words at every byte offset.
_S64 = np.array([int.from_bytes(_SECRET[i:i + 8], "little")
                 for i in range(len(_SECRET) - 7)], dtype=np.uint64)
# Densification probes per bin precomputed once per batch.
_PROBE_TABLE = 16
# Longer tokens take XXH3's long-input path; the caller hashes those (rare)
# with the xxhash package instead.
XXH3_MAX_LEN = 240


@numba.njit(cache=True, nogil=True)
def _fmix64(h):
  """``hashing.fmix64`` of one uint64."""
  h ^= h >> _S33
  h *= FMIX_M1
  h ^= h >> _S33
  h *= FMIX_M2
  return h ^ (h >> _S33)


@numba.njit(cache=True, nogil=True)
def _read64(buf, p):
  return (_U64(buf[p]) | (_U64(buf[p + 1]) << _U64(8))
          | (_U64(buf[p + 2]) << _U64(16)) | (_U64(buf[p + 3]) << _U64(24))
          | (_U64(buf[p + 4]) << _U64(32)) | (_U64(buf[p + 5]) << _U64(40))
          | (_U64(buf[p + 6]) << _U64(48)) | (_U64(buf[p + 7]) << _U64(56)))


@numba.njit(cache=True, nogil=True)
def _read32(buf, p):
  return (_U64(buf[p]) | (_U64(buf[p + 1]) << _U64(8))
          | (_U64(buf[p + 2]) << _U64(16)) | (_U64(buf[p + 3]) << _U64(24)))


@numba.njit(cache=True, nogil=True)
def _mul128_fold64(x, y):
  x_lo, x_hi = x & _MASK32, x >> _U64(32)
  y_lo, y_hi = y & _MASK32, y >> _U64(32)
  lo_lo = x_lo * y_lo
  hi_lo = x_hi * y_lo
  lo_hi = x_lo * y_hi
  cross = (lo_lo >> _U64(32)) + (hi_lo & _MASK32) + lo_hi
  upper = (hi_lo >> _U64(32)) + (cross >> _U64(32)) + x_hi * y_hi
  lower = (cross << _U64(32)) | (lo_lo & _MASK32)
  return lower ^ upper


@numba.njit(cache=True, nogil=True)
def _xxh3_avalanche(h):
  h ^= h >> _U64(37)
  h *= _PMX1
  return h ^ (h >> _U64(32))


@numba.njit(cache=True, nogil=True)
def _mix16(buf, p, key_lo, key_hi, seed):
  # The secret words arrive as values, not offsets: numba would compile one
  # specialisation per literal offset.
  return _mul128_fold64(_read64(buf, p) ^ (key_lo + seed),
                        _read64(buf, p + 8) ^ (key_hi - seed))


@numba.njit(cache=True, nogil=True)
def xxh3_64(buf, p, n, seed):
  """``xxh3_64_intdigest(bytes(buf[p:p+n]), seed)`` for ``n <= 240``."""
  ln = _U64(n)
  if n <= 16:
    if n > 8:
      lo = _read64(buf, p) ^ ((_S64[24] ^ _S64[32]) + seed)
      hi = _read64(buf, p + n - 8) ^ ((_S64[40] ^ _S64[48]) - seed)
      swapped = _U64(0)
      for k in range(8):
        swapped |= ((lo >> _U64(8 * k)) & _U64(0xFF)) << _U64(56 - 8 * k)
      return _xxh3_avalanche(ln + swapped + hi + _mul128_fold64(lo, hi))
    if n >= 4:
      s32 = seed & _MASK32
      swapped = (((s32 & _U64(0xFF)) << _U64(24))
                 | ((s32 & _U64(0xFF00)) << _U64(8))
                 | ((s32 >> _U64(8)) & _U64(0xFF00)) | (s32 >> _U64(24)))
      sd = seed ^ (swapped << _U64(32))
      keyed = ((_read32(buf, p + n - 4) + (_read32(buf, p) << _U64(32)))
               ^ ((_S64[8] ^ _S64[16]) - sd))
      keyed ^= (((keyed << _U64(49)) | (keyed >> _U64(15)))
                ^ ((keyed << _U64(24)) | (keyed >> _U64(40))))
      keyed *= _PMX2
      keyed ^= (keyed >> _U64(35)) + ln
      keyed *= _PMX2
      return keyed ^ (keyed >> _U64(28))
    if n > 0:
      combined = ((_U64(buf[p]) << _U64(16)) | (_U64(buf[p + (n >> 1)]) << _U64(24))
                  | _U64(buf[p + n - 1]) | (ln << _U64(8)))
      h = combined ^ (((_S64[0] ^ _S64[4]) & _MASK32) + seed)
    else:
      h = seed ^ (_S64[56] ^ _S64[64])
    h ^= h >> _U64(33)
    h *= _P64_2
    h ^= h >> _U64(29)
    h *= _P64_3
    return h ^ (h >> _U64(32))
  acc = ln * _P64_1
  if n <= 128:
    if n > 32:
      if n > 64:
        if n > 96:
          acc += _mix16(buf, p + 48, _S64[96], _S64[104], seed)
          acc += _mix16(buf, p + n - 64, _S64[112], _S64[120], seed)
        acc += _mix16(buf, p + 32, _S64[64], _S64[72], seed)
        acc += _mix16(buf, p + n - 48, _S64[80], _S64[88], seed)
      acc += _mix16(buf, p + 16, _S64[32], _S64[40], seed)
      acc += _mix16(buf, p + n - 32, _S64[48], _S64[56], seed)
    acc += _mix16(buf, p, _S64[0], _S64[8], seed)
    acc += _mix16(buf, p + n - 16, _S64[16], _S64[24], seed)
    return _xxh3_avalanche(acc)
  for i in range(8):
    acc += _mix16(buf, p + 16 * i, _S64[16 * i], _S64[16 * i + 8], seed)
  acc = _xxh3_avalanche(acc)
  acc += _mix16(buf, p + n - 16, _S64[119], _S64[127], seed)
  for i in range(8, n // 16):
    acc += _mix16(buf, p + 16 * i, _S64[16 * i - 125],
                  _S64[16 * i - 117], seed)
  return _xxh3_avalanche(acc)


@numba.njit(cache=True, nogil=True)
def _decode(data, p):
  """The code point starting at ``data[p]`` (valid UTF-8) and its length."""
  c = np.int64(data[p])
  if c < 0x80:
    return c, 1
  if c < 0xE0:
    return ((c & 0x1F) << 6) | (np.int64(data[p + 1]) & 0x3F), 2
  if c < 0xF0:
    return (((c & 0x0F) << 12) | ((np.int64(data[p + 1]) & 0x3F) << 6)
            | (np.int64(data[p + 2]) & 0x3F)), 3
  return (((c & 0x07) << 18) | ((np.int64(data[p + 1]) & 0x3F) << 12)
          | ((np.int64(data[p + 2]) & 0x3F) << 6)
          | (np.int64(data[p + 3]) & 0x3F)), 4


@numba.njit(cache=True, nogil=True)
def scan_codepoints(data, starts, ends, scan, check_stable, lower, props,
                    lowercase, unstable, unknown):
  """Checks the non-ASCII code points of the documents with ``scan[d]``.

  Code points (or their lowercase forms) without ``KNOWN`` in ``props`` go
  to ``unknown`` (with repeats); ``unstable[d]`` is set when ``check_stable[d]``
  and a code point lacks ``STABLE`` (NFKC could change the document).
  Returns the number of unknown entries; the tables are complete for these
  documents when it is 0.
  """
  n = 0
  for d in range(len(starts)):
    if not scan[d]:
      continue
    p = starts[d]
    while p < ends[d]:
      if data[p] < 0x80:
        p += 1
        continue
      c, size = _decode(data, p)
      p += size
      f = props[c]
      if not f & KNOWN:
        unknown[n] = c
        n += 1
        continue
      if check_stable[d] and not f & STABLE:
        unstable[d] = True
      if lowercase and not props[lower[c]] & KNOWN:
        unknown[n] = lower[c]
        n += 1
  return n


@numba.njit(cache=True, nogil=True)
def _encode(out, w, c):
  if c < 0x80:
    out[w] = c
    return w + 1
  if c < 0x800:
    out[w] = 0xC0 | (c >> 6)
    out[w + 1] = 0x80 | (c & 0x3F)
    return w + 2
  if c < 0x10000:
    out[w] = 0xE0 | (c >> 12)
    out[w + 1] = 0x80 | ((c >> 6) & 0x3F)
    out[w + 2] = 0x80 | (c & 0x3F)
    return w + 3
  out[w] = 0xF0 | (c >> 18)
  out[w + 1] = 0x80 | ((c >> 12) & 0x3F)
  out[w + 2] = 0x80 | ((c >> 6) & 0x3F)
  out[w + 3] = 0x80 | (c & 0x3F)
  return w + 4


@numba.njit(cache=True, nogil=True)
def _map_codepoint(c, lower, props, lowercase, strip_punctuation,
                   fold_digits):
  """``(normalised code point, is separator)``, as normalize_texts maps it."""
  if lowercase:
    c = lower[c]
  f = props[c]
  if fold_digits and f & DIGIT:
    c = 48
    f = props[48]
  if strip_punctuation:
    return c, not f & WORD
  return c, f & SPACE != 0


@numba.njit(cache=True, nogil=True)
def text_units(data, starts, ends, lower, props, word, lowercase,
               strip_punctuation, fold_digits, seed, norm, units,
               unit_offsets, long_tokens):
  """Normalises, splits and hashes the units of every document.

  Each code point is lowercased through ``lower``, digit-folded and
  classified exactly as ``reference_text.normalize_texts`` does, so a unit
  is a maximal run of non-separators.

  Args:
    data: uint8, the documents' UTF-8 bytes, already NFKC-normal, whose code
      points are all ``KNOWN`` in ``props`` (see :func:`scan_codepoints`).
    starts, ends: int64[n], document i is ``data[starts[i]:ends[i]]``.
    lower: the lowercase mapping table of the known code points.
    props: the code point property table (:func:`scan_codepoints`).
    word: True for word units, False for character units.
    lowercase, strip_punctuation, fold_digits: the normalisation steps.
    seed: uint64, keys the unit hashes.
    norm: uint8 output, receives the normalised word bytes.
    units: uint64 output, the unit hashes (xxh3 of a word, or fmix64 of a
      code point with one space between runs), document i's at
      ``units[unit_offsets[i]:unit_offsets[i+1]]``.
    unit_offsets: int64[n + 1] output, the documents' offsets into ``units``.
    long_tokens: int64 ``(m, 3)`` output: (unit index, start, end) in
      ``norm`` of each word longer than ``XXH3_MAX_LEN`` bytes, whose unit
      holds a placeholder until the caller hashes it.

  Returns:
    The number of long words written to ``long_tokens``.
  """
  space = _fmix64(_U64(32) + seed)
  # ASCII bytes map through a 128-entry table (0: separator; NUL always is).
  ascii_map = np.empty(128, dtype=np.int64)
  for c in range(128):
    mapped, separator = _map_codepoint(c, lower, props, lowercase,
                                       strip_punctuation, fold_digits)
    ascii_map[c] = 0 if separator else mapped
  n_long = 0
  u = 0
  w = 0
  unit_offsets[0] = 0
  for d in range(len(starts)):
    p, end = starts[d], ends[d]
    in_token = False
    any_token = False
    token_start = w
    while True:
      if p >= end:
        separator = True
      elif data[p] < 0x80:
        c = ascii_map[data[p]]
        p += 1
        separator = c == 0
      else:
        c, size = _decode(data, p)
        p += size
        c, separator = _map_codepoint(c, lower, props, lowercase,
                                      strip_punctuation, fold_digits)
      if separator:
        if in_token and word:
          n = w - token_start
          if n <= XXH3_MAX_LEN:
            units[u] = xxh3_64(norm, token_start, n, seed)
          else:
            units[u] = 0
            long_tokens[n_long, 0] = u
            long_tokens[n_long, 1] = token_start
            long_tokens[n_long, 2] = w
            n_long += 1
          u += 1
        in_token = False
        if p >= end:
          break
        continue
      if not in_token:
        if any_token and not word:
          units[u] = space
          u += 1
        in_token = True
        any_token = True
        token_start = w
      if word:
        w = _encode(norm, w, c)
      else:
        units[u] = _fmix64(_U64(c) + seed)
        u += 1
    unit_offsets[d + 1] = u
  return n_long


@numba.njit(cache=True, nogil=True)
def _probe(probe_key, i, attempt, k):
  """p(i, attempt): the bin that empty bin i tries at that attempt."""
  h = _fmix64(probe_key ^ ((_U64(i) << _U64(32)) | _U64(attempt)))
  return np.int64(((h >> _U64(32)) * k) >> _U64(32))


@numba.njit(cache=True, nogil=True)
def sketch_rows(units, offsets, ngram, seed, oph, a, b, oph_key, probe_key,
                out):
  """Signature rows of the documents ``units[offsets[i]:offsets[i+1]]``.

  With ``ngram >= 1`` the units are first folded into n-gram shingles (the
  ``reference_text.py`` scheme; fewer than n units give one shingle over all of them);
  with ``ngram == 0`` they already are shingles. ``oph`` false: classic
  MinHash with the permutations ``(a, b)`` (the ``minhash.py`` scheme); true:
  one-permutation hashing into ``out.shape[1]`` bins keyed by ``oph_key``,
  empty bins densified with probes keyed by ``probe_key``. A document with no
  units gets an all-``0xFFFFFFFF`` row.
  """
  n_docs, k = out.shape
  longest = 1
  for d in range(n_docs):
    longest = max(longest, offsets[d + 1] - offsets[d])
  shingles = np.empty(longest, dtype=np.uint64)
  row = np.empty(k, dtype=np.uint64)
  # Classic MinHash keeps its minima as uint32 (every value fits): 8 lanes
  # of AVX2's unsigned min instead of 4 emulated 64-bit ones, 2.3x faster.
  minima = np.empty(k, dtype=np.uint32)
  kk = _U64(k)
  # The first probes of every bin, shared by all documents of the batch.
  probes = np.empty((k if oph else 0, _PROBE_TABLE), dtype=np.int64)
  for i in range(probes.shape[0]):
    for t in range(_PROBE_TABLE):
      probes[i, t] = _probe(probe_key, i, t + 1, kk)
  for d in range(n_docs):
    start, end = offsets[d], offsets[d + 1]
    n = end - start
    if n == 0:
      out[d, :] = 0xFFFFFFFF
      continue
    if ngram == 0:
      m = n
      for j in range(n):
        shingles[j] = units[start + j]
    else:
      length = min(ngram, n)
      m = n - length + 1
      init = (_U64(length) * GOLDEN) ^ seed
      for j in range(m):
        h = init
        for t in range(length):
          h = (h ^ units[start + j + t]) * GOLDEN
        shingles[j] = _fmix64(h)
    if not oph:
      minima[:] = np.uint32(0xFFFFFFFF)
      for j in range(m):
        x = shingles[j] & _MASK32
        for i in range(k):
          value = np.uint32((a[i] * x + b[i]) >> _U64(32))
          minima[i] = min(minima[i], value)
      out[d, :] = minima
      continue
    row[:] = _EMPTY
    for j in range(m):
      h = _fmix64(shingles[j] ^ oph_key)
      slot = ((h >> _U64(32)) * kk) >> _U64(32)
      row[slot] = min(row[slot], h & _MASK32)
    # Optimal densification (Shrivastava 2017): an empty bin i copies the
    # first non-empty bin on its own probe sequence p(i, 1), p(i, 2), ...;
    # the sequence is the same for every document, so two documents fill the
    # bin from the same source bin whenever both have it non-empty.
    for i in range(k):
      if row[i] != _EMPTY:
        out[d, i] = row[i]
        continue
      attempt = 1
      while True:
        source = (probes[i, attempt - 1] if attempt <= _PROBE_TABLE else
                  _probe(probe_key, i, attempt, kk))
        if row[source] != _EMPTY:
          out[d, i] = row[source]
          break
        attempt += 1


@numba.njit(cache=True, nogil=True)
def band_entries(sig, ids, rows, band_starts, num_shards):
  """``(keys, ids, bounds)`` of ``lsh.band_entries``: every (document,
  band) entry's key and its document's id, counting-sorted by shard (shard
  s is ``[bounds[s], bounds[s + 1])``)."""
  n = sig.shape[0]
  bands = len(band_starts)
  keys = np.empty(n * bands, dtype=np.uint64)
  shards = np.empty(n * bands, dtype=np.int64)
  bounds = np.zeros(num_shards + 1, dtype=np.int64)
  for doc in range(n):
    for band in range(bands):
      h = band_starts[band]
      for j in range(rows):
        h = _fmix64((h ^ np.uint64(sig[doc, band * rows + j])) * GOLDEN)
      entry = doc * bands + band
      keys[entry] = h
      shard = np.int64((h >> np.uint64(32)) % np.uint64(num_shards))
      shards[entry] = shard
      bounds[shard + 1] += 1
  bounds = np.cumsum(bounds)
  # A counting sort by shard: stable, so entries keep their order.
  at = bounds[:-1].copy()
  out_keys = np.empty_like(keys)
  out_ids = np.empty(n * bands, dtype=np.int64)
  for entry in range(n * bands):
    shard = shards[entry]
    out_keys[at[shard]] = keys[entry]
    out_ids[at[shard]] = ids[entry // bands]
    at[shard] += 1
  return out_keys, out_ids, bounds


@numba.njit(cache=True, nogil=True)
def occurs_in(values, members):
  """Mask of ``values[i] in members`` (distinct), by an open-addressing
  table of ``members``: one probe sequence per value, no sort."""
  bits = 1
  while (1 << bits) < 2 * len(members):
    bits += 1
  slots = np.uint64((1 << bits) - 1)
  shift = np.uint64(64 - bits)
  table = np.zeros(1 << bits, dtype=np.uint64)
  used = np.zeros(1 << bits, dtype=np.bool_)
  for member in members:
    slot = (member * GOLDEN) >> shift
    while used[slot]:
      slot = (slot + np.uint64(1)) & slots
    used[slot] = True
    table[slot] = member
  found = np.zeros(len(values), dtype=np.bool_)
  for i in range(len(values)):
    slot = (values[i] * GOLDEN) >> shift
    while used[slot]:
      if table[slot] == values[i]:
        found[i] = True
        break
      slot = (slot + np.uint64(1)) & slots
  return found


@numba.njit(cache=True, nogil=True)
def sorted_sets(values, offsets):
  """``jaccard.sorted_sets``: each document's distinct values, sorted."""
  out = values.copy()
  set_offsets = np.zeros(len(offsets), dtype=np.int64)
  n = 0
  for doc in range(len(offsets) - 1):
    lo, hi = offsets[doc], offsets[doc + 1]
    out[lo:hi].sort()
    # Compacting in place: n <= lo, so no unread element is overwritten.
    for j in range(lo, hi):
      if j == lo or out[j] != out[j - 1]:
        out[n] = out[j]
        n += 1
    set_offsets[doc + 1] = n
  return out[:n].copy(), set_offsets


@numba.njit(cache=True, nogil=True)
def are_sets(values, offsets):
  """Whether every document's values are sorted and distinct."""
  for doc in range(len(offsets) - 1):
    for j in range(offsets[doc] + 1, offsets[doc + 1]):
      if values[j] <= values[j - 1]:
        return False
  return True


@numba.njit(cache=True, nogil=True)
def merge_intersections(values, offsets, left, right, out):
  """``out[i] = |S_left[i] ∩ S_right[i]|``, by one merge of the two sets."""
  for i in range(len(left)):
    out[i] = merged_count(values, offsets[left[i]], offsets[left[i] + 1],
                          offsets[right[i]], offsets[right[i] + 1])


def _with_compiled(fn, **helpers):
  """``fn`` compiled, the plain functions it calls by the names in
  ``helpers`` replaced by their compiled forms: so the union-find and the
  large-bucket search run the same source on both paths."""
  names = dict(fn.__globals__, **helpers)
  return numba.njit(cache=True, nogil=True)(types.FunctionType(
      fn.__code__, names, fn.__name__, fn.__defaults__))


root = numba.njit(cache=True, nogil=True)(union_find.root)
merged_count = numba.njit(cache=True, nogil=True)(jaccard.merged_count)
unite = _with_compiled(union_find.unite, root=root)
forest_loop = _with_compiled(bucket_components.forest_loop, root=root,
                             merged_count=merged_count)
