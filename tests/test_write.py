"""WriteResults: the write stage reads every input again, so no document
goes through a shuffle; parts, ids and accounting must match the read."""

import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms import ClusterInfo, WriteResults, metrics
from transforms import write as write_module
from transforms.read import InputFile, Rejected, make_doc_id


def _run(files, clusters, rejected, out):
  with TestPipeline(runner="FnApiRunner") as p:
    counts = ({"files": p | "Files" >> beam.Create(files),
               "clusters": p | "Clusters" >> beam.Create(clusters),
               "rejected": p | "Rejected" >> beam.Create(rejected)}
              | WriteResults(out)
              | beam.Filter(lambda kv: not metrics.is_timing(kv[0]))
              | beam.CombinePerKey(sum))
    # 4 cluster rows of 32 bytes; the rejection's 16 + source + reason.
    shuffled = 4 * 32 + 16 + len(rejected[0].source) + len("blank_line: x")
    assert_that(counts, equal_to([("kept", 7), ("removed", 3),
                                  ("rejected", 1), ("rejected_blank_line", 1),
                                  ("shuffle_bytes_write", shuffled)]))


def _inputs(path, fmt):
  files = [InputFile(0, path, fmt, os.path.getsize(path))]
  # Rows 1, 4, 5 and 9 form one cluster kept at row 1; row 7 is rejected.
  clusters = [(make_doc_id(0, r), ClusterInfo(make_doc_id(0, 1), 4, r == 1))
              for r in (1, 4, 5, 9)]
  rejected = [Rejected(make_doc_id(0, 7), path, 8, "blank_line", "x", "")]
  return files, clusters, rejected


def _lines(path):
  with open(path, "rb") as f:
    return f.read().splitlines()


@pytest.fixture
def small_parts(monkeypatch):
  monkeypatch.setattr(write_module, "PART_ROW_BITS", 2)


def test_jsonl_rows_land_in_their_parts(tmp_path, small_parts):
  path = str(tmp_path / "in.jsonl")
  lines = [json.dumps({"id": f"u{r}", "text": f"t{r}"}).encode()
           for r in range(11)]
  with open(path, "wb") as f:
    f.write(b"\n".join(lines) + b"\n")
  out = str(tmp_path / "out")
  _run(*_inputs(path, "jsonl"), out)
  deduped = {name: _lines(os.path.join(out, "deduped", name))
             for name in sorted(os.listdir(os.path.join(out, "deduped")))}
  assert deduped == {"part-00000-00000.jsonl": [lines[0], lines[1],
                                                lines[2], lines[3]],
                     "part-00000-00001.jsonl": [lines[6]],
                     "part-00000-00002.jsonl": [lines[8], lines[10]]}
  clusters = [json.loads(line) for name in sorted(os.listdir(
      os.path.join(out, "clusters"))) for line in _lines(
          os.path.join(out, "clusters", name))]
  assert [(c["id"], c["position"], c["kept"]) for c in clusters] == [
      ("u1", 2, True), ("u4", 5, False), ("u5", 6, False), ("u9", 10, False)]
  assert os.listdir(os.path.join(out, "rejected")) == [
      "part-00000-00001.jsonl"]


def test_parquet_rows_land_in_their_parts(tmp_path, small_parts):
  path = str(tmp_path / "in.parquet")
  table = pa.table({"id": [f"u{r}" for r in range(11)],
                    "text": [f"t{r}" for r in range(11)],
                    "n": list(range(11))})
  pq.write_table(table, path, row_group_size=3)
  out = str(tmp_path / "out")
  _run(*_inputs(path, "parquet"), out)
  parts = sorted(os.listdir(os.path.join(out, "deduped")))
  kept = [pq.read_table(os.path.join(out, "deduped", name)) for name in parts]
  assert [t.column("n").to_pylist() for t in kept] == [[0, 1, 2, 3], [6],
                                                       [8, 10]]
  assert all(t.schema == table.schema for t in kept)


def test_a_file_that_changed_since_it_was_read_fails_the_job(tmp_path):
  path = str(tmp_path / "in.jsonl")
  with open(path, "w") as f:
    f.write('{"text": "a"}\n')
  files, clusters, rejected = _inputs(path, "jsonl")
  with pytest.raises(Exception, match="changed while the job ran"):
    _run([files[0]._replace(size=files[0].size + 1)], clusters, rejected,
         str(tmp_path / "out1"))
  # Same size as matched, but fewer rows than the clustered ids refer to.
  with pytest.raises(Exception, match="fewer rows than when it was read"):
    _run(files, clusters, rejected, str(tmp_path / "out2"))
