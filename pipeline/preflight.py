"""Checks of the inputs before a job starts: every problem found is one line
naming the file and the fix, and nothing is deleted or written first.

Each matched file must be a regular, readable file whose bytes agree with how
it will be read: compression magic versus extension (gzip, bzip2, zstd, xz),
Parquet magic and footer, Arrow IPC magic (file or stream format), JSON
objects in a JSONL sample, and the text field in the Parquet or Arrow schema
or in the sampled JSONL records (the fields there are are listed). A
Hugging Face ``datasets.save_to_disk`` folder given as ``--input`` stands
for its data files (:func:`dataset_patterns`): each file its
``state.json`` lists, which must be a file name in the folder and exist;
its metadata files matched by a glob are refused, never read as data. An
Arrow IPC stream must end with its end-of-stream marker. A truncated
compressed stream can only be found by reading all of it; the job does that
and fails naming the file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import os
from typing import List, Optional, Sequence, Tuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.annotate import FIELDS as ANNOTATION_FIELDS
from transforms.annotate import conflicting_columns
from transforms.index import (Index, IndexFolderError, incompatibilities,
                              read_manifest)
from transforms.read import (ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC, InputFile,
                             InputReadError, compression_of, expand_inputs,
                             field_value, iter_lines, line_content,
                             loads_json, open_arrow, open_parquet)

HEAD_BYTES = 1 << 16
SAMPLE_LINES = 100
_SAMPLE_BYTES = 1 << 20
_PARALLEL_FILES = 16
_PARQUET_MAGIC = b"PAR1"
# The extension to suggest for data of each codec.
_SUFFIX = {"gzip": "gz", "bzip2": "bz2", "zstd": "zst", "lzma": "xz",
           "deflate": "deflate"}
# What datasets.save_to_disk writes next to its data-*.arrow files, and the
# key that marks each as such.
_DATASET_STATE, _DATASET_INFO, _DATASET_DICT = (
    "state.json", "dataset_info.json", "dataset_dict.json")
_DATASET_METADATA = {_DATASET_STATE: "_data_files",
                     _DATASET_INFO: "features", _DATASET_DICT: "splits"}


def check_inputs(patterns: Sequence[str], input_format: str,
                 text_field: str, annotate: bool = False
                 ) -> Tuple[List[InputFile], List[str]]:
  """``(matched files, problems)``; each problem is one line starting with
  the pattern or file it concerns and saying how to fix it. With
  ``annotate``, inputs must be able to take the annotation fields."""
  problems = [p for pattern in patterns for p in _check_pattern(pattern)]
  try:
    files = expand_inputs(patterns, input_format)
  except ValueError as e:
    return [], problems or [str(e)]
  # Beam matches a folder named as such as a file; _check_pattern said so.
  checked = [f for f in files if "://" in f.path or not os.path.isdir(f.path)]
  with concurrent.futures.ThreadPoolExecutor(_PARALLEL_FILES) as pool:
    for found in pool.map(lambda f: _check_file(f, text_field, annotate),
                          checked):
      problems.extend(found)
  return files, problems


def dataset_patterns(patterns: Sequence[str]) -> List[str]:
  """``patterns`` with each Hugging Face ``datasets.save_to_disk`` folder
  (one holding ``state.json``) replaced by its data files, in the order
  ``state.json`` lists them, each a pattern matching that file only;
  every other pattern unchanged."""
  resolved = []
  for pattern in patterns:
    folder = pattern.rstrip("/")
    if _is_folder(pattern) and FileSystems.exists(
        FileSystems.join(folder, _DATASET_STATE)):
      try:
        # Escaped: a file name is matched as itself, never as a glob.
        resolved.extend(glob.escape(path) for path in _dataset_files(folder))
        continue
      except ValueError:
        pass  # Left as given: the pre-flight's pattern check says why.
    resolved.append(pattern)
  return resolved


def _dataset_files(folder: str) -> List[str]:
  """The paths of the data files a ``datasets.save_to_disk`` folder's
  ``state.json`` lists. Raises ``ValueError`` (its message the problem's
  line) unless it lists files by plain names, each once, and all exist."""
  state_path = FileSystems.join(folder, _DATASET_STATE)
  give = f"give the data files, e.g. --input '{folder}/*.arrow'"
  try:
    with FileSystems.open(
        state_path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
      entries = loads_json(f.read().decode("utf-8"))["_data_files"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{state_path}: does not list the data files "
                     f"(_data_files); {give}") from e
  if not isinstance(entries, list) or not entries:
    raise ValueError(f"{state_path}: does not list the data files "
                     f"(_data_files); {give}")
  paths = []
  for entry in entries:
    name = entry.get("filename", entry) if isinstance(entry, dict) else entry
    if not isinstance(entry, dict) or not _is_file_name(name):
      raise ValueError(f"{state_path}: lists {name!r} in _data_files, not a"
                       f" file name in the folder; fix it or {give}")
    path = FileSystems.join(folder, name)
    if path in paths:
      raise ValueError(f"{state_path}: lists {name!r} twice in _data_files;"
                       f" fix it or {give}")
    if not FileSystems.exists(path):
      raise ValueError(f"{path}: listed in {state_path} but missing; restore"
                       " it (an incomplete copy?) or give the files that are"
                       f" there, e.g. --input '{folder}/*.arrow'")
    paths.append(path)
  return paths


def _is_file_name(name) -> bool:
  """Whether ``name`` names a file in a folder: not a path, not the folder
  or its parent."""
  return (isinstance(name, str) and name not in ("", ".", "..")
          and "/" not in name and "\\" not in name)


def _check_pattern(pattern: str) -> List[str]:
  """Folders and, on the local filesystem, broken links or non-files a
  glob matches (Beam's own matching lists a folder, or skips the others)."""
  if pattern.endswith("/") or _is_folder(pattern):
    name = pattern.rstrip("/")
    if FileSystems.exists(FileSystems.join(name, _DATASET_DICT)):
      return [f"{pattern}: is a Hugging Face DatasetDict folder; give one "
              f"split's folder (e.g. --input {name}/train) or its files, "
              f"e.g. --input '{name}/*/data-*.arrow'"]
    if FileSystems.exists(FileSystems.join(name, _DATASET_STATE)):
      try:
        _dataset_files(name)
      except ValueError as e:
        return [str(e)]
    return [f"{pattern}: is a folder, not a file pattern; give the files in "
            f"it, e.g. --input '{name}/*.jsonl'"]
  if "://" in pattern:
    return []
  problems = []
  for path in sorted(glob.glob(pattern)):
    if os.path.islink(path) and not os.path.exists(path):
      problems.append(f"{path}: broken symbolic link (its target "
                      f"{os.readlink(path)!r} does not exist); fix or remove "
                      "the link, or narrow --input")
    elif os.path.isdir(path):
      problems.append(f"{path}: is a folder matched by {pattern!r}; narrow "
                      "--input to files, e.g. '*.jsonl'")
    elif not os.path.isfile(path):
      problems.append(f"{path}: is not a regular file; narrow --input")
  return problems


def _is_folder(pattern: str) -> bool:
  if "://" not in pattern:
    return os.path.isdir(pattern)
  # Object stores have no folders: a pattern that names nothing itself but
  # has objects below it was meant as one.
  exact = FileSystems.match([pattern])[0].metadata_list
  below = FileSystems.match([pattern.rstrip("/") + "/*"], [1])[0]
  return not exact and bool(below.metadata_list)


def _check_file(source: InputFile, text_field: str,
                annotate: bool = False) -> List[str]:
  path = source.path
  if annotate and source.format == "text":
    return [f"{path}: --annotate adds fields to each row, which plain text "
            "has not; use clusters/ or --removal_list for text inputs, or "
            "pass --input_format jsonl if it is JSONL"]
  try:
    with FileSystems.open(
        path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
      head = handle.read(HEAD_BYTES)
  except (OSError, ValueError) as e:
    return [f"{path}: cannot be read ({type(e).__name__}: {e}); fix its "
            "permissions or remove it from --input"]
  codec = compression_of(path)
  found = _codec_of(head)
  if codec and not head:
    return [f"{path}: is empty, but a {codec} file holds at least a header; "
            "replace it (truncated upload?) or remove it from --input"]
  if codec != found and not (codec == "lzma" and head[:1] == b"\x5d"):
    return [_codec_mismatch(path, codec, found, head)]
  metadata = _dataset_metadata(path, head)
  if metadata:
    return [metadata]
  if source.format == "parquet":
    return _check_parquet(source, codec, text_field, annotate)
  if source.format == "arrow":
    return _check_arrow(source, codec, head, text_field, annotate)
  if head.startswith(_PARQUET_MAGIC):
    return [f"{path}: is a Parquet file but would be read as "
            f"{source.format} (its extension or --input_format); name it "
            "*.parquet or pass --input_format parquet"]
  if head.startswith((ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC)):
    return [f"{path}: is an Arrow IPC file but would be read as "
            f"{source.format} (its extension or --input_format); name it "
            "*.arrow or pass --input_format arrow"]
  try:
    lines = _sample_lines(path)
  except InputReadError as e:
    return [str(e)]
  if source.format == "jsonl":
    return _check_jsonl(path, lines, text_field, annotate)
  return _check_text(path, lines)


def _dataset_metadata(path: str, head: bytes) -> Optional[str]:
  """The problem of a ``datasets.save_to_disk`` metadata file matched as
  input (by its name and its marking key), else None."""
  folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
  key = _DATASET_METADATA.get(name)
  if key is None:
    return None
  try:
    value = loads_json(head.decode("utf-8"))
  except ValueError:
    return None
  if not isinstance(value, dict) or key not in value:
    return None
  return (f"{path}: is Hugging Face datasets metadata, not data; give the "
          f"folder (--input {folder}) or its data files, e.g. --input "
          f"'{folder}/*.arrow'")


def _codec_of(head: bytes) -> Optional[str]:
  """The compression the first bytes announce (strong magic numbers only)."""
  if head.startswith(b"\x1f\x8b"):
    return "gzip"
  if head.startswith(b"\x28\xb5\x2f\xfd"):
    return "zstd"
  if head.startswith(b"\xfd7zXZ\x00"):
    return "lzma"
  if (head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0"
      and head[4:10] in (b"\x31\x41\x59\x26\x53\x59",
                         b"\x17\x72\x45\x38\x50\x90")):
    return "bzip2"
  if (len(head) >= 2 and head[0] == 0x78 and head[1] in (1, 0x5E, 0x9C, 0xDA)
      and (head[0] << 8 | head[1]) % 31 == 0):
    return "deflate"
  return None


def _codec_mismatch(path: str, codec, found, head: bytes) -> str:
  if codec is None:
    if found == "deflate":
      return (f"{path}: starts like zlib data; if it is, name it *.deflate, "
              "otherwise it is not text")
    return (f"{path}: holds {found} data but its name has no matching "
            f"extension; rename it (e.g. to {os.path.basename(path)}"
            f".{_SUFFIX[found]}) so it is decompressed")
  what = f"{found} data" if found else f"no {codec} data (starts with " \
      f"{head[:8]!r})"
  return (f"{path}: is named as {codec} but holds {what}; recompress it or "
          "fix its extension")



def _check_parquet(source: InputFile, codec, text_field: str,
                   annotate: bool) -> List[str]:
  path = source.path
  if codec:
    return [f"{path}: a Parquet file is compressed inside; decompress the "
            f"{codec} wrapper and name it *.parquet"]
  try:
    with FileSystems.open(
        path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
      head = handle.read(4)
      handle.seek(max(source.size - 4, 0))
      tail = handle.read(4)
  except (OSError, ValueError) as e:
    return [f"{path}: cannot be read ({e}); fix its permissions"]
  if head != _PARQUET_MAGIC:
    return [f"{path}: is not a Parquet file (starts with {head!r}); pass the "
            "right --input_format or fix its extension"]
  if tail != _PARQUET_MAGIC:
    return [f"{path}: has no Parquet footer (truncated or still being "
            "written?); replace it or remove it from --input"]
  try:
    with open_parquet(path) as parquet:
      schema = parquet.schema_arrow
  except InputReadError as e:
    return [str(e)]
  return _check_schema(path, schema, text_field, annotate)


def _check_arrow(source: InputFile, codec, head: bytes, text_field: str,
                 annotate: bool) -> List[str]:
  path = source.path
  if codec:
    return [f"{path}: an Arrow IPC file is compressed inside; decompress the "
            f"{codec} wrapper and name it *.arrow"]
  if head[:4] == b"FEA1":
    return [f"{path}: is a Feather v1 file; convert it to Feather v2 / Arrow "
            "IPC (pyarrow.feather.write_feather(pyarrow.feather.read_table"
            "(path), new_path))"]
  if not head.startswith((ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC)):
    return [f"{path}: is not an Arrow IPC file (starts with {head[:8]!r}); "
            "pass the right --input_format or fix its extension"]
  try:
    with open_arrow(path) as (reader, _):
      schema = reader.schema
  except InputReadError as e:
    return [str(e)]
  return _check_schema(path, schema, text_field, annotate)


def _check_schema(path: str, schema, text_field: str,
                  annotate: bool) -> List[str]:
  """The text column of a Parquet or Arrow schema, and with ``annotate``
  no column named like an annotation field."""
  if text_field not in schema.names:
    return [f"{path}: has no column {text_field!r} (columns: "
            f"{', '.join(schema.names)}); pass --text_field with one of them"]
  kind = schema.field(text_field).type
  if not _is_string_type(kind):
    return [f"{path}: column {text_field!r} is {kind}, not string; pass "
            "--text_field naming the text column"]
  conflicts = conflicting_columns(schema.names) if annotate else []
  if conflicts:
    return [f"{path}: already has the column {conflicts[0]!r}, which "
            "--annotate adds; rename it or run without --annotate"]
  return []


def _is_string_type(kind) -> bool:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  if pa.types.is_dictionary(kind):
    kind = kind.value_type
  return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
          or pa.types.is_string_view(kind))


def _sample_lines(path: str) -> List[bytes]:
  """The first complete lines of a file (decompressed), up to
  ``SAMPLE_LINES`` or ``_SAMPLE_BYTES``."""
  lines, size = [], 0
  with contextlib.closing(iter_lines(path)) as rows:
    for row, line in rows:
      lines.append(line_content(row, line))
      size += len(line)
      if len(lines) >= SAMPLE_LINES or size >= _SAMPLE_BYTES:
        break
  return lines


def _check_jsonl(path: str, lines: List[bytes], text_field: str,
                 annotate: bool = False) -> List[str]:
  objects = []
  for line in lines:
    try:
      value = loads_json(line.decode("utf-8"))
    except ValueError:
      continue
    if isinstance(value, dict):
      objects.append(value)
  if lines and not objects:
    return [f"{path}: none of its first {len(lines)} lines is a JSON object "
            f"(first: {lines[0][:60]!r}); if it is plain text, pass "
            "--input_format text"]
  if objects and not any(field_value(o, text_field)[0] for o in objects):
    fields = sorted({name for o in objects for name in _field_paths(o)})
    nested = " (a dotted path for a nested one)" if any(
        "." in name for name in fields) else ""
    return [f"{path}: no record of the first {len(objects)} has the field "
            f"{text_field!r} (fields: {', '.join(fields[:20])}); pass "
            f"--text_field with one of them{nested}"]
  conflicts = sorted({name for o in objects for name in o
                      if name in ANNOTATION_FIELDS}) if annotate else []
  if conflicts:
    return [f"{path}: its records have the field {conflicts[0]!r}, which "
            "--annotate adds; rename it or run without --annotate"]
  return []


def _field_paths(obj: dict, prefix: str = "") -> List[str]:
  """Every field of a JSON object, nested ones as dotted paths."""
  paths = []
  for name, value in obj.items():
    paths.append(prefix + name)
    if isinstance(value, dict):
      paths.extend(_field_paths(value, f"{prefix}{name}."))
  return paths


def _check_text(path: str, lines: List[bytes]) -> List[str]:
  bad = 0
  for line in lines:
    try:
      line.decode("utf-8")
    except UnicodeDecodeError:
      bad += 1
  if lines and bad * 2 > len(lines):
    return [f"{path}: {bad} of its first {len(lines)} lines are not UTF-8 "
            "text (a binary file?); remove it from --input"]
  return []


def check_index(against: Optional[str], index_out: Optional[str],
                params: dict, inputs: Sequence[InputFile]
                ) -> Tuple[Optional[Index], List[str]]:
  """``(the --against index or None, problems)``: the index must be one
  (manifest, format version, every field well formed), with every shard
  file it lists there at its recorded size, built with the run's detection
  parameters (``params``, as stats.json records them), over files that are
  still there unchanged (their texts are read back) and not among
  ``inputs``; ``--index_out`` must be a new or empty folder other than
  ``--against``."""
  problems, index = [], None
  if against:
    try:
      index = read_manifest(against)
    except IndexFolderError as e:
      return None, [str(e)]
    problems += index.shard_problems()
    problems += incompatibilities(index, params)
    problems += _check_indexed_files(index, inputs)
  if index_out:
    problems += _check_index_out(index_out, against)
  return index, problems


def _check_indexed_files(index: Index, inputs: Sequence[InputFile]
                         ) -> List[str]:
  indexed = index.files
  problems = []
  sizes = {}
  try:
    # Paths, not patterns: a glob character in a name matches only itself.
    for result in FileSystems.match([glob.escape(f.path) for f in indexed]):
      sizes.update((m.path, m.size_in_bytes) for m in result.metadata_list)
  except (OSError, ValueError) as e:
    return [f"--against {index.path}: its indexed files cannot be listed"
            f" ({e}); restore their filesystem's access (a run against the"
            " index reads their texts back)"]
  for source in indexed:
    size = sizes.get(source.path)
    if size != source.size:
      now = "is missing" if size is None else f"now has {size} bytes"
      problems.append(
          f"{source.path}: indexed in --against {index.path} with"
          f" {source.size} bytes, {now}; a run against the index reads"
          " indexed texts back (verification, explanations): restore the"
          " file, or build a new index without --against")
  paths = {f.path for f in indexed}
  problems += [f"{f.path}: already indexed in --against {index.path}; remove"
               " it from --input (its documents are in the index)"
               for f in inputs if f.path in paths]
  return problems


def same_folder(a: str, b: str) -> bool:
  """Whether two folder names name the same folder (local ones after
  making them absolute; on object stores, up to a trailing ``/``)."""
  if "://" in a or "://" in b:
    return a.rstrip("/") == b.rstrip("/")
  return os.path.abspath(a) == os.path.abspath(b)


def _check_index_out(index_out: str, against: Optional[str]) -> List[str]:
  if against and same_folder(index_out, against):
    return [f"--index_out {index_out}: is the --against index; write the"
            " updated index to a new folder (the old one is read while the"
            " job runs)"]
  if "://" not in index_out and os.path.exists(index_out) and not (
      os.path.isdir(index_out)):
    return [f"--index_out {index_out}: is a file; --index_out names a folder"]
  found = FileSystems.match([FileSystems.join(index_out, "**")])
  if any(result.metadata_list for result in found):
    return [f"--index_out {index_out}: already holds files; give a new or"
            " empty folder (an index is never overwritten)"]
  return []
