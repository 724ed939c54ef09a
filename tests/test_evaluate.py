"""pipeline.tools.evaluate and pipeline.tools.truth against independent brute force, and
pipeline.tools.params' output."""

import itertools
import json
import math
import os

import numpy as np
import pytest

from pipeline.tools import evaluate, params, truth
from transforms.config import DedupConfig


def _write(path, text):
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _clusters_dir(tmp_path, predicted, num_docs, run_params):
  """A run's output folder: clusters/ rows and stats.json."""
  out = tmp_path / "run"
  os.makedirs(out / "clusters")
  sizes = {}
  for label in predicted.values():
    sizes[label] = sizes.get(label, 0) + 1
  rows = [json.dumps({"doc_id": i, "id": key, "cluster_id": label,
                      "cluster_size": sizes[label], "kept": False,
                      "source": "/data/c.jsonl", "position": i + 1})
          for i, (key, label) in enumerate(sorted(predicted.items()))]
  _write(out / "clusters" / "part-00000-00000.jsonl",
         "".join(r + "\n" for r in rows))
  _write(out / "stats.json", json.dumps(
      {"docs_in": num_docs + 2, "rejected": 2, "params": run_params}))
  return str(out)


def _ari_from_labels(x, y):
  """Textbook ARI from the full contingency table of two labelings."""
  n = len(x)
  table = {}
  for a, b in zip(x, y):
    table[(a, b)] = table.get((a, b), 0) + 1
  rows, cols = {}, {}
  for (a, b), v in table.items():
    rows[a] = rows.get(a, 0) + v
    cols[b] = cols.get(b, 0) + v
  index = sum(math.comb(v, 2) for v in table.values())
  sa = sum(math.comb(v, 2) for v in rows.values())
  sb = sum(math.comb(v, 2) for v in cols.values())
  expected = sa * sb / math.comb(n, 2)
  return (index - expected) / ((sa + sb) / 2 - expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_figures_match_brute_force(tmp_path, capsys, seed):
  rng = np.random.default_rng(seed)
  n = 60
  keys = [f"d{i}" for i in range(n)]
  true_label = rng.integers(0, 25, size=n)
  pred_label = np.where(rng.random(n) < 0.7, true_label,
                        rng.integers(0, 25, size=n))
  # Truth as pairs: every pair within a true group, with a similarity.
  pairs = [(keys[i], keys[j]) for i, j in itertools.combinations(range(n), 2)
           if true_label[i] == true_label[j]]
  sims = rng.uniform(0.8, 1.0, size=len(pairs))
  _write(tmp_path / "pairs.tsv", "id_a\tid_b\tjaccard\n" + "".join(
      f"{a}\t{b}\t{s:.6f}\n" for (a, b), s in zip(pairs, sims)))
  _write(tmp_path / "clusters.tsv", "id\tcluster\n" + "".join(
      f"{keys[i]}\tg{true_label[i]}\n" for i in range(n)
      if (true_label == true_label[i]).sum() > 1))
  groups = {}
  for i in range(n):
    groups.setdefault(pred_label[i], []).append(i)
  predicted = {keys[i]: min(g) for g in groups.values() if len(g) > 1
               for i in g}
  run_params = dataclass_params(DedupConfig(threshold=0.8, verify="signature"))
  out = _clusters_dir(tmp_path, predicted, n, run_params)

  # Brute force over all pairs of the n documents.
  same_true = {(i, j) for i, j in itertools.combinations(range(n), 2)
               if true_label[i] == true_label[j]}
  same_pred = {(i, j) for i, j in itertools.combinations(range(n), 2)
               if pred_label[i] == pred_label[j]}
  tp = len(same_true & same_pred)
  dup_true = {i for p in same_true for i in p}
  dup_pred = {i for p in same_pred for i in p}
  ari = _ari_from_labels(true_label.tolist(), pred_label.tolist())

  for name in ("pairs.tsv", "clusters.tsv"):
    report = evaluate.evaluate(evaluate.read_clusters(out),
                               evaluate.read_truth(str(tmp_path / name)),
                               n, run_params)
    assert report["pairs"]["precision"] == pytest.approx(tp / len(same_pred))
    assert report["pairs"]["recall"] == pytest.approx(tp / len(same_true))
    docs = report["documents"]
    assert docs["precision"] == pytest.approx(
        len(dup_true & dup_pred) / len(dup_pred))
    assert docs["recall"] == pytest.approx(
        len(dup_true & dup_pred) / len(dup_true))
    assert report["ari"] == pytest.approx(ari)
  # The predicted recall is the mean edge probability of the truth pairs.
  assert report.get("recall_predicted") is None
  report = evaluate.evaluate(evaluate.read_clusters(out),
                             evaluate.read_truth(str(tmp_path / "pairs.tsv")),
                             n, run_params)
  config = DedupConfig(threshold=0.8, verify="signature")
  assert report["recall_predicted"] == pytest.approx(
      float(np.mean(params.edge_probability(sims, config))))

  # --json prints exactly these figures, with the document count from
  # stats.json (docs_in - rejected).
  capsys.readouterr()
  assert evaluate.main(["--clusters", out, "--truth",
                        str(tmp_path / "pairs.tsv"), "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed == json.loads(json.dumps(report))
  assert printed["num_docs"] == n
  assert printed["pairs"]["tp"] == tp
  assert printed["pairs"]["actual"] == len(same_true)
  assert printed["pairs"]["predicted"] == len(same_pred)
  assert printed["ari"] == pytest.approx(ari)
  assert printed["recall_measured"] == pytest.approx(tp / len(same_true))


def dataclass_params(config):
  from pipeline.job import run_params  # pylint: disable=import-outside-toplevel
  return run_params(config)


def test_ari_identical_and_trivial_partitions():
  assert evaluate.adjusted_rand_index(3, 3, 3, 10) == pytest.approx(1.0)
  assert evaluate.adjusted_rand_index(0, 0, 0, 10) == 1.0


def test_truth_cli_matches_brute_force(tmp_path):
  words = [f"w{i}" for i in range(30)]
  texts = [" ".join(words), " ".join(words[:26] + ["x", "y", "z", "v"]),
           " ".join(words[:29] + ["q"]), "something else entirely here",
           " ".join(reversed(words))]
  _write(tmp_path / "in.jsonl", "".join(
      json.dumps({"id": f"k{i}", "text": t}) + "\n"
      for i, t in enumerate(texts)) + "not json\n")
  out = tmp_path / "truth"
  assert truth.main(["--input", str(tmp_path / "in.jsonl"), "--output",
                     str(out), "--ngram", "2", "--threshold", "0.8"]) == 0
  config = DedupConfig(ngram=2, threshold=0.8)
  values, offsets = truth.shingle_sets(texts, config)
  sets = [set(values[offsets[i]:offsets[i + 1]].tolist())
          for i in range(len(texts))]
  want = []
  for i, j in itertools.combinations(range(len(texts)), 2):
    s = len(sets[i] & sets[j]) / len(sets[i] | sets[j])
    if s >= 0.8:
      want.append(f"k{i}\tk{j}\t{s:.6f}")
  lines = (out / "pairs.tsv").read_text().splitlines()
  assert lines[0] == "id_a\tid_b\tjaccard" and lines[1:] == want
  assert len(want) == 1  # (k0, k2): 28/30; k1 shares 25 of 33
  clusters = (out / "clusters.tsv").read_text().splitlines()
  assert clusters == ["id\tcluster", "k0\tk0", "k2\tk0"]
  # Position keys name documents by source and 1-based line.
  assert truth.main(["--input", str(tmp_path / "in.jsonl"), "--output",
                     str(out), "--ngram", "2", "--key", "position"]) == 0
  first = (out / "pairs.tsv").read_text().splitlines()[1].split("\t")
  assert first[0].endswith("in.jsonl:1") and first[1].endswith("in.jsonl:3")


def test_params_cli_prints_choice_and_writes_png(tmp_path, capsys):
  png = tmp_path / "s.png"
  assert params.main(["--threshold", "0.8", "--num-perm", "128", "--plot",
                      str(png)]) == 0
  text = capsys.readouterr().out
  config = DedupConfig(threshold=0.8, num_perm=128)
  assert f"{config.bands} bands x {config.rows} rows" in text
  assert f"{config.lsh_threshold:.3f}" in text
  assert "64x2" in text and "8x16" in text
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert params.main(["--threshold", "0.8", "--bands", "64", "--rows",
                      "4"]) == 2


def test_params_cli_states_p_candidate_at_the_threshold(capsys):
  # The default (verification on) reaches 0.99 at the threshold; explicit
  # 16x8 does not, and says so; without verification nothing is flagged.
  for argv, line in ((["--threshold", "0.8"],
                      "P(candidate | J >= 0.8) >= 0.9923 (P at J = 0.8);"
                      " mean P(candidate) of a pair below it 0.274"),
                     (["--threshold", "0.8", "--bands", "16", "--rows", "8"],
                      "P(candidate | J >= 0.8) >= 0.9470"),
                     (["--threshold", "0.8", "--verify", "none"],
                      "P(candidate | J >= 0.8) >= 0.9470")):
    assert params.main(argv) == 0
    text = capsys.readouterr().out
    assert line in text, text
    assert ("below 0.99" in text) == ("--bands" in argv), text
