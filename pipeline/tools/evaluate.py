"""Quality of a run against ground truth: pairwise and document-level
precision/recall/F1, the adjusted Rand index, and the pair recall the S-curve
predicts next to the measured one.

``python -m pipeline.tools.evaluate --clusters out/run --truth truth/pairs.tsv``

* ``--clusters``: the job's ``--output`` folder, its ``clusters/`` folder or a
  glob of clusters files. The folder's ``stats.json`` supplies the number of
  documents (for the ARI; else give ``--num_docs``) and the run's parameters
  (for the predicted recall).
* ``--truth``: a TSV with a header line, either pairs ``id_a  id_b
  [jaccard]`` (as ``python -m pipeline.tools.truth`` writes) or clusters ``id
  cluster``. Documents named in neither file are unique.
* ``--key``: ``id`` (the clusters/ ``id`` column = your id field) or
  ``position`` (``<source>:<position>`` from the clusters/ columns).

Definitions: a predicted pair is two documents in one output cluster. With
pairs truth, a predicted pair is correct only if it is listed (true
similarity >= the truth's threshold), and the ARI compares with the connected
components of the listed pairs. A document is a true duplicate if it appears
in the truth, and predicted as one if it is in an output cluster.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import glob
import json
import os
import sys
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from pipeline.tools import parse_args, run_tool, tool_parser
from pipeline.tools.params import edge_probability
from transforms.config import DedupConfig
from transforms.kernels import connected as graph_kernels

KEYS = ("id", "position")


class Truth(NamedTuple):
  """Ground truth: ``clusters`` maps each duplicated document's key to its
  cluster label; ``pairs`` (pairs truth only) lists the key pairs and
  ``similarity`` their Jaccard (None when the file has no such column)."""
  clusters: Dict[str, str]
  pairs: Optional[List[tuple]]
  similarity: Optional[np.ndarray]


def _row_key(row: dict, key: str) -> str:
  if key == "id":
    if row.get("id") is None:
      raise ValueError(f"clusters row for doc_id {row.get('doc_id')} has no "
                       "id: use --key position.")
    return str(row["id"])
  return f"{row['source']}:{row['position']}"


def cluster_files(path: str) -> List[str]:
  if os.path.isdir(os.path.join(path, "clusters")):
    path = os.path.join(path, "clusters")
  if os.path.isdir(path):
    return sorted(glob.glob(os.path.join(path, "*.jsonl")))
  return sorted(glob.glob(path))


def read_clusters(path: str, key: str = "id") -> Dict[str, int]:
  """Key → cluster id for every document of the run's clusters/ rows."""
  predicted = {}
  for name in cluster_files(path):
    with open(name, encoding="utf-8") as f:
      for line in f:
        row = json.loads(line)
        predicted[_row_key(row, key)] = row["cluster_id"]
  return predicted


def read_stats(path: str) -> Optional[dict]:
  """The run's stats.json next to its clusters, if there is one."""
  folder = path if os.path.isdir(path) else os.path.dirname(path.rstrip("/*"))
  for candidate in (folder, os.path.dirname(folder.rstrip("/"))):
    name = os.path.join(candidate, "stats.json")
    if os.path.isfile(name):
      with open(name, encoding="utf-8") as f:
        return json.load(f)
  return None


def read_truth(path: str) -> Truth:
  with open(path, encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f, delimiter="\t"))
  if not rows:
    raise ValueError(f"{path} is empty; it needs a header line.")
  header, body = [h.strip() for h in rows[0]], rows[1:]
  if header[:2] == ["id_a", "id_b"]:
    pairs = [(r[0], r[1]) for r in body if r]
    similarity = (np.array([float(r[2]) for r in body if r])
                  if header[2:3] == ["jaccard"] else None)
    labels = graph_kernels.union_find_labels(pairs)
    return Truth({k: str(v) for k, v in labels.items()}, pairs, similarity)
  if header[:2] == ["id", "cluster"]:
    return Truth({r[0]: r[1] for r in body if r}, None, None)
  raise ValueError(f"{path}: header {header} is neither 'id_a<TAB>id_b"
                   "[<TAB>jaccard]' (pairs) nor 'id<TAB>cluster'.")


def _comb2(n) -> int:
  return n * (n - 1) // 2


def _prf(tp, predicted, actual) -> dict:
  precision = tp / predicted if predicted else 1.0
  recall = tp / actual if actual else 1.0
  f1 = (2 * precision * recall / (precision + recall)
        if precision + recall else 0.0)
  return {"precision": precision, "recall": recall, "f1": f1, "tp": tp,
          "predicted": predicted, "actual": actual}


def evaluate(predicted: Dict[str, int], truth: Truth,
             num_docs: Optional[int] = None,
             params: Optional[dict] = None) -> dict:
  """Every figure of the report as a dict (see the module docstring)."""
  pred_sizes = collections.Counter(predicted.values())
  true_sizes = collections.Counter(truth.clusters.values())
  predicted_pairs = sum(_comb2(n) for n in pred_sizes.values())
  together = collections.Counter(
      (truth.clusters[k], predicted[k]) for k in truth.clusters
      if k in predicted)
  same_in_both = sum(_comb2(n) for n in together.values())
  if truth.pairs is None:
    pair_tp, true_pairs = same_in_both, sum(_comb2(n)
                                            for n in true_sizes.values())
  else:
    hit = [a in predicted and b in predicted and predicted[a] == predicted[b]
           for a, b in truth.pairs]
    pair_tp, true_pairs = sum(hit), len(truth.pairs)
  report = {
      "pairs": _prf(pair_tp, predicted_pairs, true_pairs),
      "documents": _prf(len(set(predicted) & set(truth.clusters)),
                        len(predicted), len(truth.clusters)),
  }
  if num_docs is not None:
    true_total = sum(_comb2(n) for n in true_sizes.values())
    report["ari"] = adjusted_rand_index(same_in_both, true_total,
                                        predicted_pairs, num_docs)
    report["num_docs"] = num_docs
  if truth.similarity is not None and params is not None:
    report["recall_predicted"] = predicted_recall(truth.similarity, params)
    report["recall_measured"] = report["pairs"]["recall"]
  return report


def adjusted_rand_index(same_in_both: int, same_in_truth: int,
                        same_in_predicted: int, n: int) -> float:
  """Hubert-Arabie ARI from pair counts (documents not clustered are
  singletons, which add to n only)."""
  total = _comb2(n)
  expected = same_in_truth * same_in_predicted / total if total else 0.0
  best = (same_in_truth + same_in_predicted) / 2
  if best == expected:
    return 1.0
  return (same_in_both - expected) / (best - expected)


def predicted_recall(similarity: np.ndarray, params: dict) -> float:
  """Mean probability that a pair of each similarity becomes an edge under
  the run's parameters (stats.json ``params``): the S-curve, and the binomial
  signature test or the exact threshold of its verify mode."""
  if not len(similarity):
    return 1.0
  fields = {f.name for f in dataclasses.fields(DedupConfig)}
  config = DedupConfig(**{k: v for k, v in params.items() if k in fields})
  return float(edge_probability(similarity, config).mean())


def format_report(report: dict) -> str:
  lines = []
  for name in ("pairs", "documents"):
    m = report[name]
    lines.append(f"{name:9s}  precision {m['precision']:.4f}  recall "
                 f"{m['recall']:.4f}  F1 {m['f1']:.4f}  (correct {m['tp']:,}"
                 f" of {m['predicted']:,} predicted, {m['actual']:,} true)")
  if "ari" in report:
    lines.append(f"adjusted Rand index {report['ari']:.4f} over "
                 f"{report['num_docs']:,} documents")
  if "recall_predicted" in report:
    lines.append(f"pair recall: measured {report['recall_measured']:.4f}, "
                 f"S-curve prediction {report['recall_predicted']:.4f}")
  return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
  parser = tool_parser("evaluate", __doc__)
  parser.add_argument("--clusters", required=True,
                      help="The run's --output folder, its clusters/ folder"
                      " or a glob of clusters files.")
  parser.add_argument("--truth", required=True,
                      help="pairs.tsv (id_a, id_b[, jaccard]) or clusters.tsv"
                      " (id, cluster).")
  parser.add_argument("--key", choices=KEYS, default="id",
                      help="How truth names documents: id or position"
                      " (<source>:<position>).")
  parser.add_argument("--num_docs", type=int, default=None,
                      help="Documents in the corpus (default: from stats.json:"
                      " docs_in - rejected).")
  parser.add_argument("--json", action="store_true",
                      help="Print the figures as JSON.")
  args = parse_args(parser, argv)
  if isinstance(args, int):
    return args
  try:
    if not cluster_files(args.clusters):
      raise ValueError(f"no clusters files at {args.clusters}")
    predicted = read_clusters(args.clusters, args.key)
    truth = read_truth(args.truth)
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  stats = read_stats(args.clusters)
  num_docs = args.num_docs
  if num_docs is None and stats is not None:
    num_docs = stats["docs_in"] - stats["rejected"]
  report = evaluate(predicted, truth, num_docs,
                    stats["params"] if stats else None)
  print(json.dumps(report, indent=2, sort_keys=True) if args.json
        else format_report(report))
  return 0


if __name__ == "__main__":
  run_tool(main)
