"""The systems under comparison, each as raw texts -> signatures and raw
texts -> duplicate clusters (in memory), with the same K, seed and (b, r).

* ``ours-<sketch>``: ``transforms.kernels.compiled_signature.signature_batch`` on
  batches of 4,096 documents (end to end, ours is ``python -m pipeline``,
  driven by ``bench/run.py``).
* ``rensa``: one ``RMinHash`` per document fed its shingle set, then
  ``RMinHashLSH`` and a union-find over the candidate pairs.
  ``rensa-matrix`` is rensa's bulk ``digest_matrix_from_token_sets`` path
  (signatures only; reported for information).
* ``datasketch``: ``MinHash.update_batch`` per document, ``MinHashLSH`` with
  ``params=(b, r)``, union-find.
* ``py-shingles``: only the peers' Python preprocessing below, no
  signatures (signatures only; for information).
* ``dedup_jsonl``: a peer as its users run it on a file (the JSONL read,
  the kept lines written), for ``bench/run.py --peer-scripts``.
* ``seed-numpy``: the method document's from-scratch approach: per-document
  affine hashes ``(a*x + b) mod p`` over the document's shingle hashes in
  numpy, then dict-based banding. Here p = 2^31 - 1 so that the products stay
  exact in int64.

Peers get the same normalisation as ours, done in Python the way their users
do it (NFKC, lowercase, non-word runs -> space, split, word n-gram strings in
a set); that preprocessing is part of their measured time, as text
normalisation and shingling are part of ours.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from typing import Callable, Dict, List, Sequence

import numpy as np

# The exact union-find of the pipeline's residual step (pure Python, no Beam,
# no pyarrow): the peers' candidate pairs go through the same code.
from transforms.kernels import connected as graph

OURS_BATCH = 4096
_NON_WORD = re.compile(r"[\W_]+")
_SEED_PRIME = (1 << 31) - 1


def shingle_sets(texts: Sequence[str], ngram: int) -> List[set]:
  """Word n-gram string sets; a document shorter than ``ngram`` words gives
  one shingle of all its words (as ours does)."""
  out = []
  for text in texts:
    tokens = _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()
                           ).split()
    if len(tokens) < ngram:
      out.append({" ".join(tokens)} if tokens else set())
    else:
      out.append({" ".join(tokens[i:i + ngram])
                  for i in range(len(tokens) - ngram + 1)})
  return out


# ------------------------------------------------------------- signatures


def ours_signer(params: dict, sketch: str) -> Callable:
  from transforms.kernels import minhash
  from transforms.kernels.compiled_signature import signature_batch
  a, b = minhash.permutations(params["num_perm"], params["seed"])

  def sign(texts):
    return [signature_batch(texts[lo:lo + OURS_BATCH], unit="word",
                            ngram=params["ngram"], seed=params["seed"], a=a,
                            b=b, sketch=sketch)[0]
            for lo in range(0, len(texts), OURS_BATCH)]
  return sign


def _per_document(params: dict, new_sketch: Callable,
                  feed: Callable) -> Callable:
  """Signer that builds one sketch object per document from its set."""
  ngram = params["ngram"]

  def sign(texts):
    out = []
    for shingles in shingle_sets(texts, ngram):
      m = new_sketch()
      feed(m, shingles)
      out.append(m)
    return out
  return sign


def rensa_signer(params: dict) -> Callable:
  from rensa import RMinHash
  k, seed = params["num_perm"], params["seed"]
  return _per_document(params, lambda: RMinHash(num_perm=k, seed=seed),
                       lambda m, shingles: m.update(list(shingles)))


def rensa_matrix_signer(params: dict) -> Callable:
  from rensa import RMinHash
  k, seed, ngram = params["num_perm"], params["seed"], params["ngram"]

  def sign(texts):
    return RMinHash.digest_matrix_from_token_sets(
        [list(s) for s in shingle_sets(texts, ngram)], k, seed)
  return sign


def datasketch_signer(params: dict) -> Callable:
  from datasketch import MinHash
  k, seed = params["num_perm"], params["seed"]
  return _per_document(
      params, lambda: MinHash(num_perm=k, seed=seed),
      lambda m, shingles: m.update_batch([s.encode("utf-8") for s in shingles]))


def seed_numpy_signer(params: dict) -> Callable:
  rng = np.random.default_rng(params["seed"])
  k, ngram = params["num_perm"], params["ngram"]
  a = rng.integers(1, _SEED_PRIME, size=k, dtype=np.int64)
  b = rng.integers(0, _SEED_PRIME, size=k, dtype=np.int64)

  def sign(texts):
    sigs = np.empty((len(texts), k), dtype=np.int64)
    for i, shingles in enumerate(shingle_sets(texts, ngram)):
      x = np.fromiter((zlib.crc32(s.encode("utf-8")) for s in shingles),
                      dtype=np.int64, count=len(shingles)) % _SEED_PRIME
      sigs[i] = ((np.outer(a, x) + b[:, None]) % _SEED_PRIME).min(axis=1)
    return sigs
  return sign


def py_shingles_signer(params: dict) -> Callable:
  """Only the peers' Python preprocessing (no signatures): the ceiling of
  any signer fed Python shingle sets."""
  return lambda texts: shingle_sets(texts, params["ngram"])


def signer(system: str, params: dict) -> Callable:
  """The signature function of ``system`` (state built here, untimed)."""
  if system.startswith("ours-"):
    return ours_signer(params, system[len("ours-"):])
  return {"rensa": rensa_signer, "rensa-matrix": rensa_matrix_signer,
          "datasketch": datasketch_signer, "seed-numpy": seed_numpy_signer,
          "py-shingles": py_shingles_signer}[system](params)


# ------------------------------------------------- end to end, in memory
# Each returns the cluster label (smallest member) of every document in a
# candidate pair; documents in no pair are singletons.


def rensa_clusters(texts: Sequence[str], params: dict) -> Dict[int, int]:
  from rensa import RMinHashLSH
  minhashes = rensa_signer(params)(texts)
  lsh = RMinHashLSH(threshold=params["threshold"], num_perm=params["num_perm"],
                    num_bands=params["bands"])
  lsh.insert_many(minhashes)
  pairs = ((i, j) for i, found in enumerate(lsh.query_all(minhashes))
           for j in found if j != i)
  return graph.union_find_labels(pairs)


def datasketch_clusters(texts: Sequence[str], params: dict) -> Dict[int, int]:
  from datasketch import MinHashLSH
  minhashes = datasketch_signer(params)(texts)
  lsh = MinHashLSH(num_perm=params["num_perm"],
                   params=(params["bands"], params["rows"]))
  with lsh.insertion_session() as session:
    for i, m in enumerate(minhashes):
      session.insert(i, m)
  pairs = ((i, j) for i, m in enumerate(minhashes) for j in lsh.query(m)
           if j != i)
  return graph.union_find_labels(pairs)


def seed_numpy_clusters(texts: Sequence[str], params: dict) -> Dict[int, int]:
  sigs = seed_numpy_signer(params)(texts)
  rows = params["rows"]
  pairs = set()
  for band in range(params["bands"]):
    block = np.ascontiguousarray(sigs[:, band * rows:(band + 1) * rows])
    buckets: Dict[bytes, List[int]] = {}
    for i in range(len(block)):
      buckets.setdefault(block[i].tobytes(), []).append(i)
    for members in buckets.values():
      for x in range(len(members)):
        for y in range(x + 1, len(members)):
          pairs.add((members[x], members[y]))
  return graph.union_find_labels(pairs)


CLUSTERERS = {"rensa": rensa_clusters, "datasketch": datasketch_clusters,
              "seed-numpy": seed_numpy_clusters}


def dedup_jsonl(system: str, in_path: str, out_path: str,
                params: dict) -> dict:
  """A peer as its users run it on a file: read the JSONL (orjson), cluster
  the texts in memory (:data:`CLUSTERERS`), write the lines of the documents
  kept (the lowest index of each cluster, every unclustered one) unchanged.
  ``{"docs", "kept"}``."""
  import orjson  # pylint: disable=import-outside-toplevel
  with open(in_path, "rb") as f:
    lines = f.read().splitlines(keepends=True)
  texts = [orjson.loads(line)["text"] for line in lines]
  labels = CLUSTERERS[system](texts, params)
  kept = [line for i, line in enumerate(lines) if labels.get(i, i) == i]
  with open(out_path, "wb") as f:
    f.write(b"".join(kept))
  return {"docs": len(lines), "kept": len(kept)}


def pairs_at_least(texts: Sequence[str], groups: List[List[int]], ngram: int,
                   threshold: float) -> List[tuple]:
  """Planted pairs whose exact Jaccard (of the Python shingle sets) is at
  least ``threshold``: the pairs a verifying system is asked to find."""
  out = []
  for group in groups:
    sets = dict(zip(group, shingle_sets([texts[i] for i in group], ngram)))
    for x, i in enumerate(group):
      for j in group[x + 1:]:
        union = len(sets[i] | sets[j])
        if union and len(sets[i] & sets[j]) / union >= threshold:
          out.append((i, j))
  return out


def pair_metrics(labels: Dict[int, int], groups: List[List[int]],
                 strong_pairs: Sequence[tuple] = ()) -> dict:
  """Pairwise precision/recall of predicted clusters against planted groups.

  ``labels`` maps document index -> cluster label for clustered documents
  (absent = singleton). A pair is predicted when both documents share a
  cluster and true when both are in one planted group; counted without
  enumerating pairs. ``recall_at_threshold`` is the recall over
  ``strong_pairs`` (planted pairs at or above the threshold).
  """
  sizes: Dict[int, int] = {}
  for label in labels.values():
    sizes[label] = sizes.get(label, 0) + 1
  predicted = sum(s * (s - 1) // 2 for s in sizes.values())
  truth = sum(len(g) * (len(g) - 1) // 2 for g in groups)
  hits = 0
  for group in groups:
    counts: Dict[int, int] = {}
    for i in group:
      if i in labels:
        counts[labels[i]] = counts.get(labels[i], 0) + 1
    hits += sum(c * (c - 1) // 2 for c in counts.values())
  strong_hits = sum(1 for i, j in strong_pairs
                    if i in labels and labels.get(j) == labels[i])
  multi = [s for s in sizes.values() if s > 1]
  return {"predicted_pairs": predicted, "truth_pairs": truth,
          "true_positive_pairs": hits,
          "precision": hits / predicted if predicted else None,
          "recall": hits / truth if truth else None,
          "pairs_at_threshold": len(strong_pairs),
          "recall_at_threshold": (strong_hits / len(strong_pairs)
                                  if strong_pairs else None),
          "clusters": len(multi), "clustered_docs": sum(multi)}
