"""WriteReport: ``report.json`` and ``report.html`` written by the job itself,
so they exist on runners whose launcher does not wait for the job."""

from __future__ import annotations

import heapq
import json
import time
from typing import NamedTuple, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms import metrics
from transforms import report_render
from transforms.join import JoinByKey
from transforms.read import read_file, split_doc_id
from transforms.report_render import LARGEST_CLUSTERS, MEMBERS_SHOWN

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


class WriteReport(beam.PTransform):
  """Writes the run report under ``output``.

  Inputs (a dict): ``stats`` (the one stats dict :class:`WriteStats`
  returns), ``totals`` (the one dict of all summed ``(stat, n)`` counts; its
  ``worker_ms_*`` entries give the stage timings), ``clusters``
  (``(doc_id, ClusterInfo)``) and ``files`` (:class:`InputFile`). Per
  cluster one combine gathers its size, the minimum exact Jaccard of a
  member to the kept document and its first ``MEMBERS_SHOWN`` members (the
  kept one, then lowest doc ids); one global combine keeps the
  ``LARGEST_CLUSTERS`` largest (ties: lowest cluster id) and counts the
  clusters whose minimum is below ``threshold`` (held together by a chain).
  So only bounded data reaches one worker. The shown members' texts are
  read again from the input files that hold them, each only up to its last
  shown row, so the documents are neither kept nor shuffled for the report.

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
        "doc_id": summary | "ShownByFile" >> beam.FlatMap(_shown_by_file),
        "file": inputs["files"] | "KeyFiles" >> beam.Map(
            lambda f: (f.index, f)),
    }
    snippets = (shown
                | "GroupByFile" >> JoinByKey()
                | "ReadSnippets" >> beam.ParDo(
                    _ReadSnippetsFn(self._text_field, self._id_field)))
    return inputs["stats"] | "WriteReportFiles" >> beam.Map(
        _write, self._output, beam.pvalue.AsSingleton(inputs["totals"]),
        beam.pvalue.AsSingleton(summary, default_value=_NO_CLUSTERS),
        beam.pvalue.AsList(snippets), self._threshold, self._started,
        self._run)


class SummarizeClusters(beam.PTransform):
  """``(doc_id, ClusterInfo)`` rows → one :class:`Summary` of the largest
  clusters (nothing when there are no rows): one combine per cluster, then
  one global combine of bounded size.

  Args:
    threshold: the run's Jaccard threshold; a cluster whose minimum
      Jaccard to the kept document is below it is held by a chain.
  """

  def __init__(self, threshold: float):
    super().__init__()
    self._threshold = threshold

  def expand(self, clusters):
    return (clusters
            | "ByCluster" >> beam.Map(_member_row)
            | "PerCluster" >> beam.CombinePerKey(_ClusterFn())
            | "Largest" >> beam.CombineGlobally(
                _LargestFn(self._threshold)).without_defaults())


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


def _member_row(element):
  doc_id, info = element
  # Smallest first: the kept member, then by doc id.
  return info.cluster_id, (info.cluster_size, (
      doc_id != info.kept_doc_id, doc_id, info.jaccard_to_kept,
      info.chain_kept))


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


class _LargestFn(beam.CombineFn):
  """``(cluster id, (size, min, members))`` → the :class:`Summary` of the
  ``LARGEST_CLUSTERS`` largest (ties: lowest id) and the chain count."""

  def __init__(self, threshold: float):
    self._threshold = threshold

  def create_accumulator(self):
    return [], 0

  def add_input(self, accumulator, cluster):
    top, chains = accumulator
    cluster_id, (size, lowest, members) = cluster
    top.append((size, -cluster_id, lowest, members))
    if len(top) > 2 * LARGEST_CLUSTERS:  # Cut now and then, not per row.
      top = _largest(top)
    return top, chains + report_render.is_chain(lowest, self._threshold)

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


class _ReadSnippetsFn(beam.DoFn):
  """``(doc_id, (user id, snippet))`` of the shown rows of one input file."""

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
