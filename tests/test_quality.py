"""Quality at a threshold, end to end through the CLI, against exact truth.

* Real text: license and copyright prose found on this machine (see
  tests/corpus.py real_text_corpus); with only ``--threshold 0.8`` (word
  5-grams, K=128), documents must be clustered only through pairs that really
  are that similar: document-level F1 >= 0.97 against pipeline.truth's exact
  kernel.
* Seed-style corpus at ``--threshold 0.5``: the measured pair recall is within
  0.03 of what the S-curve (and the verify mode) predicts for the truth
  pairs' similarities.
"""

import os

import pytest

from pipeline import evaluate, truth
from pipeline.cli import main
from tests.corpus import real_text_corpus, seed_corpus, stats_of, write_jsonl
from transforms.config import DedupConfig
from transforms.kernels import graph

pytestmark = pytest.mark.e2e

MIN_DOCS, MIN_DUPLICATES = 300, 50


def _truth(ids, texts, config):
  a, b, similarity = truth.exact_pairs(texts, config)
  pairs = [(ids[i], ids[j]) for i, j in zip(a.tolist(), b.tolist())]
  labels = graph.union_find_labels(pairs)
  return evaluate.Truth({k: str(v) for k, v in labels.items()}, pairs,
                        similarity)


def _run(tmp_path, ids, texts, *flags):
  path = tmp_path / "corpus.jsonl"
  write_jsonl(path, texts, ids)
  out = str(tmp_path / "out")
  assert main(["--input", str(path), "--output", out, *flags]) == 0
  return out, stats_of(out)


def test_real_text_document_f1_at_threshold_alone(tmp_path):
  ids, texts = real_text_corpus()
  expected = _truth(ids, texts, DedupConfig(threshold=0.8))
  if len(texts) < MIN_DOCS or len(expected.clusters) < MIN_DUPLICATES:
    pytest.skip(f"only {len(texts)} documents with {len(expected.clusters)}"
                " near-duplicates from the license/copyright files on this"
                f" machine; need {MIN_DOCS} and {MIN_DUPLICATES}")
  out, stats = _run(tmp_path, ids, texts, "--threshold", "0.8")
  assert stats["params"]["verify"] == "exact"
  assert stats["params"]["lsh_threshold"] < 0.8  # over-generated candidates
  assert stats["verify_removed_edges"] == (stats["candidate_edges"]
                                           - stats["verified_edges"]) > 0
  report = evaluate.evaluate(evaluate.read_clusters(out), expected,
                             len(texts), stats["params"])
  docs = report["documents"]
  assert docs["f1"] >= 0.97, evaluate.format_report(report)
  # Exact verification never clusters a document without a true partner.
  assert docs["precision"] == 1.0


@pytest.mark.parametrize("verify", ["exact", "signature"])
def test_seed_recall_matches_s_curve_prediction(tmp_path, verify):
  texts, _ = seed_corpus(n_base=4000)
  ids = [f"doc-{i}" for i in range(len(texts))]
  config = DedupConfig(ngram=3, threshold=0.5, num_perm=128, verify=verify)
  expected = _truth(ids, texts, config)
  assert len(expected.pairs) > 1000
  out, stats = _run(tmp_path, ids, texts, "--ngram", "3", "--threshold",
                    "0.5", "--num_perm", "128", "--verify", verify)
  params = stats["params"]
  assert (params["bands"], params["rows"]) == (config.bands, config.rows)
  assert params["verify"] == verify
  report = evaluate.evaluate(evaluate.read_clusters(out), expected,
                             len(texts), params)
  assert abs(report["recall_measured"] - report["recall_predicted"]) <= 0.03, (
      evaluate.format_report(report))
  if verify == "exact":
    assert report["pairs"]["precision"] == 1.0
  assert os.path.isdir(os.path.join(out, "clusters"))
