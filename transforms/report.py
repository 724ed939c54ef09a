"""WriteReport: ``report.json`` and ``report.html`` written by the job itself,
so they exist on runners whose launcher does not wait for the job."""

from __future__ import annotations

import heapq
import json
import time
from operator import attrgetter
from typing import Any, List, NamedTuple, Optional, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms import metrics
from transforms import report_render
from transforms.elements import fields_coder
from transforms.join import JoinByKey
from transforms.kernels import lsh as lsh_kernels
from transforms.read import read_file, split_doc_id
from transforms.report_render import LARGEST_CLUSTERS, MEMBERS_SHOWN
from transforms.select import cluster_rows

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


class WriteReport(beam.PTransform):
  """Writes the run report under ``output``.

  Inputs (a dict): ``stats`` (the one stats dict :class:`WriteStats`
  returns), ``totals`` (the one dict of all summed ``(stat, n)`` counts; its
  ``worker_ms_*`` entries give the stage timings), ``clusters``
  (:class:`~transforms.select.ClusterColumns`) and ``files`` (:class:`InputFile`). Per
  cluster its size, the minimum exact Jaccard of a member to the kept
  document and its first ``MEMBERS_SHOWN`` members (the kept one, then
  lowest doc ids) are gathered (:class:`SummarizeClusters`); one global
  combine keeps the ``LARGEST_CLUSTERS`` largest (ties: lowest cluster id)
  and counts the clusters whose minimum is below ``threshold`` (held
  together by a chain). So only bounded data reaches one worker. The shown
  members' texts are read again from the input files that hold them, each
  only up to its last shown row, so the documents are neither kept nor
  shuffled for the report.

  Args:
    output: the folder the two files are written to (each under a temporary
      name, then renamed, so neither is ever seen half written).
    text_field: the JSONL field / Parquet column of the texts.
    id_field: the user id field shown next to each snippet.
    threshold: the run's Jaccard threshold (what a chain is below).
    started: the launch time (``time.time()``) when known: the report's
      ``wall_seconds`` is the time from it to the report, measured where
      the report is written.
    run: what the report's header says of the run: ``inputs`` (the input
      patterns as given) and ``version`` (of this package).

  Returns:
    A PCollection of the one report dict.
  """

  def __init__(self, output: str, text_field: str = "text",
               id_field: str = "id", threshold: float = 1.0,
               started: Optional[float] = None,
               run: Optional[dict] = None):
    super().__init__()
    self._output = output
    self._started = started
    self._run = dict(run or {})
    self._text_field = text_field
    self._id_field = id_field
    self._threshold = threshold

  def expand(self, inputs):
    summary = inputs["clusters"] | "SummarizeClusters" >> SummarizeClusters(
        self._threshold)
    shown = {
        "doc_id": summary | "ShownByFile" >> beam.FlatMap(
            _shown_by_file).with_output_types(Tuple[int, int]),
        "file": inputs["files"],
    }
    snippets = (shown
                | "GroupByFile" >> JoinByKey(
                    key_by={"file": attrgetter("index")})
                | "ReadSnippets" >> beam.ParDo(
                    _ReadSnippetsFn(self._text_field, self._id_field)))
    return inputs["stats"] | "WriteReportFiles" >> beam.Map(
        _write, self._output, beam.pvalue.AsSingleton(inputs["totals"]),
        beam.pvalue.AsSingleton(summary, default_value=_NO_CLUSTERS),
        beam.pvalue.AsList(snippets), self._threshold, self._started,
        self._run)


class SummarizeClusters(beam.PTransform):
  """:class:`~transforms.select.ClusterColumns` (``(doc_id, ClusterInfo)``
  rows) → one :class:`Summary` of the largest clusters (nothing when there
  are no rows).

  Each bundle gathers its rows per cluster and sends them to the cluster's
  shard as one list per shard; each shard merges its clusters and keeps
  its largest; one global combine merges those bounded partial summaries.
  (Beam's ``CombinePerKey`` moved one element per cluster through its
  precombine, shuffle, merge and keying: 22k at 100k documents.)

  Args:
    threshold: the run's Jaccard threshold; a cluster whose minimum
      Jaccard to the kept document is below it is held by a chain.
    shards: the cluster shards; a shard's worker holds 1/shards of the
      clusters.
    max_clusters: the most clusters a bundle gathers before it sends them.
  """

  def __init__(self, threshold: float, shards: int = 64,
               max_clusters: int = 1 << 16):
    super().__init__()
    self._threshold = threshold
    self._shards = shards
    self._max_clusters = max_clusters

  def expand(self, clusters):
    return (clusters
            | "ByClusterShard" >> beam.ParDo(
                _ByClusterShardFn(self._shards, self._max_clusters))
            | "GroupClusters" >> beam.GroupByKey()
            | "PerShard" >> beam.Map(_shard_summary, self._threshold)
            | "Largest" >> beam.CombineGlobally(
                _LargestFn()).without_defaults())


class Summary(NamedTuple):
  """What the report shows of the clusters: ``largest`` ``(cluster id,
  size)``, largest first; per shown cluster id its ``members`` (``(not the
  kept one, doc id, jaccard_to_kept, chain_kept)``, smallest first) and
  ``min_to_kept`` (when a member has a Jaccard to the kept one); and
  ``chains``, the number of clusters held together by a chain."""
  largest: list
  members: dict
  min_to_kept: dict
  chains: int


_NO_CLUSTERS = Summary([], {}, {}, 0)
# Its dicts make it no grouping key; it is only ever a side input.
SummaryCoder = fields_coder(Summary, __name__, deterministic=False)


@beam.typehints.with_output_types(Tuple[int, List[Tuple[int, Any]]])
class _ByClusterShardFn(beam.DoFn):
  """:class:`~transforms.select.ClusterColumns` → ``(cluster shard,
  [(cluster id, _ClusterFn accumulator)])``: a bundle's rows gathered per
  cluster (at most ``max_clusters`` held at once), one list per shard."""

  def __init__(self, shards: int, max_clusters: int):
    self._shards = shards
    self._max_clusters = max_clusters
    self._fn = _ClusterFn()

  def start_bundle(self):
    self._clusters = {}

  def process(self, columns):
    for doc_id, info in cluster_rows(columns):
      # Smallest first: the kept member, then by doc id.
      row = info.cluster_size, (doc_id != info.kept_doc_id, doc_id,
                                info.jaccard_to_kept, info.chain_kept)
      accumulator = self._clusters.get(info.cluster_id)
      if accumulator is None:
        if len(self._clusters) >= self._max_clusters:
          yield from self._take()
        accumulator = self._fn.create_accumulator()
      self._clusters[info.cluster_id] = self._fn.add_input(accumulator, row)

  def finish_bundle(self):
    for out in self._take():
      yield GlobalWindows.windowed_value(out)

  def _take(self):
    ids = sorted(self._clusters)
    shards = lsh_kernels.node_shard(np.array(ids, dtype=np.int64),
                                    self._shards).tolist()
    by_shard = {}
    for shard, cluster_id in zip(shards, ids):
      by_shard.setdefault(shard, []).append(
          (cluster_id, self._clusters[cluster_id]))
    self._clusters = {}
    return sorted(by_shard.items())


def _shard_summary(element, threshold):
  """One shard's lists of ``(cluster id, accumulator)`` → its partial
  :class:`_LargestFn` accumulator: each cluster's accumulators merged, its
  largest clusters and its chain count."""
  _, lists = element
  fn, merged = _ClusterFn(), {}
  for clusters in lists:
    for cluster_id, accumulator in clusters:
      merged.setdefault(cluster_id, []).append(accumulator)
  top, chains = [], 0
  for cluster_id, accumulators in merged.items():
    size, lowest, members = fn.extract_output(
        fn.merge_accumulators(accumulators))
    top.append((size, -cluster_id, lowest, members))
    chains += report_render.is_chain(lowest, threshold)
  return _largest(top), chains


class _ClusterFn(beam.CombineFn):
  """A cluster's member rows → ``(size, min jaccard_to_kept or None, its
  first MEMBERS_SHOWN members)``."""

  def create_accumulator(self):
    return 0, None, []

  def add_input(self, accumulator, row):
    size, member = row
    _, lowest, members = accumulator
    low = member[2]
    if low is not None and (lowest is None or low < lowest):
      lowest = low
    members.append(member)
    if len(members) > 2 * MEMBERS_SHOWN:  # Cut now and then, not per row.
      members = heapq.nsmallest(MEMBERS_SHOWN, members)
    return size, lowest, members

  def merge_accumulators(self, accumulators):
    size, lowest, members = 0, None, []
    for s, low, m in accumulators:
      size = max(size, s)
      if low is not None and (lowest is None or low < lowest):
        lowest = low
      members.extend(m)
    return size, lowest, heapq.nsmallest(MEMBERS_SHOWN, members)

  def extract_output(self, accumulator):
    size, lowest, members = accumulator
    return size, lowest, heapq.nsmallest(MEMBERS_SHOWN, members)


@beam.typehints.with_output_types(Summary)
class _LargestFn(beam.CombineFn):
  """The shards' partial summaries ``(largest clusters, chain count)`` →
  the :class:`Summary` of the ``LARGEST_CLUSTERS`` largest (ties: lowest
  id) and the chain count."""

  def create_accumulator(self):
    return [], 0

  def add_input(self, accumulator, partial):
    return self.merge_accumulators([accumulator, partial])

  def merge_accumulators(self, accumulators):
    top, chains = [], 0
    for t, c in accumulators:
      top.extend(t)
      chains += c
    return _largest(top), chains

  def extract_output(self, accumulator):
    top, chains = accumulator
    top = _largest(top)
    return Summary(
        [(-negated, size) for size, negated, _, _ in top],
        {-negated: members for _, negated, _, members in top},
        {-negated: lowest for _, negated, lowest, _ in top
         if lowest is not None}, chains)


def _largest(top):
  # (size, -id) is unique per cluster, so the rest is never compared.
  return heapq.nlargest(LARGEST_CLUSTERS, top, key=lambda c: (c[0], c[1]))


def _shown_by_file(summary):
  for members in summary.members.values():
    for _, doc_id, _, _ in members:
      yield split_doc_id(doc_id)[0], doc_id


# Declared, so that Beam need not infer it from the code at every build
# (31 ms: its inference walks read_file and the record parsers).
@beam.typehints.with_output_types(Tuple[int, Tuple[Any, str, str]])
class _ReadSnippetsFn(beam.DoFn):
  """``(doc_id, (user id, where, snippet))`` of the shown rows of one input
  file (``where``: ``path:line``)."""

  def __init__(self, text_field: str, id_field: str):
    self._text_field = text_field
    self._id_field = id_field

  def process(self, element):
    _, grouped = element
    wanted = set(grouped["doc_id"])
    if not wanted:
      return
    last = max(wanted)
    source = next(iter(grouped["file"]))
    for record in read_file(source, self._text_field, self._id_field):
      if record.doc_id in wanted:
        where = f"{source.path}:{split_doc_id(record.doc_id)[1] + 1}"
        yield record.doc_id, (record.user_id, where,
                              report_render.snippet(record.text))
      if record.doc_id >= last:
        return


# What report.json measures, and so differs between runs of the same input
# and seed; everything else in it is the same.
MEASURED_FIELDS = ("started_at", "wall_seconds", "worker_seconds")


def _write(stats, output, totals, summary, snippets, threshold, started,
           run):
  timings = {name: n for name, n in totals.items() if metrics.is_timing(name)}
  shown = {cluster_id: [(doc_id, not other, similarity, chain_kept)
                        for other, doc_id, similarity, chain_kept in firsts]
           for cluster_id, firsts in summary.members.items()}
  report = report_render.assemble(stats, timings, summary.largest, shown,
                                  dict(snippets), summary.min_to_kept,
                                  summary.chains, threshold)
  report["run"] = run
  if started is not None:
    report["wall_seconds"] = round(time.time() - started, 3)
    report["started_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                         time.gmtime(started))
  write_report_files(output, report)
  return report


def write_report_files(output: str, report: dict) -> None:
  """Writes ``report.json`` and its rendering ``report.html``, each under a
  temporary name first and then renamed into place."""
  rendered = {
      REPORT_JSON: json.dumps(report, indent=2, ensure_ascii=False,
                              default=str).encode("utf-8") + b"\n",
      REPORT_HTML: report_render.render_html(report).encode("utf-8"),
  }
  for name, data in rendered.items():
    path = FileSystems.join(output, name)
    # A retried bundle may find its own temporary file from the last try.
    if FileSystems.exists(path + ".tmp"):
      FileSystems.delete([path + ".tmp"])
    with FileSystems.create(path + ".tmp") as handle:
      handle.write(data)
    if FileSystems.exists(path):
      FileSystems.delete([path])
    FileSystems.rename([path + ".tmp"], [path])
