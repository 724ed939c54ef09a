"""Raw text to MinHash signatures for a batch: the whole per-document stage
(normalise, shingle, hash, MinHash) as one kernel call."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from transforms.kernels import minhash
from transforms.kernels import text


def signature_batch(texts: Sequence[Optional[str]], *, unit: str, ngram: int,
                    seed: int, a: np.ndarray, b: np.ndarray, nfkc: bool = True,
                    lowercase: bool = True, strip_punctuation: bool = True,
                    fold_digits: bool = False
                    ) -> Tuple[np.ndarray, np.ndarray]:
  """Signatures of a batch of raw texts.

  Returns ``(signatures, unit_counts)``: uint32 ``(n_docs, K)`` and the
  number of units (words or characters) of each normalised document. A
  document with no units has no shingles; its row is all ``0xFFFFFFFF`` and
  must not be used.
  """
  shingles, offsets, unit_counts = text.shingle_batch(
      texts, unit=unit, ngram=ngram, seed=seed, nfkc=nfkc,
      lowercase=lowercase, strip_punctuation=strip_punctuation,
      fold_digits=fold_digits)
  sigs = np.full((len(unit_counts), len(a)), 0xFFFFFFFF, dtype=np.uint32)
  signed = np.flatnonzero(unit_counts > 0)
  if len(signed):
    starts, ends = offsets[signed], offsets[signed + 1]
    sub_offsets = np.zeros(len(signed) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=sub_offsets[1:])
    flat = (shingles if len(signed) == len(unit_counts) else
            np.concatenate([shingles[s:e] for s, e in zip(starts, ends)]))
    sigs[signed] = minhash.minhash_batch(flat, sub_offsets, a, b)
  return sigs, unit_counts
