"""Streaming and batch agree: the same signature and band keys per
document, and on an in-order stream with retention longer than the stream,
``event_time`` verdicts equal batch ``--verify signature --keep first``'s
removed set when clusters are cliques."""

import json
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from pipeline.cli import main
from tests.corpus import read_jsonl, seed_corpus, write_jsonl
from tests.stream_harness import make_test_stream, run_stream
from transforms import ComputeSignatures
from transforms.config import DedupConfig, StreamConfig
from transforms.kernels import lsh as lsh_kernels
from transforms.stream.dedup import DeduplicateStream, Sign

pytestmark = pytest.mark.extended

FULL = os.environ.get("NEARDUP_FULL") == "1"
SEED_ARGS = ["--ngram", "3", "--num_perm", "128", "--bands", "32", "--rows",
             "4", "--threshold", "0.4", "--verify", "signature", "--keep",
             "first"]
SEED_CONFIG = DedupConfig(ngram=3, num_perm=128, bands=32, rows=4,
                          threshold=0.4, verify="signature", keep="first")
DIRECT = ["--runner", "BundleBasedDirectRunner"]


class _Dump(beam.DoFn):

  def __init__(self, path):
    self._path = path

  def process(self, row):
    with open(self._path, "a", encoding="utf-8") as f:
      f.write(json.dumps(row) + "\n")


def read_rows(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_stream_signs_exactly_as_batch(tmp_path):
  texts, _ = seed_corpus(n_base=40, seed=5)
  texts += ["", "Ünïcode — tëxt, with PUNCTUATION!! 12 34 " * 3]
  config = DedupConfig(ngram=3, num_perm=64, bands=8, rows=8, min_tokens=2)
  batch_path, stream_path = tmp_path / "batch", tmp_path / "stream"
  with TestPipeline(runner="FnApiRunner") as p:
    signed = (p | beam.Create(list(enumerate(texts)))
              | ComputeSignatures(config))
    _ = (signed["signatures"]
         | beam.FlatMap(lambda b: [
             [int(i), s.tolist(), lsh_kernels.band_keys(
                 s[None], config.bands, config.rows, config.seed)[0].tolist()]
             for i, s in zip(*b)])
         | beam.ParDo(_Dump(str(batch_path))))
  events = [("add", [(str(i), t, 1000 + i) for i, t in enumerate(texts)])]
  p = beam.Pipeline(options=beam.options.pipeline_options.PipelineOptions(
      DIRECT + ["--streaming"]))
  _ = (p | make_test_stream(events) | Sign(StreamConfig(config))
       | beam.Map(lambda s: [int(s.member.doc_id), s.member.signature.tolist(),
                             s.band_keys.tolist(), s.status,
                             s.member.event_ms])
       | beam.ParDo(_Dump(str(stream_path))))
  p.run().wait_until_finish()
  batch = {row[0]: row[1:] for row in read_rows(batch_path)}
  stream = {row[0]: row[1:] for row in read_rows(stream_path)}
  assert len(stream) == len(texts)
  signed = {i for i, row in stream.items() if row[2] == "signed"}
  # The empty text has no signature in either mode.
  assert signed == set(batch) and len(texts) - 2 not in signed
  for doc_id in signed:
    assert stream[doc_id][:2] == batch[doc_id], doc_id
    assert stream[doc_id][3] == 1000 + doc_id  # its own event time


@pytest.mark.slow
@pytest.mark.e2e
def test_event_time_verdicts_equal_batch_removed_set_on_cliques(tmp_path):
  """Quick form: 60 base documents (~80 with copies); full: 150."""
  texts, truth = seed_corpus(n_base=150 if FULL else 60, seed=11)
  path = tmp_path / "corpus.jsonl"
  write_jsonl(path, texts, ids=list(range(len(texts))))
  out = str(tmp_path / "batch")
  assert main(["--input", str(path), "--output", out, *SEED_ARGS]) == 0
  clusters = {}
  removed = set()
  for row in read_jsonl(os.path.join(out, "clusters", "*.jsonl")):
    clusters.setdefault(row["cluster_id"], []).append(row["id"])
    if not row["kept"]:
      removed.add(row["id"])
  # The precondition: every cluster is a planted pair (a clique).
  assert clusters and all(len(m) == 2 for m in clusters.values())
  assert len(removed) >= 0.9 * len(truth)
  events = []
  for start in range(0, len(texts), 50):
    events.append(("add", [(f"{i:06d}", texts[i], 1000 * (i + 1))
                           for i in range(start,
                                          min(start + 50, len(texts)))]))
    events.append(("wm", 1000 * (start + 50)))
  config = StreamConfig(SEED_CONFIG, settle_ms=2000,
                        dedup_window_ms=10**9, allowed_lateness_ms=10**6)
  result = run_stream(DeduplicateStream(config), events, DIRECT,
                      str(tmp_path))
  assert not result["late"]
  assert len(result["verdicts"]) == len(texts)
  duplicates = {int(v["id"]) for v in result["verdicts"]
                if v["verdict"] == "duplicate"}
  assert duplicates == removed
  # Each duplicate names the document batch kept in its cluster.
  kept_of = {m: min(ms) for ms in clusters.values() for m in ms}
  for v in result["verdicts"]:
    if v["verdict"] == "duplicate":
      assert int(v["of"]) == kept_of[int(v["id"])]
  assert np.all([v["similarity"] >= 0.4 for v in result["verdicts"]
                 if v["verdict"] == "duplicate"])
