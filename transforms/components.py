"""Exact distributed connected components: unrolled large-star/small-star
rounds (Kiveris et al., 2014) over edge arrays sharded by node, followed by
an exact residual resolution with an array union-find."""

from __future__ import annotations

import dataclasses
import struct
from typing import Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.elements import RouteByShard, ShardOutputs
from transforms.join import JoinByKey
from transforms.kernels import connected

_SHUFFLED = metrics.SHUFFLE_PREFIX + "connected_components"
# Node shards of every step: each holds about 1/SHARDS of the edges, so a
# worker's memory is bounded by the graph size over SHARDS.
DEFAULT_SHARDS = 64
_LEAVES, _UNSETTLED, _UF = "leaves", "unsettled", "uf"


class ResidualTooLargeError(RuntimeError):
  """The rounds left more unsettled edges than may be resolved in one place."""


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Two aligned int64 arrays: edges ``(a[i], b[i])``, or node labels."""
  a: np.ndarray
  b: np.ndarray


class PairsCoder(beam.coders.Coder):
  """Deterministic: a length, then both arrays' little-endian bytes."""

  def encode(self, value):
    return (struct.pack("<q", len(value.a)) + value.a.astype("<i8").tobytes()
            + value.b.astype("<i8").tobytes())

  def decode(self, encoded):
    n = struct.unpack_from("<q", encoded)[0]
    both = np.frombuffer(encoded, dtype="<i8", offset=8, count=2 * n)
    return Pairs(both[:n].astype(np.int64), both[n:].astype(np.int64))

  def is_deterministic(self):
    return True


beam.coders.registry.register_coder(Pairs, PairsCoder)
_Keyed = Tuple[int, Pairs]


class ConnectedComponents(beam.PTransform):
  """Edge batches → the component label of every node on an edge (the
  component's minimum id). Returns ``{"labels", "counts"}``.

  In: ``(key, batch)`` whose batch's first two fields are the edges' ends
  (e.g. :class:`~transforms.elements.EdgeBatch` or
  :class:`~transforms.elements.VerifiedEdges`). Out (``labels``):
  ``(shard, Pairs(nodes, labels))`` batches holding every node once (a
  shard where its label was resolved).

  Edges travel as arrays, one element per pair of node shards, so the cost
  is per shard, not per edge, and every step's result depends only on the
  set of edges a shard holds (not on bundling). ``max_rounds`` alternating
  large-star/small-star rounds run (Beam cannot loop); each reports the
  edges it re-pointed (``cc_changed_round_NNN``, a counter and a stat).
  Whatever the rounds leave unsettled (not yet a star around its component
  minimum) is resolved exactly by union-find in one place; if more than
  ``max_residual_edges`` edges remain the job fails with a message naming
  ``--max_cc_rounds``.

  Args:
    max_rounds: large-star/small-star rounds before the residual step.
    max_residual_edges: most unsettled edges one worker may resolve.
    shards: node shards of each step (memory per worker ~ edges / shards).
  """

  def __init__(self, max_rounds: int, max_residual_edges: int,
               shards: int = DEFAULT_SHARDS):
    super().__init__()
    self._max_rounds = max_rounds
    self._max_residual_edges = max_residual_edges
    self._shards = shards

  def expand(self, edges):
    s = self._shards
    current = edges | "BatchEdges" >> beam.ParDo(_BatchEdgesFn(s))
    counts = []
    for i in range(1, self._max_rounds + 1):
      large = (current
               | f"GroupNeighbors{i:03d}" >> beam.GroupByKey()
               | f"LargeStar{i:03d}" >> beam.ParDo(
                   _LargeStarFn(s, i)).with_outputs(metrics.COUNTS,
                                                    main="edges"))
      small = (large.edges
               | f"GroupSmaller{i:03d}" >> beam.GroupByKey()
               | f"SmallStar{i:03d}" >> beam.ParDo(
                   _SmallStarFn(s, i)).with_outputs(metrics.COUNTS,
                                                    main="edges"))
      counts += [large[metrics.COUNTS], small[metrics.COUNTS]]
      current = small.edges
    labels, resolved_counts = current | "ResolveResidual" >> _Resolve(
        s, self._max_residual_edges)
    return {"labels": labels, "counts": (*counts, *resolved_counts)}


def _keyed(shard, a, b):
  return shard, Pairs(a, b)


class _MeteredFn(metrics.MeteredDoFn):
  """Times its work as the ``components`` stage and counts nodes visited."""

  STAGE = "components"

  def __init__(self, shards: int, index: int = 0):
    super().__init__()
    self._shards = shards
    self._index = index

  def setup(self):
    super().setup()
    self._counts = metrics.BundleCounts()
    # A shard's output goes to every shard: one batch each per bundle.
    self._outputs = ShardOutputs(Pairs)

  def finish_bundle(self):
    return (self._outputs.flush() + super().finish_bundle()
            + self._counts.flush())

  def _gather(self, batches):
    batches = list(batches)
    return (np.concatenate([p.a for p in batches]),
            np.concatenate([p.b for p in batches]))


@beam.typehints.with_output_types(_Keyed)
class _BatchEdgesFn(RouteByShard):
  """Edge batches → one array batch per owner shard of either end, per
  bundle."""

  OUTPUT = Pairs

  def process(self, element):
    _, batch = element
    a = np.asarray(batch[0], dtype=np.int64)
    b = np.asarray(batch[1], dtype=np.int64)
    edge = a != b  # A self-loop connects nothing.
    a, b = a[edge], b[edge]
    yield from self.outputs.add_rows(*connected.destinations(
        np.maximum(a, b), np.minimum(a, b), self._shards, both=True))


class _StarFn(_MeteredFn):
  """One star step of round ``index``; counts what it re-pointed."""

  def _emit(self, star, both: bool):
    """Counts the step's work and routes its (child, parent) edges: to the
    child's shard only, or (``both``) to the shards of both ends."""
    self.meter.done(star.incidences)
    self._counts.add(_SHUFFLED, 16 * star.incidences)
    self._counts.add(metrics.round_stat(self._index), star.changed)
    yield from self._outputs.add_rows(*connected.destinations(
        star.child, star.parent, self._shards, both=both))


@beam.typehints.with_output_types(_Keyed)
class _LargeStarFn(_StarFn):

  def process(self, element):
    shard, batches = element
    with self.meter.timed():
      a, b = self._gather(batches)
      star = connected.large_star(a, b, shard, self._shards)
    # Small-star needs all the edges of each child in one place.
    yield from self._emit(star, both=False)


@beam.typehints.with_output_types(_Keyed)
class _SmallStarFn(_StarFn):

  def process(self, element):
    _, batches = element
    with self.meter.timed():
      a, b = self._gather(batches)
      star = connected.small_star(a, b)
    # The next step (a large star or the classification) needs every edge
    # touching a node at the node's shard.
    yield from self._emit(star, both=True)


class _Resolve(beam.PTransform):
  """Labels from the final (child, parent) edges, exactly; returns
  ``(labels, counts)``.

  Settled nodes take their parent (or themselves, for roots); edges touching
  an unsettled node go to one union-find, whose labels then override those of
  the settled nodes in the same components. Every step is sharded by node
  except the union-find over the residual edges.
  """

  def __init__(self, shards: int, max_residual_edges: int):
    super().__init__()
    self._shards = shards
    self._max_residual_edges = max_residual_edges

  def expand(self, edges):
    classified = (edges
                  | "GroupByNode" >> beam.GroupByKey()
                  | "Classify" >> beam.ParDo(_ClassifyFn(
                      self._shards)).with_output_types(
                          _Keyed, residual=_Keyed,
                          **{_UNSETTLED: _Keyed, metrics.COUNTS: metrics.Count})
                  .with_outputs(
                          "residual", _UNSETTLED, metrics.COUNTS,
                          main=_LEAVES))
    uf = (classified.residual
          | "GatherResidual" >> beam.GroupByKey()
          | "UnionFind" >> beam.ParDo(_UnionFindFn(
              self._shards, self._max_residual_edges)).with_outputs(
                  metrics.COUNTS, main="labels"))
    labels = ({_LEAVES: classified[_LEAVES],
               _UNSETTLED: classified[_UNSETTLED], _UF: uf.labels}
              | "JoinByShard" >> JoinByKey()
              | "Label" >> beam.FlatMap(_final_labels).with_output_types(
                  _Keyed))
    return labels, (classified[metrics.COUNTS], uf[metrics.COUNTS])


@beam.typehints.with_output_types(_Keyed)
class _ClassifyFn(_MeteredFn):
  """Per shard: leaves go to their parent's shard; the shard's unsettled
  nodes to itself; the edges of unsettled nodes to the residual."""

  def process(self, element):
    shard, batches = element
    with self.meter.timed():
      a, b = self._gather(batches)
      c = connected.classify(a, b, shard, self._shards)
    self.meter.done(len(a))
    yield from self._outputs.add_rows(*connected.destinations(
        c.leaf_parent, c.leaf, self._shards, both=False))
    if len(c.unsettled):
      yield beam.pvalue.TaggedOutput(
          _UNSETTLED, _keyed(shard, c.unsettled, c.unsettled))
      yield beam.pvalue.TaggedOutput(
          "residual", _keyed(0, c.residual_child, c.residual_parent))


@beam.typehints.with_output_types(_Keyed)
class _UnionFindFn(_MeteredFn):

  def __init__(self, shards: int, max_residual_edges: int):
    super().__init__(shards)
    self._max_residual_edges = max_residual_edges

  def process(self, element):
    _, batches = element
    # An edge is reported by the shards of both its ends when both are
    # unsettled, so at most twice the limit is held before deduplicating.
    held_a, held_b, held = [], [], 0
    with self.meter.timed():
      for batch in batches:
        held += len(batch.a)
        held_a.append(batch.a)
        held_b.append(batch.b)
        if held > 2 * self._max_residual_edges:
          self._too_large()
      child, parent = connected.oriented_unique(np.concatenate(held_a),
                                                np.concatenate(held_b))
      if len(child) > self._max_residual_edges:
        self._too_large()
      nodes, labels = connected.component_minima(child, parent)
    self.meter.done(len(nodes))
    yield metrics.count_tag("cc_residual_edges", len(child))
    yield metrics.count_tag("cc_residual_nodes", len(nodes))
    yield from self._outputs.add_rows(*connected.destinations(
        nodes, labels, self._shards, both=False))

  def _too_large(self):
    raise ResidualTooLargeError(
        "Connected components did not converge: more than "
        f"max_residual_edges={self._max_residual_edges} unsettled edges "
        "remain after the last round. Raise --max_cc_rounds (or "
        "--max_residual_edges if one worker can hold them).")


def _final_labels(element):
  shard, grouped = element
  empty = np.zeros(0, dtype=np.int64)

  def joined(tag):
    parts = list(grouped[tag])
    if not parts:
      return empty, empty
    return (np.concatenate([p.a for p in parts]),
            np.concatenate([p.b for p in parts]))

  leaf_parent, leaf = joined(_LEAVES)
  unsettled, _ = joined(_UNSETTLED)
  uf_nodes, uf_labels = joined(_UF)
  order = np.argsort(uf_nodes, kind="stable")
  nodes, labels = connected.final_labels(leaf_parent, leaf, unsettled,
                                         uf_nodes[order], uf_labels[order])
  return [(shard, Pairs(nodes, labels))] if len(nodes) else []
