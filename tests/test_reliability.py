"""Reliability (issue 13): every bad input fails loudly before the job or is
rejected with a reason, outputs are atomic, nothing is lost. One test per
defect of the issue, named after it, plus the safety checks."""

import ast
import bz2
import gzip
import json
import lzma
import os
import re
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline import preflight
from pipeline.cli import main
from pipeline.options import unknown_flags
from transforms.read import (InputFile, InputReadError, iter_lines,
                                  read_file)
from transforms.finalize import SUCCESS_FILE, read_success
from transforms.stats import NoTextFieldError, finalize_stats
from tests.corpus import stats_of, tree_bytes

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPRESS = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
    "xz": lzma.compress,
    "deflate": zlib.compress,
}
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu "
         "nu xi omicron pi rho sigma tau upsilon phi chi psi omega").split()


def jsonl_bytes(n, start=0, newline=b"\n"):
  """``n`` distinct JSONL records (ids ``start``...)."""
  return b"".join(json.dumps({
      "id": i, "text": " ".join(WORDS[(i * 7 + k * k) % len(WORDS)] + str(
          (i * 31 + k) % 97) for k in range(12))}).encode() + newline
                  for i in range(start, start + n))


def cli(capsys, *argv):
  """``main(argv)``'s exit code and its stderr."""
  code = main([str(a) for a in argv])
  return code, capsys.readouterr().err


def outputs(out):
  """The output tree without the staging folder of failed runs."""
  return {name: data for name, data in tree_bytes(out).items()
          if not name.startswith("_temporary")}


# --- 1. truncated compressed inputs -----------------------------------------

@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_truncated_or_corrupt_compressed_input_raises_naming_the_file(
    tmp_path, codec):
  data = jsonl_bytes(3000)
  packed = COMPRESS[codec](data)
  whole = tmp_path / f"whole.jsonl.{codec}"
  # Two members/frames/streams back to back are one file's content.
  whole.write_bytes(packed + COMPRESS[codec](jsonl_bytes(5, 3000)))
  assert [line + b"\n" for _, line in iter_lines(str(whole))] == (
      data + jsonl_bytes(5, 3000)).splitlines(keepends=True)
  cut = tmp_path / f"cut.jsonl.{codec}"
  cut.write_bytes(packed[:len(packed) * 2 // 3])
  with pytest.raises(InputReadError, match=re.escape(str(cut))):
    list(iter_lines(str(cut)))
  corrupt = bytearray(packed)
  middle = len(corrupt) // 2
  corrupt[middle:middle + 64] = bytes(64)
  bad = tmp_path / f"bad.jsonl.{codec}"
  bad.write_bytes(bytes(corrupt))
  with pytest.raises(InputReadError, match="truncated or corrupt"):
    list(iter_lines(str(bad)))


def test_truncated_gz_input_fails_the_run_naming_the_file(tmp_path, capsys):
  # Larger than the pre-flight sample: only reading to the end finds it.
  packed = gzip.compress(b"".join(
      b"line %d %s\n" % (i, " ".join(WORDS[i % 7:]).encode())
      for i in range(60000)))
  cut = tmp_path / "corpus.txt.gz"
  cut.write_bytes(packed[:len(packed) // 2])
  out = tmp_path / "out"
  code, err = cli(capsys, "--input", cut, "--output", out)
  assert code == 1
  last = err.strip().splitlines()[-2]
  assert last.startswith(f"error: the job failed: {cut}: cannot be read")
  assert "truncated or corrupt" in last
  assert not os.path.exists(out / SUCCESS_FILE)
  assert not os.path.exists(out / "deduped")


# --- 2. a crash leaves partial outputs; --overwrite deletes first -----------

def test_failed_overwrite_rerun_keeps_the_previous_complete_outputs(
    tmp_path, capsys):
  (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(50))
  (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(50, 50))
  out = tmp_path / "out"
  assert cli(capsys, "--input", tmp_path / "*.jsonl", "--output", out)[0] == 0
  before = outputs(out)
  assert SUCCESS_FILE in before and "deduped/part-00001-00000.jsonl" in before
  packed = gzip.compress(jsonl_bytes(20000))
  (tmp_path / "cut.jsonl.gz").write_bytes(packed[:len(packed) // 2])
  code, err = cli(capsys, "--input", tmp_path / "cut.jsonl.gz", "--output",
                  out, "--overwrite", "true")
  assert code == 1 and "cut.jsonl.gz" in err
  assert outputs(out) == before
  # A run that succeeds replaces every earlier output, stale parts included.
  assert cli(capsys, "--input", tmp_path / "a.jsonl", "--output", out,
             "--overwrite", "true")[0] == 0
  after = outputs(out)
  assert "deduped/part-00001-00000.jsonl" not in after
  assert after["deduped/part-00000-00000.jsonl"] == jsonl_bytes(50)
  assert not os.path.exists(out / "_temporary")
  assert read_success(str(out))["counts"]["docs_in"] == 50


# --- 4, 5 and safety: one run over BOM, CRLF and hostile contents -----------

@pytest.fixture(scope="module")
def bom_crlf_run(tmp_path_factory):
  folder = tmp_path_factory.mktemp("bomcrlf")
  jsonl = b"\xef\xbb\xbf" + jsonl_bytes(4, newline=b"\r\n")
  hostile = [{"id": "../../escape", "text": "../../../etc/passwd /dev/null"},
             {"id": "/abs/path", "text": "C:\\\\Windows\\\\x ~/.ssh/id"}]
  jsonl += b"".join(json.dumps(h).encode() + b"\r\n" for h in hostile)
  jsonl += jsonl_bytes(1, 4)[:-1]  # last line without a line ending
  (folder / "a.jsonl").write_bytes(jsonl)
  text = b"\xef\xbb\xbfone two three four five six\r\nseven eight\r\n\r\nx\n"
  (folder / "b.txt").write_bytes(text)
  out = folder / "out"
  assert main(["--input", f"{folder}/a.jsonl,{folder}/b.txt", "--output",
               str(out)]) == 0
  return out, jsonl, text


def test_utf8_bom_does_not_reject_the_first_record(bom_crlf_run):
  out, jsonl, _ = bom_crlf_run
  stats = stats_of(out)
  assert stats["rejected"] == 0 and stats["docs_in"] == 7 + 4
  with open(os.path.join(out, "deduped", "part-00000-00000.jsonl"),
            encoding="utf-8-sig") as f:
    assert json.loads(f.readline())["id"] == 0


def test_crlf_jsonl_is_written_back_byte_for_byte(bom_crlf_run):
  out, jsonl, text = bom_crlf_run
  with open(os.path.join(out, "deduped", "part-00000-00000.jsonl"),
            "rb") as f:
    # Nothing is a duplicate: every line, BOM and CRLF included; only the
    # last line gains the line ending it lacked.
    assert f.read() == jsonl + b"\n"
  with open(os.path.join(out, "deduped", "part-00001-00000.txt"), "rb") as f:
    assert f.read() == text


def test_no_document_content_chooses_an_output_path(bom_crlf_run):
  out = str(bom_crlf_run[0])
  allowed = re.compile(r"^((deduped|clusters|rejected)/part-\d{5}-\d{5}\."
                       r"(jsonl|txt|parquet)|stats\.json|report\.(json|html)|"
                       r"_SUCCESS)$")
  root = os.path.dirname(out)
  for folder, _, names in os.walk(root):
    for name in names:
      relative = os.path.relpath(os.path.join(folder, name), out)
      if relative in ("../a.jsonl", "../b.txt"):
        continue
      assert allowed.match(relative), relative


def test_success_marker_holds_the_counts_and_every_file(bom_crlf_run):
  out = str(bom_crlf_run[0])
  success = read_success(out)
  stats = stats_of(out)
  assert success["balanced"] is True
  assert success["counts"] == {name: stats[name] for name in success["counts"]}
  assert set(success["files"]) == {
      name for name in tree_bytes(out) if not name.startswith(
          ("report.", SUCCESS_FILE))}
  for name, size in success["files"].items():
    assert os.path.getsize(os.path.join(out, name)) == size


# --- 3, 6 and 7: the pre-flight ---------------------------------------------

def problems_for(patterns, input_format="auto", text_field="text"):
  return preflight.check_inputs([str(p) for p in patterns], input_format,
                                text_field)[1]


def test_corrupt_inputs_are_named_before_the_job_starts(tmp_path, capsys):
  table = pa.table({"id": list(range(1000)),
                    "text": [f"doc {i} {WORDS[i % 20]}" for i in range(1000)]})
  pq.write_table(table, tmp_path / "whole.parquet")
  data = (tmp_path / "whole.parquet").read_bytes()
  (tmp_path / "cut.parquet").write_bytes(data[:len(data) // 2])
  (tmp_path / "plain.jsonl.gz").write_bytes(jsonl_bytes(3))
  (tmp_path / "packed.jsonl").write_bytes(gzip.compress(jsonl_bytes(3)))
  (tmp_path / "wrong.jsonl.bz2").write_bytes(gzip.compress(jsonl_bytes(3)))
  (tmp_path / "empty.jsonl.zst").write_bytes(b"")
  (tmp_path / "table.txt").write_bytes(data)
  code, err = cli(capsys, "--input", tmp_path / "*", "--output",
                  tmp_path / "out")
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 6, err
  by_file = {line.split(": ", 2)[1]: line for line in lines}
  assert "no Parquet footer" in by_file[str(tmp_path / "cut.parquet")]
  assert "no gzip data" in by_file[str(tmp_path / "plain.jsonl.gz")]
  assert ("holds gzip data" in by_file[str(tmp_path / "packed.jsonl")]
          and "packed.jsonl.gz" in by_file[str(tmp_path / "packed.jsonl")])
  assert "holds gzip data" in by_file[str(tmp_path / "wrong.jsonl.bz2")]
  assert "is empty" in by_file[str(tmp_path / "empty.jsonl.zst")]
  assert "--input_format parquet" in by_file[str(tmp_path / "table.txt")]
  assert not os.path.exists(tmp_path / "out")


def test_corrupt_parquet_read_in_the_job_names_the_file(tmp_path):
  path = tmp_path / "x.parquet"
  pq.write_table(pa.table({"text": ["a b c"] * 10}), path)
  data = bytearray(path.read_bytes())
  data[-12:-8] = b"\xff\xff\xff\x7f"  # footer length beyond the file
  path.write_bytes(bytes(data))
  with pytest.raises(InputReadError, match=re.escape(str(path))):
    list(read_file(InputFile(0, str(path), "parquet", len(data))))


def test_folders_broken_links_and_unreadable_files_fail_before_the_job(
    tmp_path, capsys, monkeypatch):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "a.jsonl").write_bytes(jsonl_bytes(3))
  (corpus / "README.md").write_text("not a corpus\n")
  (corpus / "nested").mkdir()
  os.symlink(corpus / "missing.jsonl", corpus / "link.jsonl")
  assert "is a folder, not a file pattern" in problems_for([corpus])[0]
  assert "is a folder, not a file pattern" in problems_for([f"{corpus}/"])[0]
  found = problems_for([f"{corpus}/*"])
  assert any(p.startswith(f"{corpus}/link.jsonl: broken symbolic link")
             for p in found), found
  assert any(p.startswith(f"{corpus}/nested: is a folder") for p in found)
  unreadable = corpus / "secret.jsonl"
  unreadable.write_bytes(jsonl_bytes(3))
  os.chmod(unreadable, 0)
  if os.geteuid() == 0:  # root reads anything: make the read fail as it would
    real_open = preflight.FileSystems.open

    def refuse(path, *args, **kwargs):
      if path == str(unreadable):
        raise PermissionError(13, "Permission denied", path)
      return real_open(path, *args, **kwargs)
    monkeypatch.setattr(preflight.FileSystems, "open", refuse)
  found = problems_for([f"{corpus}/*.jsonl"])
  assert any(p.startswith(f"{unreadable}: cannot be read (PermissionError")
             for p in found), found
  code, err = cli(capsys, "--input", f"{corpus}/", "--output",
                  tmp_path / "out")
  assert code == 2 and f"--input '{corpus}/*.jsonl'" in err


def test_missing_text_field_fails_before_the_job_listing_the_fields(
    tmp_path, capsys):
  pq.write_table(pa.table({"body": ["x y z"], "n": [1]}),
                 tmp_path / "t.parquet")
  (tmp_path / "t.jsonl").write_bytes(b'{"body": "x", "lang": "en"}\n' * 3)
  found = problems_for([tmp_path / "t.parquet", tmp_path / "t.jsonl"])
  assert found == [
      f"{tmp_path}/t.jsonl: no record of the first 3 has the field 'text' "
      "(fields: body, lang); pass --text_field with one of them",
      f"{tmp_path}/t.parquet: has no column 'text' (columns: body, n); pass "
      "--text_field with one of them"]
  pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
  assert "is int64, not string" in problems_for([tmp_path / "n.parquet"])[0]
  code, err = cli(capsys, "--input", tmp_path / "t.jsonl", "--output",
                  tmp_path / "out", "--text_field", "body")
  assert code == 0, err
  # If every record still lacks the field, the job fails before finalizing.
  with pytest.raises(NoTextFieldError, match="--text_field"):
    finalize_stats({"docs_in": 4, "rejected": 4,
                    "rejected_missing_text_field": 4}, {})


def test_jsonl_that_is_not_json_is_named_before_the_job(tmp_path):
  (tmp_path / "notes.jsonl").write_text("just some text\nmore text\n")
  found = problems_for([tmp_path / "notes.jsonl"])
  assert len(found) == 1 and "--input_format text" in found[0]
  # Some bad records among good ones are rejected by the job, not here.
  (tmp_path / "mixed.jsonl").write_bytes(jsonl_bytes(5) + b"{broken\n")
  assert problems_for([tmp_path / "mixed.jsonl"]) == []


# --- 8. misspelled flags ----------------------------------------------------

def test_misspelled_flags_exit_2_naming_the_unknown_flag(tmp_path, capsys):
  (tmp_path / "in.jsonl").write_bytes(jsonl_bytes(3))
  code, err = cli(capsys, "--input", tmp_path / "in.jsonl", "--output",
                  tmp_path / "out", "--threshhold", "0.5")
  assert code == 2
  assert err.strip() == ("error: unknown flag --threshhold; did you mean "
                         "--threshold?")
  code, err = cli(capsys, "--inptu", tmp_path / "in.jsonl", "--output",
                  tmp_path / "out")
  assert code == 2
  assert err.strip().splitlines() == [
      "error: unknown flag --inptu; did you mean --input?",
      "error: --input required; see --help"]
  assert not os.path.exists(tmp_path / "out")


def test_runner_flags_still_pass():
  dataflow = ["--runner", "DataflowRunner", "--project", "p", "--region",
              "europe-west1", "--temp_location", "gs://b/tmp",
              "--staging_location", "gs://b/staging", "--job_name", "j",
              "--setup_file", "./setup.py", "--sdk_container_image", "i",
              "--max_num_workers", "10", "--machine_type", "n2-highmem-8",
              "--experiments", "use_runner_v2", "--no_wait_until_finish",
              "--service_account_email", "a@b", "--subnetwork", "s",
              "--no_use_public_ips", "--dataflow_service_options", "x=y"]
  assert unknown_flags(dataflow) == []
  local = ["--direct_num_workers", "2", "--direct_running_mode",
           "multi_processing", "--prism_location", "/p", "--job_endpoint",
           "localhost:1", "--environment_type", "EXTERNAL",
           "--environment_config", "localhost:2", "--flink_master", "h:8081"]
  assert unknown_flags(local) == []
  # A Flink job server defines options of its own: they pass, typos don't.
  flink = ["--runner", "FlinkRunner", "--checkpointing_interval", "1000",
           "--flink_mastr", "h:8081"]
  assert unknown_flags(flink) == [
      "unknown flag --flink_mastr; did you mean --flink_master?"]
  assert unknown_flags(["--runner", "FnApiRunner", "--checkpointing_interval",
                        "1000"]) == [
      "unknown flag --checkpointing_interval; see --help"]


# --- safety -----------------------------------------------------------------

_UNSAFE_CALLS = {("pickle", "load"), ("pickle", "loads"), ("marshal", "load"),
                 ("marshal", "loads"), ("dill", "load"), ("dill", "loads"),
                 ("cloudpickle", "loads"), ("yaml", "load"),
                 ("shelve", "open")}


def _unsafe_uses(path):
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      if isinstance(func, ast.Name) and func.id in ("eval", "exec",
                                                     "compile"):
        yield f"{path}:{node.lineno}: {func.id}()"
      if isinstance(func, ast.Attribute) and isinstance(func.value,
                                                        ast.Name):
        if (func.value.id, func.attr) in _UNSAFE_CALLS:
          yield f"{path}:{node.lineno}: {func.value.id}.{func.attr}()"
      for keyword in node.keywords:
        if keyword.arg == "allow_pickle" and not (
            isinstance(keyword.value, ast.Constant)
            and keyword.value.value is False):
          yield f"{path}:{node.lineno}: allow_pickle"
    if isinstance(node, ast.Attribute) and node.attr in ("PickleCoder",
                                                          "DillCoder"):
      yield f"{path}:{node.lineno}: {node.attr}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] + [getattr(node, "module", "")]
      if {"pickle", "dill", "marshal", "shelve"} & set(names):
        yield f"{path}:{node.lineno}: imports {names}"


def test_inputs_are_data_only_no_pickle_or_eval_anywhere():
  found = []
  for package in ("pipeline", "transforms", "templates"):
    for folder, _, names in os.walk(os.path.join(ROOT, package)):
      found += [use for name in names if name.endswith(".py")
                for use in _unsafe_uses(os.path.join(folder, name))]
  assert not found, found


def test_dockerfile_runs_as_a_non_root_user():
  with open(os.path.join(ROOT, "templates", "dataflow", "Dockerfile"),
            encoding="utf-8") as f:
    dockerfile = f.read()
  users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
  assert users, "the image runs as root: add a USER"
  uid = users[-1].split(":")[0]
  assert uid.isdigit() and int(uid) > 0, users
  # The user exists in the image (a numeric USER need not, but then it has
  # no home for pip's user install and numba's cache).
  assert re.search(rf"useradd [^\n]*--uid {uid}\b", dockerfile)
