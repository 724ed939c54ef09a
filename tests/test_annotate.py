"""--annotate and --removal_list: the annotated output keeps every document
(JSONL lines byte for byte plus the added fields, Parquet rows plus columns)
and removed/ lists exactly the removed documents, on the write stage."""

import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms import ClusterInfo, WriteResults, metrics
from transforms import annotate
from transforms.read import InputFile, Rejected, make_doc_id
from transforms.select import cluster_columns
from transforms.write import OutputOptions

UNIQUE = [None, 1, True, None, None, None, None, None, False]


def _run(files, clusters, rejected, out, options, expected=None):
  with TestPipeline(runner="FnApiRunner") as p:
    counts = ({"files": p | "Files" >> beam.Create(files),
               "clusters": p | "Clusters" >> beam.Create(
                   [cluster_columns(clusters)] if clusters else []),
               "rejected": p | "Rejected" >> beam.Create(rejected)}
              | WriteResults(out, "id", options)
              | beam.Filter(lambda kv: kv[0] in ("kept", "removed",
                                                 "rejected"))
              | beam.CombinePerKey(sum))
    if expected is not None:
      assert_that(counts, equal_to(expected))


def _clusters(index=0):
  """Rows 1, 4 and 5 form a cluster kept at row 1; 5 is explained by 4."""
  kept = make_doc_id(index, 1)
  return [
      (kept, ClusterInfo(kept, 3, True, kept)),
      (make_doc_id(index, 4), ClusterInfo(kept, 3, False, kept, kept, "u1",
                                          0.91234567, 0.91234567)),
      (make_doc_id(index, 5), ClusterInfo(kept, 3, False, kept,
                                          make_doc_id(index, 4), "u4", 0.95,
                                          0.85)),
  ]


LINES = [b'{"id": "u0", "text": "t0"}\n',
         b'{"id":"u1","text":"t1"}\r\n',
         b'{ "id" : "u2" , "text" : "t2" }   \n',
         b'not json\n',
         b'{"id": "u4", "text": "t4", "m": {"a": [1, {}]}}\n',
         b'{"text": "t5", "id": "u5"}']


def _jsonl(tmp_path):
  path = str(tmp_path / "in.jsonl")
  lines = [b"\xef\xbb\xbf" + LINES[0], LINES[1]] + LINES[2:]
  with open(path, "wb") as f:
    f.write(b"".join(lines))
  files = [InputFile(0, path, "jsonl", os.path.getsize(path))]
  rejected = [Rejected(make_doc_id(0, 3), path, 4, "malformed_json", "x",
                       "not json")]
  return files, lines, rejected


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("annotate")
  files, lines, rejected = _jsonl(tmp_path)
  out = str(tmp_path / "out")
  _run(files, _clusters(), rejected, out,
       OutputOptions(annotate=True, removal_list=True),
       [("kept", 3), ("removed", 2), ("rejected", 1)])
  return out, files[0].path, lines, (files, rejected)


def test_annotated_jsonl_keeps_every_document_byte_for_byte(jsonl_run):
  out, _, lines, _ = jsonl_run
  assert sorted(os.listdir(out)) == ["annotated", "clusters", "rejected",
                                     "removed"]
  with open(os.path.join(out, "annotated", "part-00000-00000.jsonl"),
            "rb") as f:
    written = f.read().split(b"\n")[:-1]
  kept_rows = [0, 1, 2, 4, 5]
  assert len(written) == len(kept_rows)
  for row, line in zip(kept_rows, written):
    original = lines[row].rstrip(b"\n").rstrip(b"\r")
    closing = original.rstrip().rindex(b"}")
    # Everything before the closing brace and after it is unchanged.
    assert line.startswith(original[:closing].rstrip())
    assert line.endswith(original[closing:] + (b"\r" if row == 1 else b""))
  parsed = [json.loads(line) for line in written]
  assert [r["id"] for r in parsed] == ["u0", "u1", "u2", "u4", "u5"]
  assert parsed[3]["m"] == {"a": [1, {}]}
  by_id = {r["id"]: [r[f] for f in annotate.FIELDS] for r in parsed}
  kept = make_doc_id(0, 1)
  assert by_id["u0"] == [make_doc_id(0, 0)] + UNIQUE
  assert by_id["u2"] == [make_doc_id(0, 2)] + UNIQUE
  assert by_id["u1"] == [kept, kept, 3, True, kept, None, None, None, None,
                         False]
  assert by_id["u4"] == [make_doc_id(0, 4), kept, 3, False, kept, kept, "u1",
                         0.912346, 0.912346, False]
  assert by_id["u5"] == [make_doc_id(0, 5), kept, 3, False, kept,
                         make_doc_id(0, 4), "u4", 0.95, 0.85, False]


def test_removal_list_names_every_removed_document(jsonl_run):
  out, path, _, _ = jsonl_run
  table = pq.read_table(os.path.join(out, "removed",
                                     "part-00000-00000.parquet"))
  assert table.schema == annotate.removal_schema(pa.string())
  kept = make_doc_id(0, 1)
  assert table.to_pylist() == [
      {"id": "u4", "source": path, "position": 5, "doc_id": make_doc_id(0, 4),
       "cluster_id": kept, "cluster_size": 3, "kept_doc_id": kept,
       "matched_doc_id": kept, "matched_id": "u1",
       "matched_jaccard": 0.912346, "jaccard_to_kept": 0.912346},
      {"id": "u5", "source": path, "position": 6, "doc_id": make_doc_id(0, 5),
       "cluster_id": kept, "cluster_size": 3, "kept_doc_id": kept,
       "matched_doc_id": make_doc_id(0, 4), "matched_id": "u4",
       "matched_jaccard": 0.95, "jaccard_to_kept": 0.85}]


def test_outputs_are_deterministic_and_default_is_deduped(jsonl_run,
                                                          tmp_path):
  out, _, _, (files, rejected) = jsonl_run
  again = str(tmp_path / "again")
  _run(files, _clusters(), rejected, again,
       OutputOptions(annotate=True, removal_list=True))
  for name in ("annotated/part-00000-00000.jsonl",
               "removed/part-00000-00000.parquet"):
    with open(os.path.join(out, name), "rb") as a, open(
        os.path.join(again, name), "rb") as b:
      assert a.read() == b.read(), name
  plain = str(tmp_path / "plain")
  _run(files, _clusters(), rejected, plain, OutputOptions(),
       [("kept", 3), ("removed", 2), ("rejected", 1)])
  assert sorted(os.listdir(plain)) == ["clusters", "deduped", "rejected"]


def test_annotated_parquet_adds_typed_columns(tmp_path):
  path = str(tmp_path / "in.parquet")
  table = pa.table({"id": pa.array(range(7), pa.int32()),
                    "text": [f"t{r}" for r in range(6)] + [None]}
                   ).replace_schema_metadata({"origin": "test"})
  pq.write_table(table, path, row_group_size=3)
  files = [InputFile(0, path, "parquet", os.path.getsize(path))]
  clusters = [(d, info._replace(matched_id=None if info.matched_id is None
                                else int(info.matched_id[1:])))
              for d, info in _clusters()]
  rejected = [Rejected(make_doc_id(0, 6), path, 7, "text_not_string", "x",
                       "")]
  out = str(tmp_path / "out")
  _run(files, clusters, rejected, out,
       OutputOptions(annotate=True, removal_list=True),
       [("kept", 4), ("removed", 2), ("rejected", 1)])
  written = pq.read_table(os.path.join(out, "annotated",
                                       "part-00000-00000.parquet"))
  assert written.schema.names == ["id", "text"] + list(annotate.FIELDS)
  assert written.schema.metadata[b"origin"] == b"test"
  assert written.schema.field("dup_matched_id").type == pa.int32()
  assert written.column("id").to_pylist() == list(range(6))
  assert written.column("dup_kept").to_pylist() == [True, True, True, True,
                                                    False, False]
  assert written.column("dup_cluster_size").to_pylist() == [1, 3, 1, 1, 3, 3]
  assert written.column("dup_matched_id").to_pylist() == [None] * 4 + [1, 4]
  removed = pq.read_table(os.path.join(out, "removed"))
  assert removed.schema.field("id").type == pa.int32()
  assert removed.column("id").to_pylist() == [4, 5]


def test_annotate_refuses_a_row_that_has_the_field(tmp_path):
  line = b'{"text": "a", "dup_kept": 1}'
  with pytest.raises(annotate.AnnotationConflictError,
                     match="f: row 3 already has the field 'dup_kept'"):
    annotate.annotate_line(line, [0] + UNIQUE, "f: row 3")
  # Only top-level keys conflict; a nested one or a value mentioning it not.
  for fine in (b'{"text": "\\"dup_kept\\""}', b'{"m": {"dup_kept": 1}}'):
    assert json.loads(annotate.annotate_line(fine, [0] + UNIQUE, "f"))[
        "dup_kept"] is True


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=6).filter(
    lambda k: k not in annotate.FIELDS), _JSON, max_size=4),
       spaces=st.sampled_from(["", " ", "\t "]),
       ending=st.sampled_from(["", "\n", "\r\n"]),
       indent=st.sampled_from([None, 0]), ascii_only=st.booleans())
def test_annotated_line_parses_to_the_object_plus_the_fields(
    obj, spaces, ending, indent, ascii_only):
  body = json.dumps(obj, ensure_ascii=ascii_only,
                    separators=(",", ":") if indent == 0 else None)
  line = (body + spaces + ending).encode("utf-8")
  values = [7, 3, 2, False, 3, 3, "u\u00e9", 0.5, 0.5, False]
  annotated = annotate.annotate_line(line, values, "f")
  assert annotated.endswith(ending.encode())
  assert annotated.startswith(body.encode("utf-8")[:-1].rstrip())
  assert json.loads(annotated) == {**obj, **dict(zip(annotate.FIELDS,
                                                     values))}
