"""The single Beam metrics namespace and the stat names shared by all steps.

Every count that lands in ``stats.json`` is also a Beam counter of the same
name in ``NAMESPACE`` so it shows on Dataflow/Flink dashboards while a job runs.
"""

import apache_beam as beam
from apache_beam.metrics import Metrics

NAMESPACE = "neardup"
COUNTS = "counts"
SHUFFLE_PREFIX = "shuffle_bytes_"


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


def shuffled(name: str, nbytes: int):
  """A count tag for the payload bytes a step sends into a shuffle
  (``shuffle_bytes`` in stats.json)."""
  return count_tag(SHUFFLE_PREFIX + name, nbytes)


class CountAs(beam.PTransform):
  """Counts a PCollection into one ``(name, n)`` element (0 when empty)."""

  def __init__(self, name: str):
    super().__init__()
    self._name = name

  def expand(self, pcoll):
    return (pcoll
            | "Count" >> beam.combiners.Count.Globally()
            | "Name" >> beam.Map(named_count, self._name))


def named_count(n, name):
  counter(name).inc(n)
  return name, n
