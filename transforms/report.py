"""WriteReport: ``report.json`` and ``report.html`` written by the job itself,
so they exist on runners whose launcher does not wait for the job."""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms import metrics
from transforms import report_render
from transforms.report_render import LARGEST_CLUSTERS, MEMBERS_SHOWN

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


class WriteReport(beam.PTransform):
  """Writes the run report under ``output``.

  Inputs (a dict): ``stats`` (the one stats dict :class:`WriteStats`
  returns), ``counts`` (all ``(stat, n)`` counts; the ``worker_ms_*`` ones
  give the stage timings), ``clusters`` (``(doc_id, ClusterInfo)``) and
  ``documents`` (:class:`Document`). Only bounded data reaches one worker: the
  ``LARGEST_CLUSTERS`` largest clusters (ties: lowest cluster id) and, per
  cluster, ``MEMBERS_SHOWN`` members (the kept one, then lowest doc ids),
  whose snippets are picked from ``documents`` with a side input of their
  ids.
  """

  def __init__(self, output: str):
    super().__init__()
    self._output = output

  def expand(self, inputs):
    clusters = inputs["clusters"]
    timings = (inputs["counts"]
               | "TimingsOnly" >> beam.Filter(lambda kv: metrics.is_timing(
                   kv[0]))
               | "SumTimings" >> beam.CombinePerKey(sum)
               | "TimingsDict" >> beam.combiners.ToDict())
    largest = (clusters
               # The label is the cluster's minimum id, itself a member.
               | "OnePerCluster" >> beam.Filter(
                   lambda kv: kv[0] == kv[1].cluster_id)
               | "ClusterSizes" >> beam.Map(
                   lambda kv: (kv[0], kv[1].cluster_size))
               | "Largest" >> beam.combiners.Top.Of(LARGEST_CLUSTERS,
                                                    key=_size_then_lowest_id))
    largest_ids = largest | "LargestIds" >> beam.Map(
        lambda top: frozenset(cluster_id for cluster_id, _ in top))
    members = (clusters
               | "InLargest" >> beam.FlatMap(
                   _member_of, beam.pvalue.AsSingleton(largest_ids))
               | "FirstMembers" >> beam.combiners.Top.SmallestPerKey(
                   MEMBERS_SHOWN))
    shown_ids = (members
                 | "MemberIds" >> beam.FlatMap(
                     lambda kv: [doc_id for _, doc_id in kv[1]])
                 | "ListShown" >> beam.combiners.ToList()
                 | "SetShown" >> beam.Map(frozenset))
    snippets = inputs["documents"] | "PickSnippets" >> beam.FlatMap(
        _snippet_of, beam.pvalue.AsSingleton(shown_ids))
    return inputs["stats"] | "WriteReportFiles" >> beam.Map(
        _write, self._output, beam.pvalue.AsSingleton(timings),
        beam.pvalue.AsSingleton(largest), beam.pvalue.AsList(members),
        beam.pvalue.AsList(snippets))


def _size_then_lowest_id(cluster):
  cluster_id, size = cluster
  return size, -cluster_id


def _member_of(element, largest_ids):
  doc_id, info = element
  if info.cluster_id in largest_ids:
    # Smallest first: the kept member, then by doc id.
    yield info.cluster_id, (not info.kept, doc_id)


def _snippet_of(doc, shown_ids):
  if doc.doc_id in shown_ids:
    yield doc.doc_id, (doc.user_id, report_render.snippet(doc.text))


def _write(stats, output, timings, largest, members, snippets):
  shown = {cluster_id: [(doc_id, not removed) for removed, doc_id in firsts]
           for cluster_id, firsts in members}
  report = report_render.assemble(stats, timings, largest, shown,
                                  dict(snippets))
  write_report_files(output, report)
  return report


def write_report_files(output: str, report: dict) -> None:
  """Writes ``report.json`` and its rendering ``report.html``."""
  with FileSystems.create(FileSystems.join(output, REPORT_JSON)) as handle:
    handle.write(json.dumps(report, indent=2, ensure_ascii=False,
                            default=str).encode("utf-8") + b"\n")
  with FileSystems.create(FileSystems.join(output, REPORT_HTML)) as handle:
    handle.write(report_render.render_html(report).encode("utf-8"))
