"""What ``--annotate`` adds to every output row and what ``--removal_list``
writes: pure functions of the rows and their :class:`ClusterInfo` (no Beam),
used by the write stage.

Every document of an annotated output gets all of :data:`FIELDS`. A
clustered one gets its cluster (``dup_cluster_id``: the cluster's minimum
doc id, ``dup_cluster_size``, ``dup_kept``, ``dup_kept_doc_id``) and, if it
is not the kept one, its explanation (the matched document's doc id and
user id, the exact Jaccard to it and to the kept one). A document in no
cluster (unique) gets ``dup_cluster_id`` null, ``dup_cluster_size`` 1,
``dup_kept`` true, ``dup_chain_kept`` false and null for the rest.
``dup_doc_id`` (the job's own id, ``file_index << 40 | row``) is what
``dup_kept_doc_id`` and ``dup_matched_doc_id`` refer to.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

import pyarrow as pa

from transforms.read import loads_json

FIELDS = ("dup_doc_id", "dup_cluster_id", "dup_cluster_size", "dup_kept",
          "dup_kept_doc_id", "dup_matched_doc_id", "dup_matched_id",
          "dup_matched_jaccard", "dup_jaccard_to_kept", "dup_chain_kept")
# One encoder for every written row: json.dumps with options builds one per
# call (a clusters/ row: 8.4 → 6.3 µs reused).
json_text = json.JSONEncoder(ensure_ascii=False, default=str).encode


class AnnotationConflictError(ValueError):
  """An input row already has a field the annotation would add."""


def rounded(similarity: Optional[float]) -> Optional[float]:
  """A similarity as the outputs write it (6 decimals)."""
  return None if similarity is None else round(similarity, 6)


def annotation(doc_id: int, info) -> List[Any]:
  """The values of :data:`FIELDS` for document ``doc_id``, whose
  ``ClusterInfo`` is ``info`` (None: in no cluster)."""
  if info is None:
    return [doc_id, None, 1, True, None, None, None, None, None, False]
  return [doc_id, info.cluster_id, info.cluster_size, info.kept,
          info.kept_doc_id, info.matched_doc_id, info.matched_id,
          rounded(info.matched_jaccard), rounded(info.jaccard_to_kept),
          info.chain_kept]


def annotate_line(line: bytes, values: Sequence[Any], where: str) -> bytes:
  """A JSONL line (a JSON object, with or without its line ending) with
  :data:`FIELDS` appended before its closing brace; every byte of the
  original line stays as it was.

  Args:
    line: the line as read.
    values: the annotation (:func:`annotation`).
    where: ``<file>: row <n>`` for the error of a conflicting field.

  Raises:
    AnnotationConflictError: the object already has one of the fields.

  >>> annotate_line(b'{"a": 1} \\r\\n', [5] + [None] * 9, "f: row 1")[:26]
  b'{"a": 1, "dup_doc_id": 5, '
  >>> annotate_line(b'{}', [5] + [None] * 9, "f: row 1")[:17]
  b'{"dup_doc_id": 5,'
  """
  ending = b"\r\n" if line.endswith(b"\r\n") else (
      b"\n" if line.endswith(b"\n") else b"")
  body = line[:len(line) - len(ending)]
  if b'"dup_' in body:
    _check_no_conflict(body, where)
  content = body.rstrip()
  trailing = body[len(content):]
  # The fields as one JSON object, without its braces.
  added = json_text(dict(zip(FIELDS, values))).encode("utf-8")[1:-1]
  head = content[:-1]
  separator = b"" if head.rstrip().endswith(b"{") else b", "
  return head + separator + added + b"}" + trailing + ending


def _check_no_conflict(body: bytes, where: str) -> None:
  start = body.find(b"{")
  found = sorted(set(loads_json(body[start:].decode("utf-8"))) & set(FIELDS))
  if found:
    raise AnnotationConflictError(
        f"{where} already has the field {found[0]!r}, which --annotate adds;"
        " rename it in the input or run without --annotate")


def conflicting_columns(names: Sequence[str]) -> List[str]:
  """The columns of a schema that :data:`FIELDS` would duplicate."""
  return [name for name in names if name in FIELDS]


def annotation_schema(id_type: pa.DataType) -> pa.Schema:
  """The columns ``--annotate`` adds to a Parquet or Arrow output;
  ``dup_matched_id`` has the type of the input's id column."""
  return pa.schema([
      ("dup_doc_id", pa.int64()), ("dup_cluster_id", pa.int64()),
      ("dup_cluster_size", pa.int64()), ("dup_kept", pa.bool_()),
      ("dup_kept_doc_id", pa.int64()), ("dup_matched_doc_id", pa.int64()),
      ("dup_matched_id", id_type), ("dup_matched_jaccard", pa.float64()),
      ("dup_jaccard_to_kept", pa.float64()), ("dup_chain_kept", pa.bool_())])


def annotate_batch(batch: pa.RecordBatch, annotations: Sequence[List[Any]],
                   id_type: pa.DataType) -> pa.RecordBatch:
  """``batch`` with the annotation columns appended (one annotation per
  row); the batch's columns and schema metadata are kept."""
  added = annotation_schema(id_type)
  columns = list(zip(*annotations)) if annotations else [[]] * len(FIELDS)
  schema = batch.schema
  for field in added:
    schema = schema.append(field)
  return pa.RecordBatch.from_arrays(
      batch.columns + [pa.array(list(values), type=field.type)
                       for values, field in zip(columns, added)],
      schema=schema)


def jsonl_id(value: Any) -> Optional[str]:
  """A JSONL user id as the removal list's string column holds it: strings
  as they are, other JSON values as their JSON text, null as null.

  >>> [jsonl_id(v) for v in ("a", 17, None, [1, 2])]
  ['a', '17', None, '[1, 2]']
  """
  if value is None or isinstance(value, str):
    return value
  return json_text(value)


def removal_schema(id_type: pa.DataType) -> pa.Schema:
  """The ``removed/`` Parquet schema; ``id`` and ``matched_id`` have the
  type of the input's id column (string for JSONL, null for text)."""
  return pa.schema([
      ("id", id_type), ("source", pa.string()), ("position", pa.int64()),
      ("doc_id", pa.int64()), ("cluster_id", pa.int64()),
      ("cluster_size", pa.int64()), ("kept_doc_id", pa.int64()),
      ("matched_doc_id", pa.int64()), ("matched_id", id_type),
      ("matched_jaccard", pa.float64()), ("jaccard_to_kept", pa.float64())])


def removal_table(rows: Sequence[Dict[str, Any]],
                  id_type: pa.DataType) -> pa.Table:
  """The ``removed/`` rows (dicts with the schema's names) as a table."""
  schema = removal_schema(id_type)
  return pa.Table.from_pylist(list(rows), schema=schema)
