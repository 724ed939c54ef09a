"""Reading input documents (JSONL, Parquet, Arrow IPC, plain text) from any
Beam filesystem, with a stable id per document and a reason for every
rejection."""

from __future__ import annotations

import bz2
import contextlib
import datetime
import gzip
import io
import json
import lzma
import re
import zlib
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import orjson
import pyarrow as pa
import zstandard
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import metrics
from transforms.elements import TextBatch, fields_coder

# doc_id = file_index << ROW_BITS | row: ids follow input order (files sorted
# by path, then rows), independent of bundling, and fit in a signed int64.
ROW_BITS = 40
MAX_FILES = 1 << (63 - ROW_BITS)
FORMATS = ("jsonl", "parquet", "arrow", "text")
# Formats read as Arrow record batches (by column), the others line by line.
COLUMNAR_FORMATS = ("parquet", "arrow")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# Arrow IPC: the file format (Feather v2, ``ARROW1`` magic) and the stream
# format (Hugging Face ``datasets.save_to_disk``'s ``data-*.arrow``).
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
# What ends a stream (a continuation marker, then a message length of 0);
# pyarrow's reader takes end of file without it for the end of the stream.
ARROW_STREAM_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Beam's suffixes (CompressionTypes.detect_compression_type), by codec.
COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".zst": "zstd",
                ".zstd": "zstd", ".deflate": "deflate", ".lzma": "lzma",
                ".xz": "lzma"}
UTF8_BOM = b"\xef\xbb\xbf"
_EXCERPT_CHARS = 300
_READ_CHUNK = 1 << 16
# Decompressed bytes per block of :func:`iter_line_blocks`.
LINE_BLOCK_BYTES = 1 << 22
# zstd has no output bound per call: a small input chunk bounds the output
# of one decompress() (a 128 KiB block can be a few bytes).
_ZSTD_READ_CHUNK = 1 << 13
_READ_ERRORS = (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError,
                zstandard.ZstdError, pa.ArrowException)
# The deepest nesting a line read by the standard library may have: its
# decoder fails at the interpreter's recursion limit (1,000 frames, its
# caller's included), so deeper lines would parse or not depending on where
# they are read; below that bound they parse everywhere. (orjson, tried
# first, reads up to 1,024 levels.)
MAX_JSON_DEPTH = 512
# A JSON string (to the end of the text if it has no closing quote), and
# the brackets that nest.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


class Document(NamedTuple):
  """One input document. ``record`` is what the output writes back: the
  original line bytes (JSONL, text) or the row as a dict (Parquet); None for
  Arrow, whose rows are read by column (the writer reads the file again)."""
  doc_id: int
  text: str
  user_id: Any
  record: Any


class Rejected(NamedTuple):
  """An input record that is not a document: ``reason`` is a code (the
  ``rejected_<reason>`` stat), ``detail`` says what exactly is wrong."""
  doc_id: int
  source: str
  position: int
  reason: str
  detail: str
  excerpt: str

  @property
  def message(self) -> str:
    """``<reason>: <detail>``, as the ``rejected/`` rows hold it."""
    return f"{self.reason}: {self.detail}" if self.detail else self.reason

  def row(self) -> dict:
    """The record's ``rejected/`` row."""
    return {"doc_id": self.doc_id, "source": self.source,
            "position": self.position, "reason": self.message,
            "excerpt": self.excerpt}


class InputFile(NamedTuple):
  """A matched input file; ``size`` (bytes) and ``mtime`` (modification
  time, seconds since the epoch) at match time let the stages that read the
  file again detect that it changed meanwhile (``mtime`` None: not
  recorded, the size alone is compared)."""
  index: int
  path: str
  format: str
  size: int
  mtime: Optional[float] = None


InputFileCoder = fields_coder(InputFile, __name__)
# A Parquet record's dict (and any user id) may hold values of any type.
DocumentCoder = fields_coder(Document, __name__, deterministic=False)
RejectedCoder = fields_coder(Rejected, __name__)


class InputChangedError(RuntimeError):
  """An input file differs between two reads of the same job."""


class InputReadError(IOError):
  """An input file cannot be read to its end (truncated or corrupt); the
  message starts with the file's path."""


def check_unchanged(source: InputFile) -> None:
  """Raises :class:`InputChangedError` naming the file if ``source``'s size
  or (when recorded) modification time is not what it was when matched
  (stages after the first read read inputs again). Rewriting a file with
  the same bytes, or touching it, counts as a change."""
  # The path is a path, not a pattern: matching it again as a glob would
  # miss a name holding glob characters.
  try:
    now = FileSystems.get_filesystem(source.path).metadata(source.path)
  except (BeamIOError, OSError):
    now = None
  if now is not None and now.size_in_bytes == source.size and (
      source.mtime is None or now.last_updated_in_seconds == source.mtime):
    return
  found = "now missing" if now is None else (
      f"now {_file_state(now.size_in_bytes, now.last_updated_in_seconds)}")
  raise InputChangedError(
      f"{source.path}: changed while the job ran (modified or touched since"
      f" it was matched: {_file_state(source.size, source.mtime)} then,"
      f" {found}): rerun on an unchanging snapshot")


def _file_state(size: int, mtime: Optional[float]) -> str:
  if mtime is None:
    return f"{size} bytes"
  when = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)
  return f"{size} bytes, modified {when.isoformat(timespec='microseconds')}"


def read_texts(source: InputFile, rows: Iterable[int], text_field: str,
               id_field: Optional[str] = None) -> Iterable[Tuple[int, Any]]:
  """``(row, text)`` of the given rows of a file that were documents when
  the job read it, in row order, parsing only those rows; with
  ``id_field``, ``(row, (text, user id))`` (the user id as
  :class:`Document` has it: None when absent)."""
  wanted = set(rows)
  check_unchanged(source)
  found = 0
  if source.format in COLUMNAR_FORMATS:
    columns = [text_field] + ([id_field] if id_field else [])
    with open_batches(source, columns) as (names, batches):
      with_id = bool(id_field) and id_field in names
      start = 0
      for batch in batches:
        hits = sorted(r - start for r in wanted
                      if start <= r < start + batch.num_rows)
        if hits:
          texts = batch.column(text_field).take(hits).to_pylist()
          if id_field:
            users = (batch.column(id_field).take(hits).to_pylist() if with_id
                     else [None] * len(hits))
            texts = list(zip(texts, users))
          found += len(hits)
          yield from ((start + r, t) for r, t in zip(hits, texts))
        start += batch.num_rows
  else:
    # Only the wanted rows are sliced out of each block of lines.
    rows_wanted = np.array(sorted(wanted), dtype=np.int64)
    for first, block, starts in iter_line_blocks(source.path):
      lo, hi = np.searchsorted(rows_wanted, [first, first + len(starts) - 1])
      at = rows_wanted[lo:hi] - first
      for row, start, end in zip(rows_wanted[lo:hi].tolist(),
                                 starts[at].tolist(), starts[at + 1].tolist()):
        found += 1
        text = line_content(row, strip_line_end(block[start:end])).decode(
            "utf-8")
        if source.format != "jsonl":
          yield row, (text, None) if id_field else text
          continue
        text, user_id = document_fields(text, text_field, id_field or "")
        yield row, (text, user_id) if id_field else text
  if found < len(wanted):
    raise InputChangedError(
        f"{source.path} has fewer rows than when it was read: it changed "
        "while the job ran; rerun on an unchanging snapshot.")


def make_doc_id(file_index, row):
  """The document id of a file's row (ints, or int64 arrays of rows).

  >>> make_doc_id(2, 5) == 2 * 2**40 + 5
  True
  >>> import numpy as np
  >>> split_doc_id(make_doc_id(2, np.array([5, 6])))
  (array([2, 2]), array([5, 6]))
  """
  return (file_index << ROW_BITS) | row


def split_doc_id(doc_id):
  """``(file index, row)`` of a document id (or of an int64 array of them)."""
  return doc_id >> ROW_BITS, doc_id & ((1 << ROW_BITS) - 1)


def compression_of(path: str) -> Optional[str]:
  """The codec a file's extension names (Beam's rule), or None."""
  name = path.lower()
  for suffix, codec in COMPRESSIONS.items():
    if name.endswith(suffix):
      return codec
  return None


def detect_format(path: str, input_format: str = "auto") -> str:
  if input_format != "auto":
    return input_format
  name = path.lower()
  for suffix in COMPRESSIONS:
    if name.endswith(suffix):
      name = name[:-len(suffix)]
  if name.endswith(".parquet"):
    return "parquet"
  if name.endswith(ARROW_SUFFIXES):
    return "arrow"
  if name.endswith(_JSONL_SUFFIXES):
    return "jsonl"
  return "text"


def expand_inputs(patterns: Sequence[str], input_format: str = "auto",
                  first_index: int = 0) -> List[InputFile]:
  """All files matching ``patterns``, de-duplicated and sorted by path,
  numbered from ``first_index``.

  Raises ``ValueError`` naming the patterns when nothing matches.
  """
  if input_format not in FORMATS + ("auto",):
    raise ValueError(f"input format {input_format!r}: use one of "
                     f"{('auto',) + FORMATS}")
  paths = {}
  for result in FileSystems.match(list(patterns)):
    paths.update((m.path, m) for m in result.metadata_list)
  if not paths:
    raise ValueError(f"No input files match {list(patterns)}; check --input.")
  if len(paths) + first_index > MAX_FILES:
    raise ValueError(f"{len(paths) + first_index} input files (indexed ones"
                     f" included) exceed the limit of {MAX_FILES}; merge"
                     " inputs into fewer files.")
  return [InputFile(i, p, detect_format(p, input_format),
                    paths[p].size_in_bytes, paths[p].last_updated_in_seconds)
          for i, p in enumerate(sorted(paths), first_index)]


class ReadDocuments(beam.PTransform):
  """Reads documents; returns ``{"documents", "batches", "rejected", "files",
  "counts"}``.

  * ``documents``: :class:`Document` with ``doc_id = file_index << 40 | row``
    (rows count every line or Parquet row, rejected ones too); empty unless
    ``documents``.
  * ``batches``: the same documents' ids and texts as
    :class:`~transforms.elements.TextBatch` elements of up to
    ``TEXT_BATCH`` documents of one file (what signing takes, with no
    per-document element).
  * ``rejected``: :class:`Rejected` for malformed JSON, a missing or non-string
    text field, invalid UTF-8 and a JSONL line that is blank.
  * ``files``: :class:`InputFile` per matched file (the manifest).
  * ``counts``: a tuple of PCollections of ``("docs_in", n)`` per file:
    documents plus rejections.

  Text files: one document per line (blank lines are empty documents).
  Compression is detected from the file extension. Parquet and Arrow IPC
  files are read by column: only the text and id columns.

  Args:
    patterns: file patterns (any Beam filesystem), matched files sorted by
      path.
    input_format: ``auto`` (by extension), ``jsonl``, ``parquet``,
      ``arrow`` or ``text``.
    text_field: the JSONL field (a dotted path reaches into nested objects,
      see :func:`field_value`) or the Parquet/Arrow column holding the text.
    id_field: the field or column holding the user's id (kept as is).
    first_index: the index of the first file (a run against an index
      numbers its files after the indexed ones).
    documents: whether to emit the per-document ``documents`` too.
  """

  def __init__(self, patterns: Sequence[str], input_format: str = "auto",
               text_field: str = "text", id_field: str = "id",
               first_index: int = 0, documents: bool = True):
    super().__init__()
    if isinstance(patterns, str):
      patterns = [patterns]
    self._patterns = tuple(patterns)
    self._input_format = input_format
    self._text_field = text_field
    self._id_field = id_field
    self._first_index = first_index
    self._documents = documents

  def expand(self, pbegin):
    files = (pbegin
             | "CreatePatterns" >> beam.Create([self._patterns])
             | "MatchFiles" >> beam.FlatMap(expand_inputs, self._input_format,
                                            self._first_index)
             .with_output_types(InputFile))
    read = (files
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(
                _ReadFileFn(self._text_field, self._id_field,
                            self._documents))
            .with_output_types(Document, batches=TextBatch, rejected=Rejected,
                               **{metrics.COUNTS: Any})
            .with_outputs("batches", "rejected", metrics.COUNTS,
                          main="documents"))
    return {
        "documents": read.documents,
        "batches": read.batches,
        "rejected": read.rejected,
        "files": files,
        "counts": (read[metrics.COUNTS],),
    }


# Documents per TextBatch: signing's batch size.
TEXT_BATCH = 4096


class _ReadFileFn(beam.DoFn):
  """Parses one input file into text batches (and documents), and
  rejections."""

  def __init__(self, text_field: str, id_field: str, documents: bool):
    self._text_field = text_field
    self._id_field = id_field
    self._documents = documents

  def process(self, input_file: InputFile):
    metrics.counter("input_files").inc()
    if input_file.format == "jsonl" and not self._documents:
      yield from self._jsonl_texts(input_file)
      return
    rows = 0
    ids, texts = [], []
    for record in read_file(input_file, self._text_field, self._id_field):
      rows += 1
      if isinstance(record, Rejected):
        metrics.counter(metrics.rejected_stat(record.reason)).inc()
        yield beam.pvalue.TaggedOutput("rejected", record)
        continue
      ids.append(record.doc_id)
      texts.append(record.text)
      if self._documents:
        yield record
      if len(ids) == TEXT_BATCH:
        yield _text_batch(ids, texts)
        ids, texts = [], []
    if ids:
      yield _text_batch(ids, texts)
    yield metrics.count_tag("docs_in", rows)


  def _jsonl_texts(self, input_file: InputFile):
    """What :meth:`process` gives for a JSONL file when no documents are
    wanted, a block of lines at a time (:func:`jsonl_texts`)."""
    rows, ids, texts = 0, [], []
    for block_ids, block_texts, rejected, n in jsonl_texts(
        input_file.index, input_file.path, self._text_field, self._id_field):
      rows += n
      for record in rejected:
        metrics.counter(metrics.rejected_stat(record.reason)).inc()
        yield beam.pvalue.TaggedOutput("rejected", record)
      ids += block_ids
      texts += block_texts
      while len(ids) >= TEXT_BATCH:
        yield _text_batch(ids[:TEXT_BATCH], texts[:TEXT_BATCH])
        del ids[:TEXT_BATCH], texts[:TEXT_BATCH]
    if ids:
      yield _text_batch(ids, texts)
    yield metrics.count_tag("docs_in", rows)


def jsonl_texts(index: int, path: str, text_field: str, id_field: str,
                block_bytes: int = LINE_BLOCK_BYTES
                ) -> Iterable[Tuple[List[int], List[str], List[Any], int]]:
  """``(doc ids, texts, rejections, rows)`` per block of a JSONL file's
  lines (:func:`iter_line_blocks`): the documents and :class:`Rejected`
  rows that :func:`read_file` gives, in row order, without making a
  :class:`Document` of each line.

  A line that :func:`json_fields` would take from orjson is that document
  (orjson reads the bytes, refusing invalid UTF-8 as the decoding would);
  every other line, and row 0 (which may open with a BOM), takes
  :func:`parse_json_line`.
  """
  for first, block, _ in iter_line_blocks(path, block_bytes):
    lines = block.split(b"\n")
    ended = lines[-1] == b""  # the block's last line has its line ending
    if ended:
      lines.pop()
    ids, texts, rejected = [], [], []
    last = len(lines) - 1
    for i, line in enumerate(lines):
      row = first + i
      if line[-1:] == b"\r" and (ended or i < last):
        line = line[:-1]  # \r\n, as iter_lines strips it
      if row:
        try:
          obj = orjson.loads(line)
        except orjson.JSONDecodeError:
          obj = None
        if type(obj) is dict:
          found, text = field_value(obj, text_field)
          if found and type(text) is str and _exact(
              field_value(obj, id_field)[1]):
            ids.append(make_doc_id(index, row))
            texts.append(text)
            continue
      record = parse_json_line(make_doc_id(index, row), path, row, line,
                               text_field, id_field)
      if isinstance(record, Rejected):
        rejected.append(record)
      else:
        ids.append(record.doc_id)
        texts.append(record.text)
    yield ids, texts, rejected, len(lines)


def _text_batch(ids, texts):
  return beam.pvalue.TaggedOutput(
      "batches", TextBatch(np.array(ids, dtype=np.int64), texts))


def read_file(input_file: InputFile, text_field: str = "text",
              id_field: str = "id") -> Iterable[Any]:
  """Every row of one input file in order, as the :class:`Document` or
  :class:`Rejected` that :class:`ReadDocuments` makes of it (without adding
  to its counters); stop iterating early to read only a prefix."""
  index, path, fmt = input_file[:3]
  if fmt in COLUMNAR_FORMATS:
    return _columnar_records(input_file, text_field, id_field)
  return _line_records(index, path, fmt, text_field, id_field)


def _line_records(index, path, fmt, text_field, id_field):
  for row, line in iter_lines(path):
    doc_id = make_doc_id(index, row)
    if fmt == "jsonl":
      yield parse_json_line(doc_id, path, row, line, text_field, id_field)
    else:
      yield _text_document(doc_id, path, row, line)


def parse_json_line(doc_id: int, path: str, row: int, line: bytes,
                    text_field: str, id_field: str):
  """One JSONL line (without its line ending) as a :class:`Document`, or as
  the :class:`Rejected` that says why it is none.

  Args:
    doc_id: the id the document gets.
    path: the file's path (``Rejected.source``).
    row: the line's 0-based row (a UTF-8 BOM is dropped on row 0).
    line: the line's bytes.
    text_field: the JSON field holding the text (dotted: nested, see
      :func:`field_value`).
    id_field: the JSON field holding the user's id (None if absent).

  >>> parse_json_line(7, "a.jsonl", 3, b'{"text": 5}', "text", "id")[3:5]
  ('text_not_string', "'text' is int")
  >>> parse_json_line(7, "a.jsonl", 3, b'{"text": "hi", "id": 1}', "text",
  ...                 "id")[:3]
  (7, 'hi', 1)
  """

  def reject(reason, detail):
    return Rejected(doc_id, path, row + 1, reason, detail, _excerpt(line))

  try:
    decoded = line_content(row, line).decode("utf-8")
  except UnicodeDecodeError as e:
    return reject("invalid_utf8", f"{e.reason} at byte {e.start}")
  if not decoded.strip():
    return reject("blank_line", "a JSONL line must hold one JSON object")
  fast = json_fields(decoded, text_field, id_field)
  if fast is not None:
    return Document(doc_id, fast[0], fast[1], line)
  try:
    obj = loads_json(decoded)
  except ValueError as e:
    return reject("malformed_json", str(e))
  if not isinstance(obj, dict):
    return reject("not_an_object", f"got JSON {type(obj).__name__}")
  found, text = field_value(obj, text_field)
  if not found:
    return reject("missing_text_field", missing_field_detail(obj, text_field))
  if not isinstance(text, str):
    return reject("text_not_string", f"{text_field!r} is "
                  f"{type(text).__name__}")
  if not _encodable(text):
    return reject("invalid_utf8", "text holds an unpaired surrogate escape")
  return Document(doc_id, text, field_value(obj, id_field)[1], line)


def json_fields(decoded: str, text_field: str,
                id_field: str) -> Optional[Tuple[str, Any]]:
  """``(text, user id)`` of a JSONL line read by orjson, when that is
  exactly what ``json.loads`` gives: the line is an object, its text a
  string, its user id absent, a string, an int or a bool. None otherwise,
  and the caller reads the line with ``json.loads``.

  orjson is about 5x faster on these lines; it differs from the standard
  library only in what it refuses (NaN, Infinity, unpaired surrogate
  escapes, deep nesting) and in reading integers beyond 64 bits as floats,
  so those lines, and every rejection, take the standard library's path
  and words.

  >>> json_fields('{"text": "a", "id": 7}', "text", "id")
  ('a', 7)
  >>> json_fields('{"text": "a", "id": 18446744073709551616}', "text", "id")
  """
  try:
    obj = orjson.loads(decoded)
  except orjson.JSONDecodeError:
    return None
  if type(obj) is not dict:
    return None
  found, text = field_value(obj, text_field)
  user_id = field_value(obj, id_field)[1]
  if found and type(text) is str and _exact(user_id):
    return text, user_id
  return None


def json_field(decoded: str, field: str) -> Any:
  """The value of a JSONL document's ``field`` (None when absent), as
  ``json.loads`` gives it (orjson where that is the same, see
  :func:`json_fields`)."""
  try:
    obj = orjson.loads(decoded)
    if type(obj) is dict:
      value = field_value(obj, field)[1]
      if _exact(value):
        return value
  except orjson.JSONDecodeError:
    pass
  return field_value(loads_json(decoded), field)[1]


def _exact(value) -> bool:
  """Whether orjson's reading of a value is the standard library's."""
  return value is None or type(value) in (str, int, bool)


def document_fields(decoded: str, text_field: str,
                    id_field: str) -> Tuple[str, Any]:
  """``(text, user id)`` of a JSONL line that :func:`parse_json_line`
  reads as a document, as that document has them."""
  fast = json_fields(decoded, text_field, id_field)
  if fast is not None:
    return fast
  obj = loads_json(decoded)
  return field_value(obj, text_field)[1], field_value(obj, id_field)[1]


def loads_json(text: str) -> Any:
  """``json.loads(text)`` of user data, a ``ValueError`` (never a
  ``RecursionError``) for any text it cannot read: nested deeper than
  :data:`MAX_JSON_DEPTH` levels, the same wherever it is read.

  >>> loads_json("[" * 600 + "]" * 600)
  Traceback (most recent call last):
  ...
  ValueError: nesting too deep (more than 512 levels of arrays and objects)
  """
  depth = 0
  for bracket in _JSON_BRACKETS.findall(_JSON_STRING.sub("", text)):
    depth += 1 if bracket in "[{" else -1
    if depth > MAX_JSON_DEPTH:
      raise ValueError(f"nesting too deep (more than {MAX_JSON_DEPTH} levels"
                       " of arrays and objects)")
  return json.loads(text)


def field_value(obj: dict, path: str) -> Tuple[bool, Any]:
  """``(found, value)`` of a JSON object's field ``path``: a top-level key
  spelled exactly ``path`` (dots included) wins; otherwise a dotted path
  walks nested objects (``metadata.body`` is ``obj["metadata"]["body"]``).

  >>> field_value({"meta": {"body": "x"}}, "meta.body")
  (True, 'x')
  >>> field_value({"meta.body": 1, "meta": {"body": 2}}, "meta.body")
  (True, 1)
  >>> field_value({"meta": "x"}, "meta.body")
  (False, None)
  """
  if path in obj:
    return True, obj[path]
  if "." not in path:
    return False, None
  value = obj
  for name in path.split("."):
    if not isinstance(value, dict) or name not in value:
      return False, None
    value = value[name]
  return True, value


def missing_field_detail(obj: dict, path: str) -> str:
  """Why :func:`field_value` found no ``path`` in ``obj``, naming the path
  and, for a dotted one, the step where it ends.

  >>> missing_field_detail({"meta": {"a": 1}}, "meta.body")
  "no 'meta.body' field ('meta' has no 'body')"
  """
  detail = f"no {path!r} field"
  if "." not in path:
    return detail
  value, walked = obj, []
  for name in path.split("."):
    if not isinstance(value, dict):
      return (f"{detail} ({'.'.join(walked)!r} is {type(value).__name__},"
              " not an object)")
    if name not in value:
      return (f"{detail} ({'.'.join(walked)!r} has no {name!r})" if walked
              else detail)
    walked.append(name)
    value = value[name]
  return detail


def _columnar_records(source: InputFile, text_field: str, id_field: str):
  """The rows of a Parquet or Arrow file as documents or rejections. Arrow
  files are read by column (text and id only; ``record`` None, a
  rejection's excerpt shows those columns); Parquet rows keep every column
  in ``record``."""
  columns = None if source.format == "parquet" else [text_field, id_field]
  with open_batches(source, columns) as (names, batches):
    has_text, has_id = text_field in names, id_field in names
    row = 0
    for batch in batches:
      for obj in batch.to_pylist():
        doc_id = make_doc_id(source.index, row)
        text = obj.get(text_field)
        if not has_text:
          yield Rejected(doc_id, source.path, row + 1, "missing_text_field",
                         f"no {text_field!r} column", _excerpt(obj))
        elif not isinstance(text, str):
          yield Rejected(doc_id, source.path, row + 1, "text_not_string",
                         f"{text_field!r} is {type(text).__name__}",
                         _excerpt(obj))
        else:
          yield Document(doc_id, text, obj.get(id_field) if has_id else None,
                         obj if source.format == "parquet" else None)
        row += 1


@contextlib.contextmanager
def open_arrow(path: str):
  """``(reader, flavour)`` of an Arrow IPC file over any Beam filesystem:
  flavour ``file`` (``ARROW1`` magic: Feather v2) or ``stream`` (what
  ``datasets.save_to_disk`` writes). A local file is memory-mapped, so the
  columns a reader does not select are never read from disk. A file that is
  neither, or a stream without its end-of-stream marker (cut, possibly at a
  record-batch boundary, which pyarrow would read as its end), raises
  :class:`InputReadError`."""
  local = "://" not in path
  with (contextlib.nullcontext(pa.memory_map(path)) if local else
        FileSystems.open(path,
                         compression_type=CompressionTypes.UNCOMPRESSED)
        ) as handle:
    flavour = ("file" if handle.read(len(ARROW_FILE_MAGIC))
               == ARROW_FILE_MAGIC else "stream")
    handle.seek(0)
    try:
      # Looked at before the reader takes the handle, whose position it
      # owns from then on.
      ended = flavour == "file" or _ends_stream(handle)
      reader = (pa.ipc.open_file(handle) if flavour == "file"
                else pa.ipc.open_stream(handle))
      if not ended:
        raise EOFError("the Arrow IPC stream ends without its end-of-stream"
                       " marker")
    except _READ_ERRORS as e:
      raise _read_error(path, e) from e
    yield reader, flavour


def _ends_stream(handle) -> bool:
  """Whether the file open in ``handle`` ends with an Arrow IPC stream's
  end-of-stream marker; leaves ``handle`` at its start."""
  size = handle.seek(0, io.SEEK_END)
  handle.seek(max(size - len(ARROW_STREAM_EOS), 0))
  tail = handle.read(len(ARROW_STREAM_EOS))
  handle.seek(0)
  return tail == ARROW_STREAM_EOS


def _projected_batches(path: str, reader, columns=None):
  """The record batches of an IPC reader (file or stream), with only
  ``columns`` when given; a read error names ``path``."""

  def batches():
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
      yield from (reader.get_batch(i)
                  for i in range(reader.num_record_batches))
    else:
      yield from reader

  for batch in _read_or_fail(path, batches()):
    yield batch if columns is None else batch.select(columns)


@contextlib.contextmanager
def open_batches(source: InputFile, columns=None):
  """``(column names, record batches)`` of a Parquet or Arrow IPC input:
  the file's column names, and its batches in row order with only those of
  ``columns`` (when given) that the file has; read errors name the file."""
  with (open_parquet(source.path) if source.format == "parquet"
        else open_arrow(source.path)) as opened:
    names = (opened.schema_arrow if source.format == "parquet"
             else opened[0].schema).names
    if columns is not None:
      columns = list(dict.fromkeys(c for c in columns if c in names))
    if source.format == "parquet":
      kwargs = {} if columns is None else {"columns": columns}
      yield names, iter_parquet_batches(source.path, opened, **kwargs)
    else:
      yield names, _projected_batches(source.path, opened[0], columns)


def parse_record(line: bytes, input_format: str, source: str, row: int,
                 text_field: str = "text", id_field: str = "id"):
  """One JSONL or text line as the :class:`Document` (``doc_id`` 0) or
  :class:`Rejected` that :class:`ReadDocuments` makes of it; the streaming
  path parses its messages with the same rules and reasons."""
  if input_format == "jsonl":
    return parse_json_line(0, source, row, line, text_field, id_field)
  return _text_document(0, source, row, line)


def iter_lines(path: str) -> Iterable[Tuple[int, bytes]]:
  """``(row, line)`` for every line of a (possibly compressed) file, without
  its ``\\n`` or ``\\r\\n``; the row numbering every reader of a file
  shares. A compressed stream is read to its end-of-stream check: a
  truncated or corrupt one raises :class:`InputReadError`."""
  # Iterating a stream gives the lines readline() would, faster.
  with open_stream(path) as handle:
    for row, line in enumerate(_read_or_fail(path, handle)):
      if line[-1:] == b"\n":
        line = line[:-2] if line[-2:-1] == b"\r" else line[:-1]
      yield row, line


def iter_line_blocks(path: str, block_bytes: int = LINE_BLOCK_BYTES
                     ) -> Iterable[Tuple[int, bytes, np.ndarray]]:
  """The lines of :func:`iter_lines` (same rows), a block of whole lines at
  a time: ``(first row, block, starts)`` where row ``first + i`` is
  ``block[starts[i]:starts[i + 1]]``, its line ending (none on a last line
  without one) included. Readers that touch a few rows, or copy runs of rows as they
  are, pay no Python work per line.

  Args:
    path: the file (any Beam filesystem; compressed by its extension).
    block_bytes: how many decompressed bytes are read at a time (a line
      longer than that makes its block longer).
  """
  with open_stream(path) as handle:
    row, carry = 0, b""
    reads = iter(lambda: handle.read(block_bytes), b"")
    for data in _read_or_fail(path, reads):
      block = carry + data if carry else data
      cut = block.rfind(b"\n") + 1
      if not cut:
        carry = block
        continue
      block, carry = (block[:cut], block[cut:]) if cut < len(block) else (
          block, b"")
      starts = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
      starts = np.concatenate([[0], starts + 1])
      yield row, block, starts
      row += len(starts) - 1
    if carry:  # a last line without a line ending
      yield row, carry, np.array([0, len(carry)])


def strip_line_end(line: bytes) -> bytes:
  """A line without its ``\\n`` or ``\\r\\n`` (as :func:`iter_lines` gives
  it)."""
  if line[-1:] == b"\n":
    return line[:-2] if line[-2:-1] == b"\r" else line[:-1]
  return line


def line_content(row: int, line: bytes) -> bytes:
  """A line without the UTF-8 byte order mark that may open a file (row 0):
  the BOM marks the encoding, it is not part of the first record."""
  return line[len(UTF8_BOM):] if row == 0 and line.startswith(
      UTF8_BOM) else line


@contextlib.contextmanager
def open_stream(path: str):
  """A buffered binary stream of a file's decompressed bytes (codec from the
  extension, as Beam picks it). Unlike Beam's own reader, every codec checks
  its end-of-stream marker, so a truncated file raises instead of ending
  early."""
  with FileSystems.open(
      path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
    codec = compression_of(path)
    if codec is None:
      yield raw
    elif codec == "gzip":
      with gzip.GzipFile(fileobj=raw, mode="rb") as handle:
        yield handle
    elif codec == "bzip2":
      with bz2.BZ2File(raw) as handle:
        yield handle
    elif codec == "lzma":
      with lzma.LZMAFile(raw) as handle:
        yield handle
    else:
      yield io.BufferedReader(_CheckedStream(raw, codec), _READ_CHUNK)


# What ``--output_compression`` accepts besides ``auto`` and ``none``, and
# the suffix each codec's output gets.
OUTPUT_CODECS = {"gzip": ".gz", "bzip2": ".bz2", "zstd": ".zst",
                 "lzma": ".xz", "deflate": ".deflate"}


def compression_suffix(path: str) -> str:
  """The compression suffix of ``path`` as spelled there (``.gz``,
  ``.zstd``, ``.lzma``, ...), or ``""``."""
  name = path.lower()
  return next((suffix for suffix in COMPRESSIONS if name.endswith(suffix)),
              "")


class _Compressed(io.RawIOBase):
  """A writable stream compressing into ``raw`` with one streaming
  compressor object (zstd frames or Beam's zlib "deflate")."""

  def __init__(self, raw, compressor):
    super().__init__()
    self._raw = raw
    self._compressor = compressor

  def writable(self):
    return True

  def write(self, data):
    self._raw.write(self._compressor.compress(data))
    return len(data)

  def close(self):
    if not self.closed:
      self._raw.write(self._compressor.flush())
    super().close()


@contextlib.contextmanager
def create_stream(path: str, suffix: str = ""):
  """A binary stream writing ``path`` (any Beam filesystem) compressed as
  ``suffix`` says (``""``: not at all), byte-identical for the same data:
  gzip with mtime 0 and no file name in its header, xz (``.lzma``: the
  legacy ``lzma_alone`` format, as such inputs are), one zstd frame (level
  3, single-threaded), zlib for ``.deflate`` (what Beam reads as deflate).
  Readable back by :func:`open_stream`."""
  codec = COMPRESSIONS.get(suffix)
  with FileSystems.create(
      path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
    if codec is None:
      yield raw
      return
    if codec == "gzip":
      handle = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
    elif codec == "bzip2":
      handle = bz2.BZ2File(raw, "wb")
    elif codec == "lzma":
      handle = lzma.LZMAFile(raw, "wb", format=(
          lzma.FORMAT_ALONE if suffix == ".lzma" else lzma.FORMAT_XZ))
    elif codec == "zstd":
      handle = _Compressed(raw, zstandard.ZstdCompressor(
          level=3, threads=0).compressobj())
    else:
      handle = _Compressed(raw, zlib.compressobj())
    with handle:
      yield handle


class _CheckedStream(io.RawIOBase):
  """Decompresses zstd or zlib (Beam's "deflate") frames one after another
  and raises ``EOFError`` if the input ends inside a frame (zstandard's own
  stream reader just stops there)."""

  def __init__(self, raw, codec: str):
    super().__init__()
    self._raw = raw
    self._codec = codec
    self._decompressor = None
    self._pending = b""

  def readable(self):
    return True

  def _new_decompressor(self):
    if self._codec == "zstd":
      return zstandard.ZstdDecompressor().decompressobj()
    return zlib.decompressobj()

  def readinto(self, buffer):
    while not self._pending:
      data = self._raw.read(_ZSTD_READ_CHUNK if self._codec == "zstd"
                            else _READ_CHUNK)
      if not data:
        if self._decompressor is not None and not self._decompressor.eof:
          raise EOFError("compressed stream ended before the end-of-stream "
                         "marker was reached")
        return 0
      while data:
        if self._decompressor is None or self._decompressor.eof:
          self._decompressor = self._new_decompressor()
        self._pending += self._decompressor.decompress(data)
        data = self._decompressor.unused_data if self._decompressor.eof \
            else b""
    n = min(len(buffer), len(self._pending))
    buffer[:n] = self._pending[:n]
    self._pending = self._pending[n:]
    return n


def _read_or_fail(path: str, items):
  """Yields from ``items``; a decoding error while reading ``path`` becomes
  an :class:`InputReadError` naming the file (a worker's traceback would
  not)."""
  try:
    yield from items
  except InputReadError:
    raise
  except _READ_ERRORS as e:
    raise _read_error(path, e) from e


def _read_error(path: str, error: Exception) -> InputReadError:
  return InputReadError(
      f"{path}: cannot be read to its end ({type(error).__name__}: {error});"
      " the file is truncated or corrupt: replace it (or remove it from"
      " --input) and rerun")


@contextlib.contextmanager
def open_parquet(path: str):
  """A ``pyarrow.parquet.ParquetFile`` over any Beam filesystem; a file
  without a valid footer raises :class:`InputReadError`."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with FileSystems.open(
      path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
    try:
      parquet = pq.ParquetFile(handle)
    except _READ_ERRORS as e:
      raise _read_error(path, e) from e
    yield parquet


def iter_parquet_batches(path: str, parquet, **kwargs):
  """``parquet.iter_batches(**kwargs)``, a read error naming ``path``."""
  return _read_or_fail(path, parquet.iter_batches(**kwargs))


def _text_document(doc_id, path, row, line: bytes):
  try:
    return Document(doc_id, line_content(row, line).decode("utf-8"), None,
                    line)
  except UnicodeDecodeError as e:
    return Rejected(doc_id, path, row + 1, "invalid_utf8",
                    f"{e.reason} at byte {e.start}", _excerpt(line))


def _encodable(text: str) -> bool:
  try:
    text.encode("utf-8")
    return True
  except UnicodeEncodeError:
    return False


def _excerpt(record) -> str:
  if isinstance(record, bytes):
    text = record.decode("utf-8", errors="backslashreplace")
  else:
    text = json.dumps(record, default=str, ensure_ascii=False)
  return text[:_EXCERPT_CHARS]
