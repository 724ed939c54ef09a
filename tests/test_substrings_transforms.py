"""StrikeSubstrings on TestPipeline equals the suffix-array oracle."""

import numpy as np
import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from hypothesis import given, settings, strategies as st

from transforms.elements import TextBatch
from transforms.kernels import substrings as sk
from transforms.read import make_doc_id
from transforms.substrings import StrikeSubstrings, strike_text
from transforms.substrings.dedup import _layout
from transforms.substrings.elements import (BLOCK_BITS, AnchorBatch,
                                            AnchorBatchCoder, BlockLayout,
                                            BlockLayoutCoder, DocBlock,
                                            payload_bytes)
from tests.test_substrings_kernels import licence_texts, oracle


def run_strike(texts, threshold, strike, check, batch=7, removed=None,
               shards=5, piece=None):
  """Runs the transform on ``texts`` split into files of ``batch`` rows,
  each file's rows in text batches of ``piece`` rows (a block in several
  batches, as a reader may cut it); ``check(marks, spans)`` asserts on the
  struck marks per document and the spans (inside the pipeline, as
  assert_that does)."""
  ids = [make_doc_id(i // batch, i % batch) for i in range(len(texts))]
  piece = piece or batch
  batches = [TextBatch(np.array(ids[i:j]), texts[i:j])
             for f in range(0, len(texts), batch)
             for i, j in ((p, min(p + piece, f + batch, len(texts)))
                          for p in range(f, min(f + batch, len(texts)),
                                         piece))]
  lengths = [len(t.encode("utf-8")) for t in texts]

  def matcher(got):
    marks = {d: np.zeros(n, bool) for d, n in zip(ids, lengths)}
    for _, spans in got:
      for d, s, e in zip(spans.doc_ids, spans.starts, spans.ends):
        marks[int(d)][s:e] = True
    check([marks[d] for d in ids], [spans for _, spans in got])

  with TestPipeline(runner="FnApiRunner") as p:
    pcoll = p | "Batches" >> beam.Create(batches)
    gone = p | "Removed" >> beam.Create(removed or [])
    out = pcoll | StrikeSubstrings(threshold, strike, shards=shards,
                                   removed=gone if removed else None)
    assert_that(out["spans"], matcher)


def narrowed(text: str, mark: np.ndarray) -> np.ndarray:
  """The oracle's marks, narrowed to whole code points."""
  out = mark.copy()
  at = 0
  for ch in text:
    n = len(ch.encode("utf-8"))
    out[at:at + n] = mark[at:at + n].all()
    at += n
  return out


@pytest.mark.parametrize("piece", [None, 3])
def test_matches_oracle_both_modes_unicode(piece):
  shared = "Ünïcödé boilerplate — repeated ✓ across documents. " * 2
  texts = (["intro " + shared + " end", "other " + shared, shared,
            "abcabcabcabcabcabcabcabcabcabc", "", "zz", "unique text here"]
           + [t.decode("utf-8") for t in licence_texts(12)])
  for strike in ("later", "all"):
    want = [narrowed(t, w) for t, w in zip(texts, oracle(
        [t.encode("utf-8") for t in texts], 20, strike))]
    assert sum(w.sum() for w in want) > 1000

    def check(got, _, want=want):
      for g, w in zip(got, want):
        assert np.array_equal(g, w)
    run_strike(texts, 20, strike, check, piece=piece)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=12),
       st.integers(1, 5))
def test_block_layouts_of_pieces(texts, piece):
  """The layouts of a block's pieces, joined, give its ids, starts and
  continuation bytes (the narrowing's only input), also after the coder."""
  data = [t.encode("utf-8") for t in texts]
  ids = np.arange(len(data), dtype=np.int64) * 3 + 1
  coder = BlockLayoutCoder()
  pieces = []
  for at in range(0, len(data), piece):
    joined, starts = sk.concatenate(data[at:at + piece])
    block = DocBlock(ids[at:at + piece], starts, joined)
    layout = BlockLayout.of(block)
    assert (len(layout.continuation) == 0) == (block.data.max(initial=0)
                                                < 0x80)
    pieces.append(coder.decode(coder.encode(layout)))
  got_ids, got_starts, got_cont = _layout(pieces[::-1])
  whole, starts = sk.concatenate(data)
  assert np.array_equal(got_ids, ids)
  assert np.array_equal(got_starts, starts)
  assert np.array_equal(got_cont, sk.continuation_bytes(whole))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, (1 << 50) - 1),
       st.lists(st.tuples(st.integers(0, (1 << BLOCK_BITS) - 1),
                          st.integers(0, sk.MAX_DOC_BYTES),
                          st.integers(0, (1 << 64) - 1)), max_size=20))
def test_anchor_batches_keep_ids_and_offsets(block, anchors):
  """Compact anchors (16-bit members, 32-bit offsets) give back the ids and
  offsets they were made of, also after the coder."""
  members, offsets, hashes = (np.array([a[i] for a in anchors], dtype)
                              for i, dtype in enumerate(
                                  (np.int64, np.int64, np.uint64)))
  ids = (block << BLOCK_BITS) | members
  coder = AnchorBatchCoder()
  batch = coder.decode(coder.encode(AnchorBatch.of(block, hashes, ids,
                                                   offsets)))
  assert payload_bytes(batch) == 8 + 14 * len(anchors)
  assert np.array_equal(batch.doc_ids(), ids)
  assert np.array_equal(batch.offsets, offsets)
  assert np.array_equal(batch.hashes, hashes)


def test_removed_documents_do_not_count():
  texts = ["the same long sentence of boilerplate here."] * 3 + ["x"]

  def check(got, spans):
    # Without the removed first copy, the second is the first occurrence.
    assert not got[0].any() and not got[1].any() and got[2].all()
    assert [s.first_doc_ids.tolist() for s in spans] == [[make_doc_id(0, 1)]]
  run_strike(texts, 10, "later", check, batch=2, removed=[make_doc_id(0, 0)])


def test_strike_text():
  text = "aé€b"
  assert strike_text(text, [1], [6]) == "ab"
  assert strike_text(text, [], []) == text
