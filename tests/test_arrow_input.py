"""Arrow IPC input (Feather v2 = IPC file format; Hugging Face
``datasets.save_to_disk`` = IPC stream format plus metadata files): read by
column, written back in the same flavour and schema; preflight sniffs it.
Fixtures are built with pyarrow directly (``datasets`` is not a dependency).
"""

import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.feather as feather
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from pipeline.preflight import check_inputs, dataset_patterns
from transforms import ClusterInfo, WriteResults
from transforms import read as read_module
from transforms.read import (Document, InputFile, Rejected, expand_inputs,
                             make_doc_id, read_file, read_texts)
from transforms.select import cluster_columns
from transforms.write import OutputOptions

HF_METADATA = {"huggingface": json.dumps({"info": {"features": {
    "id": {"dtype": "string"}, "text": {"dtype": "string"}}}})}


def _table(start, n, texts=None):
  return pa.table({
      "id": [f"u{r}" for r in range(start, start + n)],
      "text": texts or [f"text {r}" for r in range(start, start + n)],
      "blob": [b"x" * 100] * n,
  }).replace_schema_metadata(HF_METADATA)


def save_to_disk(folder, shards=2, rows=5):
  """What ``Dataset.save_to_disk`` writes: IPC stream shards, state.json
  listing them, dataset_info.json."""
  os.makedirs(folder)
  names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
  for i, name in enumerate(names):
    table = _table(i * rows, rows)
    with pa.OSFile(os.path.join(folder, name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
  with open(os.path.join(folder, "state.json"), "w") as f:
    json.dump({"_data_files": [{"filename": n} for n in names],
               "_fingerprint": "0", "_format_type": None}, f)
  with open(os.path.join(folder, "dataset_info.json"), "w") as f:
    json.dump({"features": {"text": {"dtype": "string"}}}, f)
  return [os.path.join(folder, n) for n in names]


def _write_ipc(path, table, flavour, chunk):
  """``table`` as an Arrow IPC file (Feather v2, LZ4) or stream."""
  if flavour == "file":
    feather.write_feather(table, path, chunksize=chunk)
    return
  with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(
      sink, table.schema) as writer:
    writer.write_table(table, max_chunksize=chunk)


def test_save_to_disk_folder_stands_for_its_data_files(tmp_path):
  folder = str(tmp_path / "ds")
  paths = save_to_disk(folder)
  assert dataset_patterns([folder, folder + "/", "x/*.jsonl"]) == (
      paths + paths + ["x/*.jsonl"])
  files, problems = check_inputs(dataset_patterns([folder]), "auto", "text")
  assert problems == [] and [f.format for f in files] == ["arrow", "arrow"]


def test_metadata_files_are_never_read_as_data(tmp_path):
  folder = str(tmp_path / "ds")
  save_to_disk(folder)
  _, problems = check_inputs([folder + "/*"], "auto", "text")
  assert sorted(p.split(":")[0] for p in problems) == [
      f"{folder}/dataset_info.json", f"{folder}/state.json"]
  assert all("Hugging Face datasets metadata, not data" in p
             and f"--input '{folder}/*.arrow'" in p for p in problems)


def test_dataset_dict_folder_says_which_pattern_to_use(tmp_path):
  root = tmp_path / "dd"
  save_to_disk(str(root / "train"))
  (root / "dataset_dict.json").write_text('{"splits": ["train"]}')
  _, problems = check_inputs([str(root)], "auto", "text")
  assert "DatasetDict" in problems[0]
  assert f"--input {root}/train" in problems[0]


def test_preflight_checks_magic_schema_and_flavour(tmp_path):
  good = str(tmp_path / "good.feather")
  feather.write_feather(_table(0, 3), good)  # LZ4-compressed file format
  renamed = str(tmp_path / "data.txt")
  feather.write_feather(_table(0, 3), renamed)
  fake = tmp_path / "fake.arrow"
  fake.write_bytes(b"id,text\n1,a\n")
  numeric = str(tmp_path / "numeric.arrow")
  feather.write_feather(pa.table({"text": [1, 2]}), numeric)
  _, problems = check_inputs([str(tmp_path / "*")], "auto", "text")
  by_file = {p.split(":")[0]: p for p in problems}
  assert good not in by_file
  assert "is an Arrow IPC file but would be read as text" in by_file[renamed]
  assert "--input_format arrow" in by_file[renamed]
  assert "is not an Arrow IPC file" in by_file[str(fake)]
  assert "column 'text' is int64, not string" in by_file[numeric]
  _, problems = check_inputs([good], "auto", "body")
  assert problems == [f"{good}: has no column 'body' (columns: id, text, "
                      "blob); pass --text_field with one of them"]
  _, problems = check_inputs([good], "auto", "text", annotate=True)
  assert problems == []


@pytest.mark.parametrize("flavour", ["stream", "file"])
def test_reads_documents_by_column(tmp_path, flavour, monkeypatch):
  path = str(tmp_path / f"in.{'arrow' if flavour == 'stream' else 'feather'}")
  _write_ipc(path, _table(0, 5, ["a", None, "c", "d", "e"]), flavour, 2)
  selected = []
  original = read_module._projected_batches

  def spy(path_, reader, columns=None):
    for batch in original(path_, reader, columns):
      selected.append(batch.schema.names)
      yield batch

  monkeypatch.setattr(read_module, "_projected_batches", spy)
  (source,) = expand_inputs([path])
  records = list(read_file(source, "text", "id"))
  assert records[0] == Document(0, "a", "u0", None)
  assert isinstance(records[1], Rejected)
  assert records[1][2:5] == (2, "text_not_string", "'text' is NoneType")
  assert [r.user_id for r in records if isinstance(r, Document)] == [
      "u0", "u2", "u3", "u4"]
  assert list(read_texts(source, [3, 0], "text")) == [(0, "a"), (3, "d")]
  # The blob column is never materialised for signing or verification.
  assert all("blob" not in names for names in selected) and selected


@pytest.mark.parametrize("flavour", ["stream", "file"])
def test_kept_rows_are_written_back_in_the_same_flavour(tmp_path, flavour):
  name = "data-00000-of-00001.arrow" if flavour == "stream" else "in.feather"
  path = str(tmp_path / name)
  table = _table(0, 6)
  _write_ipc(path, table, flavour, 4)
  files = [InputFile(0, path, "arrow", os.path.getsize(path))]
  kept = make_doc_id(0, 1)
  clusters = [(kept, ClusterInfo(kept, 2, True, kept)),
              (make_doc_id(0, 4), ClusterInfo(kept, 2, False, kept, kept,
                                              "u1", 0.9, 0.9))]
  out = str(tmp_path / "out")
  for options in (OutputOptions(), OutputOptions(annotate=True)):
    with TestPipeline(runner="FnApiRunner") as p:
      _ = ({"files": p | "Files" >> beam.Create(files),
            "clusters": p | "Clusters" >> beam.Create(
                [cluster_columns(clusters)]),
            "rejected": p | "Rejected" >> beam.Create([])}
           | WriteResults(out, "id", options))
  extension = name.rsplit(".", 1)[1]
  written = os.path.join(out, "deduped", f"part-00000-00000.{extension}")
  with open(written, "rb") as f:
    head = f.read(6)
  assert (head == b"ARROW1") == (flavour == "file")
  back = (pa.ipc.open_file(written) if flavour == "file"
          else pa.ipc.open_stream(written)).read_all()
  assert back.schema == table.schema
  assert back.schema.metadata == table.schema.metadata
  assert back.column("id").to_pylist() == ["u0", "u1", "u2", "u3", "u5"]
  annotated = os.path.join(out, "annotated", f"part-00000-00000.{extension}")
  back = (pa.ipc.open_file(annotated) if flavour == "file"
          else pa.ipc.open_stream(annotated)).read_all()
  assert back.num_rows == 6 and back.schema.metadata == table.schema.metadata
  assert back.column("dup_kept").to_pylist() == [True] * 4 + [False, True]


@pytest.mark.parametrize("extra,message", [
    (["--input", "x/*.arrow"], "convert Parquet or Arrow inputs"),
    (["--input", "x/*.jsonl", "--annotate"], "are batch-job flags"),
    (["--input", "x/*.jsonl", "--output_compression", "gzip"],
     "are batch-job flags"),
])
def test_streaming_refuses_arrow_inputs_and_batch_output_flags(extra,
                                                               message):
  from apache_beam.options.pipeline_options import PipelineOptions
  from pipeline import streaming
  options = PipelineOptions(extra + ["--output", "out", "--streaming"])
  with pytest.raises(ValueError, match=message):
    streaming.check_io(options)
