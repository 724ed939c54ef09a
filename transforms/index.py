"""A persistent LSH index of a deduplicated corpus, for incremental runs.

Layout of an index folder (see README, "Incremental dedup against an
index")::

  manifest.json                   format, version, detection parameters,
                                  the corpus files (index, path, format,
                                  size), counts and the shard files (name,
                                  rows, size; format 3)
  keys/part-SSSSS-of-NNNNN.parquet  key uint64, doc_id int64 (format 1
                                  also a digest uint64, now read from the
                                  signatures): one row per (document,
                                  band), sharded by band key
                                  (``shard_of(key, NNNNN)``)
  docs/part-SSSSS-of-NNNNN.parquet  doc_id, kept, id (the user id as JSON),
                                  source, position, signature uint32[K]:
                                  one row per signed document, sharded by
                                  ``node_shard(doc_id, NNNNN)``

Every signed document of the corpus is indexed, the removed ones too
(``kept`` false): in a run over the whole corpus a new document that is
similar only to a removed one joins its cluster and is removed, so an index
of the kept documents alone could not give the same result. Doc ids are the
ones a run over the whole corpus (indexed files first) gives, so a run
``--against`` the index numbers its files after the indexed ones.

Each shard file is written by the worker that grouped its key range and
read back file by file, by row group, re-sharded to the run's
``--lsh_shards``: the index never passes through one worker.

A damaged index is refused, never read as a smaller one: every manifest
field is checked when it is read (:func:`read_manifest`), every shard it
lists must be there with its recorded size before a run starts
(:meth:`Index.shard_problems`), and each shard must hold the rows the manifest
lists when a worker reads it (format 3; formats 1 and 2 record names only,
so their shards are checked for existence alone).
"""

from __future__ import annotations

import glob
import io
import json
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from transforms.annotate import json_text
from transforms.config import DedupConfig
from transforms.elements import (KeyShard, SignatureBatch, fields_coder,
                                 key_columns)
from transforms.join import JoinByKey
from transforms.kernels import lsh as lsh_kernels
from transforms.read import (FORMATS, MAX_FILES, InputFile, InputReadError,
                             make_doc_id, open_parquet, split_doc_id)

INDEX_FORMAT = "neardup-lsh-index"
FORMAT_VERSION = 3
# Format 1 also stored each key row's signature digest, which runs now
# compute from the indexed signatures; its key files read the same. Formats
# 1 and 2 list each shard by name only, format 3 with its rows and size:
# older indexes stay readable (rebuilding one is a run over the whole
# corpus), their shards checked for existence only; a run against one that
# writes --index_out writes format 3.
READABLE_VERSIONS = (1, 2, 3)
MANIFEST_FILE = "manifest.json"
KEYS_DIR, DOCS_DIR = "keys", "docs"
# What must agree between an index and a run against it: everything that
# changes signatures, band keys, the candidate pairs or their verification,
# and the fields the indexed texts are read back with.
MATCHED_PARAMS = ("shingle_unit", "ngram", "num_perm", "sketch", "bands",
                  "rows", "seed", "nfkc", "lowercase", "strip_punctuation",
                  "fold_digits", "min_tokens", "threshold", "verify",
                  "exhaustive_bucket_size", "shingle_scheme",
                  "minhash_scheme", "text_field", "id_field")


_SHARD_NAME = re.compile(r"part-\d{5,}-of-\d{5,}\.parquet")
_COUNTS = ("index_docs", "index_kept", "index_keys")
# Which count each kind of shard's rows sum to.
_SHARD_COUNTS = {KEYS_DIR: "index_keys", DOCS_DIR: "index_docs"}
_REBUILD = ("the index is damaged: rebuild it (a run over the whole corpus"
            " with --index_out)")
_MISSING = object()


class IndexFolderError(ValueError):
  """Not a usable index; the message names the folder and the fix."""


class IndexShard(NamedTuple):
  """One shard file of an index, with the rows and size its manifest
  records (None in formats 1 and 2, which record neither)."""
  path: str
  rows: Optional[int]
  size: Optional[int]


IndexShardCoder = fields_coder(IndexShard, __name__)


class Index(NamedTuple):
  """An index as read from its manifest (what a run against it needs)."""
  path: str
  manifest: dict

  @property
  def files(self) -> List[InputFile]:
    """The indexed corpus's files, with the indices its doc ids use."""
    return [InputFile(f["index"], f["path"], f["format"], f["size"])
            for f in self.manifest["files"]]

  @property
  def first_file(self) -> int:
    """The file index a run against this index starts its own files at."""
    return self.manifest["next_file_index"]

  @property
  def first_new_id(self) -> int:
    """Every indexed doc id is below this one, every new one at least it."""
    return make_doc_id(self.first_file, 0)

  def shards(self, kind: str) -> List[IndexShard]:
    """The shard files of ``kind`` (keys or docs) the manifest lists."""
    return [IndexShard(FileSystems.join(self.path, kind, entry), None, None)
            if isinstance(entry, str) else
            IndexShard(FileSystems.join(self.path, kind, entry["name"]),
                       entry["rows"], entry["size"])
            for entry in self.manifest["shards"][kind]]

  def shard_problems(self) -> List[str]:
    """One line per shard file the manifest lists that is missing or has
    another size than it records (format 3), naming the shard, the index and
    the fix. One listing per shard folder, not a look-up per shard."""
    problems = []
    for kind in (KEYS_DIR, DOCS_DIR):
      folder = FileSystems.join(self.path, kind)
      try:
        # The folder is a path: its glob characters match only themselves.
        listed = FileSystems.match([FileSystems.join(glob.escape(folder),
                                                     "*")])
      except (OSError, ValueError) as e:
        problems.append(f"{folder}: the --against index's shards cannot be"
                        f" listed ({e}); fix its permissions")
        continue
      sizes = {m.path.rsplit("/", 1)[-1]: m.size_in_bytes
               for m in listed[0].metadata_list}
      for shard in self.shards(kind):
        size = sizes.get(shard.path.rsplit("/", 1)[-1])
        if size is None:
          problems.append(f"{shard.path}: listed in the --against index"
                          f" {self.path} but missing; {_REBUILD}")
        elif shard.size is not None and size != shard.size:
          problems.append(f"{shard.path}: has {size} bytes, the --against"
                          f" index {self.path} recorded {shard.size}"
                          f" (truncated or replaced); {_REBUILD}")
    return problems


class IndexedCorpus(NamedTuple):
  """What :class:`~transforms.near_dedup.NearDedup` needs of an index to
  deduplicate new documents against it: its band keys ``(shard,
  KeyShard)`` and signature batches (from :class:`ReadIndex`), and the
  first doc id of the new documents (every indexed id is below it)."""
  keys: object
  signatures: object
  first_new_id: int


def shard_name(shard: int, num_shards: int) -> str:
  return f"part-{shard:05d}-of-{num_shards:05d}.parquet"


def read_manifest(path: str) -> Index:
  """The index at ``path``; raises :class:`IndexFolderError` when there is none
  there (missing folder, no manifest, another format or version) or its
  manifest has a malformed field: every field of a returned index has the
  type and range the run reads it with."""
  manifest_path = FileSystems.join(path, MANIFEST_FILE)
  try:
    exists = FileSystems.exists(path)
  except (OSError, ValueError) as e:
    raise IndexFolderError(f"--against {path}: cannot be read ({e})") from e
  if not exists:
    raise IndexFolderError(f"--against {path}: no such folder; give the folder an"
                      " earlier run wrote with --index_out")
  if not FileSystems.exists(manifest_path):
    raise IndexFolderError(f"--against {path}: not an index (no {MANIFEST_FILE});"
                      " give the folder an earlier run wrote with"
                      " --index_out (a run that failed leaves none)")
  try:
    with FileSystems.open(manifest_path) as f:
      manifest = json.loads(f.read())
  except (OSError, ValueError) as e:
    raise IndexFolderError(f"--against {path}: {MANIFEST_FILE} cannot be read"
                      f" ({e}); rebuild the index with --index_out") from e
  if not isinstance(manifest, dict) or manifest.get("format") != INDEX_FORMAT:
    raise IndexFolderError(f"--against {path}: {MANIFEST_FILE} is not a neardup"
                      " index manifest; give a folder written by"
                      " --index_out")
  version = manifest.get("format_version")
  # An int, not a bool or float: true and 2.0 equal versions 1 and 2.
  if not _is_count(version) or version not in READABLE_VERSIONS:
    raise IndexFolderError(
        f"--against {path}: index format version {version!r}, this version"
        f" reads {', '.join(map(str, READABLE_VERSIONS[:-1]))} and"
        f" {READABLE_VERSIONS[-1]}; rebuild the index with this version's"
        " --index_out")
  problem = _malformed(manifest)
  if problem:
    raise IndexFolderError(f"--against {path}: {MANIFEST_FILE} is malformed"
                           f" ({problem}); {_REBUILD}")
  return Index(path, manifest)


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_path(value) -> bool:
  return isinstance(value, str) and bool(value)


def _bad(where: str, value, expected: str) -> str:
  shown = json.dumps(value)
  shown = shown if len(shown) <= 60 else shown[:57] + "..."
  return f"{where} is {shown}, not {expected}"


def _malformed(manifest: dict) -> Optional[str]:
  """The first malformed field of a manifest of a readable version, as
  ``"<field> is <value>, not <what it must be>"``; None when there is none.
  """
  for name, kind, expected in (
      ("version", str, "a string"), ("params", dict, "an object"),
      ("num_shards", int, "a shard count"),
      ("next_file_index", int, "a file index"),
      ("files", list, "a list"), ("counts", dict, "an object"),
      ("shards", dict, "an object")):
    value = manifest.get(name, _MISSING)
    if value is _MISSING:
      return f"{name} is missing"
    if not isinstance(value, kind) or isinstance(value, bool):
      return _bad(name, value, expected)
  if manifest["num_shards"] < 1:
    return _bad("num_shards", manifest["num_shards"], "a shard count")
  indices = set()
  for i, entry in enumerate(manifest["files"]):
    if not isinstance(entry, dict):
      return _bad(f"files[{i}]", entry, "an object")
    for name, valid, expected in (
        ("index", _is_count, "a file index"), ("path", _is_path, "a path"),
        ("format", FORMATS.__contains__, " or ".join(FORMATS)),
        ("size", _is_count, "a size in bytes")):
      value = entry.get(name, _MISSING)
      if value is _MISSING:
        return f"files[{i}].{name} is missing"
      if not valid(value):
        return _bad(f"files[{i}].{name}", value, expected)
    if entry["index"] in indices:
      return f"files[{i}].index {entry['index']} is listed twice"
    indices.add(entry["index"])
  first = manifest["next_file_index"]
  if not max(indices, default=-1) < first < MAX_FILES:
    return _bad("next_file_index", first, "a file index above every"
                f" file's (highest {max(indices, default=-1)}) and below"
                f" {MAX_FILES}")
  counts = manifest["counts"]
  for name in _COUNTS:
    if not _is_count(counts.get(name)):
      return _bad(f"counts.{name}", counts.get(name), "a count")
  version = manifest["format_version"]
  for kind in (KEYS_DIR, DOCS_DIR):
    entries = manifest["shards"].get(kind, _MISSING)
    if entries is _MISSING:
      return f"shards.{kind} is missing"
    if not isinstance(entries, list):
      return _bad(f"shards.{kind}", entries, "a list")
    names, rows = set(), 0
    for i, entry in enumerate(entries):
      where = f"shards.{kind}[{i}]"
      if version >= 3:
        if not isinstance(entry, dict):
          return _bad(where, entry, "an object")
        for name in ("rows", "size"):
          if not _is_count(entry.get(name)):
            return _bad(f"{where}.{name}", entry.get(name), "a count")
        rows += entry["rows"]
        where, entry = f"{where}.name", entry.get("name")
      if not (isinstance(entry, str) and _SHARD_NAME.fullmatch(entry)):
        return _bad(where, entry, "a shard file name")
      if entry in names:
        return f"{where} {entry} is listed twice"
      names.add(entry)
    count = _SHARD_COUNTS[kind]
    if version >= 3 and rows != counts[count]:
      return (f"counts.{count} is {counts[count]}, but its shards list"
              f" {rows} rows")
  return None


def _flag_value(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def incompatibilities(index: Index, params: dict) -> List[str]:
  """One line per parameter of ``params`` (a run's, as :func:`index_params`
  gives them) that differs from the index's, naming both values and the
  fix; empty when the run can be deduplicated against the index."""
  built = index.manifest["params"]
  problems = []
  for name in MATCHED_PARAMS:
    if built.get(name) != params.get(name):
      flag = (f"--{name} {_flag_value(built.get(name))}"
              if not name.endswith("_scheme") else "the version that built it")
      problems.append(
          f"--against {index.path}: the index was built with {name}="
          f"{_flag_value(built.get(name))}, this run has {name}="
          f"{_flag_value(params.get(name))}; rerun with {flag}, or build a"
          " new index over the whole corpus (without --against)")
  return problems


def index_params(run_params: dict) -> dict:
  """The parameters an index records (and a run against it must match)."""
  return {name: run_params[name] for name in MATCHED_PARAMS}


def build_manifest(params: dict, files: Sequence[InputFile], num_shards: int,
                   counts: Dict[str, int], shards: Dict[str, List[dict]],
                   version: str) -> dict:
  """The manifest of an index over ``files`` with ``num_shards`` shards, of
  which ``shards`` (``{"keys": [{"name", "rows", "size"}, ...], "docs":
  [...]}``) hold rows."""
  files = sorted(files, key=lambda f: f.index)
  return {
      "format": INDEX_FORMAT,
      "format_version": FORMAT_VERSION,
      "version": version,
      "params": index_params(params),
      "num_shards": num_shards,
      "next_file_index": files[-1].index + 1 if files else 0,
      # What identifies a file: its modification time is not recorded,
      # since an index outlives its corpus and copies change mtimes.
      "files": [{"index": f.index, "path": f.path, "format": f.format,
                 "size": f.size} for f in files],
      "counts": {name: counts.get(name, 0) for name in _COUNTS},
      "shards": {kind: sorted(shards.get(kind, ()), key=lambda s: s["name"])
                 for kind in (KEYS_DIR, DOCS_DIR)},
  }


# --- reading -----------------------------------------------------------------


class ReadIndex(beam.PTransform):
  """An index's shard files → ``{"keys": (shard, KeyShard), "signatures":
  SignatureBatch, "docs": (node shard, Arrow IPC bytes)}``, re-sharded to
  ``config.lsh_shards``. Each shard file is read by one worker, one row
  group at a time (``docs`` only when ``with_rows``, for an updated index).

  A shard that cannot be read, or holds other rows than its manifest lists,
  fails the job with an :class:`~transforms.read.InputReadError` naming the
  shard and the index.

  Args:
    index: the :class:`Index` (from :func:`read_manifest`).
    config: the run's ``lsh_shards`` and ``num_perm``.
    with_rows: also return the document rows, for writing an updated index.
  """

  def __init__(self, index: Index, config: DedupConfig,
               with_rows: bool = False):
    super().__init__()
    self._index = index
    self._config = config
    self._with_rows = with_rows

  def expand(self, pbegin):
    n = self._config.lsh_shards
    keys = (pbegin
            | "ListKeyShards" >> beam.Create(
                self._index.shards(KEYS_DIR)).with_output_types(IndexShard)
            | "SpreadKeyShards" >> beam.Reshuffle()
            | "ReadKeyShards" >> beam.ParDo(_ReadKeysFn(self._index.path, n)))
    docs = (pbegin
            | "ListDocShards" >> beam.Create(
                self._index.shards(DOCS_DIR)).with_output_types(IndexShard)
            | "SpreadDocShards" >> beam.Reshuffle()
            | "ReadDocShards" >> beam.ParDo(
                _ReadDocsFn(self._index.path, n, self._config.num_perm,
                            self._with_rows)).with_outputs("rows",
                                                           main="signatures"))
    out = {"keys": keys, "signatures": docs.signatures}
    if self._with_rows:
      out["docs"] = docs.rows
    return out


def _row_groups(shard: IndexShard, index_path: str, columns=None):
  """The row groups of an index shard. One that cannot be read, or whose
  footer counts other rows than the manifest lists, raises
  :class:`~transforms.read.InputReadError` naming it and the index (the
  cli prints that as the job's failure)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  try:
    with open_parquet(shard.path) as parquet:
      rows = parquet.metadata.num_rows
      if shard.rows in (None, rows):
        for group in range(parquet.num_row_groups):
          yield parquet.read_row_group(group, columns=columns)
  except (OSError, ValueError, EOFError, pa.ArrowException) as e:
    # open_parquet's error advises on an input file; say what failed in it.
    cause = e.__cause__ if isinstance(e, InputReadError) and e.__cause__ else e
    raise InputReadError(f"{shard.path}: a shard of the --against index"
                         f" {index_path} cannot be read"
                         f" ({type(cause).__name__}: {cause}); {_REBUILD}"
                         ) from e
  if shard.rows is not None and rows != shard.rows:
    raise InputReadError(f"{shard.path}: a shard of the --against index"
                         f" {index_path} holds {rows} rows, its"
                         f" {MANIFEST_FILE} lists {shard.rows}; {_REBUILD}")


@beam.typehints.with_output_types(Tuple[int, KeyShard])
class _ReadKeysFn(beam.DoFn):

  def __init__(self, index_path: str, num_shards: int):
    self._index_path = index_path
    self._num_shards = num_shards

  def process(self, index_shard: IndexShard):
    for table in _row_groups(index_shard, self._index_path,
                             columns=["key", "doc_id"]):
      keys = table.column("key").to_numpy().astype(np.uint64)
      ids = table.column("doc_id").to_numpy().astype(np.int64)
      yield from ((shard, KeyShard.of(*parts)) for shard, parts in
                  lsh_kernels.split_by_shard(
                      lsh_kernels.shard_of(keys, self._num_shards), keys, ids))


@beam.typehints.with_output_types(SignatureBatch)
class _ReadDocsFn(beam.DoFn):

  def __init__(self, index_path: str, num_shards: int, num_perm: int,
               with_rows: bool):
    self._index_path = index_path
    self._num_shards = num_shards
    self._num_perm = num_perm
    self._with_rows = with_rows

  def process(self, index_shard: IndexShard):
    for table in _row_groups(index_shard, self._index_path):
      ids = table.column("doc_id").to_numpy().astype(np.int64)
      sigs = signature_array(table, self._num_perm)
      yield SignatureBatch(ids, sigs)
      if self._with_rows:
        shards = lsh_kernels.node_shard(ids, self._num_shards)
        for shard, (rows,) in lsh_kernels.split_by_shard(
            shards, np.arange(len(ids))):
          yield beam.pvalue.TaggedOutput("rows", (shard, to_ipc(
              table.take(rows))))


def signature_array(table, num_perm: int) -> np.ndarray:
  """The ``signature`` column of a docs table as uint32[n, K]."""
  column = table.column("signature").combine_chunks()
  return column.flatten().to_numpy().astype(np.uint32).reshape(-1, num_perm)


def to_ipc(table) -> bytes:
  """An Arrow table as IPC stream bytes (what doc rows travel as)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  sink = io.BytesIO()
  with pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table)
  return sink.getvalue()


def from_ipc(data: bytes):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  return pa.ipc.open_stream(data).read_all()


# --- writing -----------------------------------------------------------------


def docs_schema(num_perm: int):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  return pa.schema([("doc_id", pa.int64()), ("kept", pa.bool_()),
                    ("id", pa.string()), ("source", pa.string()),
                    ("position", pa.int64()),
                    ("signature", pa.list_(pa.uint32(), num_perm))])


def keys_schema():
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  return pa.schema([("key", pa.uint64()), ("doc_id", pa.int64())])


class WriteIndex(beam.PTransform):
  """Writes an index of this run's signed documents (and the rows of the
  index it ran against, if any) under ``path``; its ``manifest.json`` last,
  once every shard file is written and ``done`` (the run's finalized
  outputs) has an element, so a folder with a manifest is complete.

  Inputs (a dict): ``keys`` ``(shard, KeyShard)`` and ``signatures``
  (this run's, from :class:`~transforms.near_dedup.NearDedup`),
  ``clusters`` (:class:`~transforms.select.ClusterColumns`) of this run's
  documents, ``users``
  ``(doc_id, user id)``, ``files`` (this run's :class:`InputFile`), ``done``;
  optional ``old_keys`` and ``old_docs`` from :class:`ReadIndex`.

  Args:
    path: the index folder (empty or new).
    config: the run's parameters (``lsh_shards`` is the index's shards).
    params: the run's parameters as stats.json records them.
    old_files: the files of the index this run ran against (or none).
    version: this package's version, recorded in the manifest.
  """

  def __init__(self, path: str, config: DedupConfig, params: dict,
               old_files: Sequence[InputFile], version: str):
    super().__init__()
    self._path = path
    self._config = config
    self._params = params
    self._old_files = list(old_files)
    self._version = version

  def expand(self, inputs):
    n = self._config.lsh_shards
    keys = [inputs["keys"]] + ([inputs["old_keys"]] if "old_keys" in inputs
                               else [])
    written_keys = (keys | "AllKeys" >> beam.Flatten()
                    | "GroupKeyShards" >> beam.GroupByKey()
                    | "WriteKeyShard" >> beam.ParDo(_WriteKeysFn(self._path,
                                                                 n)))
    sources = beam.pvalue.AsDict(inputs["files"] | "FilePaths" >> beam.Map(
        lambda f: (f.index, f.path)))
    new_docs = ({"signatures": inputs["signatures"]
                             | "RouteSignatures" >> beam.ParDo(
                                 _RouteSignaturesFn(n)),
                 "users": inputs["users"]
                          | "BatchUsers" >> beam.BatchElements(
                              min_batch_size=64, max_batch_size=4096)
                          | "RouteUsers" >> beam.ParDo(_RouteUsersFn(n)),
                 "clusters": inputs["clusters"]
                             | "RouteClusters" >> beam.FlatMap(
                                 _route_clusters, n)}
                | "JoinDocShards" >> JoinByKey()
                | "DocRows" >> beam.ParDo(_DocRowsFn(self._config.num_perm),
                                          sources))
    docs = [new_docs] + ([inputs["old_docs"]] if "old_docs" in inputs else [])
    written_docs = (docs | "AllDocs" >> beam.Flatten()
                    | "GroupDocShards" >> beam.GroupByKey()
                    | "WriteDocShard" >> beam.ParDo(
                        _WriteDocsFn(self._path, n, self._config.num_perm)))
    written = (written_keys, written_docs) | "ShardCounts" >> beam.Flatten()
    # One key: the manifest is written once, after every shard and output.
    return ({"written": written | "KeyCounts" >> beam.Map(
                 lambda shard: (0, shard)),
             "files": inputs["files"] | "KeyFiles" >> beam.Map(
                 lambda f: (0, f)),
             "done": inputs["done"] | "KeyDone" >> beam.Map(
                 lambda d: (0, None))}
            | "JoinForManifest" >> JoinByKey()
            | "WriteManifest" >> beam.Map(self._write_manifest))

  def _write_manifest(self, element):
    _, grouped = element
    if not list(grouped["done"]):
      return None
    counts = dict.fromkeys(_COUNTS, 0)
    shards = {KEYS_DIR: [], DOCS_DIR: []}
    for kind, entry, kept in grouped["written"]:
      shards[kind].append(entry)
      counts[_SHARD_COUNTS[kind]] += entry["rows"]
      counts["index_kept"] += kept
    files = self._old_files + list(grouped["files"])
    manifest = build_manifest(self._params, files, self._config.lsh_shards,
                              counts, shards, self._version)
    with FileSystems.create(FileSystems.join(self._path,
                                             MANIFEST_FILE)) as handle:
      handle.write(json.dumps(manifest, indent=2, sort_keys=True).encode(
          "utf-8") + b"\n")
    return manifest


class _RouteSignaturesFn(beam.DoFn):

  def __init__(self, num_shards: int):
    self._num_shards = num_shards

  def process(self, batch):
    ids, sigs = batch
    for shard, (shard_ids, shard_sigs) in lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(ids, self._num_shards), ids, sigs):
      yield shard, SignatureBatch(shard_ids, shard_sigs)


@beam.typehints.with_output_types(Tuple[int, Tuple[List[int], List[Any]]])
class _RouteUsersFn(beam.DoFn):
  """``(doc_id, user id)`` batches → ``(node shard, (ids, JSON ids))``, as
  lists (Beam's coders encode those natively; an array they would
  pickle)."""

  def __init__(self, num_shards: int):
    self._num_shards = num_shards

  def process(self, batch):
    ids = np.fromiter((d for d, _ in batch), dtype=np.int64, count=len(batch))
    users = np.array([None if u is None else json_text(u)
                      for _, u in batch], dtype=object)
    for shard, (shard_ids, shard_users) in lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(ids, self._num_shards), ids, users):
      yield shard, (shard_ids.tolist(), shard_users.tolist())


def _route_clusters(columns, num_shards: int):
  """A batch of cluster rows → ``(node shard, (doc_id, kept))`` per row."""
  ids, kept = columns.arrays.doc_ids, columns.arrays.kept
  return zip(lsh_kernels.node_shard(ids, num_shards).tolist(),
             zip(ids.tolist(), kept.tolist()))


class _DocRowsFn(beam.DoFn):
  """One node shard's signatures, user ids and kept flags → its doc rows
  (Arrow IPC bytes)."""

  def __init__(self, num_perm: int):
    self._num_perm = num_perm

  def process(self, element, sources):
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    shard, grouped = element
    if not grouped["signatures"]:
      return
    ids, sigs = lsh_kernels.concat_arrays(grouped["signatures"])
    users = {}
    for user_ids, values in grouped["users"]:
      users.update(zip(user_ids, values))
    removed = {doc_id for doc_id, kept in grouped["clusters"] if not kept}
    files, rows = split_doc_id(ids)
    table = pa.table({
        "doc_id": pa.array(ids, pa.int64()),
        "kept": pa.array([d not in removed for d in ids.tolist()], pa.bool_()),
        "id": pa.array([users.get(d) for d in ids.tolist()], pa.string()),
        "source": pa.array([sources[f] for f in files.tolist()], pa.string()),
        "position": pa.array(rows + 1, pa.int64()),
        "signature": pa.FixedSizeListArray.from_arrays(
            pa.array(sigs.ravel(), pa.uint32()), self._num_perm),
    }, schema=docs_schema(self._num_perm))
    yield shard, to_ipc(table)


def _write_parquet(path: str, table) -> int:
  """Writes ``table`` to ``path``; returns the file's size."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with FileSystems.create(path) as handle:
    pq.write_table(table, handle, row_group_size=1 << 20)
  return FileSystems.get_filesystem(path).metadata(path).size_in_bytes


def _shard_entry(path: str, name: str, table) -> dict:
  """A shard's manifest entry, once written to ``path``."""
  return {"name": name, "rows": table.num_rows,
          "size": _write_parquet(path, table)}


class _WriteKeysFn(beam.DoFn):

  def __init__(self, path: str, num_shards: int):
    self._path = path
    self._num_shards = num_shards

  def process(self, element):
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    shard, parts = element
    keys, ids = key_columns(parts)
    order = np.lexsort((ids, keys))
    table = pa.table({"key": keys[order], "doc_id": ids[order]},
                     schema=keys_schema())
    name = shard_name(shard, self._num_shards)
    yield KEYS_DIR, _shard_entry(FileSystems.join(self._path, KEYS_DIR, name),
                                 name, table), 0


class _WriteDocsFn(beam.DoFn):

  def __init__(self, path: str, num_shards: int, num_perm: int):
    self._path = path
    self._num_shards = num_shards
    self._num_perm = num_perm

  def process(self, element):
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    shard, parts = element
    table = pa.concat_tables([from_ipc(p) for p in parts]).cast(
        docs_schema(self._num_perm))
    table = table.take(np.argsort(table.column("doc_id").to_numpy(),
                                  kind="stable"))
    name = shard_name(shard, self._num_shards)
    yield DOCS_DIR, _shard_entry(
        FileSystems.join(self._path, DOCS_DIR, name), name, table), int(
            np.count_nonzero(table.column("kept").to_numpy(
                zero_copy_only=False)))
