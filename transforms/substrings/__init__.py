"""Exact-substring deduplication (issue 27): :class:`StrikeSubstrings` finds
the spans a suffix array of the corpus would strike, sharded like the
near-dup graph; its kernels are in :mod:`transforms.kernels.substrings`."""

from transforms.substrings.dedup import StrikeSubstrings, strike_text
from transforms.substrings.elements import DocBlock, SpanBatch

__all__ = ["StrikeSubstrings", "strike_text", "DocBlock", "SpanBatch"]
