"""Writing the deduplicated corpus, the clusters table, rejections and stats.

Output is byte-identical for the same input and seed, whatever the runner or
parallelism: every file is written by one keyed group, in sorted doc-id order.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Dict, List, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms import metrics
from transforms.join import JoinByKey
from transforms.select import Clustered
from transforms.stats import finalize_stats
from transforms.read import (InputChangedError,
                                  check_unchanged, iter_parquet_batches,
                                  iter_raw_lines, line_content, make_doc_id,
                                  open_parquet, split_doc_id)

# One output part per (input file, 2**20 rows): bounds a writer's memory.
PART_ROW_BITS = 20
_EXTENSIONS = {"jsonl": "jsonl", "text": "txt", "parquet": "parquet"}
DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR = "deduped", "clusters", "rejected"
STATS_FILE = "stats.json"


def part_name(file_index: int, chunk: int, extension: str) -> str:
  return f"part-{file_index:05d}-{chunk:05d}.{extension}"


def join_path(directory: str, *names: str) -> str:
  return FileSystems.join(directory, *names)


class WriteResults(beam.PTransform):
  """Writes ``deduped/``, ``clusters/`` and ``rejected/`` under ``output``.

  Inputs (a dict): ``files`` (:class:`InputFile`), ``clusters`` (``(doc_id,
  ClusterInfo)`` for clustered documents) and ``rejected``
  (:class:`Rejected`). Every input file is read again, start to end, and
  every row that is neither rejected nor removed as a duplicate is written
  back in the input's format with all original fields (JSONL and text lines
  byte for byte), so the documents themselves never go through a shuffle:
  only the clustered and rejected rows are grouped by file. A file whose
  size changed since it was matched fails the job
  (:class:`~transforms.read.InputChangedError`).

  Args:
    output: the folder (any Beam filesystem) to write under.
    id_field: the JSONL field or Parquet column holding the user's id.
    indexed: in a run against an index, ``{file index: path}`` of the
      indexed files: every ``clusters/`` row then also says whether its
      matched document is an indexed one (``matched_indexed``) and where
      that one is (``matched_source``, ``matched_position``).

  Returns:
    The counts: ``kept``, ``removed``, ``rejected`` and
    ``rejected_<reason>``.
  """

  def __init__(self, output: str, id_field: str = "id", indexed=None):
    super().__init__()
    self._output = output
    self._id_field = id_field
    self._indexed = indexed

  def expand(self, inputs):
    keyed = {
        "file": inputs["files"] | "KeyFiles" >> beam.Map(
            lambda f: (f.index, f)),
        "cluster": inputs["clusters"] | "KeyClusters" >> beam.Map(
            lambda kv: (split_doc_id(kv[0])[0], kv)).with_output_types(
                Tuple[int, Clustered]),
        "rejected": inputs["rejected"] | "KeyRejected" >> beam.Map(
            lambda r: (split_doc_id(r.doc_id)[0], r)),
    }
    written = (keyed
               | "GroupByFile" >> JoinByKey()
               | "WriteFile" >> beam.ParDo(
                   _WriteFileFn(self._output, self._id_field,
                                self._indexed)).with_outputs(
                       metrics.COUNTS))
    return written[metrics.COUNTS]


class _Part:
  """The clustered and rejected rows of one (file, 2**20 rows) part."""

  def __init__(self):
    self.clusters: Dict[int, Any] = {}
    self.rejected: List[Any] = []

  def last_row(self) -> int:
    return max([-1] + list(self.clusters)
               + [split_doc_id(r.doc_id)[1] for r in self.rejected])

  def skipped(self):
    """Rows not written back: removed duplicates and rejections."""
    rows = {row for row, info in self.clusters.items() if not info.kept}
    rows.update(split_doc_id(r.doc_id)[1] for r in self.rejected)
    return rows


class _WriteFileFn(metrics.MeteredDoFn):

  STAGE = "writing"

  def __init__(self, output: str, id_field: str, indexed=None):
    self._output = output
    self._id_field = id_field
    self._indexed = indexed

  def process(self, element):
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
    for doc_id, info in grouped["cluster"]:
      row = split_doc_id(doc_id)[1]
      parts.setdefault(row >> PART_ROW_BITS, _Part()).clusters[row] = info
    received = 0
    for rejected in grouped["rejected"]:
      row = split_doc_id(rejected.doc_id)[1]
      parts.setdefault(row >> PART_ROW_BITS, _Part()).rejected.append(rejected)
      received += 16 + len(rejected.source) + len(rejected.message) + len(
          rejected.excerpt)
    received += 32 * sum(len(p.clusters) for p in parts.values())
    if source.format == "parquet":
      chunks = self._parquet_chunks(source, parts)
    else:
      chunks = self._line_chunks(source, parts)
    totals = {"kept": 0, "removed": 0, "rejected": 0}
    reasons = collections.Counter()
    for chunk, n_rows, kept, user_ids in chunks:
      part = parts.pop(chunk, None) or _Part()
      if part.last_row() >= (chunk << PART_ROW_BITS) + n_rows:
        parts[chunk] = part
        break
      self._write_tables(source, chunk, part, user_ids)
      totals["kept"] += kept
      totals["removed"] += sum(not i.kept for i in part.clusters.values())
      totals["rejected"] += len(part.rejected)
      reasons.update(r.reason for r in part.rejected)
    if parts:
      raise InputChangedError(
          f"{source.path} has fewer rows than when it was read: it changed"
          " while the job ran; rerun on an unchanging snapshot.")
    return received, totals, reasons

  def _deduped_path(self, source, chunk):
    return join_path(self._output, DEDUPED_DIR, part_name(
        source.index, chunk, _EXTENSIONS[source.format]))

  def _line_chunks(self, source, parts):
    """Streams the kept lines of each part to its file; yields ``(chunk,
    rows read, rows kept, user ids of clustered rows)`` per part."""
    chunk, sink, user_ids, skipped, clusters = None, None, {}, set(), {}
    row = -1
    for row, line in iter_raw_lines(source.path):
      if row >> PART_ROW_BITS != chunk:
        if chunk is not None:
          yield chunk, row - (chunk << PART_ROW_BITS), sink.close(), user_ids
        chunk = row >> PART_ROW_BITS
        part = parts.get(chunk) or _Part()
        sink = _LineSink(self._deduped_path(source, chunk))
        user_ids, skipped, clusters = {}, part.skipped(), part.clusters
      if row in clusters:
        user_ids[row] = (_json_field(line_content(row, line), self._id_field)
                         if source.format == "jsonl" else None)
      if row not in skipped:
        sink.add(line)
    if chunk is not None:
      yield chunk, row + 1 - (chunk << PART_ROW_BITS), sink.close(), user_ids

  def _parquet_chunks(self, source, parts):
    """Like :meth:`_line_chunks`, streaming Arrow record batches."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    chunk, sink, user_ids = None, None, {}
    with open_parquet(source.path) as parquet:
      has_id = self._id_field in parquet.schema_arrow.names
      row = 0
      for batch in iter_parquet_batches(source.path, parquet):
        while batch.num_rows:
          if row >> PART_ROW_BITS != chunk:
            if chunk is not None:
              yield (chunk, row - (chunk << PART_ROW_BITS), sink.close(),
                     user_ids)
            chunk = row >> PART_ROW_BITS
            part = parts.get(chunk) or _Part()
            sink = _ParquetSink(self._deduped_path(source, chunk))
            user_ids, skipped = {}, part.skipped()
          take = min(batch.num_rows, ((chunk + 1) << PART_ROW_BITS) - row)
          piece, batch = batch.slice(0, take), batch.slice(take)
          in_piece = [r for r in part.clusters if row <= r < row + take]
          if in_piece:
            ids = (piece.column(self._id_field).to_pylist() if has_id
                   else [None] * take)
            user_ids.update((r, ids[r - row]) for r in in_piece)
          drop = [r - row for r in skipped if row <= r < row + take]
          if drop:
            mask = np.ones(take, dtype=bool)
            mask[drop] = False
            piece = piece.filter(mask)
          sink.add(piece)
          row += take
      if chunk is not None:
        yield chunk, row - (chunk << PART_ROW_BITS), sink.close(), user_ids

  def _write_tables(self, source, chunk, part, user_ids):
    """The part's ``clusters/`` and ``rejected/`` files, if it has rows."""
    index = source.index
    if part.clusters:
      rows = [_cluster_row(make_doc_id(index, row), info, user_ids.get(row),
                           source, self._indexed)
              for row, info in sorted(part.clusters.items())]
      _write_lines(join_path(self._output, CLUSTERS_DIR,
                             part_name(index, chunk, "jsonl")), rows)
    if part.rejected:
      _write_lines(join_path(self._output, REJECTED_DIR,
                             part_name(index, chunk, "jsonl")),
                   [_json_line(r.row()) for r in
                    sorted(part.rejected, key=lambda r: r.doc_id)])


class _LineSink:
  """Writes a part's kept lines as they come, each with its own line ending
  (``\\n`` added only to a last line that had none); the file is created only
  when the first one arrives. ``close()`` returns the number written."""

  def __init__(self, path: str):
    self._path = path
    self._handle = None
    self._count = 0

  def add(self, line: bytes) -> None:
    if self._handle is None:
      self._handle = FileSystems.create(self._path)
    self._handle.write(line if line.endswith(b"\n") else line + b"\n")
    self._count += 1

  def close(self) -> int:
    if self._handle is not None:
      self._handle.close()
    return self._count


class _ParquetSink(_LineSink):
  """Like :class:`_LineSink` for Arrow record batches of the input schema."""

  def __init__(self, path: str):
    super().__init__(path)
    self._writer = None

  def add(self, batch) -> None:
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    if not batch.num_rows:
      return
    if self._writer is None:
      self._handle = FileSystems.create(self._path)
      self._writer = pq.ParquetWriter(self._handle, batch.schema)
    self._writer.write_batch(batch)
    self._count += batch.num_rows

  def close(self) -> int:
    if self._writer is not None:
      self._writer.close()
    return super().close()


def _json_field(line: bytes, field: str):
  return json.loads(line.decode("utf-8")).get(field)


def _cluster_row(doc_id, info, user_id, source, indexed=None):
  row = {
      "doc_id": doc_id,
      "id": user_id,
      "cluster_id": info.cluster_id,
      "cluster_size": info.cluster_size,
      "kept": info.kept,
      "source": source.path,
      "position": split_doc_id(doc_id)[1] + 1,
      "kept_doc_id": info.kept_doc_id,
      "matched_doc_id": info.matched_doc_id,
      "matched_id": info.matched_id,
      "matched_jaccard": _rounded(info.matched_jaccard),
      "jaccard_to_kept": _rounded(info.jaccard_to_kept),
      "chain_kept": info.chain_kept,
  }
  if indexed is not None:
    row.update(_matched_in_index(info.matched_doc_id, indexed))
  return _json_line(row)


def _matched_in_index(matched_doc_id, indexed) -> dict:
  """Where the matched document is, when it is an indexed one."""
  file_index, row = (split_doc_id(matched_doc_id) if matched_doc_id
                     is not None else (None, None))
  found = file_index in indexed
  return {"matched_indexed": found,
          "matched_source": indexed[file_index] if found else None,
          "matched_position": row + 1 if found else None}


def _rounded(similarity):
  return None if similarity is None else round(similarity, 6)


def _json_line(obj) -> bytes:
  return json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")


def _write_lines(path: str, lines) -> None:
  with FileSystems.create(path) as handle:
    handle.write(b"".join(line + b"\n" for line in lines))


class WriteStats(beam.PTransform):
  """Sums ``(stat, n)`` counts into ``stats.json`` (sorted keys), adding the
  run's parameters and derived figures
  (:func:`transforms.stats.finalize_stats`); fails the job if documents in
  != kept + removed + rejected.

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

  def expand(self, counts):
    return (counts
            | "SumCounts" >> beam.CombineGlobally(metrics.SumByName())
            | "Finalize" >> beam.Map(finalize_stats, self._params)
            | "WriteStatsFile" >> beam.Map(_write_stats, self._output))


def _write_stats(stats: dict, output: str) -> dict:
  with FileSystems.create(join_path(output, STATS_FILE)) as handle:
    handle.write(json.dumps(stats, indent=2, sort_keys=True).encode("utf-8")
                 + b"\n")
  return stats
