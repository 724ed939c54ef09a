"""Each public PTransform on a TestPipeline (FnApiRunner) with assert_that."""

import dataclasses
import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty

from transforms import (BandKey, ComputeSignatures, DedupConfig,
                        FindCandidates, MinHash, NearDedup, Normalize,
                        ReadDocuments, SelectKept, Shingle, VerifyEdges,
                        VerifyExact)
from transforms import metrics
from transforms.components import Pairs
from transforms.elements import SignatureBatch, TextBatch
from transforms import read as read_module
from transforms.read import ROW_BITS, InputFile
from transforms.select import cluster_rows
from transforms.verify import ServeTextsFromFiles
from transforms.kernels import connected
from transforms.kernels import lsh as lsh_kernels
from transforms.kernels import minhash as mh
from transforms.kernels import reference_text as tk

CONFIG = DedupConfig(ngram=3, num_perm=64, bands=16, rows=4, threshold=0.5)


def pipeline():
  return TestPipeline(runner="FnApiRunner")


def by_stat(counts, label="Stats"):
  """Summed counts (a composite's tuple of them), without the run-dependent
  worker_ms_* timings."""
  return (counts
          | f"{label}Flatten" >> beam.Flatten()
          | f"{label}NoTimings" >> beam.Filter(
              lambda kv: not metrics.is_timing(kv[0]))
          | f"{label}Sum" >> beam.CombinePerKey(sum))


def unbatch_signatures(batch):
  ids, sigs = batch
  return [(i, sig.tolist()) for i, sig in zip(ids.tolist(), sigs)]


def signature_batch(pairs):
  return SignatureBatch(np.array([i for i, _ in pairs], dtype=np.int64),
                        np.stack([sig for _, sig in pairs]))


def edge_pairs(edges):
  return edges | "EdgePairs" >> beam.FlatMap(
      lambda kv: zip(kv[1][0].tolist(), kv[1][1].tolist()))


def without_shuffle_bytes(counts):
  return by_stat(counts, "Counts") | "NoShuffleBytes" >> beam.Filter(
      lambda kv: not kv[0].startswith("shuffle_bytes_"))


def test_read_documents_assigns_positional_ids_and_rejects_with_reasons(
    tmp_path):
  (tmp_path / "a.jsonl").write_bytes(
      b'{"id": "x", "text": "hello", "extra": [1]}\n{"text": 5}\nnot json\n')
  (tmp_path / "b.txt").write_bytes(b"line one\r\n\xff\xfe\n\nlast")
  pq.write_table(pa.table({"text": ["p0", None], "id": [1, 2]}),
                 tmp_path / "c.parquet")
  with pipeline() as p:
    read = p | ReadDocuments([str(tmp_path / "*")])
    docs = read["documents"] | "DocKeys" >> beam.Map(
        lambda d: (d.doc_id >> ROW_BITS, d.doc_id & 0xFFFF, d.text, d.user_id))
    assert_that(docs, equal_to([
        (0, 0, "hello", "x"), (1, 0, "line one", None), (1, 2, "", None),
        (1, 3, "last", None), (2, 0, "p0", 1)]), label="Docs")
    rejected = read["rejected"] | "RejectKeys" >> beam.Map(
        lambda r: (r.doc_id, r.position, r.reason))
    assert_that(rejected, equal_to([
        (1, 2, "text_not_string"), (2, 3, "malformed_json"),
        ((1 << ROW_BITS) | 1, 2, "invalid_utf8"),
        ((2 << ROW_BITS) | 1, 2, "text_not_string")]), label="Rejected")
    assert_that(by_stat(read["counts"]), equal_to([("docs_in", 9)]),
                label="Counts")
    files = read["files"] | "FileFormats" >> beam.Map(
        lambda f: (f.index, f.format))
    assert_that(files, equal_to([(0, "jsonl"), (1, "text"), (2, "parquet")]),
                label="Files")


def test_read_batches_hold_every_document_in_row_order(tmp_path, monkeypatch):
  monkeypatch.setattr(read_module, "TEXT_BATCH", 2)
  (tmp_path / "a.jsonl").write_bytes(
      b'{"text": "t0"}\n{"text": 1}\n{"text": "t2"}\n{"text": "t3"}\n'
      b'{"text": "t4"}\n')
  with pipeline() as p:
    read = p | ReadDocuments(str(tmp_path / "a.jsonl"), documents=False)
    batches = read["batches"] | beam.Map(
        lambda b: ([i & 0xFFFF for i in b.ids.tolist()], b.texts))
    assert_that(batches, equal_to([([0, 2], ["t0", "t2"]),
                                   ([3, 4], ["t3", "t4"])]), label="Batches")
    assert_that(read["documents"], equal_to([]), label="NoDocuments")


def test_read_documents_keeps_raw_jsonl_line(tmp_path):
  line = b'{"text": "a",   "keep": "me"}'
  (tmp_path / "a.jsonl").write_bytes(line + b"\n")
  with pipeline() as p:
    records = (p | ReadDocuments(str(tmp_path / "a.jsonl"))
               )["documents"] | beam.Map(lambda d: d.record)
    assert_that(records, equal_to([line]))


@pytest.mark.parametrize("sketch", ["classic", "oph"])
def test_normalize_shingle_minhash_match_the_kernels(sketch):
  config = dataclasses.replace(CONFIG, sketch=sketch)
  texts = ["Hello,   World! The ＱＵＩＣＫ fox.", "a b", "", "one two three four"]
  expected_norm = tk.normalize_texts(texts).to_pylist()
  shingles, offsets = tk.ngram_hashes(
      *tk.unit_hashes(tk.normalize_texts(texts), "word", CONFIG.seed),
      CONFIG.ngram, CONFIG.seed)
  expected_sets = tk.unique_per_document(shingles, offsets)
  a, b = mh.permutations(CONFIG.num_perm, CONFIG.seed)
  with pipeline() as p:
    docs = p | beam.Create(list(enumerate(texts)))
    norm = docs | Normalize(CONFIG)
    assert_that(norm, equal_to(list(enumerate(expected_norm))),
                label="Normalized")
    sets = norm | Shingle(CONFIG)
    as_lists = sets | "SetsToLists" >> beam.Map(lambda kv: (kv[0],
                                                            kv[1].tolist()))
    assert_that(as_lists, equal_to(
        [(i, s.tolist()) for i, s in enumerate(expected_sets)]),
                label="Shingles")
    sigs = sets | MinHash(config) | "SigsToLists" >> beam.Map(
        lambda kv: (kv[0], kv[1].tolist()))
    expected_sigs = [
        (i, (mh.oph_batch(s, np.array([0, len(s)]), CONFIG.num_perm,
                          CONFIG.seed) if sketch == "oph" else
             mh.minhash_batch(s, np.array([0, len(s)]), a, b))[0].tolist())
        for i, s in enumerate(expected_sets) if len(s)]
    assert_that(sigs, equal_to(expected_sigs), label="Signatures")
    fused = (docs | ComputeSignatures(config))
    assert_that(fused["signatures"] | "FusedToLists" >> beam.FlatMap(
        unbatch_signatures), equal_to(expected_sigs), label="Fused")
    assert_that(by_stat(fused["counts"]), equal_to(
        [("docs_empty", 1), ("docs_signed", 3)]), label="FusedCounts")


def test_min_tokens_keeps_short_documents_out_of_clustering():
  config = DedupConfig(ngram=3, num_perm=64, bands=16, rows=4, min_tokens=3)
  with pipeline() as p:
    out = (p | beam.Create([(1, "a b"), (2, "a b"), (3, "a b c d")])
           | ComputeSignatures(config))
    assert_that(out["signatures"] | beam.FlatMap(lambda b: b[0].tolist()),
                equal_to([3]), label="Ids")
    assert_that(by_stat(out["counts"]), equal_to(
        [("docs_too_short", 2), ("docs_signed", 1)]), label="Counts")


def _signatures(pairs):
  """Signature rows for (doc id, equal-prefix length) specs over K=64."""
  base = np.arange(64, dtype=np.uint32)
  out = []
  for doc_id, same in pairs:
    sig = base.copy()
    sig[same:] = np.uint32(1000 + doc_id) + np.arange(64 - same,
                                                      dtype=np.uint32)
    out.append((doc_id, sig))
  return out


def test_band_key_and_find_candidates_emit_every_pair_of_small_buckets():
  # Docs 5, 9, 2 share all 64 entries; 7 shares the first 8 (2 bands); 4 none.
  sigs = _signatures([(5, 64), (9, 64), (2, 64), (7, 8), (4, 0)])
  config = DedupConfig(num_perm=64, bands=16, rows=4, lsh_shards=4)
  with pipeline() as p:
    # Two batches, so edges of one bucket come from different elements.
    keyed = (p | beam.Create([signature_batch(sigs[:2]),
                              signature_batch(sigs[2:])])
             | BandKey(config))
    found = {"keys": keyed["keys"]} | FindCandidates(config)
    # Every pair of every bucket, each once although 14 or 16 bands find it.
    assert_that(edge_pairs(found["edges"]), equal_to(
        [(2, 5), (2, 9), (5, 9), (2, 7), (5, 7), (7, 9)]), label="Edges")
    # All of them in the shard of the buckets' smallest id, 2.
    assert_that(found["edges"] | "EdgeShards" >> beam.Keys(), equal_to(
        [int(lsh_kernels.node_shard(np.array([2]), 4)[0])]), label="Shard")
    # 14 buckets of {2, 5, 9} (size 3: log2 bin 1), 2 with 7 too (4: bin 2).
    assert_that(without_shuffle_bytes(found["counts"]), equal_to(
        [("buckets_multi", 16), ("candidate_edges", 6),
         ("bucket_size_log2_01", 14), ("bucket_size_log2_02", 2)]),
                label="Counts")
    # Key and 16-bit id offset: 10 bytes per document and band.
    assert_that(by_stat(keyed["counts"], "KeyBytes"), equal_to(
        [("shuffle_bytes_band_keys", 5 * 16 * 10)]), label="KeyBytes")
    shards = (keyed["keys"] | beam.Keys()
              | "DistinctShards" >> beam.Distinct())
    assert_that(shards | "AllInRange" >> beam.Filter(lambda s: 0 <= s < 4),
                is_not_empty(), label="Shards")


def test_verify_edges_keeps_only_pairs_at_or_above_threshold():
  sigs = _signatures([(1, 64), (2, 48), (3, 32), (4, 31)])
  config = DedupConfig(num_perm=64, bands=16, rows=4, threshold=0.5)
  with pipeline() as p:
    signatures = p | "Sigs" >> beam.Create([signature_batch(sigs[:3]),
                                            signature_batch(sigs[3:])])
    edges = p | "Edges" >> beam.Create([
        (0, (np.array([1, 1]), np.array([2, 3]))),
        (3, (np.array([1, 2]), np.array([4, 4])))])
    out = {"edges": edges, "signatures": signatures} | VerifyEdges(config)
    # 48/64, 32/64 pass; 31/64 and (2,4): 31/64 fail.
    assert_that(edge_pairs(out["edges"]), equal_to([(1, 2), (1, 3)]),
                label="Edges")
    assert_that(without_shuffle_bytes(out["counts"]), equal_to(
        [("verified_edges", 2), ("verify_removed_edges", 2),
         ("graph_edges", 2)]), label="Counts")
    assert_that(out["edges"] | "Sims" >> beam.FlatMap(
        lambda kv: kv[1][2].tolist()),
                equal_to([0.75, 0.5]), label="Similarity")


def test_verify_exact_keeps_pairs_by_true_jaccard(tmp_path):
  # Word 1-grams: doc 1 = w0..w9; doc 2 shares 8 of 10 words with it (8/12),
  # doc 3 all 10 plus 2 more (10/12), doc 4 none; doc 5 is in no edge.
  words = [f"w{i}" for i in range(10)]
  docs = [(1, " ".join(words)), (2, " ".join(words[:8] + ["x", "y"])),
          (3, " ".join(words + ["u", "v"])), (4, "a b c"), (5, "w0 w1")]
  config = DedupConfig(ngram=1, num_perm=64, bands=16, rows=4, threshold=0.8,
                       lsh_shards=3)
  # (1,3): 10/12 >= 0.8 kept; (1,2): 8/12, (1,4): 0, (2,3): 8/14 dropped.
  edges = [(0, (np.array([1, 1]), np.array([2, 3]))),
           (2, (np.array([1, 2]), np.array([4, 3])))]
  with pipeline() as p:
    out = ({"edges": p | "Edges" >> beam.Create(edges),
            "docs": p | "Docs" >> beam.Create(docs)}
           | VerifyExact(config))
    assert_that(edge_pairs(out["edges"]), equal_to([(1, 3)]), label="Edges")
    assert_that(without_shuffle_bytes(out["counts"]), equal_to(
        [("verified_edges", 1), ("verify_removed_edges", 3),
         ("graph_edges", 1)]), label="Counts")
    assert_that(out["edges"] | "Sims" >> beam.FlatMap(
        lambda kv: kv[1][2].tolist()),
                equal_to([10 / 12]), label="Similarity")
  # The same from files: doc ids are file << 40 | row, texts read back.
  path = tmp_path / "docs.jsonl"
  path.write_text("".join(json.dumps({"text": t}) + "\n" for _, t in docs))
  files = [InputFile(0, str(path), "jsonl", path.stat().st_size)]
  with pipeline() as p:
    out = ({"edges": p | "Edges" >> beam.Create([
        (s, (src - 1, dst - 1)) for s, (src, dst) in edges]),
            "docs": p | "NoDocs" >> beam.Create([])}
           | VerifyExact(config, ServeTextsFromFiles(
               p | "Files" >> beam.Create(files))))
    assert_that(edge_pairs(out["edges"]), equal_to([(0, 2)]), label="Edges")


@pytest.mark.parametrize("keep,kept", [("first", 3), ("longest", 8)])
def test_select_kept_one_per_cluster(keep, kept):
  shards = 4
  members = [(3, 3), (8, 3), (11, 3), (20, 20), (21, 20)]
  with pipeline() as p:
    # Two label batches per node shard, as components gives them.
    labels = p | "Labels" >> beam.Create([
        (connected.shard_of(np.array([n]), shards)[0].item(),
         Pairs(np.array([n]), np.array([label]))) for n, label in members])
    lengths = p | "Lengths" >> beam.Create(
        [(3, 10), (8, 50), (11, 50), (20, 5), (21, 5), (99, 1000)])
    out = labels | SelectKept(keep, lengths if keep == "longest" else None,
                              shards=shards)
    assert_that(out["clusters"] | beam.FlatMap(_cluster_rows, shards),
                equal_to([(3, 3, 3, kept), (8, 3, 3, kept),
                          (11, 3, 3, kept), (20, 20, 2, 20),
                          (21, 20, 2, 20)]), label="Clusters")
    assert_that(without_shuffle_bytes(out["counts"]), equal_to(
        [("clusters", 2), ("clustered_docs", 5),
         ("cluster_size_log2_01", 2)]), label="Counts")


def _cluster_rows(element, shards):
  """A ClusterBatch as ``(doc, cluster id, size, kept doc)`` rows; each
  batch is at its documents' node shard."""
  shard, batch = element
  assert (lsh_kernels.node_shard(batch.docs, shards) == shard).all(), element
  return zip(*(column.tolist() for column in batch))


@pytest.mark.parametrize("batched", [False, True])
def test_near_dedup_on_a_user_pcollection(batched):
  base = ("near duplicate detection keeps one document of every cluster of "
          "similar documents in the corpus")
  texts = {10: base, 11: base.upper() + "!!", 12: base.replace("corpus",
                                                                "dataset"),
           13: "an unrelated sentence about the weather in spring time",
           14: ""}
  config = DedupConfig(ngram=3, threshold=0.6)
  with pipeline() as p:
    docs = p | beam.Create(sorted(texts.items()))
    if batched:  # two TextBatch elements, as ReadDocuments gives them
      docs = docs | beam.combiners.ToList() | beam.FlatMap(lambda pairs: [
          TextBatch(np.array([i for i, _ in part], dtype=np.int64),
                    [t for _, t in part]) for part in (pairs[:2], pairs[2:])])
    out = docs | NearDedup(config, batched=batched)
    if batched:  # ClusterColumns batches, turned back into rows
      out["clusters"] = out["clusters"] | "Rows" >> beam.FlatMap(cluster_rows)
    assert_that(out["clusters"] | "Flags" >> beam.Map(
        lambda kv: (kv[0], kv[1].cluster_id, kv[1].kept, kv[1].kept_doc_id,
                    kv[1].matched_doc_id)),
                equal_to([(10, 10, True, 10, None), (11, 10, False, 10, 10),
                          (12, 10, False, 10, 10)]))
    # 11 is 10 after normalisation; 12 changes the last of 15 words: 12 of
    # 13 word 3-grams shared, 14 in the union.
    assert_that(out["clusters"] | "Similarities" >> beam.Map(
        lambda kv: (kv[0], kv[1].matched_jaccard, kv[1].jaccard_to_kept)),
                equal_to([(10, None, None), (11, 1.0, 1.0),
                          (12, 12 / 14, 12 / 14)]), label="Explained")
    stats = by_stat(out["counts"]) | "Some" >> beam.Filter(
        lambda kv: kv[0] in ("docs_empty", "clusters", "verified_edges",
                             "graph_edges", "chain_docs"))
    # All three pairs of the bucket pass; two of them span the cluster.
    assert_that(stats, equal_to([("docs_empty", 1), ("clusters", 1),
                                 ("verified_edges", 3), ("graph_edges", 2)]),
                label="Counts")


def test_config_round_trips_through_json_params():
  # stats.json records the config; it must be JSON-serialisable as is.
  from pipeline.job import run_params
  params = run_params(CONFIG)
  assert json.loads(json.dumps(params))["bands"] == 16
  assert params["sketch"] == "classic"
  assert params["minhash_scheme"] == mh.MINHASH_SCHEME
  oph = run_params(dataclasses.replace(CONFIG, sketch="oph"))
  assert oph["sketch"] == "oph" and oph["minhash_scheme"] == mh.OPH_SCHEME
