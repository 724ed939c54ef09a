"""End to end through the CLI: a Hugging Face ``save_to_disk`` folder, a
Feather file and a gzipped JSONL file in one run with ``--annotate
--removal_list``; a nested JSONL text field; refusals before the start."""

import glob
import gzip
import json
import os

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.corpus import seed_corpus, stats_of
from tests.test_arrow_input import HF_METADATA
from transforms import annotate
from transforms.finalize import read_success

ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold", "0.4"]


def _write_stream(path, table):
  with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(
      sink, table.schema) as writer:
    writer.write_table(table, max_chunksize=16)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
  """120 seed-style texts (planted pairs) split over two save_to_disk
  shards, a Feather file and a .jsonl.gz; pairs cross the files."""
  base = tmp_path_factory.mktemp("eco")
  texts, planted = seed_corpus(n_base=90, seed=11)
  ids = [f"d{i}" for i in range(len(texts))]
  cut = [0, len(texts) // 4, len(texts) // 2, 3 * len(texts) // 4,
         len(texts)]
  folder = base / "ds"
  folder.mkdir()
  shards = []
  for k in range(2):
    table = pa.table({"id": ids[cut[k]:cut[k + 1]],
                      "text": texts[cut[k]:cut[k + 1]]}
                     ).replace_schema_metadata(HF_METADATA)
    name = f"data-{k:05d}-of-00002.arrow"
    _write_stream(str(folder / name), table)
    shards.append(name)
  (folder / "state.json").write_text(json.dumps(
      {"_data_files": [{"filename": n} for n in shards]}))
  (folder / "dataset_info.json").write_text('{"features": {}}')
  feather.write_feather(pa.table({"id": ids[cut[2]:cut[3]],
                                  "text": texts[cut[2]:cut[3]]}),
                        str(base / "more.feather"))
  lines = [json.dumps({"id": i, "text": t}).encode()
           for i, t in zip(ids[cut[3]:], texts[cut[3]:])]
  # A copy of the first shard's first text: a cluster across formats.
  lines.append(json.dumps({"id": 7, "text": texts[0]}).encode())
  ids.append(7)
  (base / "rest.jsonl.gz").write_bytes(
      gzip.compress(b"\n".join(lines) + b"\n", mtime=0))
  out = str(base / "out")
  assert main(["--input", f"{folder},{base}/*.feather,{base}/*.jsonl.gz",
               "--output", out, "--annotate", "--removal_list", "true",
               *ARGS]) == 0
  return out, len(ids), planted, ids


def _annotated_rows(out):
  rows = []
  for path in sorted(glob.glob(os.path.join(out, "annotated", "*"))):
    if path.endswith(".jsonl.gz"):
      with gzip.open(path) as f:
        rows.extend(json.loads(line) for line in f)
    else:
      with open(path, "rb") as f:
        flavour_file = f.read(6) == b"ARROW1"
      reader = (pa.ipc.open_file(path) if flavour_file
                else pa.ipc.open_stream(path))
      rows.extend(reader.read_all().to_pylist())
  return rows


@pytest.mark.e2e
def test_annotated_output_keeps_every_document_of_every_format(mixed_run):
  out, n, planted, ids = mixed_run
  stats = stats_of(out)
  assert stats["docs_in"] == n and stats["rejected"] == 0
  assert stats["params"]["annotate"] is True
  assert sorted(os.listdir(os.path.join(out, "annotated"))) == [
      "part-00000-00000.arrow", "part-00001-00000.arrow",
      "part-00002-00000.feather", "part-00003-00000.jsonl.gz"]
  assert not os.path.exists(os.path.join(out, "deduped"))
  rows = _annotated_rows(out)
  assert [r["id"] for r in rows] == ids
  assert sum(r["dup_kept"] for r in rows) == stats["kept"]
  assert sum(not r["dup_kept"] for r in rows) == stats["removed"] > 20
  by_doc = {r["dup_doc_id"]: r for r in rows}
  for r in rows:
    if r["dup_cluster_id"] is None:
      assert (r["dup_cluster_size"], r["dup_kept"]) == (1, True)
    else:
      kept = by_doc[r["dup_kept_doc_id"]]
      assert kept["dup_kept"] and kept["dup_cluster_id"] == r[
          "dup_cluster_id"]
    if not r["dup_kept"]:
      assert by_doc[r["dup_matched_doc_id"]]["id"] == r["dup_matched_id"]
      assert r["dup_matched_jaccard"] >= 0.4
  together = sum(rows[a]["dup_cluster_id"] is not None and rows[a][
      "dup_cluster_id"] == rows[b]["dup_cluster_id"] for a, b in planted)
  assert together >= 0.9 * len(planted)
  # The JSONL copy of the first Arrow row is removed in favour of it.
  assert (rows[-1]["dup_kept"], rows[-1]["dup_kept_doc_id"],
          rows[-1]["dup_matched_id"], rows[-1]["dup_jaccard_to_kept"]) == (
              False, rows[0]["dup_doc_id"], "d0", 1.0)
  arrow_part = os.path.join(out, "annotated", "part-00000-00000.arrow")
  schema = pa.ipc.open_stream(arrow_part).schema
  assert schema.metadata == {k.encode(): v.encode()
                             for k, v in HF_METADATA.items()}
  assert schema.names == ["id", "text"] + list(annotate.FIELDS)
  with open(os.path.join(out, "annotated", "part-00003-00000.jsonl.gz"),
            "rb") as f:
    assert f.read(8)[4:8] == b"\0\0\0\0"  # gzip mtime 0


@pytest.mark.e2e
def test_removal_list_matches_the_annotations_and_success(mixed_run):
  out, _, _, _ = mixed_run
  removed = pq.read_table(os.path.join(out, "removed")).to_pylist()
  rows = _annotated_rows(out)
  dropped = [r for r in rows if not r["dup_kept"]]
  assert [r["doc_id"] for r in removed] == [r["dup_doc_id"] for r in dropped]
  assert [r["cluster_id"] for r in removed] == [r["dup_cluster_id"]
                                                for r in dropped]
  # The JSONL file's integer ids become strings, the Arrow ones stay.
  assert [r["id"] for r in removed] == [str(r["id"]) for r in dropped]
  assert all(r["source"].endswith((".arrow", ".feather", ".jsonl.gz"))
             and r["position"] >= 1 for r in removed)
  success = read_success(out)
  assert success["counts"]["removed"] == len(removed)
  assert {name.split("/")[0] for name in success["files"]} == {
      "annotated", "clusters", "removed", "stats.json"}


@pytest.mark.e2e
def test_nested_text_field(tmp_path):
  texts, planted = seed_corpus(n_base=40, seed=4)
  path = tmp_path / "nested.jsonl"
  records = [{"meta": {"body": t, "uid": f"n{i}"}} for i, t in
             enumerate(texts)]
  records[3] = {"meta": {"title": "no body"}}
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
  out = str(tmp_path / "out")
  assert main(["--input", str(path), "--output", out, "--text_field",
               "meta.body", "--id_field", "meta.uid", *ARGS]) == 0
  stats = stats_of(out)
  assert stats["rejected_by_reason"] == {"missing_text_field": 1}
  (rejected,) = [json.loads(line) for line in open(
      glob.glob(os.path.join(out, "rejected", "*"))[0])]
  assert rejected["reason"] == ("missing_text_field: no 'meta.body' field"
                                " ('meta' has no 'body')")
  clusters = [json.loads(line) for p in glob.glob(
      os.path.join(out, "clusters", "*")) for line in open(p)]
  assert stats["removed"] >= 0.9 * len(planted) - 1
  assert all(c["id"].startswith("n") for c in clusters)
  assert all(c["matched_id"].startswith("n") for c in clusters
             if not c["kept"])


@pytest.mark.e2e
def test_annotate_refusals_before_the_start(tmp_path, capsys):
  text = tmp_path / "plain.txt"
  text.write_text("one line\n")
  table = tmp_path / "t.parquet"
  pq.write_table(pa.table({"text": ["a"], "dup_kept": [True]}), str(table))
  code = main(["--input", f"{text},{table}", "--output",
               str(tmp_path / "out"), "--annotate"])
  err = capsys.readouterr().err
  assert code == 2
  assert f"{text}: --annotate adds fields to each row" in err
  assert f"{table}: already has the column 'dup_kept'" in err
  assert not os.path.exists(tmp_path / "out")
