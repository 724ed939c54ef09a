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
from tests.corpus import (chain_corpus, read_jsonl, real_text_corpus,
                          seed_corpus, stats_of, write_jsonl)
from transforms.config import DedupConfig
from transforms.kernels import graph
from transforms.kernels import jaccard as jaccard_kernels

MIN_DOCS, MIN_DUPLICATES = 300, 50


def _truth(ids, texts, config):
  a, b, similarity = truth.exact_pairs(texts, config)
  pairs = [(ids[i], ids[j]) for i, j in zip(a.tolist(), b.tolist())]
  labels = graph.union_find_labels(pairs)
  return evaluate.Truth({k: str(v) for k, v in labels.items()}, pairs,
                        similarity)


def _run(tmp_path, ids, texts, *flags):
  os.makedirs(tmp_path, exist_ok=True)
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


def _pieces(out):
  """The run's clusters as a set of frozensets of user ids."""
  members = {}
  for key, cluster in evaluate.read_clusters(out).items():
    members.setdefault(cluster, set()).add(key)
  return {frozenset(m) for m in members.values()}


@pytest.mark.slow
def test_chain_verified_exactly_gives_the_pieces_of_no_verification(tmp_path):
  """A sliding-window chain (consecutive Jaccard 0.959): exact verification
  loses no pair of a bucket, so it cuts the chain exactly where the
  unverified candidates do (the old star edges cut it into dozens)."""
  n = 2000 if os.environ.get("NEARDUP_FULL") == "1" else 400
  texts = chain_corpus(n)
  ids = [f"doc-{i}" for i in range(n)]
  flags = ["--ngram", "3", "--threshold", "0.9"]
  exact, stats = _run(tmp_path / "exact", ids, texts, *flags)
  none, _ = _run(tmp_path / "none", ids, texts, *flags, "--verify", "none")
  assert stats["verify_removed_edges"] > 0 and stats["buckets_large"] == 0
  assert _pieces(exact) == _pieces(none)
  assert stats["clustered_docs"] == n


def test_explanations_and_chain_guard_on_a_chain(tmp_path):
  texts = chain_corpus(120)
  ids = [f"doc-{i}" for i in range(len(texts))]
  flags = ["--ngram", "3", "--threshold", "0.9"]
  out, stats = _run(tmp_path / "plain", ids, texts, *flags)
  rows = {r["id"]: r for r in read_jsonl(os.path.join(out, "clusters",
                                                      "*.jsonl"))}
  config = DedupConfig(ngram=3, threshold=0.9)
  by_doc = {r["doc_id"]: r for r in rows.values()}
  for row in rows.values():
    if row["doc_id"] == row["kept_doc_id"]:
      assert row["kept"] and row["matched_doc_id"] is None
      continue
    assert not row["kept"]
    matched = by_doc[row["matched_doc_id"]]
    kept = by_doc[row["kept_doc_id"]]
    assert row["matched_id"] == matched["id"]
    assert matched["cluster_id"] == kept["cluster_id"] == row["cluster_id"]
    # The edge passed exact verification; both figures are exact Jaccards.
    assert row["matched_jaccard"] >= 0.9
    for other, field in ((matched, "matched_jaccard"),
                         (kept, "jaccard_to_kept")):
      values, offsets = truth.shingle_sets(
          [texts[ids.index(row["id"])], texts[ids.index(other["id"])]],
          config)
      inter, union = jaccard_kernels.jaccard(values[:offsets[1]],
                                             values[offsets[1]:])
      assert row[field] == round(inter / union, 6), field
  chains = [r for r in rows.values() if r["jaccard_to_kept"] is not None
            and r["jaccard_to_kept"] < 0.9]
  assert len(chains) == stats["chain_docs"] > 0
  assert stats["chain_kept"] == 0

  guarded, gstats = _run(tmp_path / "guarded", ids, texts, *flags,
                         "--chain_guard", "true")
  grows = {r["id"]: r for r in read_jsonl(os.path.join(guarded, "clusters",
                                                       "*.jsonl"))}
  # The same clusters and explanations; only documents below the threshold
  # to their kept one are kept, and written to deduped/.
  assert {k: r["cluster_id"] for k, r in grows.items()} == {
      k: r["cluster_id"] for k, r in rows.items()}
  for key, row in grows.items():
    removed = not row["kept"]
    assert removed == (row["jaccard_to_kept"] is not None
                       and row["jaccard_to_kept"] >= 0.9)
    assert row["chain_kept"] == (rows[key]["jaccard_to_kept"] is not None
                                 and not removed)
  deduped = {r["id"] for r in read_jsonl(os.path.join(guarded, "deduped",
                                                      "*.jsonl"))}
  assert {k for k, r in grows.items() if r["chain_kept"]} <= deduped
  assert gstats["chain_kept"] == stats["chain_docs"]
  assert gstats["removed"] == stats["removed"] - stats["chain_docs"]
  assert gstats["balanced"]
