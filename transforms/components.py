"""Exact distributed connected components: unrolled large-star/small-star
rounds (Kiveris et al., 2014) followed by an exact residual resolution."""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.kernels import graph


_SETTLED = "settled"
_SHUFFLED = metrics.SHUFFLE_PREFIX + "connected_components"


class ResidualTooLargeError(RuntimeError):
  """The rounds left more unsettled edges than may be resolved in one place."""


class ConnectedComponents(beam.PTransform):
  """``(a, b)`` edges → ``(node, component label)`` for every node on an edge;
  the label is the component's minimum id. Returns ``{"labels", "counts"}``.

  ``max_rounds`` alternating large-star/small-star rounds run (Beam cannot
  loop); once a round changes nothing, the edges skip the remaining rounds
  (a side-input flag), so converged graphs are not shuffled again. Each
  round reports the number of edges it re-pointed (``cc_changed_round_NNN``,
  a counter and a stat). Whatever the rounds leave unsettled (not yet a star
  around its component minimum) is resolved exactly by union-find in one
  place; if more than ``max_residual_edges`` edges remain the job fails with
  a message naming ``--max_cc_rounds``.
  """

  def __init__(self, max_rounds: int, max_residual_edges: int):
    super().__init__()
    self._max_rounds = max_rounds
    self._max_residual_edges = max_residual_edges

  def expand(self, edges):
    current = edges | "Orient" >> beam.Map(_orient)
    counts, settled, converged = [], [], None
    for i in range(1, self._max_rounds + 1):
      if converged is not None:
        # After a round that changed nothing the edges form stars around
        # their component minima, and every later round is a no-op: they
        # bypass the remaining rounds instead of being shuffled again.
        split = current | f"Bypass{i:03d}" >> beam.ParDo(
            _BypassFn(), beam.pvalue.AsSingleton(converged)).with_outputs(
                _SETTLED, main="active")
        settled.append(split[_SETTLED])
        current = split.active
      current, changed = current | f"Round{i:03d}" >> _StarRound(i)
      counts.append(changed)
      converged = (changed
                   | f"ChangedIn{i:03d}" >> beam.Map(
                       _changes_only, metrics.round_stat(i))
                   | f"SumChanged{i:03d}" >> beam.CombineGlobally(sum)
                   | f"Converged{i:03d}" >> beam.Map(lambda n: n == 0))
    final = (settled + [current]) | "SettledEdges" >> beam.Flatten()
    labels, resolved_counts = final | "ResolveResidual" >> _Resolve(
        self._max_residual_edges)
    counts.append(resolved_counts)
    return {"labels": labels,
            "counts": counts | "FlattenCounts" >> beam.Flatten()}


def _changes_only(count, stat):
  name, n = count
  return n if name == stat else 0


class _BypassFn(beam.DoFn):

  def process(self, edge, converged):
    if converged:
      yield beam.pvalue.TaggedOutput(_SETTLED, edge)
    else:
      yield edge


def _orient(edge):
  a, b = edge
  return (a, b) if a > b else (b, a)


class _StarRound(beam.PTransform):
  """One large-star then one small-star step over (child, parent) edges."""

  def __init__(self, index: int):
    super().__init__()
    self._index = index

  def expand(self, edges):
    stat = metrics.round_stat(self._index)
    large = (edges
             | "BothDirections" >> beam.FlatMap(lambda e: (e, e[::-1]))
             | "GroupNeighbors" >> beam.GroupByKey()
             | "LargeStar" >> beam.ParDo(_LargeStarFn(), stat).with_outputs(
                 metrics.COUNTS, main="edges"))
    small = (large.edges
             | "GroupSmaller" >> beam.GroupByKey()
             | "SmallStar" >> beam.ParDo(_SmallStarFn(), stat).with_outputs(
                 metrics.COUNTS, main="edges"))
    changed = ((large[metrics.COUNTS], small[metrics.COUNTS])
               | "FlattenChanged" >> beam.Flatten())
    return small.edges, changed


class _MeteredFn(beam.DoFn):
  """Times its work as the ``components`` stage and counts nodes visited."""

  def setup(self):
    self._meter = metrics.StageMeter("components", "nodes")
    self._counts = metrics.BundleCounts()

  def finish_bundle(self):
    return self._meter.flush() + self._counts.flush()


@beam.typehints.with_output_types(Tuple[int, int])
class _LargeStarFn(_MeteredFn):

  def process(self, element, stat):
    node, neighbors = element
    self._meter.start()
    neighbors = np.fromiter(neighbors, dtype=np.int64)
    larger, m = graph.large_star(node, neighbors)
    self._meter.stop()
    self._meter.done(1)
    self._counts.add(_SHUFFLED, 16 * len(neighbors))
    if m != node:
      self._counts.add(stat, len(larger))
    for v in larger.tolist():
      yield v, m


@beam.typehints.with_output_types(Tuple[int, int])
class _SmallStarFn(_MeteredFn):

  def process(self, element, stat):
    node, smaller = element
    self._meter.start()
    smaller = np.fromiter(smaller, dtype=np.int64)
    members, m = graph.small_star(node, smaller)
    moved = int(np.count_nonzero(np.unique(smaller) != m))
    self._meter.stop()
    self._meter.done(1)
    self._counts.add(_SHUFFLED, 16 * len(smaller))
    self._counts.add(stat, moved)
    for v in members.tolist():
      yield v, m


class _Resolve(beam.PTransform):
  """Labels from the final (child, parent) edges, exactly.

  Settled nodes take their parent (or themselves, for roots); edges touching
  an unsettled node go to one union-find, whose labels then override those of
  the settled nodes in the same components.
  """

  def __init__(self, max_residual_edges: int):
    super().__init__()
    self._max_residual_edges = max_residual_edges

  def expand(self, edges):
    classified = (edges
                  | "UpAndDown" >> beam.FlatMap(_up_and_down)
                  | "GroupByNode" >> beam.GroupByKey()
                  | "Classify" >> beam.ParDo(_ClassifyFn()).with_outputs(
                      "residual", "leaf", metrics.COUNTS, main="marks"))
    uf = (classified.residual
          | "OneKey" >> beam.Map(lambda e: (None, e))
          | "GatherResidual" >> beam.GroupByKey()
          | "UnionFind" >> beam.ParDo(_UnionFindFn(self._max_residual_edges))
          .with_outputs(metrics.COUNTS, main="labels"))
    labels = ({"mark": classified.marks, "leaf": classified.leaf,
               "uf": uf.labels}
              | "JoinByParent" >> beam.CoGroupByKey()
              | "Label" >> beam.FlatMap(_final_labels))
    counts = ((classified[metrics.COUNTS], uf[metrics.COUNTS])
              | "FlattenCounts" >> beam.Flatten())
    return labels, counts


def _up_and_down(edge):
  child, parent = edge
  yield child, (True, parent)
  yield parent, (False, child)


@beam.typehints.with_output_types(Tuple[int, str])
class _ClassifyFn(_MeteredFn):
  """Per node: roots and unsettled nodes are marked; a leaf reports itself to
  its parent; unsettled nodes hand all their edges to the residual."""

  def process(self, element):
    node, incident = element
    self._meter.start()
    parents, children = [], []
    for is_up, other in incident:
      (parents if is_up else children).append(other)
    role = graph.classify_node(np.asarray(parents, dtype=np.int64),
                               np.asarray(children, dtype=np.int64))
    self._meter.stop()
    self._meter.done(1)
    if role == "leaf":
      yield beam.pvalue.TaggedOutput("leaf", (parents[0], node))
      return
    yield node, role
    if role == "unsettled":
      for p in set(parents):
        yield beam.pvalue.TaggedOutput("residual", (node, p))
      for c in set(children):
        yield beam.pvalue.TaggedOutput("residual", (c, node))


@beam.typehints.with_output_types(Tuple[int, int])
class _UnionFindFn(_MeteredFn):

  def __init__(self, max_residual_edges: int):
    self._max_residual_edges = max_residual_edges

  def process(self, element):
    _, edges = element
    # Both unsettled ends of an edge report it; the set counts it once.
    held = set()
    self._meter.start()
    for edge in edges:
      held.add(edge)
      if len(held) > self._max_residual_edges:
        raise ResidualTooLargeError(
            "Connected components did not converge: more than "
            f"max_residual_edges={self._max_residual_edges} unsettled edges "
            "remain after the last round. Raise --max_cc_rounds (or "
            "--max_residual_edges if one worker can hold them).")
    labels = graph.union_find_labels(sorted(held))
    self._meter.stop()
    self._meter.done(len(labels))
    yield metrics.count_tag("cc_residual_edges", len(held))
    yield metrics.count_tag("cc_residual_nodes", len(labels))
    yield from labels.items()


def _final_labels(element):
  node, grouped = element
  marks = list(grouped["mark"])
  uf = list(grouped["uf"])
  label = uf[0] if uf else node
  if uf or marks == ["root"]:
    yield node, label
  if marks == ["unsettled"]:
    # Its leaves touch a residual edge, so the union-find labelled them.
    return
  for leaf in grouped["leaf"]:
    yield leaf, label
