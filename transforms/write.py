"""Writing the deduplicated corpus, the clusters table, rejections and stats.

Output is byte-identical for the same input and seed, whatever the runner or
parallelism: every file is written by one keyed group, in sorted doc-id order.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
from operator import attrgetter
from typing import Any, Dict, List, NamedTuple, Tuple

import apache_beam as beam
import numpy as np
import orjson
from apache_beam.io.filesystems import FileSystems

from transforms import annotate, metrics
from transforms.join import JoinByKey
from transforms.select import (ClusterColumns, cluster_rows,
                               split_cluster_columns)
from transforms.substrings import SpanBatch, strike_text
from transforms.stats import finalize_stats
from transforms.read import (ROW_BITS, ARROW_SUFFIXES, COLUMNAR_FORMATS, OUTPUT_CODECS,
                             InputChangedError, check_unchanged,
                             compression_suffix, create_stream,
                             iter_line_blocks, json_field, line_content,
                             make_doc_id, open_arrow, open_batches,
                             split_doc_id)

# One output part per (input file, 2**20 rows): bounds a writer's memory.
PART_ROW_BITS = 20
_EXTENSIONS = {"jsonl": "jsonl", "text": "txt", "parquet": "parquet"}
DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR = "deduped", "clusters", "rejected"
# --annotate writes every document to annotated/ instead of deduped/;
# --removal_list adds removed/.
ANNOTATED_DIR, REMOVED_DIR = "annotated", "removed"
# --substrings writes one row per struck span to substrings/.
SUBSTRINGS_DIR = "substrings"
OUTPUT_COMPRESSIONS = ("auto", "none") + tuple(OUTPUT_CODECS)


class OutputOptions(NamedTuple):
  """What the write stage writes besides ``clusters/`` and ``rejected/``.

  * ``annotate``: every document (not only the kept ones) to
    ``annotated/``, with the fields of :data:`transforms.annotate.FIELDS`.
  * ``removal_list``: ``removed/``, one Parquet part per input part that
    has removed documents.
  * ``compression``: of JSONL and text outputs: ``auto`` (that of the
    input file), ``none`` or a codec of ``OUTPUT_CODECS``.
  """
  annotate: bool = False
  removal_list: bool = False
  compression: str = "auto"

  def non_default(self) -> dict:
    """The options that differ from the defaults (recorded in stats)."""
    return {f"output_{k}" if k == "compression" else k: v
            for k, v in self._asdict().items()
            if v != self._field_defaults[k]}
STATS_FILE = "stats.json"


def part_name(file_index: int, chunk: int, extension: str) -> str:
  return f"part-{file_index:05d}-{chunk:05d}.{extension}"


def join_path(directory: str, *names: str) -> str:
  return FileSystems.join(directory, *names)


class WriteResults(beam.PTransform):
  """Writes ``deduped/``, ``clusters/`` and ``rejected/`` under ``output``.

  Inputs (a dict): ``files`` (:class:`InputFile`), ``clusters``
  (:class:`~transforms.select.ClusterColumns`: the ``(doc_id,
  ClusterInfo)`` rows of clustered documents) and ``rejected``
  (:class:`Rejected`). Every input file is read again, start to end, and
  every row that is neither rejected nor removed as a duplicate is written
  back in the input's format with all original fields (JSONL and text lines
  byte for byte), so the documents themselves never go through a shuffle:
  only the clustered and rejected rows are grouped by file. A file whose
  size changed since it was matched fails the job
  (:class:`~transforms.read.InputChangedError`).

  With ``options.annotate`` every row that is not rejected is written
  (to ``annotated/``), the annotation fields added; ``options`` also
  selects the removal list and the output compression
  (:class:`OutputOptions`).

  Args:
    output: the folder (any Beam filesystem) to write under.
    id_field: the JSONL field (dotted: nested) or Parquet/Arrow column
      holding the user's id.
    options: :class:`OutputOptions`.
    indexed: in a run against an index, ``{file index: path}`` of the
      indexed files: every ``clusters/`` row then also says whether its
      matched document is an indexed one (``matched_indexed``) and where
      that one is (``matched_source``, ``matched_position``).

  Returns:
    The counts: ``kept``, ``removed``, ``rejected`` and
    ``rejected_<reason>``.
  """

  def __init__(self, output: str, id_field: str = "id",
               options: OutputOptions = OutputOptions(), indexed=None,
               text_field: str = "text"):
    super().__init__()
    self._output = output
    self._id_field = id_field
    self._options = options
    self._indexed = indexed
    self._text_field = text_field

  def expand(self, inputs):
    struck = {}
    if "spans" in inputs:
      # Exact-substring spans (transforms.substrings), by file.
      struck["spans"] = inputs["spans"] | "KeySpans" >> beam.Map(
          lambda keyed: (int(keyed[1].doc_ids[0]) >> ROW_BITS, keyed[1])
      ).with_output_types(Tuple[int, SpanBatch])
    keyed = {**struck,
        "file": inputs["files"],
        "cluster": inputs["clusters"] | "KeyClusters" >> beam.FlatMap(
            _clusters_by_file).with_output_types(Tuple[int, ClusterColumns]),
        "rejected": inputs["rejected"],
    }
    written = (keyed
               | "GroupByFile" >> JoinByKey(key_by={
                   "file": attrgetter("index"), "rejected": _rejected_file})
               | "WriteFile" >> beam.ParDo(
                   _WriteFileFn(self._output, self._id_field,
                                self._options, self._indexed,
                                self._text_field),
                   **({"paths": beam.pvalue.AsList(inputs["files"])}
                      if struck else {})).with_outputs(metrics.COUNTS))
    return written[metrics.COUNTS]


def _rejected_file(rejected) -> int:
  return split_doc_id(rejected.doc_id)[0]


def _clusters_by_file(columns: ClusterColumns):
  """A batch of cluster rows → ``(file index, ClusterColumns)`` per input
  file it has rows of."""
  return split_cluster_columns(columns, columns.arrays.doc_ids >> ROW_BITS)


class _Part:
  """The clustered and rejected rows of one (file, 2**20 rows) part."""

  def __init__(self):
    self.clusters: Dict[int, Any] = {}
    self.rejected: List[Any] = []
    # Row -> its struck spans (starts, ends, first doc ids, first starts).
    self.spans: Dict[int, Any] = {}

  def last_row(self) -> int:
    return max([-1] + list(self.clusters)
               + [split_doc_id(r.doc_id)[1] for r in self.rejected])

  def removed(self) -> int:
    return sum(not info.kept for info in self.clusters.values())

  def skipped(self, annotate: bool = False):
    """Rows not written back: removed duplicates (unless ``annotate``) and
    rejections."""
    rows = set() if annotate else {
        row for row, info in self.clusters.items() if not info.kept}
    rows.update(split_doc_id(r.doc_id)[1] for r in self.rejected)
    return rows


class _WriteFileFn(metrics.MeteredDoFn):

  STAGE = "writing"

  def __init__(self, output: str, id_field: str, options: OutputOptions,
               indexed=None, text_field: str = "text"):
    self._output = output
    self._id_field = id_field
    self._options = options
    self._indexed = indexed
    self._text_field = text_field
    self._paths = {}

  def process(self, element, paths=()):
    self._paths = {f.index: f.path for f in paths}
    with self.meter.timed():
      received, totals, reasons = self._write_file(element[1])
    self.meter.done(totals["kept"] + totals["removed"] + totals["rejected"])
    yield metrics.shuffled("write", received)
    for name, value in totals.items():
      yield metrics.count_tag(name, value)
    for reason, value in sorted(reasons.items()):
      yield metrics.count_tag(metrics.rejected_stat(reason), value)

  def _write_file(self, grouped):
    """Writes one input file's outputs; returns ``(bytes received, totals,
    rejections by reason)``."""
    source = next(iter(grouped["file"]))
    check_unchanged(source)
    parts: Dict[int, _Part] = {}
    for columns in grouped["cluster"]:
      for doc_id, info in cluster_rows(columns):
        row = split_doc_id(doc_id)[1]
        parts.setdefault(row >> PART_ROW_BITS, _Part()).clusters[row] = info
    received = 0
    for rejected in grouped["rejected"]:
      row = split_doc_id(rejected.doc_id)[1]
      parts.setdefault(row >> PART_ROW_BITS, _Part()).rejected.append(rejected)
      received += 16 + len(rejected.source) + len(rejected.message) + len(
          rejected.excerpt)
    for spans in grouped.get("spans", ()):
      for row, at in zip(*_spans_by_row(spans)):
        parts.setdefault(row >> PART_ROW_BITS, _Part()).spans[row] = at
      received += sum(column.nbytes for column in spans)
    received += 32 * sum(len(p.clusters) for p in parts.values())
    if source.format in COLUMNAR_FORMATS:
      chunks = self._table_chunks(source, parts)
    else:
      chunks = self._line_chunks(source, parts)
    totals = {"kept": 0, "removed": 0, "rejected": 0}
    reasons = collections.Counter()
    for chunk, n_rows, written, user_ids in chunks:
      part = parts.pop(chunk, None) or _Part()
      if part.last_row() >= (chunk << PART_ROW_BITS) + n_rows:
        parts[chunk] = part
        break
      self._write_tables(source, chunk, part, user_ids)
      removed = part.removed()
      totals["kept"] += written - removed if self._options.annotate \
          else written
      totals["removed"] += removed
      totals["rejected"] += len(part.rejected)
      reasons.update(r.reason for r in part.rejected)
    if parts:
      raise InputChangedError(
          f"{source.path} has fewer rows than when it was read: it changed"
          " while the job ran; rerun on an unchanging snapshot.")
    return received, totals, reasons

  def _deduped_path(self, source, chunk):
    if source.format == "arrow":
      # The input's own extension (.arrow, .feather, ...).
      extension = next((suffix[1:] for suffix in ARROW_SUFFIXES
                        if source.path.lower().endswith(suffix)), "arrow")
    else:
      extension = _EXTENSIONS[source.format] + self._line_suffix(source)
    return join_path(self._output, ANNOTATED_DIR if self._options.annotate
                     else DEDUPED_DIR,
                     part_name(source.index, chunk, extension))

  def _line_suffix(self, source) -> str:
    """The compression suffix of a JSONL or text output part."""
    codec = self._options.compression
    if codec == "auto":
      return compression_suffix(source.path)
    return "" if codec == "none" else OUTPUT_CODECS[codec]

  def _annotated(self, source, row, line, info):
    return annotate.annotate_line(
        line, annotate.annotation(make_doc_id(source.index, row), info),
        f"{source.path}: row {row + 1}")

  def _line_chunks(self, source, parts):
    """Streams the kept lines of each part to its file; yields ``(chunk,
    rows read, rows kept, user ids of clustered rows)`` per part."""
    chunk, sink, user_ids, emptied, rows_read = None, None, {}, 0, 0
    for first, block, starts in iter_line_blocks(source.path):
      n = len(starts) - 1
      i = 0
      while i < n:
        if (first + i) >> PART_ROW_BITS != chunk:
          if chunk is not None:
            yield (chunk, first + i - (chunk << PART_ROW_BITS),
                   sink.close() + emptied, user_ids)
          chunk, emptied, user_ids = (first + i) >> PART_ROW_BITS, 0, {}
          part = parts.get(chunk) or _Part()
          sink = _LineSink(self._deduped_path(source, chunk),
                           self._line_suffix(source))
          skipped = part.skipped(self._options.annotate)
          special = np.array(sorted(set(part.clusters) | set(part.spans)
                                    | skipped), dtype=np.int64)
        stop = min(n, ((chunk + 1) << PART_ROW_BITS) - first)
        emptied += self._write_rows(source, part, skipped, special, sink,
                                    user_ids, first, block, starts, i, stop)
        i = stop
      rows_read = first + n
    if chunk is not None:
      yield (chunk, rows_read - (chunk << PART_ROW_BITS),
             sink.close() + emptied, user_ids)

  def _write_rows(self, source, part, skipped, special, sink, user_ids,
                  first, block, starts, lo, hi) -> int:
    """Writes the rows ``first + lo`` to ``first + hi - 1`` of a block of
    lines (:func:`~transforms.read.iter_line_blocks`); returns how many
    were struck to nothing. Rows that are clustered, struck or skipped are
    handled one by one, the runs between them copied as they are."""
    if self._options.annotate:  # every row gets its annotation
      bounds = starts.tolist()
      return sum(self._write_row(source, part, skipped, sink, user_ids,
                                 first + i, block[bounds[i]:bounds[i + 1]])
                 for i in range(lo, hi))
    emptied, run = 0, lo
    a, b = np.searchsorted(special, [first + lo, first + hi])
    for row in special[a:b].tolist():
      i = row - first
      if i > run:
        sink.add_lines(block[starts[run]:starts[i]], i - run)
      emptied += self._write_row(source, part, skipped, sink, user_ids, row,
                                 block[starts[i]:starts[i + 1]])
      run = i + 1
    if hi > run:
      sink.add_lines(block[starts[run]:starts[hi]], hi - run)
    return emptied

  def _write_row(self, source, part, skipped, sink, user_ids, row,
                 line: bytes) -> int:
    """One row: its user id noted when clustered or struck, its struck
    spans removed, written unless skipped; 1 if struck to nothing."""
    if row in part.clusters or row in part.spans:
      user_ids[row] = (_json_field(line_content(row, line), self._id_field)
                       if source.format == "jsonl" else None)
    if row in skipped:
      return 0
    if row in part.spans:
      line = self._struck_line(source, row, line, part.spans[row])
      if line is None:  # struck to nothing: counted, not written
        return 1
    sink.add(self._annotated(source, row, line, part.clusters.get(row))
             if self._options.annotate else line)
    return 0

  def _struck_line(self, source, row, line: bytes, spans):
    """The line with its text's struck spans removed (the other fields as
    they were); None if nothing is left of the text."""
    content = line_content(row, line)
    if source.format == "jsonl":
      record = orjson.loads(content)
      *parents, name = self._text_field.split(".")
      holder = record
      for parent in parents:
        holder = holder[parent]
      text = strike_text(holder[name], spans[0], spans[1])
      holder[name] = text
      out = orjson.dumps(record)
    else:
      text = strike_text(content.decode("utf-8"), spans[0], spans[1])
      out = text.encode("utf-8")
    if not text:
      return None
    return out + (b"\n" if line.endswith(b"\n") else b"")

  def _table_chunks(self, source, parts):
    """Like :meth:`_line_chunks`, streaming the Arrow record batches of a
    Parquet or Arrow IPC file (written back in its format and flavour)."""
    chunk, sink, user_ids, emptied = None, None, {}, 0
    annotating = self._options.annotate
    with open_batches(source) as (names, batches):
      has_id = self._id_field in names
      row = 0
      for batch in batches:
        while batch.num_rows:
          if row >> PART_ROW_BITS != chunk:
            if chunk is not None:
              yield (chunk, row - (chunk << PART_ROW_BITS),
                     sink.close() + emptied, user_ids)
            chunk, emptied = row >> PART_ROW_BITS, 0
            part = parts.get(chunk) or _Part()
            sink = self._table_sink(source, chunk)
            user_ids, skipped = {}, part.skipped(annotating)
          take = min(batch.num_rows, ((chunk + 1) << PART_ROW_BITS) - row)
          piece, batch = batch.slice(0, take), batch.slice(take)
          in_piece = [r for r in list(part.clusters) + list(part.spans)
                      if row <= r < row + take]
          if in_piece:
            ids = (piece.column(self._id_field).to_pylist() if has_id
                   else [None] * take)
            user_ids.update((r, ids[r - row]) for r in in_piece)
          if annotating:
            piece = annotate.annotate_batch(piece, [
                annotate.annotation(make_doc_id(source.index, r),
                                    part.clusters.get(r))
                for r in range(row, row + take)], _id_type(
                    piece.schema, self._id_field))
          drop = [r - row for r in skipped if row <= r < row + take]
          struck = [r for r in part.spans
                    if row <= r < row + take and r not in skipped]
          if struck:
            piece, gone = self._struck_piece(piece, row, struck, part.spans)
            emptied += len(gone)
            drop += gone
          if drop:
            mask = np.ones(take, dtype=bool)
            mask[drop] = False
            piece = piece.filter(mask)
          sink.add(piece)
          row += take
      if chunk is not None:
        yield (chunk, row - (chunk << PART_ROW_BITS), sink.close() + emptied,
               user_ids)

  def _struck_piece(self, piece, row, struck, spans):
    """``piece`` (rows from ``row``) with the struck spans of the rows
    ``struck`` removed from its text column, and the offsets of the rows
    struck to nothing."""
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    column = piece.schema.get_field_index(self._text_field)
    texts = piece.column(column).to_pylist()
    gone = []
    for r in struck:
      texts[r - row] = strike_text(texts[r - row], *spans[r][:2])
      if not texts[r - row]:
        gone.append(r - row)
    return piece.set_column(column, piece.schema.field(column), pa.array(
        texts, type=piece.schema.field(column).type)), gone

  def _table_sink(self, source, chunk):
    path = self._deduped_path(source, chunk)
    if source.format == "parquet":
      return _ParquetSink(path)
    with open_arrow(source.path) as (_, flavour):
      return _ArrowSink(path, flavour)

  def _write_tables(self, source, chunk, part, user_ids):
    """The part's ``clusters/`` and ``rejected/`` files, if it has rows."""
    index = source.index
    if part.clusters:
      rows = _cluster_lines(index, sorted(part.clusters.items()), user_ids,
                            source.path, self._indexed)
      _write_lines(join_path(self._output, CLUSTERS_DIR,
                             part_name(index, chunk, "jsonl")), rows)
    if self._options.removal_list and part.removed():
      self._write_removed(source, chunk, part, user_ids)
    if part.spans:
      _write_lines(join_path(self._output, SUBSTRINGS_DIR,
                             part_name(index, chunk, "jsonl")),
                   [_json_line(r) for r in self._span_rows(
                       source, part, user_ids)])
    if part.rejected:
      _write_lines(join_path(self._output, REJECTED_DIR,
                             part_name(index, chunk, "jsonl")),
                   [_json_line(r.row()) for r in
                    sorted(part.rejected, key=lambda r: r.doc_id)])


  def _span_rows(self, source, part, user_ids):
    """``substrings/`` rows: one per struck span, in (row, start) order."""
    for row, (starts, ends, first_ids, first_starts) in sorted(
        part.spans.items()):
      for start, end, first_id, first_start in zip(starts, ends, first_ids,
                                                   first_starts):
        first_file, first_row = split_doc_id(int(first_id))
        yield {"doc_id": make_doc_id(source.index, row),
               "id": user_ids.get(row), "source": source.path,
               "position": row + 1, "start": int(start), "end": int(end),
               "length": int(end - start), "boundary": "narrowed",
               "first_doc_id": int(first_id),
               "first_source": self._paths.get(first_file),
               "first_position": first_row + 1,
               "first_start": int(first_start)}

  def _write_removed(self, source, chunk, part, user_ids):
    """The part's ``removed/`` Parquet file: one row per removed document,
    in doc-id order."""
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    if source.format in COLUMNAR_FORMATS:
      id_type = _id_type(_schema_of(source), self._id_field)
      as_id = lambda value: value  # pylint: disable=unnecessary-lambda-assignment
    else:
      id_type = pa.string() if source.format == "jsonl" else pa.null()
      as_id = annotate.jsonl_id
    rows = [{"id": as_id(user_ids.get(row)), "source": source.path,
             "position": row + 1, "doc_id": make_doc_id(source.index, row),
             "cluster_id": info.cluster_id, "cluster_size": info.cluster_size,
             "kept_doc_id": info.kept_doc_id,
             "matched_doc_id": info.matched_doc_id,
             "matched_id": as_id(info.matched_id),
             "matched_jaccard": annotate.rounded(info.matched_jaccard),
             "jaccard_to_kept": annotate.rounded(info.jaccard_to_kept)}
            for row, info in sorted(part.clusters.items()) if not info.kept]
    with FileSystems.create(join_path(
        self._output, REMOVED_DIR, part_name(source.index, chunk,
                                             "parquet"))) as handle:
      pq.write_table(annotate.removal_table(rows, id_type), handle)


def _id_type(schema, id_field: str):
  """The Arrow type of the id column (null when there is none)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  return (schema.field(id_field).type if id_field in schema.names
          else pa.null())


def _schema_of(source):
  """The Arrow schema of a Parquet or Arrow IPC input."""
  if source.format == "parquet":
    from transforms.read import open_parquet  # pylint: disable=import-outside-toplevel
    with open_parquet(source.path) as parquet:
      return parquet.schema_arrow
  with open_arrow(source.path) as (reader, _):
    return reader.schema


class _LineSink:
  """Writes a part's kept lines as they come, each with its own line ending
  (``\\n`` added only to a last line that had none), compressed as
  ``suffix`` says; the file is created only when the first one arrives.
  ``close()`` returns the number written."""

  # Lines are handed to the stream in batches of about this many bytes: one
  # write per line was a fifth of the writing stage at 100k documents.
  BATCH_BYTES = 1 << 20

  def __init__(self, path: str, suffix: str = ""):
    self._path = path
    self._suffix = suffix
    self._files = contextlib.ExitStack()
    self._handle = None
    self._count = 0
    self._pending: List[bytes] = []
    self._pending_bytes = 0

  def _open(self):
    self._handle = self._files.enter_context(
        create_stream(self._path, self._suffix))
    return self._handle

  def add(self, line: bytes) -> None:
    self.add_lines(line, 1)

  def add_lines(self, lines: bytes, count: int) -> None:
    """``count`` whole lines as they are (bytes of consecutive lines)."""
    self._pending.append(lines if lines.endswith(b"\n") else lines + b"\n")
    self._pending_bytes += len(lines)
    self._count += count
    if self._pending_bytes >= self.BATCH_BYTES:
      self._flush()

  def _flush(self) -> None:
    if self._pending:
      (self._handle or self._open()).write(b"".join(self._pending))
      self._pending, self._pending_bytes = [], 0

  def close(self) -> int:
    self._flush()
    self._files.close()
    return self._count


class _ParquetSink(_LineSink):
  """Like :class:`_LineSink` for Arrow record batches of the input schema."""

  def __init__(self, path: str):
    super().__init__(path)
    self._writer = None

  def _new_writer(self, handle, schema):
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    return pq.ParquetWriter(handle, schema)

  def add(self, batch) -> None:
    if not batch.num_rows:
      return
    if self._writer is None:
      self._writer = self._new_writer(self._open(), batch.schema)
    self._writer.write_batch(batch)
    self._count += batch.num_rows

  def close(self) -> int:
    if self._writer is not None:
      self._writer.close()
    return super().close()


class _ArrowSink(_ParquetSink):
  """Like :class:`_ParquetSink`, writing Arrow IPC in the input's flavour
  (``file``: Feather v2 / IPC file format; ``stream``: IPC stream format,
  as ``datasets.save_to_disk`` writes), uncompressed."""

  def __init__(self, path: str, flavour: str):
    super().__init__(path)
    self._flavour = flavour

  def _new_writer(self, handle, schema):
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    return (pa.ipc.new_file(handle, schema) if self._flavour == "file"
            else pa.ipc.new_stream(handle, schema))


def _spans_by_row(spans):
  """``(rows, [(starts, ends, first doc ids, first starts)] per row)`` of a
  :class:`~transforms.substrings.SpanBatch` (sorted by document)."""
  rows = split_doc_id(spans.doc_ids)[1]
  keys, first = np.unique(rows, return_index=True)
  cut = list(first[1:])
  return keys.tolist(), list(zip(*(np.split(column, cut) for column in (
      spans.starts, spans.ends, spans.first_doc_ids, spans.first_starts))))


def _json_field(line: bytes, field: str):
  return json_field(line.decode("utf-8"), field)


# One clusters/ row; the same bytes json_text writes for the dict of these
# keys in this order (tests/test_write.py checks it on arbitrary values),
# formatted directly: 44k rows of a 100k-document run took 0.17 s through
# the generic encoder.
_CLUSTER_ROW = ('{"doc_id": %s, "id": %s, "cluster_id": %s, "cluster_size": %s,'
                ' "kept": %s, "source": %s, "position": %s, "kept_doc_id": %s,'
                ' "matched_doc_id": %s, "matched_id": %s, "matched_jaccard": %s,'
                ' "jaccard_to_kept": %s, "chain_kept": %s')


def json_scalar(value) -> str:
  """``json_text(value)``, with None, bools, ints and finite floats written
  without the encoder."""
  if value is None:
    return "null"
  if value is True:
    return "true"
  if value is False:
    return "false"
  kind = type(value)
  if kind is int:
    return int.__repr__(value)
  if kind is float and math.isfinite(value):
    return float.__repr__(value)
  return annotate.json_text(value)


def _cluster_lines(file_index: int, rows, user_ids, path: str,
                   indexed=None) -> List[bytes]:
  """The ``clusters/`` lines of ``rows`` (sorted ``(row, ClusterInfo)``) of
  one input file: one JSON object each, keys in the order of
  :data:`_CLUSTER_ROW` (then where the matched document is, for a run
  against an index)."""
  source = annotate.json_text(path)
  lines = []
  for row, info in rows:
    doc_id = make_doc_id(file_index, row)
    line = _CLUSTER_ROW % (
        json_scalar(doc_id), json_scalar(user_ids.get(row)),
        json_scalar(info.cluster_id), json_scalar(info.cluster_size),
        json_scalar(info.kept), source, json_scalar(row + 1),
        json_scalar(info.kept_doc_id), json_scalar(info.matched_doc_id),
        json_scalar(info.matched_id),
        json_scalar(_rounded(info.matched_jaccard)),
        json_scalar(_rounded(info.jaccard_to_kept)),
        json_scalar(info.chain_kept))
    if indexed is not None:
      line += ", " + annotate.json_text(
          _matched_in_index(info.matched_doc_id, indexed))[1:-1]
    lines.append((line + "}").encode("utf-8"))
  return lines


def _matched_in_index(matched_doc_id, indexed) -> dict:
  """Where the matched document is, when it is an indexed one."""
  file_index, row = (split_doc_id(matched_doc_id) if matched_doc_id
                     is not None else (None, None))
  found = file_index in indexed
  return {"matched_indexed": found,
          "matched_source": indexed[file_index] if found else None,
          "matched_position": row + 1 if found else None}


_rounded = annotate.rounded


def _json_line(obj) -> bytes:
  return annotate.json_text(obj).encode("utf-8")


def _write_lines(path: str, lines) -> None:
  with FileSystems.create(path) as handle:
    handle.write(b"".join(line + b"\n" for line in lines))


class WriteStats(beam.PTransform):
  """The one dict of summed ``(stat, n)`` counts (see :class:`SumCounts`)
  → ``stats.json`` (sorted keys), adding the run's parameters and derived
  figures (:func:`transforms.stats.finalize_stats`); fails the job if
  documents in != kept + removed + rejected.

  Args:
    output: the folder to write ``stats.json`` into.
    params: the run's parameters, recorded under ``params``.

  Returns:
    The stats document, once it is written.
  """

  def __init__(self, output: str, params: dict):
    super().__init__()
    self._output = output
    self._params = params

  def expand(self, totals):
    return (totals
            | "Finalize" >> beam.Map(finalize_stats, self._params)
            | "WriteStatsFile" >> beam.Map(_write_stats, self._output))


class SumCounts(beam.PTransform):
  """All ``(stat, n)`` counts → the one dict of their sums by name (an empty
  dict when there are none), which both :class:`WriteStats` and the report
  read."""

  def expand(self, counts):
    return counts | "SumByName" >> beam.CombineGlobally(metrics.SumByName())


def _write_stats(stats: dict, output: str) -> dict:
  with FileSystems.create(join_path(output, STATS_FILE)) as handle:
    handle.write(json.dumps(stats, indent=2, sort_keys=True).encode("utf-8")
                 + b"\n")
  return stats
