"""Stable, platform-independent 64-bit mixing in numpy (``compiled`` has its
scalar form).

All arithmetic is on uint64 arrays and is defined modulo 2**64, so wrap-around
is the intended operation, not an overflow.
"""

import numpy as np

FMIX_M1 = np.uint64(0xFF51AFD7ED558CCD)
FMIX_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def fmix64(h: np.ndarray) -> np.ndarray:
  """MurmurHash3's 64-bit finaliser: a bijection with full avalanche."""
  h = np.asarray(h, dtype=np.uint64)
  h = h ^ (h >> _S33)
  h = h * FMIX_M1
  h = h ^ (h >> _S33)
  h = h * FMIX_M2
  return h ^ (h >> _S33)


def seeded_uint64(seed: int, size: int, stream: int) -> np.ndarray:
  """``size`` uniform uint64 values that depend only on (seed, stream)."""
  rng = np.random.Generator(np.random.PCG64([seed, stream]))
  return rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False)
