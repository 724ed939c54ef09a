"""WriteResults: the write stage reads every input again, so no document
goes through a shuffle; parts, ids and accounting must match the read."""

import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms import ClusterInfo, WriteResults, metrics
from transforms import write as write_module
from transforms.read import InputFile, Rejected, make_doc_id
from transforms.select import cluster_columns


def _run(files, clusters, rejected, out):
  with TestPipeline(runner="FnApiRunner") as p:
    counts = ({"files": p | "Files" >> beam.Create(files),
               "clusters": p | "Clusters" >> beam.Create(
                   [cluster_columns(clusters)] if clusters else []),
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


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(user_id=_JSON_VALUES, matched_id=_JSON_VALUES,
       numbers=st.lists(st.one_of(st.none(), st.integers(0, 2**62)),
                        min_size=4, max_size=4),
       similarities=st.lists(st.one_of(
           st.none(), st.floats(0, 1), st.floats(allow_nan=True,
                                                 allow_infinity=True)),
           min_size=2, max_size=2),
       flags=st.lists(st.booleans(), min_size=2, max_size=2),
       row=st.integers(0, 2**20), path=st.text(max_size=10),
       indexed=st.booleans())
def test_cluster_lines_are_the_json_of_the_row_dict(
    user_id, matched_id, numbers, similarities, flags, row, path, indexed):
  """The directly formatted clusters/ line is byte for byte what the JSON
  encoder writes for the row's dict, whatever the values' types."""
  cluster_id, size, kept_doc, matched_doc = numbers
  info = ClusterInfo(cluster_id, size, flags[0], kept_doc, matched_doc,
                     matched_id, *similarities, flags[1])
  files = {0: "old.jsonl"} if indexed else None
  doc_id = make_doc_id(3, row)
  expected = {
      "doc_id": doc_id, "id": user_id, "cluster_id": cluster_id,
      "cluster_size": size, "kept": flags[0], "source": path,
      "position": row + 1, "kept_doc_id": kept_doc,
      "matched_doc_id": matched_doc, "matched_id": matched_id,
      "matched_jaccard": write_module.annotate.rounded(similarities[0]),
      "jaccard_to_kept": write_module.annotate.rounded(similarities[1]),
      "chain_kept": flags[1]}
  if indexed:
    expected.update(write_module._matched_in_index(matched_doc, files))  # pylint: disable=protected-access
  (line,) = write_module._cluster_lines(3, [(row, info)], {row: user_id},  # pylint: disable=protected-access
                                        path, files)
  assert line == write_module.annotate.json_text(expected).encode("utf-8")


@pytest.mark.parametrize("value", [np.int64(7), np.float64(0.25),
                                   np.bool_(True), 2**70, -0.0, 1e-7])
def test_json_scalar_writes_what_the_encoder_writes(value):
  assert write_module.json_scalar(value) == write_module.annotate.json_text(
      value)
