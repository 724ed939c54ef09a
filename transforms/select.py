"""Choosing the one document kept per duplicate cluster."""

from __future__ import annotations

from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np

from transforms import metrics
from transforms.elements import (ArraysCoder, BatchByShard, ClusterBatch,
                                 ElementCoder, MemberBatch, RouteByShard,
                                 ShardOutputs)
from transforms.join import JoinByKey
from transforms.kernels import clusters as cluster_kernels
from transforms.kernels import lsh as lsh_kernels


class ClusterInfo(NamedTuple):
  """A clustered document's cluster (labelled by its minimum doc id), the
  cluster's size, whether this document is the one kept, and which one is.

  The explanation of a document that is not the kept one (filled in by
  :class:`~transforms.verify.ExplainClusters`): ``matched_doc_id``, a
  document it shares a verified edge with (the kept one when they share
  one), that document's user id, the exact Jaccard of the two, and the exact
  Jaccard to the kept document. ``chain_kept``: kept by the chain guard
  although clustered (its Jaccard to the kept document is below the
  threshold).
  """
  cluster_id: int
  cluster_size: int
  kept: bool
  kept_doc_id: Optional[int] = None
  matched_doc_id: Optional[int] = None
  matched_id: Any = None
  matched_jaccard: Optional[float] = None
  jaccard_to_kept: Optional[float] = None
  chain_kept: bool = False


class ClusterInfoCoder(ElementCoder):
  """ClusterInfo's fields in order with Beam's compiled primitive coders
  (half the bytes of pickling it, and no pickle)."""

  TYPE = ClusterInfo
  DETERMINISTIC = False  # matched_id is any JSON value; never a grouping key.

  def __init__(self):
    ints = beam.coders.VarIntCoder()
    maybe_int = beam.coders.NullableCoder(ints)
    maybe_float = beam.coders.NullableCoder(beam.coders.FloatCoder())
    flag = beam.coders.BooleanCoder()
    self._fields = beam.coders.TupleCoder([
        ints, ints, flag, maybe_int, maybe_int,
        beam.coders.FastPrimitivesCoder(), maybe_float, maybe_float, flag])

  def encode(self, value: ClusterInfo) -> bytes:
    return self._fields.encode(value)

  def decode(self, encoded: bytes) -> ClusterInfo:
    return ClusterInfo(*self._fields.decode(encoded))


beam.coders.registry.register_coder(ClusterInfo, ClusterInfoCoder)
Clustered = Tuple[int, ClusterInfo]


class _ClusterArrays(NamedTuple):
  """The numeric columns of :class:`ClusterColumns`."""
  doc_ids: np.ndarray
  cluster_ids: np.ndarray
  cluster_sizes: np.ndarray
  kept: np.ndarray
  kept_doc_ids: np.ndarray
  matched_doc_ids: np.ndarray
  matched_jaccards: np.ndarray
  jaccards_to_kept: np.ndarray
  chain_kept: np.ndarray
  known: np.ndarray


# Bits of ClusterColumns.known: which optional fields of a row are not None.
_OPTIONAL = ("kept_doc_id", "matched_doc_id", "matched_jaccard",
             "jaccard_to_kept")


class ClusterColumns(NamedTuple):
  """Clustered documents' ``(doc_id, ClusterInfo)`` rows as columns: a
  file's rows of one bundle on their way to the writer, one element
  instead of one per document. ``arrays`` holds the numeric fields (None
  as a cleared bit of ``known``), ``matched_ids`` the user ids (any JSON
  value). :func:`cluster_columns` and :func:`cluster_rows` convert, and
  the rows come back equal."""
  arrays: _ClusterArrays
  matched_ids: List[Any]


def cluster_columns(rows: Sequence[Clustered]) -> ClusterColumns:
  """The rows ``(doc_id, ClusterInfo)`` as one :class:`ClusterColumns`."""
  n = len(rows)
  docs, infos = zip(*rows) if n else ((), ())
  fields = dict(zip(ClusterInfo._fields, zip(*infos))) if n else {
      name: () for name in ClusterInfo._fields}
  known = np.zeros(n, dtype=np.uint8)
  optional = []
  for bit, name in enumerate(_OPTIONAL):
    values = fields[name]
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
      values = list(values)
      for i in missing:
        values[i] = 0
    known |= np.uint8(1 << bit)
    known[missing] &= np.uint8(~(1 << bit) & 0xFF)
    optional.append(values)
  kept_docs, matched_docs, matched_jaccards, to_kept = optional
  arrays = _ClusterArrays(
      np.array(docs, dtype=np.int64),
      np.array(fields["cluster_id"], dtype=np.int64),
      np.array(fields["cluster_size"], dtype=np.int64),
      np.array(fields["kept"], dtype=bool),
      np.array(kept_docs, dtype=np.int64),
      np.array(matched_docs, dtype=np.int64),
      np.array(matched_jaccards, dtype=np.float64),
      np.array(to_kept, dtype=np.float64),
      np.array(fields["chain_kept"], dtype=bool), known)
  return ClusterColumns(arrays, list(fields["matched_id"]))


def cluster_rows(columns: ClusterColumns) -> Iterator[Clustered]:
  """The ``(doc_id, ClusterInfo)`` rows of :func:`cluster_columns`."""
  a = columns.arrays
  optional = []
  for bit, values in enumerate((a.kept_doc_ids, a.matched_doc_ids,
                                a.matched_jaccards, a.jaccards_to_kept)):
    values = values.tolist()
    for i in np.flatnonzero((a.known >> bit & 1) == 0).tolist():
      values[i] = None
    optional.append(values)
  kept_docs, matched_docs, matched_jaccards, to_kept = optional
  infos = map(ClusterInfo, a.cluster_ids.tolist(), a.cluster_sizes.tolist(),
              a.kept.tolist(), kept_docs, matched_docs, columns.matched_ids,
              matched_jaccards, to_kept, a.chain_kept.tolist())
  return zip(a.doc_ids.tolist(), infos)


def split_cluster_columns(columns: ClusterColumns, keys: np.ndarray
                          ) -> Iterator[Tuple[int, ClusterColumns]]:
  """``(key, its rows)`` per distinct value of ``keys`` (int64, one per row
  of ``columns``), keys ascending, each key's rows in their order."""
  if not len(keys):
    return
  order = np.argsort(keys, kind="stable")
  for part in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1):
    ids = columns.matched_ids
    yield int(keys[part[0]]), ClusterColumns(
        _ClusterArrays(*(column[part] for column in columns.arrays)),
        [ids[i] for i in part.tolist()])


class _ClusterArraysCoder(ArraysCoder):
  TYPE = _ClusterArrays


class ClusterColumnsCoder(ElementCoder):
  """:class:`ClusterColumns` as its arrays' bytes (:class:`ArraysCoder`),
  then the user ids with Beam's ``FastPrimitivesCoder`` (JSON values, no
  pickling). Not a grouping key."""

  TYPE = ClusterColumns
  DETERMINISTIC = False

  def __init__(self):
    self._arrays = _ClusterArraysCoder()
    self._ids = beam.coders.FastPrimitivesCoder()

  def encode(self, value: ClusterColumns) -> bytes:
    arrays = self._arrays.encode(value.arrays)
    return b"".join([len(arrays).to_bytes(8, "little"), arrays,
                     self._ids.encode(value.matched_ids)])

  def decode(self, encoded: bytes) -> ClusterColumns:
    n = int.from_bytes(encoded[:8], "little")
    return ClusterColumns(self._arrays.decode(encoded[8:8 + n]),
                          self._ids.decode(encoded[8 + n:]))


beam.coders.registry.register_coder(ClusterColumns, ClusterColumnsCoder)


class SelectKept(beam.PTransform):
  """Component labels (``(shard, Pairs(nodes, labels))``, as
  :class:`~transforms.components.ConnectedComponents` gives them) → every
  clustered document's cluster id, cluster size and kept document, as
  ``(node shard, ClusterBatch)`` (one batch per shard and bundle).

  Policies: ``first`` keeps the lowest id (first in input order); ``longest``
  keeps the longest text (ties: lowest id) and needs ``lengths``, a
  PCollection of ``(doc_id, text length)``.

  Against an index (``first_new_id`` given), only the members with ids
  from it on (the new documents) are returned and counted: ``clusters``
  counts the clusters holding one, ``clusters_with_index`` those of them
  whose kept document is an indexed one.

  Args:
    keep: ``"first"`` or ``"longest"``.
    lengths: ``(doc_id, text length)``, needed for ``"longest"``.
    first_new_id: the lowest id of a new document, or None.

  Returns:
    ``{"clusters": (node shard, ClusterBatch), "counts"}`` (``clusters``,
    ``clustered_docs``, the cluster size histogram).

  Raises:
    ValueError: ``keep="longest"`` without ``lengths``.
  """

  def __init__(self, keep: str, lengths=None, first_new_id: int = None,
               shards: int = 64):
    super().__init__()
    if keep == "longest" and lengths is None:
      raise ValueError("keep='longest' needs the document lengths")
    self._keep = keep
    self._lengths = lengths
    self._first_new_id = first_new_id
    self._shards = shards

  def expand(self, labels):
    if self._keep == "longest":
      nodes = labels | "Unbatch" >> beam.FlatMap(
          _node_labels).with_output_types(Tuple[int, int])
      members = ({"label": nodes, "length": self._lengths}
                 | "JoinLengths" >> JoinByKey()
                 | "KeyByLabel" >> beam.FlatMap(_member_with_length)
                 | "BatchMembers" >> beam.ParDo(BatchByShard(
                     MemberBatch, _member_row, self._shards, by=1))
                 .with_output_types(Tuple[int, MemberBatch]))
    else:
      members = labels | "BatchMembers" >> beam.ParDo(
          _MembersByLabelFn(self._shards))
    chosen = (members
              # A cluster's members meet as arrays at their label's shard.
              | "GroupClusters" >> beam.GroupByKey()
              | "ChooseKept" >> beam.ParDo(
                  _ChooseFn(self._first_new_id, self._shards)).with_outputs(
                  metrics.COUNTS, main="clusters"))
    return {"clusters": chosen.clusters,
            "counts": (chosen[metrics.COUNTS],)}


def _node_labels(element):
  _, pairs = element
  return zip(pairs.a.tolist(), pairs.b.tolist())


@beam.typehints.with_output_types(Tuple[int, MemberBatch])
class _MembersByLabelFn(RouteByShard):
  """Label batches → the members (``first`` policy: lengths 0) at their
  label's shard, one batch per shard and bundle."""

  OUTPUT = MemberBatch

  def process(self, element):
    _, pairs = element
    nodes, labels = pairs.a, pairs.b
    yield from self.outputs.add_rows(
        lsh_kernels.node_shard(labels, self._shards), nodes, labels,
        np.zeros(len(nodes), dtype=np.int64))


def _member_with_length(element):
  node, grouped = element
  length = next(iter(grouped["length"]), 0)
  for label in grouped["label"]:
    yield label, (node, length)


def _member_row(member):
  label, (node, length) = member
  return node, label, length


@beam.typehints.with_output_types(Tuple[int, ClusterBatch])
class _ChooseFn(metrics.MeteredDoFn):
  """A label shard's clusters: the kept member of each
  (:func:`~transforms.kernels.clusters.choose_kept`), then every member's
  row at its own node shard."""

  STAGE = "selection"

  def __init__(self, first_new_id: int = None, shards: int = 64):
    self._first_new_id = first_new_id
    self._shards = shards

  def setup(self):
    super().setup()
    self._sizes = metrics.distribution("cluster_size")
    self._counts = metrics.BundleCounts()
    self._outputs = ShardOutputs(ClusterBatch)

  def finish_bundle(self):
    return (self._outputs.flush() + super().finish_bundle()
            + self._counts.flush())

  def process(self, element):
    _, batches = element
    with self.meter.timed():
      c = cluster_kernels.choose_kept(*lsh_kernels.concat_arrays(batches))
    sizes = np.diff(c.starts)
    self.meter.done(len(sizes))
    self._counts.add(metrics.shuffle_stat("select_kept"), 24 * len(c.nodes))
    members = np.ones(len(c.nodes), dtype=bool)
    counted = np.ones(len(sizes), dtype=bool)
    if self._first_new_id is not None and len(sizes):
      # Only clusters holding a new document are returned and counted.
      members = c.nodes >= self._first_new_id
      counted = np.add.reduceat(members, c.starts[:-1]) > 0
      indexed_kept = c.kept[c.starts[:-1]] < self._first_new_id
      self._counts.add("clusters_with_index",
                       int(np.count_nonzero(counted & indexed_kept)))
    for size in sizes[counted].tolist():
      self._sizes.update(size)
      # bit_length() - 1 = floor(log2(size))
      self._counts.add(metrics.size_bin_stat(metrics.CLUSTER_SIZES,
                                             size.bit_length() - 1), 1)
    self._counts.add("clusters", int(np.count_nonzero(counted)))
    self._counts.add("clustered_docs", int(np.count_nonzero(members)))
    docs = c.nodes[members]
    yield from self._outputs.add_rows(
        lsh_kernels.node_shard(docs, self._shards), docs, c.labels[members],
        c.sizes[members], c.kept[members])
