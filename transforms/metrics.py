"""The single Beam metrics namespace and the stat names shared by all steps.

Every count that lands in ``stats.json`` is also a Beam counter of the same
name in ``NAMESPACE`` so it shows on Dataflow/Flink dashboards while a job runs.
"""

import apache_beam as beam
from apache_beam.metrics import Metrics

NAMESPACE = "neardup"
COUNTS = "counts"


def round_stat(index: int) -> str:
  """Stat name of the edges re-pointed by connected-component round i."""
  return f"cc_changed_round_{index:03d}"


def counter(name: str):
  return Metrics.counter(NAMESPACE, name)


def distribution(name: str):
  return Metrics.distribution(NAMESPACE, name)


def count_tag(name: str, value: int):
  """A ``(stat name, value)`` element for the tagged ``counts`` output, also
  added to the Beam counter of that name."""
  counter(name).inc(value)
  return beam.pvalue.TaggedOutput(COUNTS, (name, int(value)))


class CountAs(beam.PTransform):
  """Counts a PCollection into one ``(name, n)`` element (0 when empty)."""

  def __init__(self, name: str):
    super().__init__()
    self._name = name

  def expand(self, pcoll):
    return (pcoll
            | "Count" >> beam.combiners.Count.Globally()
            | "Name" >> beam.Map(_named_count, self._name))


def _named_count(n, name):
  counter(name).inc(n)
  return name, n
