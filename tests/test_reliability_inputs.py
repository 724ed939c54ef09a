"""Reliability, round two (issue 26): inputs are read whole or the run fails
naming the file. One test per defect of the issue, named after it."""

import glob
import json
import os
import re

import pyarrow as pa
import pytest

from pipeline.preflight import check_inputs, dataset_patterns
from tests.corpus import stats_of
from tests.test_arrow_input import _table, save_to_disk
from tests.test_reliability import cli, jsonl_bytes, outputs
from transforms import read as read_module
from transforms.finalize import SUCCESS_FILE
from transforms.read import (InputChangedError, InputFile, InputReadError,
                             check_unchanged, expand_inputs, parse_json_line,
                             read_file)

pytestmark = pytest.mark.e2e

DEEP = 100_000


def _stream_bytes(table, chunk):
  sink = pa.BufferOutputStream()
  with pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table, max_chunksize=chunk)
  return sink.getvalue().to_pybytes()


def _rows(out, folder):
  """The JSON rows of every file of ``out/folder``."""
  rows = []
  for path in sorted(glob.glob(os.path.join(out, folder, "*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      rows.extend(json.loads(line) for line in f)
  return rows


# --- 2. short reads of Arrow inputs -----------------------------------------

def test_arrow_stream_cut_at_a_batch_boundary_fails_naming_the_file(
    tmp_path, capsys):
  table = _table(0, 400)
  whole = _stream_bytes(table, 100)
  # What a closed writer (and datasets.save_to_disk) ends a stream with.
  assert whole[-8:] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
  half = _stream_bytes(table.slice(0, 200), 100)
  cut = whole[:len(half) - 8]
  assert whole.startswith(cut)
  # pyarrow reads such a stream as if it ended there.
  assert pa.ipc.open_stream(cut).read_all().num_rows == 200
  path = tmp_path / "data-00000-of-00001.arrow"
  path.write_bytes(cut)
  code, err = cli(capsys, "--input", path, "--output", tmp_path / "out")
  assert code == 2, err
  assert err.startswith(f"error: {path}: cannot be read to its end")
  assert "end-of-stream marker" in err and len(err.splitlines()) == 1
  assert not os.path.exists(tmp_path / "out")
  # The job's reader (the file cut after the pre-flight) fails the same way.
  source = InputFile(0, str(path), "arrow", len(cut))
  with pytest.raises(InputReadError, match=re.escape(f"{path}: cannot be "
                                                     "read to its end")):
    list(read_file(source))


def test_save_to_disk_folder_with_a_missing_shard_fails_naming_it(
    tmp_path, capsys):
  folder = str(tmp_path / "ds")
  paths = save_to_disk(folder, shards=3)
  os.remove(paths[1])
  code, err = cli(capsys, "--input", folder, "--output", tmp_path / "out")
  assert code == 2, err
  assert err.strip() == (
      f"error: {paths[1]}: listed in {folder}/state.json but missing; restore"
      " it (an incomplete copy?) or give the files that are there, e.g."
      f" --input '{folder}/*.arrow'")
  assert not os.path.exists(tmp_path / "out")


def _state(folder, names):
  with open(os.path.join(folder, "state.json"), "w") as f:
    json.dump({"_data_files": names, "_fingerprint": "0"}, f)


@pytest.mark.parametrize("entry,shown", [
    ({"filename": "../outside.arrow"}, "'../outside.arrow'"),
    ({"filename": "sub/data.arrow"}, "'sub/data.arrow'"),
    ({"filename": ".."}, "'..'"), ({"filename": ""}, "''"),
    ({"filename": 5}, "5"), ({"name": "x"}, "{'name': 'x'}"),
    ("data-00001-of-00002.arrow", "'data-00001-of-00002.arrow'")])
def test_state_json_entries_must_name_files_in_the_folder(
    tmp_path, capsys, entry, shown):
  folder = str(tmp_path / "ds")
  paths = save_to_disk(folder)
  # Files that such entries would reach.
  os.rename(paths[1], tmp_path / "outside.arrow")
  os.makedirs(os.path.join(folder, "sub"))
  with open(os.path.join(folder, "sub", "data.arrow"), "wb") as f:
    f.write(_stream_bytes(_table(0, 3), 2))
  _state(folder, [{"filename": os.path.basename(paths[0])}, entry])
  code, err = cli(capsys, "--input", folder, "--output", tmp_path / "out")
  assert code == 2, err
  assert err.strip() == (
      f"error: {folder}/state.json: lists {shown} in _data_files, not a"
      " file name in the folder; fix it or give the data files, e.g."
      f" --input '{folder}/*.arrow'")


def test_state_json_file_names_are_names_not_globs(tmp_path, capsys):
  folder = str(tmp_path / "ds")
  paths = save_to_disk(folder)
  _state(folder, [{"filename": "data-*.arrow"}])
  code, err = cli(capsys, "--input", folder, "--output", tmp_path / "out")
  assert code == 2
  assert err.startswith(f"error: {folder}/data-*.arrow: listed in {folder}/"
                        "state.json but missing")
  # A name with glob characters stands for that one file only.
  literal = os.path.join(folder, "data-[0].arrow")
  with open(literal, "wb") as f:
    f.write(_stream_bytes(_table(100, 4), 2))
  # What the name read as a glob would match instead.
  os.rename(paths[0], os.path.join(folder, "data-0.arrow"))
  _state(folder, [{"filename": "data-[0].arrow"}])
  files, problems = check_inputs(dataset_patterns([folder]), "auto", "text")
  assert problems == [] and [f.path for f in files] == [literal]
  out = tmp_path / "out"
  code, err = cli(capsys, "--input", folder, "--output", out)
  assert code == 0, err
  assert stats_of(out)["docs_in"] == 4
  # Written back as a whole stream: readable as an input in turn.
  with read_module.open_arrow(str(out / "deduped" / "part-00000-00000.arrow")
                              ) as (back, _):
    assert back.read_all().column("id").to_pylist() == [
        "u100", "u101", "u102", "u103"]


# --- 3. deeply nested JSON --------------------------------------------------

DEEP_LINES = {
    "text": b'{"text": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "line": b"[" * DEEP + b"]" * DEEP,
    "other field": b'{"text": "a b c", "meta": ' + b"{\"a\": " * DEEP
                   + b"1" + b"}" * DEEP + b"}",
}


@pytest.mark.parametrize("where", sorted(DEEP_LINES))
def test_deeply_nested_json_line_is_a_malformed_json_rejection(where):
  rejected = parse_json_line(7, "a.jsonl", 3, DEEP_LINES[where], "text",
                             "id")
  assert rejected.reason == "malformed_json", rejected
  assert rejected.detail.startswith("nesting too deep")
  assert (rejected.doc_id, rejected.source, rejected.position) == (
      7, "a.jsonl", 4)


def test_deeply_nested_json_is_rejected_in_the_job_and_the_preflight(
    tmp_path, capsys):
  deep = b"\n".join(DEEP_LINES[k] for k in sorted(DEEP_LINES)) + b"\n"
  # In the pre-flight's sample, and beyond it.
  (tmp_path / "early.jsonl").write_bytes(jsonl_bytes(5) + deep)
  (tmp_path / "late.jsonl").write_bytes(jsonl_bytes(150, 5) + deep)
  assert check_inputs([str(tmp_path / "*.jsonl")], "auto", "text")[1] == []
  out = tmp_path / "out"
  code, err = cli(capsys, "--input", tmp_path / "*.jsonl", "--output", out)
  assert code == 0, err
  stats = stats_of(out)
  assert stats["docs_in"] == 155 + 6 and stats["rejected"] == 6
  assert stats["rejected_by_reason"] == {"malformed_json": 6}
  rejected = _rows(out, "rejected")
  assert len(rejected) == 6
  assert all(r["reason"].startswith("malformed_json: nesting too deep")
             for r in rejected), rejected
  assert sorted((os.path.basename(r["source"]), r["position"])
                for r in rejected) == [
      ("early.jsonl", 6), ("early.jsonl", 7), ("early.jsonl", 8),
      ("late.jsonl", 151), ("late.jsonl", 152), ("late.jsonl", 153)]


def test_deeply_nested_json_never_crashes_the_preflight(tmp_path, capsys):
  only = tmp_path / "deep.jsonl"
  only.write_bytes(DEEP_LINES["line"] + b"\n")
  found = check_inputs([str(only)], "auto", "text")[1]
  assert len(found) == 1 and found[0].startswith(
      f"{only}: none of its first 1 lines is a JSON object")
  # Metadata and state.json are JSON the pre-flight reads too.
  (tmp_path / "state.json").write_bytes(DEEP_LINES["line"])
  assert check_inputs([str(tmp_path / "state.json")], "auto", "text")[1][
      0].startswith(f"{tmp_path}/state.json: none of its first 1 lines")
  folder = tmp_path / "ds"
  save_to_disk(str(folder))
  (folder / "state.json").write_bytes(DEEP_LINES["line"])
  code, err = cli(capsys, "--input", folder, "--output", tmp_path / "out")
  assert code == 2
  assert err.startswith(f"error: {folder}/state.json: does not list the data"
                        " files")


# --- 5. file names with glob characters -------------------------------------

GLOB_NAMES = ("br[ack]et.jsonl", "a*b?.jsonl")


def test_input_names_with_glob_characters_are_read_as_paths(tmp_path,
                                                            capsys):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  data = {name: jsonl_bytes(20, 100 * i) for i, name in enumerate(GLOB_NAMES)}
  for name, content in data.items():
    (corpus / name).write_bytes(content)
  out = tmp_path / "out"
  code, err = cli(capsys, "--input", f"{corpus}/*.jsonl", "--output", out)
  assert code == 0, err
  written = outputs(out)
  # Files sort by path: a*b?.jsonl is file 0, br[ack]et.jsonl file 1.
  assert written["deduped/part-00000-00000.jsonl"] == data["a*b?.jsonl"]
  assert written["deduped/part-00001-00000.jsonl"] == data["br[ack]et.jsonl"]
  escaped = out.parent / "escaped"
  code, err = cli(capsys, "--input", f"{corpus}/br[[]ack]et.jsonl",
                  "--output", escaped)
  assert code == 0, err
  assert outputs(escaped)["deduped/part-00000-00000.jsonl"] == data[
      "br[ack]et.jsonl"]
  for name in GLOB_NAMES:
    check_unchanged(expand_inputs([glob.escape(str(corpus / name))])[0])


# --- 6. an input rewritten in place with the same size ----------------------

def test_check_unchanged_compares_size_and_modification_time(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_bytes(jsonl_bytes(3))
  (source,) = expand_inputs([str(path)])
  assert source.mtime == os.path.getmtime(path)
  check_unchanged(source)
  stat = os.stat(path)
  # touch: the same bytes, a new modification time.
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  with pytest.raises(InputChangedError, match=re.escape(
      f"{path}: changed while the job ran (modified or touched since it was"
      " matched")):
    check_unchanged(source)
  # A file recorded without its modification time (an index's manifest)
  # is compared by size.
  check_unchanged(InputFile(0, str(path), "jsonl", len(jsonl_bytes(3))))
  os.remove(path)
  with pytest.raises(InputChangedError, match="now missing"):
    check_unchanged(source)


def test_input_rewritten_with_the_same_size_during_the_run_fails_it(
    tmp_path, capsys, monkeypatch):
  path = tmp_path / "a.jsonl"
  original = jsonl_bytes(40)
  path.write_bytes(original)
  rewritten = original.replace(b"alpha", b"ALPHA")
  assert rewritten != original and len(rewritten) == len(original)
  real_read = read_module.jsonl_texts  # what the job reads JSONL with

  def read_then_rewrite(*args, **kwargs):
    yield from real_read(*args, **kwargs)
    # Rewritten in place after the job read it, before it writes it back;
    # a second later, as any rewrite after the match is.
    stat = os.stat(path)
    path.write_bytes(rewritten)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

  monkeypatch.setattr(read_module, "jsonl_texts", read_then_rewrite)
  out = tmp_path / "out"
  code, err = cli(capsys, "--input", path, "--output", out)
  assert code == 1, err
  assert (f"error: the job failed: {path}: changed while the job ran"
          " (modified or touched") in err
  assert "rerun on an unchanging snapshot" in err
  assert not os.path.exists(out / SUCCESS_FILE)
  assert not os.path.exists(out / "deduped")
