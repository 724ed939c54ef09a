"""Writing the deduplicated corpus, the clusters table, rejections and stats.

Output is byte-identical for the same input and seed, whatever the runner or
parallelism: every file is written by one keyed group, in sorted doc-id order.
"""

from __future__ import annotations

import io
import json
from typing import Dict

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import metrics
from transforms.documents import ROW_BITS, split_doc_id

# One output part per (input file, 2**20 rows): bounds a writer's memory.
PART_ROW_BITS = 20
_EXTENSIONS = {"jsonl": "jsonl", "text": "txt", "parquet": "parquet"}
DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR = "deduped", "clusters", "rejected"
STATS_FILE = "stats.json"


def part_of(doc_id: int):
  file_index, row = split_doc_id(doc_id)
  return file_index, row >> PART_ROW_BITS


def part_name(file_index: int, chunk: int, extension: str) -> str:
  return f"part-{file_index:05d}-{chunk:05d}.{extension}"


def join_path(directory: str, *names: str) -> str:
  return FileSystems.join(directory, *names)


class WriteResults(beam.PTransform):
  """Writes ``deduped/``, ``clusters/`` and ``rejected/`` under ``output``.

  Inputs (a dict): ``documents`` (:class:`Document`), ``clusters`` (``(doc_id,
  ClusterInfo)`` for clustered documents), ``rejected`` (:class:`Rejected`)
  and ``files`` (:class:`InputFile`). Every document not removed as a
  duplicate is written back in its input format with all original fields.
  Returns the ``kept``, ``removed``, ``rejected`` and ``rejected_<reason>``
  counts.
  """

  def __init__(self, output: str):
    super().__init__()
    self._output = output

  def expand(self, inputs):
    keyed = {
        # The record already holds the text; shipping both doubles the
        # largest shuffle of the job.
        "doc": inputs["documents"] | "KeyDocs" >> beam.Map(
            lambda d: (part_of(d.doc_id), d._replace(text=None))),
        "cluster": inputs["clusters"] | "KeyClusters" >> beam.Map(
            lambda kv: (part_of(kv[0]), kv)),
        "rejected": inputs["rejected"] | "KeyRejected" >> beam.Map(
            lambda r: (part_of(r.doc_id), r)),
    }
    files = beam.pvalue.AsDict(
        inputs["files"] | "KeyFiles" >> beam.Map(lambda f: (f.index, f)))
    written = (keyed
               | "GroupByPart" >> beam.CoGroupByKey()
               | "WritePart" >> beam.ParDo(_WritePartFn(self._output),
                                           files).with_outputs(metrics.COUNTS))
    return written[metrics.COUNTS]


class _WritePartFn(beam.DoFn):

  def __init__(self, output: str):
    self._output = output

  def setup(self):
    self._meter = metrics.StageMeter("writing", "documents")

  def finish_bundle(self):
    return self._meter.flush()

  def process(self, element, files):
    self._meter.start()
    (file_index, chunk), grouped = element
    source = files[file_index]
    clusters: Dict[int, tuple] = dict(grouped["cluster"])
    docs = sorted(grouped["doc"], key=lambda d: d.doc_id)
    kept = [d for d in docs if d.doc_id not in clusters or
            clusters[d.doc_id].kept]
    removed = len(docs) - len(kept)
    if kept:
      name = part_name(file_index, chunk, _EXTENSIONS[source.format])
      path = join_path(self._output, DEDUPED_DIR, name)
      if source.format == "parquet":
        _write_parquet(path, source.path, [d.record for d in kept])
      else:
        _write_lines(path, [d.record for d in kept])
    if clusters:
      user_ids = {d.doc_id: d.user_id for d in docs}
      rows = [_cluster_row(doc_id, info, user_ids.get(doc_id), source)
              for doc_id, info in sorted(clusters.items())]
      _write_lines(join_path(self._output, CLUSTERS_DIR,
                             part_name(file_index, chunk, "jsonl")), rows)
    rejected = sorted(grouped["rejected"], key=lambda r: r.doc_id)
    if rejected:
      _write_lines(join_path(self._output, REJECTED_DIR,
                             part_name(file_index, chunk, "jsonl")),
                   [_json_line(r._asdict()) for r in rejected])
    self._meter.stop()
    self._meter.done(len(docs))
    yield metrics.count_tag("kept", len(kept))
    yield metrics.count_tag("removed", removed)
    yield metrics.count_tag("rejected", len(rejected))
    for r in rejected:
      yield metrics.count_tag("rejected_" + r.reason.split(":")[0], 1)


def _cluster_row(doc_id, info, user_id, source):
  return _json_line({
      "doc_id": doc_id,
      "id": user_id,
      "cluster_id": info.cluster_id,
      "cluster_size": info.cluster_size,
      "kept": info.kept,
      "source": source.path,
      "position": (doc_id & ((1 << ROW_BITS) - 1)) + 1,
  })


def _json_line(obj) -> bytes:
  return json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")


def _write_lines(path: str, lines) -> None:
  with FileSystems.create(path) as handle:
    handle.write(b"".join(line + b"\n" for line in lines))


def _write_parquet(path: str, source_path: str, rows) -> None:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with FileSystems.open(
      source_path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
    schema = pq.read_schema(handle)
  table = pa.Table.from_pylist(rows, schema=schema)
  buffer = io.BytesIO()
  pq.write_table(table, buffer)
  with FileSystems.create(path) as handle:
    handle.write(buffer.getvalue())


class WriteStats(beam.PTransform):
  """Sums ``(stat, n)`` counts into ``stats.json`` (sorted keys), adding the
  run's parameters and derived figures; fails the job if documents in !=
  kept + removed + rejected."""

  def __init__(self, output: str, params: dict):
    super().__init__()
    self._output = output
    self._params = params

  def expand(self, counts):
    return (counts
            | "SumCounts" >> beam.CombinePerKey(sum)
            | "ToDict" >> beam.combiners.ToDict()
            | "Finalize" >> beam.Map(finalize_stats, self._params)
            | "WriteStatsFile" >> beam.Map(_write_stats, self._output))


def finalize_stats(counts: dict, params: dict) -> dict:
  """Stats document from summed counts; see the README for each field."""
  stats = {name: 0 for name in (
      "docs_in", "kept", "removed", "rejected", "clusters", "clustered_docs",
      "candidate_edges", "verified_edges", "docs_empty", "docs_too_short",
      "docs_signed", "buckets_multi", "cc_residual_edges",
      "cc_residual_nodes")}
  rejected_by_reason = {}
  histograms = {metrics.BUCKET_SIZES: {}, metrics.CLUSTER_SIZES: {}}
  for name, value in counts.items():
    # Timings vary run to run; stats.json stays byte-identical.
    if name.startswith("cc_changed_round_") or metrics.is_timing(name):
      continue
    histogram, _, log2_bin = name.rpartition("_")
    if histogram in histograms:
      histograms[histogram][int(log2_bin)] = value
    elif name.startswith("rejected_"):
      rejected_by_reason[name[len("rejected_"):]] = value
    else:
      stats[name] = value
  rounds = params.get("max_cc_rounds", 0)
  changes = [counts.get(metrics.round_stat(i), 0) for i in range(1, rounds + 1)]
  stats["rejected_by_reason"] = rejected_by_reason
  for histogram, bins in histograms.items():
    # Entry k: sizes 2^k .. 2^(k+1)-1.
    stats[histogram] = [bins.get(k, 0)
                        for k in range(max(bins, default=-1) + 1)]
  stats["cc_changes_per_round"] = changes
  # Rounds that changed something, plus the one that confirmed convergence.
  busy = [i for i, c in enumerate(changes, 1) if c]
  stats["cc_rounds_used"] = min(busy[-1] + 1, rounds) if busy else (
      1 if stats["verified_edges"] else 0)
  stats["cc_converged"] = not changes or changes[-1] == 0
  stats["params"] = params
  accounted = stats["kept"] + stats["removed"] + stats["rejected"]
  stats["balanced"] = accounted == stats["docs_in"]
  if not stats["balanced"]:
    raise RuntimeError(
        f"Document accounting is off: {stats['docs_in']} in, but kept "
        f"{stats['kept']} + removed {stats['removed']} + rejected "
        f"{stats['rejected']} = {accounted}. This is a bug; please report it.")
  return stats


def _write_stats(stats: dict, output: str) -> dict:
  with FileSystems.create(join_path(output, STATS_FILE)) as handle:
    handle.write(json.dumps(stats, indent=2, sort_keys=True).encode("utf-8")
                 + b"\n")
  return stats
