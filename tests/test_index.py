"""Incremental dedup against an LSH index (``--index_out``, ``--against``).

The contract (README, "Incremental dedup against an index"): for corpora A
then B, a run over B against index(A) removes exactly the documents of B
that a run over A + B removes (A's files first), with the same doc ids, and
writes the same ``deduped/`` files for B.
"""

import glob
import json
import os

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline import cli, job
from pipeline.preflight import check_index
from transforms import index as index_lib
from transforms.config import DedupConfig
from transforms.elements import KeyShard, SignatureBatch
from transforms.kernels import lsh as lsh_kernels
from transforms.read import InputFile, make_doc_id
from transforms.select import ClusterInfo, cluster_columns

# K = 512 puts the estimates of the corpus's near pairs (J ~ 0.87) and far
# pairs (J ~ 0.75) several standard errors from the threshold 0.8.
FLAGS = ["--verify", "signature", "--num_perm", "512"]


def _window(words, start, n=200):
  return " ".join(words[start:start + n])


def _corpora():
  """A's and B's files: ``{relative path: [(user id, text)]}``."""
  rng = np.random.default_rng(14)
  vocab = [f"w{i}" for i in range(5000)]

  def words(n):
    return [vocab[i] for i in rng.integers(0, len(vocab), n)]

  chain, bridge, grow, lone, fresh = (words(400) for _ in range(5))
  a0 = [
      # c1 is removed in A (near c0); B's c2 is near c1 only.
      ("c0", _window(chain, 0)), ("c1", _window(chain, 14)),
      # p and q are too far apart to cluster; B's r is near both.
      ("p", _window(bridge, 0)), ("q", _window(bridge, 28)),
  ]
  a1 = [("g0", _window(grow, 0)), ("l0", _window(lone, 0))] + [
      (f"ua{i}", " ".join(words(150))) for i in range(4)]
  b0 = [
      ("c2", _window(chain, 28)), ("r", _window(bridge, 14)),
      # g1 is near A's g0, g2 near g1 only: both go with g0.
      ("g1", _window(grow, 14)), ("g2", _window(grow, 28)),
      ("empty", ""), ("short", "w1 w2"),
  ]
  b1 = [
      # A copy of an A document, and a B-only cluster of three.
      ("l1", _window(lone, 0)), ("f0", _window(fresh, 0)),
      ("f1", _window(fresh, 5)), ("f2", _window(fresh, 0) + " w9"),
  ] + [(f"ub{i}", " ".join(words(150))) for i in range(3)]
  return {"A/part-0.jsonl": a0, "A/part-1.jsonl": a1,
          "B/part-0.jsonl": b0, "B/part-1.jsonl": b1}


def _write_corpora(root):
  for name, rows in _corpora().items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      for user_id, text in rows:
        f.write(json.dumps({"id": user_id, "text": text}) + "\n")


def _clusters(out):
  rows = []
  for path in sorted(glob.glob(os.path.join(out, "clusters", "*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      rows += [json.loads(line) for line in f]
  return rows


def _files(out, sub):
  found = {}
  for path in sorted(glob.glob(os.path.join(out, sub, "*"))):
    with open(path, "rb") as f:
      found[os.path.basename(path)] = f.read()
  return found


def _table(index_dir, kind):
  paths = sorted(glob.glob(os.path.join(index_dir, kind, "*.parquet")))
  rows = [r for p in paths for r in pq.read_table(p).to_pylist()]
  return sorted(rows, key=lambda r: (r.get("key", 0), r["doc_id"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A with an index; B against it (writing the updated index); A + B."""
  root = str(tmp_path_factory.mktemp("incremental"))
  _write_corpora(root)
  at = lambda *names: os.path.join(root, *names)  # pylint: disable=unnecessary-lambda-assignment
  codes = [
      cli.main(["--input", at("A", "*.jsonl"), "--output", at("out_a"),
                "--index_out", at("index_a")] + FLAGS),
      cli.main(["--input", at("B", "*.jsonl"), "--output", at("out_b"),
                "--against", at("index_a"), "--index_out", at("index_ab")]
               + FLAGS),
      cli.main(["--input", at("A", "*.jsonl") + "," + at("B", "*.jsonl"),
                "--output", at("out_all"), "--index_out", at("index_all")]
               + FLAGS),
  ]
  assert codes == [0, 0, 0]
  return at


def _removed(rows, first_id=0):
  return sorted(r["doc_id"] for r in rows
                if not r["kept"] and r["doc_id"] >= first_id)


@pytest.mark.e2e
def test_against_removes_what_the_whole_corpus_run_removes(runs):
  first_b = make_doc_id(2, 0)
  against = _removed(_clusters(runs("out_b")))
  whole = _removed(_clusters(runs("out_all")), first_b)
  assert against == whole
  # c2, r, g1, g2, l1 and two of f0, f1, f2.
  assert len(against) == 7
  b_parts = {n: b for n, b in _files(runs("out_all"), "deduped").items()
             if n.startswith(("part-00002", "part-00003"))}
  assert _files(runs("out_b"), "deduped") == b_parts


@pytest.mark.e2e
def test_clusters_name_the_indexed_document_matched(runs):
  rows = {r["id"]: r for r in _clusters(runs("out_b"))}
  a_docs = {r["doc_id"]: r for r in _table(runs("index_a"), "docs")}
  c2 = rows["c2"]
  # Matched only through c1, which A's run removed: the index holds it.
  assert c2["matched_indexed"] and c2["matched_id"] == "c1"
  assert not a_docs[c2["matched_doc_id"]]["kept"]
  assert c2["matched_source"] == runs("A", "part-0.jsonl")
  assert c2["matched_position"] == 2
  assert 0.8 <= c2["matched_jaccard"] < 1
  assert rows["l1"]["matched_id"] == "l0" and rows["l1"]["matched_jaccard"] == 1
  assert not rows["f1"]["matched_indexed"] and rows["f0"]["kept"]
  stats = json.load(open(runs("out_b", "stats.json"), encoding="utf-8"))
  assert stats["balanced"] and stats["removed"] == 7
  assert stats["clusters_with_index"] == 4


@pytest.mark.e2e
def test_updated_index_equals_the_index_of_the_whole_corpus(runs):
  for kind in ("keys", "docs"):
    updated, whole = _table(runs("index_ab"), kind), _table(
        runs("index_all"), kind)
    if kind == "docs":
      # Old entries keep the verdict of their own run: q is kept in A but
      # removed in A + B, where B's r joins it to p.
      for row in updated + whole:
        row.pop("kept")
    assert updated == whole
  manifest = json.load(open(runs("index_ab", "manifest.json"),
                            encoding="utf-8"))
  assert manifest["next_file_index"] == 4
  assert manifest["counts"]["index_docs"] == len(_table(runs("index_ab"),
                                                        "docs"))


@pytest.mark.e2e
def test_incompatible_or_missing_index_is_refused_before_the_job(
    runs, capsys):
  base = ["--input", runs("B", "*.jsonl"), "--output", runs("out_never")]
  assert cli.main(base + ["--against", runs("index_a"), "--ngram", "3"]
                  + FLAGS) == 2
  err = capsys.readouterr().err
  assert "built with ngram=5, this run has ngram=3; rerun with --ngram 5" in err
  assert cli.main(base + ["--against", runs("nowhere")] + FLAGS) == 2
  assert "no such folder" in capsys.readouterr().err
  assert cli.main(base + ["--against", runs("out_a")] + FLAGS) == 2
  assert "not an index (no manifest.json)" in capsys.readouterr().err
  assert not os.path.exists(runs("out_never"))


# --- without running the job --------------------------------------------------


def _manifest_index(tmp_path, files, **params):
  config = DedupConfig(**params)
  manifest = index_lib.build_manifest(
      job.effective_params(config, "auto", "text", "id"), files, 4, {}, {},
      "test")
  folder = tmp_path / "index"
  folder.mkdir()
  (folder / index_lib.MANIFEST_FILE).write_text(json.dumps(manifest))
  return str(folder)


def test_manifest_check_names_each_parameter_and_the_fix(tmp_path):
  folder = _manifest_index(tmp_path, [], seed=7, lowercase=False)
  index = index_lib.read_manifest(folder)
  params = job.effective_params(DedupConfig(), "auto", "text", "id")
  problems = index_lib.incompatibilities(index, params)
  assert len(problems) == 2
  assert ("built with seed=7, this run has seed=42; rerun with --seed 7"
          in problems[0])
  assert "lowercase=false, this run has lowercase=true" in problems[1]
  same = job.effective_params(DedupConfig(seed=7, lowercase=False,
                                          lsh_shards=3, keep="longest"),
                              "jsonl", "text", "id")
  assert index_lib.incompatibilities(index, same) == []


def test_manifest_format_and_version_are_checked(tmp_path):
  folder = _manifest_index(tmp_path, [])
  path = os.path.join(folder, index_lib.MANIFEST_FILE)
  manifest = json.load(open(path, encoding="utf-8"))
  for change, message in (({"format_version": 99}, "format version 99"),
                          ({"format": "other"}, "not a neardup index")):
    with open(path, "w", encoding="utf-8") as f:
      json.dump(dict(manifest, **change), f)
    with pytest.raises(index_lib.IndexFolderError, match=message):
      index_lib.read_manifest(folder)


def test_preflight_checks_indexed_files_and_index_out(tmp_path):
  data = tmp_path / "a.jsonl"
  data.write_text('{"text": "one two three"}\n')
  source = InputFile(0, str(data), "jsonl", data.stat().st_size)
  folder = _manifest_index(tmp_path, [source])
  params = job.effective_params(DedupConfig(), "auto", "text", "id")
  index, problems = check_index(folder, None, params, [])
  assert problems == [] and index.first_file == 1
  _, problems = check_index(folder, folder, params, [source])
  assert "already indexed" in problems[0]
  assert "is the --against index" in problems[1]
  data.write_text('{"text": "changed"}\n')
  _, problems = check_index(folder, str(tmp_path / "new"), params, [])
  assert len(problems) == 1 and "now has 20 bytes" in problems[0]
  data.unlink()
  _, problems = check_index(folder, str(tmp_path), params, [])
  assert "is missing" in problems[0]
  assert "already holds files" in problems[1]


def test_buckets_reaching_keeps_whole_buckets_with_a_new_document():
  keys = np.array([5, 5, 7, 7, 9], dtype=np.uint64)
  ids = np.array([1, 10, 2, 3, 11])
  assert lsh_kernels.buckets_reaching(keys, ids, 10).tolist() == [
      True, True, False, False, True]


def test_index_round_trip_through_shards():
  """WriteIndex's shards, read back by ReadIndex with another shard count,
  give every key and signature; the kept flags follow the clusters."""
  config = DedupConfig(num_perm=16, bands=4, rows=4, lsh_shards=4)
  rng = np.random.default_rng(3)
  ids = make_doc_id(0, np.arange(50))
  sigs = rng.integers(0, 1 << 32, (50, 16), dtype=np.uint64).astype(np.uint32)
  keys = lsh_kernels.band_keys(sigs, 4, 4, config.seed).ravel()
  key_ids = np.repeat(ids, 4)
  shards = lsh_kernels.shard_of(keys, 4)
  source = InputFile(0, "/data/a.jsonl", "jsonl", 1)
  params = job.effective_params(config, "auto", "text", "id")
  import tempfile  # pylint: disable=import-outside-toplevel
  folder = tempfile.mkdtemp(prefix="neardup-index-")
  with TestPipeline(runner="FnApiRunner") as p:
    inputs = {
        "keys": p | "Keys" >> beam.Create([
            (s, KeyShard.of(*parts)) for s, parts in lsh_kernels.split_by_shard(
                shards, keys, key_ids)]),
        "signatures": p | "Sigs" >> beam.Create(
            [SignatureBatch(ids[:20], sigs[:20]),
             SignatureBatch(ids[20:], sigs[20:])]),
        "clusters": p | "Clusters" >> beam.Create([cluster_columns(
            [(int(ids[3]), ClusterInfo(int(ids[2]), 2, False, int(ids[2])))])]),
        "users": p | "Users" >> beam.Create(
            [(int(i), f"u{n}") for n, i in enumerate(ids)]),
        "files": p | "Files" >> beam.Create([source]),
        "done": p | "Done" >> beam.Create([{}]),
    }
    _ = inputs | index_lib.WriteIndex(folder, config, params, [], "test")
  index = index_lib.read_manifest(folder)
  assert index.manifest["counts"] == {"index_docs": 50, "index_kept": 49,
                                      "index_keys": 200}
  docs = _table(folder, "docs")
  assert [d["id"] for d in docs[:3]] == ['"u0"', '"u1"', '"u2"']
  assert docs[3]["kept"] is False and docs[3]["position"] == 4
  assert docs[0]["source"] == "/data/a.jsonl"
  with TestPipeline(runner="FnApiRunner") as p:
    read = p | index_lib.ReadIndex(
        index, DedupConfig(num_perm=16, bands=4, rows=4, lsh_shards=3))
    got_keys = read["keys"] | "FlatKeys" >> beam.FlatMap(
        lambda e: [(e[0], int(k), int(i)) for k, i in zip(
            e[1].keys.view(np.int64), e[1].doc_ids())])
    assert_that(got_keys, equal_to([
        (int(s), int(k), int(i)) for s, k, i in zip(
            lsh_kernels.shard_of(keys, 3), keys.view(np.int64), key_ids)]),
                label="keys")
    got_sigs = read["signatures"] | "FlatSigs" >> beam.FlatMap(
        lambda b: [(int(i), tuple(s.tolist())) for i, s in zip(b.ids,
                                                               b.sigs)])
    assert_that(got_sigs, equal_to([
        (int(i), tuple(s.tolist())) for i, s in zip(ids, sigs)]),
                label="signatures")
