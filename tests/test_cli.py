"""End-to-end tests through the CLI's ``main(argv)`` on temporary files."""

import bz2
import collections
import glob
import gzip
import itertools
import json
import os
import pickle
import re

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from apache_beam.coders import coders

from pipeline.tools import truth
from pipeline.cli import main
from transforms.config import DedupConfig
from transforms.kernels.minhash import OPH_SCHEME
from tests.conftest import SAMPLE
from tests.corpus import (read_jsonl, seed_corpus, stats_of, tree_bytes,
                          write_jsonl)

pytestmark = pytest.mark.e2e

SEED_ARGS = ["--ngram", "3", "--num_perm", "128", "--bands", "32", "--rows",
             "4", "--threshold", "0.4"]


def run(tmp_path, inputs, *extra, name="out"):
  out = str(tmp_path / name)
  code = main(["--input", ",".join(map(str, inputs)), "--output", out,
               *extra])
  assert code == 0
  return out


def predicted_pairs(out):
  by_cluster = {}
  for row in read_jsonl(os.path.join(out, "clusters", "*.jsonl")):
    by_cluster.setdefault(row["cluster_id"], []).append(row["id"])
  pairs = set()
  for members in by_cluster.values():
    for a, b in itertools.combinations(sorted(members), 2):
      pairs.add((a, b))
  return pairs


@pytest.fixture(scope="module")
def seed_input(tmp_path_factory):
  texts, truth = seed_corpus()
  path = tmp_path_factory.mktemp("seed") / "corpus.jsonl"
  write_jsonl(path, texts, ids=list(range(len(texts))))
  return path, texts, truth


@pytest.mark.parametrize("verify", ["exact", "signature", "none"])
def test_seed_experiment_precision_and_recall(tmp_path, seed_input, verify):
  path, texts, truth = seed_input
  out = run(tmp_path, [path], *SEED_ARGS, "--verify", verify)
  predicted = predicted_pairs(out)
  tp = len(predicted & truth)
  precision = tp / len(predicted)
  recall = tp / len(truth)
  # Reference (from-scratch code in the method): precision 1.000, recall 0.954.
  assert precision >= 0.99, (precision, recall)
  assert recall >= 0.94, (precision, recall)
  stats = stats_of(out)
  assert stats["docs_in"] == len(texts)
  assert stats["kept"] + stats["removed"] + stats["rejected"] == len(texts)
  assert stats["removed"] == stats["clustered_docs"] - stats["clusters"]
  kept_rows = read_jsonl(os.path.join(out, "deduped", "*.jsonl"))
  assert len(kept_rows) == stats["kept"]
  # Lowest id is kept: the planted copy is removed, its original stays.
  kept_ids = {r["id"] for r in kept_rows}
  assert all(a in kept_ids for a, b in predicted & truth)


def test_oph_sketch_end_to_end(tmp_path, seed_input):
  # One-permutation signatures go through the unchanged LSH, verification
  # and components; 50-token documents with 3-grams leave most of the 128
  # bins empty, so this also exercises densification at scale.
  path, texts, truth = seed_input
  out = run(tmp_path, [path], *SEED_ARGS, "--sketch", "oph")
  predicted = predicted_pairs(out)
  tp = len(predicted & truth)
  precision, recall = tp / len(predicted), tp / len(truth)
  assert precision >= 0.99, (precision, recall)
  assert recall >= 0.94, (precision, recall)
  stats = stats_of(out)
  assert stats["kept"] + stats["removed"] + stats["rejected"] == len(texts)
  assert stats["params"]["sketch"] == "oph"
  assert stats["params"]["minhash_scheme"] == OPH_SCHEME


def test_outputs_are_byte_identical_across_runs_and_workers(tmp_path):
  texts, _ = seed_corpus(n_base=1500, seed=7)
  half = len(texts) // 2
  write_jsonl(tmp_path / "a.jsonl", texts[:half])
  write_jsonl(tmp_path / "b.jsonl", texts[half:])
  inputs = [tmp_path / "*.jsonl"]
  first = run(tmp_path, inputs, *SEED_ARGS, name="run1")
  second = run(tmp_path, inputs, *SEED_ARGS, name="run2")
  threads = run(tmp_path, inputs, *SEED_ARGS, "--direct_num_workers", "2",
                "--direct_running_mode", "multi_threading", name="run3")
  reference = tree_bytes(first)
  assert any(name.startswith("deduped/part-00001") for name in reference)
  assert stats_of(first)["clusters"] > 100
  assert tree_bytes(second) == reference
  assert tree_bytes(threads) == reference


def test_bad_records_are_rejected_with_reasons_and_counted(tmp_path):
  good = {"id": "g1", "text": "the quick brown fox jumps over the lazy dog"}
  lines = [
      json.dumps(good).encode(),
      b'{"id": "broken", "text": "unterminated',
      json.dumps({"id": "no-text", "body": "x"}).encode(),
      json.dumps({"id": "number", "text": 42}).encode(),
      b'{"id": "latin1", "text": "caf\xe9"}',
      b"",
      b"[1, 2, 3]",
      b'{"id": "surrogate", "text": "bad \\ud800 escape"}',
      json.dumps({"id": "empty1", "text": ""}).encode(),
      json.dumps({"id": "empty2", "text": "   \t "}).encode(),
      json.dumps({"id": "g2", "text": "The quick brown fox jumps over the "
                  "lazy dog!"}).encode(),
  ]
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b"\n".join(lines) + b"\n")
  out = run(tmp_path, [path])
  stats = stats_of(out)
  assert stats["docs_in"] == len(lines)
  assert stats["rejected"] == 7
  assert stats["balanced"]
  assert stats["kept"] + stats["removed"] + stats["rejected"] == len(lines)
  assert stats["docs_empty"] == 2
  reasons = {r["position"]: r["reason"].split(":")[0]
             for r in read_jsonl(os.path.join(out, "rejected", "*.jsonl"))}
  assert reasons == {2: "malformed_json", 3: "missing_text_field",
                     4: "text_not_string", 5: "invalid_utf8",
                     6: "blank_line", 7: "not_an_object", 8: "invalid_utf8"}
  assert stats["rejected_by_reason"] == {
      "malformed_json": 1, "missing_text_field": 1, "text_not_string": 1,
      "invalid_utf8": 2, "blank_line": 1, "not_an_object": 1}
  kept = [r["id"] for r in read_jsonl(os.path.join(out, "deduped", "*"))]
  # g2 differs from g1 only by case and punctuation: removed as duplicate.
  # The two empty documents are kept and never clustered together.
  assert kept == ["g1", "empty1", "empty2"]
  clusters = read_jsonl(os.path.join(out, "clusters", "*"))
  assert [(c["id"], c["kept"], c["cluster_size"]) for c in clusters] == [
      ("g1", True, 2), ("g2", False, 2)]


def test_deduped_jsonl_keeps_every_original_field_verbatim(tmp_path):
  lines = [
      '{"text": "alpha beta gamma delta epsilon zeta", "meta": {"k": [1, 2]},'
      ' "id": 7}',
      '{"id": 8, "text": "alpha beta gamma delta epsilon zeta", "x": null}',
      '{"id": 9,   "text": "something else entirely here today", "z": 1.50}',
  ]
  path = tmp_path / "in.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  out = run(tmp_path, [path])
  with open(os.path.join(out, "deduped", "part-00000-00000.jsonl"),
            encoding="utf-8") as f:
    assert f.read() == lines[0] + "\n" + lines[2] + "\n"


def test_text_and_parquet_inputs_round_trip_in_their_format(tmp_path):
  (tmp_path / "docs.txt").write_text(
      "one two three four five six seven\n"
      "One, two; three four five six seven.\n"
      "\n"
      "completely different words in this line\n", encoding="utf-8")
  table = pa.table({
      "doc": ["red green blue yellow orange purple", "unrelated text here x",
              "RED green blue yellow orange purple!"],
      "id": [10, 11, 12],
      "score": [0.5, 0.25, 0.125],
  })
  pq.write_table(table, tmp_path / "docs.parquet")
  out = run(tmp_path, [tmp_path / "docs.txt"], "--input_format", "text",
            name="text_out")
  with open(os.path.join(out, "deduped", "part-00000-00000.txt"),
            encoding="utf-8") as f:
    assert f.read() == ("one two three four five six seven\n\n"
                        "completely different words in this line\n")
  out = run(tmp_path, [tmp_path / "docs.parquet"], "--text_field", "doc",
            name="parquet_out")
  written = pq.read_table(os.path.join(out, "deduped",
                                       "part-00000-00000.parquet"))
  assert written.schema == table.schema
  assert written.to_pylist() == [table.to_pylist()[0], table.to_pylist()[1]]
  assert stats_of(out)["removed"] == 1


def test_keep_longest_keeps_the_longest_member(tmp_path):
  base = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do"
  write_jsonl(tmp_path / "in.jsonl",
              [base, base + " eiusmod", base + " eiusmod tempor"],
              ids=["short", "mid", "long"])
  out = run(tmp_path, [tmp_path / "in.jsonl"], "--keep", "longest",
            "--threshold", "0.5")
  kept = [r["id"] for r in read_jsonl(os.path.join(out, "deduped", "*"))]
  assert kept == ["long"]
  clusters = read_jsonl(os.path.join(out, "clusters", "*"))
  assert {c["cluster_id"] for c in clusters} == {0}


def test_argument_errors_exit_2_with_a_clear_message(tmp_path, capsys):
  write_jsonl(tmp_path / "in.jsonl", ["a b c"])
  out = str(tmp_path / "out")
  assert main(["--input", str(tmp_path / "in.jsonl"), "--output", out,
               "--bands", "64", "--rows", "4"]) == 2
  assert "--num_perm" in capsys.readouterr().err
  assert main(["--input", str(tmp_path / "nothing*.jsonl"), "--output",
               out]) == 2
  assert "No input files match" in capsys.readouterr().err
  assert main(["--input", str(tmp_path / "in.jsonl"), "--output", out]) == 0
  assert main(["--input", str(tmp_path / "in.jsonl"), "--output", out]) == 2
  assert "--overwrite" in capsys.readouterr().err


def test_missing_input_exits_2_and_other_pipelines_still_parse(capsys):
  assert main(["--output", "/tmp/unused"]) == 2
  assert "--input" in capsys.readouterr().err
  # DedupOptions is registered globally once imported: it must not make
  # unrelated pipelines (which parse every options class) fail.
  from apache_beam.options.pipeline_options import PipelineOptions
  PipelineOptions(["--runner", "FnApiRunner"]).get_all_options()


PLANTED = re.compile(r"/(v\d+|copy)$")


def test_bundled_sample_runs_as_in_the_readme(sample_run):
  stats = stats_of(sample_run)
  assert stats["balanced"] and stats["rejected"] == 3
  assert stats["clusters"] >= 20
  assert stats["params"]["bands"] * stats["params"]["rows"] <= 128


def _sample_documents():
  docs = {}
  for path in sorted(glob.glob(SAMPLE)):
    with open(path, encoding="utf-8") as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:
          continue  # the sample's malformed line
        if isinstance(row.get("text"), str):
          docs[row["id"]] = row["text"]
  return docs


def _jaccards(pairs):
  """True Jaccard of each (text, text) pair, shingled as the job does."""
  values, offsets = truth.shingle_sets([t for p in pairs for t in p],
                                       DedupConfig())
  sets = [set(values[offsets[i]:offsets[i + 1]].tolist())
          for i in range(len(offsets) - 1)]
  return [len(a & b) / len(a | b) for a, b in zip(sets[::2], sets[1::2])]


@pytest.mark.parametrize("threshold", [0.8, 0.4])
def test_sample_planted_copies_and_variants_cluster_with_their_original(
    tmp_path, sample_run, threshold):
  # data/sample/README.md: ids ending /copy are exact copies, /v1, /v2, ...
  # edited variants of the document named by the rest of the id. At the
  # default 0.8 each one at least that similar to its original must share
  # its cluster; at 0.4 (the most edited variant has J = 0.41) all must.
  docs = _sample_documents()
  planted = sorted(i for i in docs if PLANTED.search(i))
  assert len(planted) == 74 and sum(i.endswith("/copy") for i in planted) == 9
  out = sample_run if threshold == 0.8 else run(
      tmp_path, [SAMPLE], "--threshold", str(threshold))
  cluster = {r["id"]: r["cluster_id"]
             for r in read_jsonl(os.path.join(out, "clusters", "*.jsonl"))}
  jaccard = _jaccards([(docs[PLANTED.sub("", i)], docs[i]) for i in planted])
  similar = [i for i, j in zip(planted, jaccard) if j >= threshold]
  assert len(similar) == (57 if threshold == 0.8 else 74)
  apart = [i for i in similar
           if i not in cluster or cluster[i] != cluster.get(PLANTED.sub("", i))]
  assert not apart, apart


def _compress(path, suffix, data):
  if suffix == ".gz":
    data = gzip.compress(data, mtime=0)
  elif suffix == ".bz2":
    data = bz2.compress(data)
  elif suffix == ".zst":
    data = zstandard.ZstdCompressor().compress(data)
  with open(path, "wb") as f:
    f.write(data)


def _compressed_run(base, fmt, compression):
  """The job's outputs on the same corpus written as ``corpus.<fmt>`` plus
  ``compression``, the input's path replaced by ``<input>``."""
  texts, _ = seed_corpus(n_base=200, seed=3)
  if fmt == "jsonl":
    lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(texts)]
    lines[5:5] = ['{"id": "cut", "text": "unterminated', ""]
  else:
    lines = texts
  # Equally long paths: the write stage's shuffle bytes count the source's.
  folder = base / f"{fmt}{compression}".ljust(10, "_")
  folder.mkdir()
  path = folder / ("_" * (4 - len(compression)) + f"corpus.{fmt}{compression}")
  _compress(path, compression, ("\n".join(lines) + "\n").encode("utf-8"))
  # Uncompressed outputs (by default they would be compressed like the
  # input: tests/test_output_compression.py).
  out = run(folder, [path], *SEED_ARGS, "--output_compression", "none")
  stats = stats_of(out)
  assert stats["removed"] > 30 and stats["rejected"] == (
      2 if fmt == "jsonl" else 0)
  # Rows name their source file; the rest must be byte-identical.
  return {k: v.replace(str(path).encode(), b"<input>")
          for k, v in tree_bytes(out).items()}


@pytest.fixture(scope="module")
def uncompressed(tmp_path_factory):
  return {fmt: _compressed_run(tmp_path_factory.getbasetemp(), fmt, "")
          for fmt in ("jsonl", "txt")}


@pytest.mark.parametrize("fmt,suffix", [("jsonl", ".gz"), ("jsonl", ".bz2"),
                                        ("jsonl", ".zst"), ("txt", ".gz")])
def test_compressed_inputs_give_the_outputs_of_uncompressed_ones(
    tmp_path_factory, uncompressed, fmt, suffix):
  assert _compressed_run(tmp_path_factory.getbasetemp(), fmt,
                         suffix) == uncompressed[fmt]


@pytest.fixture
def pickled(monkeypatch):
  """The types of the values Beam's pickling coders encode from now on:
  PickleCoder and the like, also as FastPrimitivesCoder's fallback for a
  type it has no encoding of (a NamedTuple, a numpy array, a Counter).
  Every such coder gets a recording impl, cached impls included."""
  seen = collections.Counter()

  def dumps(value):
    seen[type(value).__name__] += 1
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

  real = coders.Coder.get_impl

  def get_impl(self):
    if isinstance(self, coders._PickleCoderBase):  # pylint: disable=protected-access
      return coders.coder_impl.CallbackCoderImpl(dumps, pickle.loads)
    return real(self)

  monkeypatch.setattr(coders.Coder, "get_impl", get_impl)
  return seen


def test_no_value_goes_through_a_pickling_coder(tmp_path, pickled):
  # The instrument sees what the fallback pickles.
  probe = beam.coders.FastPrimitivesCoder()
  probe.decode(probe.encode(collections.Counter(a=1)))
  assert pickled.pop("Counter") == 1 and not pickled
  run(tmp_path, [SAMPLE], name="plain")  # with rejected records
  run(tmp_path, [SAMPLE], "--verify", "signature", "--keep", "longest",
      "--annotate", "true", "--removal_list", "true", name="signature")
  files = sorted(glob.glob(SAMPLE))
  first, second = files[:1], files[1:]
  index = str(tmp_path / "index")
  run(tmp_path, first, "--index_out", index, name="indexed")
  run(tmp_path, second, "--against", index, name="against")
  assert not pickled, dict(pickled)
