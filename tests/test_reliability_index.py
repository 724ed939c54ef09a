"""Reliability of ``--against`` (issue 26, item 7): a damaged index (a
malformed manifest, a missing, truncated or replaced shard) is refused
before the job with one line naming the file and "rebuild", or fails the
job naming the shard, never with a traceback or as an input's fault."""

import copy
import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline import job
from pipeline.cli import main
from pipeline.preflight import check_index
from transforms import index as index_lib
from transforms.config import DedupConfig

SHARDS = ["--lsh_shards", "4"]
WORDS = [f"w{i}" for i in range(400)]


def _jsonl(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for user_id, text in rows:
      f.write(json.dumps({"id": user_id, "text": text}) + "\n")


def _text(seed, n=60):
  return " ".join(WORDS[(seed * 37 + k * k * 11 + k) % len(WORDS)]
                  for k in range(n))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """A folder with corpora A and B and ``index`` (of A)."""
  root = tmp_path_factory.mktemp("index_reliability")
  (root / "A").mkdir()
  (root / "B").mkdir()
  _jsonl(root / "A" / "a0.jsonl", [(f"a{i}", _text(i)) for i in range(12)])
  _jsonl(root / "A" / "a1.jsonl", [(f"b{i}", _text(i + 12))
                                   for i in range(12)])
  _jsonl(root / "B" / "b0.jsonl", [("c0", _text(3)), ("c1", _text(40))])
  assert main(["--input", str(root / "A" / "*.jsonl"), "--output",
               str(root / "out_a"), "--index_out", str(root / "index")]
              + SHARDS) == 0
  return root


def _copy(built, tmp_path):
  folder = tmp_path / "index"
  shutil.copytree(built / "index", folder)
  return folder


def _manifest(folder):
  return json.loads((folder / index_lib.MANIFEST_FILE).read_text())


def _save(folder, manifest):
  (folder / index_lib.MANIFEST_FILE).write_text(json.dumps(manifest))


def _as_format_2(folder):
  """Rewrites the manifest as format 2 wrote it (shard names only)."""
  manifest = _manifest(folder)
  manifest["format_version"] = 2
  manifest["shards"] = {kind: [s["name"] for s in entries]
                        for kind, entries in manifest["shards"].items()}
  _save(folder, manifest)


def _against(built, tmp_path, capsys, folder):
  """``(exit code, stderr)`` of a run over B against ``folder``."""
  code = main(["--input", str(built / "B" / "*.jsonl"), "--output",
               str(tmp_path / "out"), "--against", str(folder)] + SHARDS)
  return code, capsys.readouterr().err


def _shard(folder, kind="keys"):
  return folder / kind / _manifest(folder)["shards"][kind][0]["name"]


def _params():
  return job.effective_params(DedupConfig(lsh_shards=4), "auto", "text", "id")


pytestmark = pytest.mark.e2e


def test_manifest_records_each_shards_rows_and_size(built):
  folder = built / "index"
  manifest = _manifest(folder)
  assert manifest["format_version"] == 3
  for kind, count in (("keys", "index_keys"), ("docs", "index_docs")):
    entries = manifest["shards"][kind]
    assert sorted(os.listdir(folder / kind)) == [s["name"] for s in entries]
    for entry in entries:
      path = folder / kind / entry["name"]
      assert entry["rows"] == pq.read_metadata(path).num_rows
      assert entry["size"] == os.path.getsize(path)
    assert sum(s["rows"] for s in entries) == manifest["counts"][count] > 0


@pytest.mark.parametrize("damage", ["missing", "truncated", "empty"])
def test_damaged_shard_is_refused_before_the_job_naming_it(
    built, tmp_path, capsys, damage):
  folder = _copy(built, tmp_path)
  shard = _shard(folder)
  if damage == "missing":
    shard.unlink()
  elif damage == "truncated":
    shard.write_bytes(shard.read_bytes()[:-10])
  else:
    # A valid Parquet file, of no rows.
    pq.write_table(index_lib.keys_schema().empty_table(), shard)
  code, err = _against(built, tmp_path, capsys, folder)
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: {shard}: ")
  assert str(folder) in lines[0] and "rebuild" in lines[0]
  assert "--input" not in lines[0]
  assert not os.path.exists(tmp_path / "out")


def test_index_of_format_2_is_read_its_listed_shards_checked(
    built, tmp_path, capsys):
  folder = _copy(built, tmp_path)
  _as_format_2(folder)
  shard = _shard(built / "index", "docs")
  moved = tmp_path / "moved.parquet"
  os.rename(folder / "docs" / shard.name, moved)
  code, err = _against(built, tmp_path, capsys, folder)
  assert code == 2 and f"{folder / 'docs' / shard.name}: " in err
  assert "missing" in err
  os.rename(moved, folder / "docs" / shard.name)
  assert _against(built, tmp_path, capsys, folder)[0] == 0


def _failure(err: str) -> str:
  """The CLI's one line saying why the job failed (a runner may log more
  after it, e.g. Prism's worker at exit)."""
  found = [line for line in err.splitlines()
           if line.startswith("error: the job failed: ")]
  assert len(found) == 1, err[-3000:]
  return found[0]


def test_truncated_shard_of_a_format_2_index_fails_the_job_as_the_index(
    built, tmp_path, capsys):
  folder = _copy(built, tmp_path)
  _as_format_2(folder)
  shard = _shard(built / "index")
  path = folder / "keys" / shard.name
  path.write_bytes(path.read_bytes()[:-10])
  code, err = _against(built, tmp_path, capsys, folder)
  assert code == 1
  reason = _failure(err)
  assert reason.startswith(f"error: the job failed: {path}: ")
  assert str(folder) in reason and "rebuild" in reason
  assert "--input" not in reason


@pytest.mark.parametrize("kind", ["keys", "docs"])
def test_shard_rows_other_than_the_manifest_lists_fail_the_job_naming_it(
    built, tmp_path, capsys, kind):
  folder = _copy(built, tmp_path)
  manifest = _manifest(folder)
  entry = manifest["shards"][kind][0]
  entry["rows"] += 1
  manifest["counts"]["index_" + kind] += 1
  _save(folder, manifest)
  code, err = _against(built, tmp_path, capsys, folder)
  assert code == 1
  reason = _failure(err)
  assert reason.startswith(
      f"error: the job failed: {folder / kind / entry['name']}: ")
  assert f"{entry['rows'] - 1} rows" in reason and "rebuild" in reason


MALFORMED = [
    ("params", []), ("params", "x"), ("params", None),
    ("files", {}), ("files", [1]), ("files.0.index", "0"),
    ("files.0.index", True), ("files.0.path", 3), ("files.0.path", ""),
    ("files.0.format", "csv"), ("files.0.size", -1), ("files.0.size", 1.5),
    ("next_file_index", "2"), ("next_file_index", None),
    ("next_file_index", 1), ("next_file_index", 1 << 40),
    ("num_shards", "4"), ("num_shards", 0), ("version", 3),
    ("counts", []), ("counts.index_keys", "9"), ("counts.index_docs", 0),
    ("shards", []), ("shards.keys", "part-00000-of-00004.parquet"),
    ("shards.docs", None), ("shards.keys.0", "part-00000-of-00004.parquet"),
    ("shards.keys.0.name", 5), ("shards.keys.0.name", "../../etc/passwd"),
    ("shards.keys.0.rows", "1"), ("shards.keys.0.rows", -1),
    ("shards.docs.0.size", None), ("shards.docs.1", "duplicate"),
]


def _set(manifest, where, value):
  """``manifest`` with the field at dotted path ``where`` set to ``value``
  (``"duplicate"``: a copy of the list's first entry)."""
  changed = copy.deepcopy(manifest)
  *parents, last = where.split(".")
  node = changed
  for part in parents:
    node = node[int(part)] if isinstance(node, list) else node[part]
  if value == "duplicate":
    value = node[0]
  if isinstance(node, list):
    node[int(last)] = value
  else:
    node[last] = value
  return changed


@pytest.mark.parametrize("where,value", MALFORMED)
def test_malformed_manifest_field_is_one_clear_error(built, tmp_path, where,
                                                     value):
  folder = _copy(built, tmp_path)
  _save(folder, _set(_manifest(folder), where, value))
  with pytest.raises(index_lib.IndexFolderError) as raised:
    index_lib.read_manifest(str(folder))
  message = str(raised.value)
  assert message.startswith(f"--against {folder}: manifest.json ")
  assert where.split(".")[0] in message and "rebuild" in message
  assert "\n" not in message


@pytest.mark.parametrize("version", [True, 2.0, 3.0])
def test_format_version_other_than_an_integer_is_refused(built, tmp_path,
                                                         version):
  folder = _copy(built, tmp_path)
  _save(folder, _set(_manifest(folder), "format_version", version))
  with pytest.raises(index_lib.IndexFolderError,
                     match=f"index format version {version!r}, this version"
                     " reads 1, 2 and 3; rebuild"):
    index_lib.read_manifest(str(folder))


def test_manifest_with_params_not_an_object_is_refused_before_the_job(
    built, tmp_path, capsys):
  folder = _copy(built, tmp_path)
  _save(folder, _set(_manifest(folder), "params", ["ngram"]))
  code, err = _against(built, tmp_path, capsys, folder)
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert err.startswith(f"error: --against {folder}: manifest.json ")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1 << 41)
    | st.floats(allow_nan=False) | st.text(
        st.characters(blacklist_categories=("Cc", "Cs")), max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(value, prefix=()):
  """Every field path in a JSON value (the value itself first)."""
  yield prefix
  if isinstance(value, dict):
    for name, item in value.items():
      yield from _paths(item, prefix + (name,))
  elif isinstance(value, list):
    for i, item in enumerate(value):
      yield from _paths(item, prefix + (i,))


@pytest.fixture(scope="module")
def mutable_index(built, tmp_path_factory):
  folder = tmp_path_factory.mktemp("mutated") / "index"
  shutil.copytree(built / "index", folder)
  return folder, _manifest(folder)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@example(data=None)
def test_any_mutated_manifest_is_read_or_refused_in_one_line(mutable_index,
                                                             data):
  folder, manifest = mutable_index
  if data is None:
    changed = dict(manifest, params="not an object")
  else:
    paths = list(_paths(manifest))[1:]
    where = data.draw(st.sampled_from(paths))
    changed = copy.deepcopy(manifest)
    node = changed
    for part in where[:-1]:
      node = node[part]
    if data.draw(st.booleans()) and isinstance(node, dict):
      del node[where[-1]]
    else:
      node[where[-1]] = data.draw(_JSON)
  _save(folder, changed)
  try:
    index, problems = check_index(str(folder), None, _params(), [])
  finally:
    _save(folder, manifest)
  assert all(isinstance(p, str) and "\n" not in p for p in problems)
  if index is not None and not problems:
    # A manifest that passes gives everything a run reads from it.
    assert index.first_new_id >= 0 and len(index.files) >= 0
    for kind in ("keys", "docs"):
      assert all(os.path.exists(s.path) for s in index.shards(kind))
