"""WriteReport: ``report.json`` and ``report.html`` written by the job itself,
so they exist on runners whose launcher does not wait for the job."""

from __future__ import annotations

import json
import time
from typing import Optional

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
  returns), ``counts`` (all ``(stat, n)`` counts; the ``worker_ms_*`` ones
  give the stage timings), ``clusters`` (``(doc_id, ClusterInfo)``),
  optionally ``selected`` (the same rows before the explanations, see
  :class:`~transforms.near_dedup.NearDedup`) and ``files``
  (:class:`InputFile`). Only bounded data reaches one worker: the
  ``LARGEST_CLUSTERS`` largest clusters (ties: lowest cluster id) and, per
  cluster, ``MEMBERS_SHOWN`` members (the kept one, then lowest doc ids).
  Their texts are read again from the input files that hold them, each only
  up to its last shown row, so the documents are neither kept nor shuffled
  for the report. Per cluster, the minimum exact Jaccard of a member to the
  kept document is combined where the members are; a cluster whose minimum
  is below ``threshold`` is held together by a chain (counted for all
  clusters, flagged for the shown ones).

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
    clusters = inputs["clusters"]
    timings = (inputs["counts"]
               | "TimingsOnly" >> beam.Filter(lambda kv: metrics.is_timing(
                   kv[0]))
               | "SumTimings" >> beam.CombineGlobally(metrics.SumByName()))
    # Sizes from the rows before the explanations when given: the largest
    # clusters are then known before the explained rows exist, so the steps
    # that use them run in the explaining stage instead of reading every
    # explained row back from a materialised PCollection.
    largest = (inputs.get("selected", clusters)
               # The label is the cluster's minimum id, itself a member.
               | "OnePerCluster" >> beam.Filter(
                   lambda kv: kv[0] == kv[1].cluster_id)
               | "ClusterSizes" >> beam.Map(
                   lambda kv: (kv[0], kv[1].cluster_size))
               # Not Top.Of: its global form flattens an extra Create into
               # its GroupByKey, which BundleBasedDirectRunner (the local
               # runner that retries bundles) can deliver after that
               # GroupByKey has completed, failing the job.
               | "Largest" >> beam.CombineGlobally(beam.combiners.TopCombineFn(
                   LARGEST_CLUSTERS, key=_size_then_lowest_id)))
    largest_ids = largest | "LargestIds" >> beam.Map(
        lambda top: frozenset(cluster_id for cluster_id, _ in top))
    members = (clusters
               | "InLargest" >> beam.FlatMap(
                   _member_of, beam.pvalue.AsSingleton(largest_ids))
               | "FirstMembers" >> beam.combiners.Top.SmallestPerKey(
                   MEMBERS_SHOWN))
    min_to_kept = (clusters
                   | "ToKept" >> beam.FlatMap(_similarity_to_kept)
                   | "MinToKept" >> beam.CombinePerKey(min))
    chains = (min_to_kept
              | "ChainsOnly" >> beam.Filter(
                  lambda kv, t: kv[1] < t - 1e-9, self._threshold)
              | "CountChains" >> beam.combiners.Count.Globally())
    largest_min = min_to_kept | "MinOfLargest" >> beam.Filter(
        lambda kv, ids: kv[0] in ids, beam.pvalue.AsSingleton(largest_ids))
    shown = {
        "doc_id": members | "ShownByFile" >> beam.FlatMap(
            lambda kv: [(split_doc_id(member[1])[0], member[1])
                        for member in kv[1]]),
        "file": inputs["files"] | "KeyFiles" >> beam.Map(
            lambda f: (f.index, f)),
    }
    snippets = (shown
                | "GroupByFile" >> JoinByKey()
                | "ReadSnippets" >> beam.ParDo(
                    _ReadSnippetsFn(self._text_field, self._id_field)))
    return inputs["stats"] | "WriteReportFiles" >> beam.Map(
        _write, self._output, beam.pvalue.AsSingleton(timings),
        beam.pvalue.AsSingleton(largest), beam.pvalue.AsList(members),
        beam.pvalue.AsList(snippets), beam.pvalue.AsList(largest_min),
        beam.pvalue.AsSingleton(chains), self._threshold, self._started,
        self._run)


def _size_then_lowest_id(cluster):
  cluster_id, size = cluster
  return size, -cluster_id


def _member_of(element, largest_ids):
  doc_id, info = element
  if info.cluster_id in largest_ids:
    # Smallest first: the kept member, then by doc id.
    yield info.cluster_id, (doc_id != info.kept_doc_id, doc_id,
                            info.jaccard_to_kept, info.chain_kept)


def _similarity_to_kept(element):
  _, info = element
  if info.jaccard_to_kept is not None:
    yield info.cluster_id, info.jaccard_to_kept


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


def _write(stats, output, timings, largest, members, snippets, largest_min,
           chains, threshold, started, run):
  shown = {cluster_id: [(doc_id, not other, similarity, chain_kept)
                        for other, doc_id, similarity, chain_kept in firsts]
           for cluster_id, firsts in members}
  report = report_render.assemble(stats, timings, largest, shown,
                                  dict(snippets), dict(largest_min), chains,
                                  threshold)
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
