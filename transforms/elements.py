"""The elements that cross the batch graph's stages, as named types with
deterministic coders (registered with Beam's coder registry on import).

Each is a NamedTuple of numeric numpy arrays of one length, so consumers may
also unpack it as a plain tuple. Keyed by a shard they travel as
``Tuple[int, <type>]``:

* :class:`TextBatch` from Read (:mod:`transforms.read`) to Sign (its texts
  a list of str, the one field that is not an array),
* :class:`SignatureBatch` from Sign (:mod:`transforms.sign`),
* ``(band-key shard, KeyShard)`` from Band (:mod:`transforms.band`),
* from Collide (:mod:`transforms.collide`) to Verify, the members of
  buckets above the exhaustive size: ``(edge shard, BucketMembers)``,
* ``(edge shard, EdgeBatch)`` from Collide (:mod:`transforms.collide`), and
  the ``(doc, other)`` pairs that Explain measures with the documents
  whose user ids it asks for (:class:`TextRequest`),
* ``(edge shard, VerifiedEdges)`` from Verify (:mod:`transforms.verify`),
* ``(shard, Pairs)`` inside and from Components
  (:mod:`transforms.components`: edges between rounds, then the labels),
* ``(label shard, MemberBatch)`` inside Select (:mod:`transforms.select`),
* ``(node shard, ClusterBatch)`` from Select to Explain and
  ``(node shard, AskedBatch)`` inside Explain (:mod:`transforms.explain`).

The coder writes, per field, the array's dtype, shape and raw bytes: no
pickling, the same bytes for equal arrays (so it is deterministic), and a
decoded array that is writable and owns its memory.
"""

from __future__ import annotations

import functools
import math
import struct
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from transforms.kernels import lsh as lsh_kernels

_HEADER = struct.Struct("<HB")  # dtype string length, ndim
_DIM = struct.Struct("<q")


class TextBatch(NamedTuple):
  """Documents of one input file in row order: ``ids`` int64[n] and their
  ``texts`` (a list of n str)."""
  ids: np.ndarray
  texts: list


class SignatureBatch(NamedTuple):
  """Documents' signatures: ``ids`` int64[n], ``sigs`` uint32[n, K]."""
  ids: np.ndarray
  sigs: np.ndarray


class KeyShard(NamedTuple):
  """One batch's band keys of one shard: ``keys`` uint64[m] (one per
  document and band) and the documents' ids: ``id_base`` int64[1] plus
  ``id_offsets``, in the narrowest of uint16, uint32 and int64 that holds
  them (uint16 for the documents of one 4,096-document signature batch of
  one file: 10 bytes an entry to shuffle and to hold, against 16 with int64
  ids). Build one with :meth:`of`, read the ids with :meth:`doc_ids`."""
  keys: np.ndarray
  id_base: np.ndarray
  id_offsets: np.ndarray

  @classmethod
  def of(cls, keys, ids) -> "KeyShard":
    """The shard of ``(keys[i], ids[i])`` entries.

    >>> shard = KeyShard.of(np.array([7, 8], dtype=np.uint64),
    ...                     np.array([5 << 40, (5 << 40) + 3]))
    >>> shard.id_offsets.dtype.name, shard.doc_ids().tolist() == [5 << 40,
    ...                                                    (5 << 40) + 3]
    ('uint16', True)
    """
    ids = np.asarray(ids, dtype=np.int64)
    base = int(ids.min()) if len(ids) else 0
    offsets = ids - base
    span = int(offsets.max()) if len(ids) else 0
    for narrow in (np.uint16, np.uint32):
      if span <= np.iinfo(narrow).max:
        offsets = offsets.astype(narrow)
        break
    return cls(keys, np.array([base], dtype=np.int64), offsets)

  def doc_ids(self) -> np.ndarray:
    """The entries' document ids, int64[m]."""
    return self.id_base[0] + self.id_offsets.astype(np.int64)


def key_columns(shards) -> tuple:
  """``(keys, doc ids)`` of the entries of :class:`KeyShard`\ s,
  concatenated in order."""
  shards = list(shards)
  if not shards:
    return np.zeros(0, np.uint64), np.zeros(0, np.int64)
  return (np.concatenate([s.keys for s in shards]),
          np.concatenate([s.doc_ids() for s in shards]))


class BucketMembers(NamedTuple):
  """Members of band-key buckets above the exhaustive size, one row per
  (bucket, document): the bucket's ``keys`` uint64[m] and ``anchors``
  int64[m] (its smallest id), the document ``ids`` int64[m]."""
  keys: np.ndarray
  anchors: np.ndarray
  ids: np.ndarray


class EdgeBatch(NamedTuple):
  """Edges (document pairs) ``src`` int64[m] → ``dst`` int64[m]."""
  src: np.ndarray
  dst: np.ndarray


class TextRequest(NamedTuple):
  """What Explain asks the text servers for: the texts of both ends of the
  pairs ``src`` → ``dst`` int64[m] it measures, and only the user ids of
  the documents ``ids`` int64[k]."""
  src: np.ndarray
  dst: np.ndarray
  ids: np.ndarray


class VerifiedEdges(NamedTuple):
  """Edges that passed verification with their ``similarity`` float64[m]
  (NaN when not measured)."""
  src: np.ndarray
  dst: np.ndarray
  similarity: np.ndarray


class Wanted(NamedTuple):
  """What a text or signature server is asked for by one edge shard: the
  documents ``ids`` int64[m], whether each one's text is wanted
  (``with_text`` bool[m]; else only its user id) and the ``edge_shard``
  int64[1] the answer goes to."""
  ids: np.ndarray
  with_text: np.ndarray
  edge_shard: np.ndarray


class Served(NamedTuple):
  """A server's answer: documents ``ids`` int64[m] and their ``values``,
  signatures (uint32[m, K]) or an object array of texts, ``(text, user
  id)`` pairs or None."""
  ids: np.ndarray
  values: np.ndarray


class MemberBatch(NamedTuple):
  """Cluster members on their way to their label's shard: ``nodes``,
  their cluster ``labels`` and their text ``lengths`` (zeros for the
  ``first`` keep policy), int64[m]."""
  nodes: np.ndarray
  labels: np.ndarray
  lengths: np.ndarray


class ClusterBatch(NamedTuple):
  """Clustered documents of one node shard: ``docs`` with their cluster
  ids, cluster ``sizes`` and the cluster's kept document, int64[m]."""
  docs: np.ndarray
  cluster_ids: np.ndarray
  sizes: np.ndarray
  kept_ids: np.ndarray


class AskedBatch(NamedTuple):
  """Removed documents of one node shard to explain: a
  :class:`ClusterBatch`'s columns plus the ``matched`` neighbour of each
  and the exact Jaccard to it when verification measured it
  (``similarity`` float64, else NaN)."""
  docs: np.ndarray
  cluster_ids: np.ndarray
  sizes: np.ndarray
  kept_ids: np.ndarray
  matched: np.ndarray
  similarity: np.ndarray


class ElementCoder(beam.coders.Coder):
  """A coder of one named element type ``TYPE``: its type hint, equality by
  class, and ``DETERMINISTIC`` (whether it may encode grouping keys)."""

  TYPE = None
  DETERMINISTIC = True

  def is_deterministic(self) -> bool:
    return self.DETERMINISTIC

  def to_type_hint(self):
    return self.TYPE

  def __eq__(self, other):
    return type(self) is type(other)

  def __hash__(self):
    return hash(type(self))


class ArraysCoder(ElementCoder):
  """Deterministic coder of the NamedTuple ``TYPE``, whose fields are
  numeric arrays.

  >>> coder = EdgeBatchCoder()
  >>> batch = EdgeBatch(np.array([1, 2]), np.array([3, 4]))
  >>> decoded = coder.decode(coder.encode(batch))
  >>> type(decoded).__name__, decoded.src.tolist(), decoded.dst.tolist()
  ('EdgeBatch', [1, 2], [3, 4])
  """

  def encode(self, value) -> bytes:
    parts = []
    for array in value:
      array = np.ascontiguousarray(array)
      if array.dtype.hasobject:
        raise TypeError(f"{self.TYPE.__name__} holds numeric arrays, got "
                        f"dtype {array.dtype}")
      dtype = array.dtype.str.encode("ascii")
      parts.append(_HEADER.pack(len(dtype), array.ndim))
      parts.append(dtype)
      parts.extend(_DIM.pack(n) for n in array.shape)
      parts.append(array.data if array.size else b"")
    return b"".join(parts)

  def decode(self, encoded: bytes):
    fields, at = [], 0
    view = memoryview(encoded)
    for _ in self.TYPE._fields:
      dtype_len, ndim = _HEADER.unpack_from(view, at)
      at += _HEADER.size
      dtype = _dtype(bytes(view[at:at + dtype_len]))
      at += dtype_len
      shape = tuple(_DIM.unpack_from(view, at + i * _DIM.size)[0]
                    for i in range(ndim))
      at += ndim * _DIM.size
      count = math.prod(shape)
      fields.append(np.frombuffer(view, dtype=dtype, count=count,
                                  offset=at).reshape(shape).copy())
      at += count * dtype.itemsize
    if at != len(encoded):
      raise ValueError(f"{self.TYPE.__name__}: {len(encoded) - at} bytes "
                       "left over after decoding")
    return self.TYPE(*fields)


@functools.lru_cache(maxsize=64)
def _dtype(name: bytes) -> np.dtype:
  # Parsing a dtype string costs more than decoding a small array.
  return np.dtype(name.decode("ascii"))


class TextBatchCoder(ElementCoder):
  """Deterministic coder of :class:`TextBatch`: the ids' bytes, then each
  text's UTF-8 length and the UTF-8 bytes of them all.

  >>> coder = TextBatchCoder()
  >>> batch = coder.decode(coder.encode(TextBatch(np.array([4, 9]),
  ...                                             ["ab", "\u00e9"])))
  >>> batch.ids.tolist(), batch.texts
  ([4, 9], ['ab', '\u00e9'])
  """

  TYPE = TextBatch

  def encode(self, value: TextBatch) -> bytes:
    ids = np.ascontiguousarray(value.ids, dtype="<i8")
    if len(ids) != len(value.texts):
      raise ValueError(f"TextBatch has {len(ids)} ids and "
                       f"{len(value.texts)} texts")
    encoded = [text.encode("utf-8") for text in value.texts]
    sizes = np.fromiter(map(len, encoded), dtype="<i8", count=len(encoded))
    return b"".join([_DIM.pack(len(ids)), ids.tobytes(), sizes.tobytes()]
                    + encoded)

  def decode(self, encoded: bytes) -> TextBatch:
    (n,) = _DIM.unpack_from(encoded, 0)
    at = _DIM.size
    ids = np.frombuffer(encoded, dtype="<i8", count=n, offset=at).copy()
    sizes = np.frombuffer(encoded, dtype="<i8", count=n, offset=at + 8 * n)
    at += 16 * n
    ends = at + np.cumsum(sizes)
    if (int(ends[-1]) if n else at) != len(encoded):
      raise ValueError("TextBatch: the text sizes do not add up to the "
                       "encoded bytes")
    starts = ends - sizes
    texts = [encoded[a:b].decode("utf-8")
             for a, b in zip(starts.tolist(), ends.tolist())]
    return TextBatch(ids, texts)


beam.coders.registry.register_coder(TextBatch, TextBatchCoder)


class ServedCoder(ElementCoder):
  """Coder of :class:`Served`: numeric values as :class:`ArraysCoder`
  writes them; texts and ``(text, user id)`` pairs with Beam's
  ``FastPrimitivesCoder``, which writes str, tuples, None and JSON values
  itself (no pickling). Not a grouping key (user ids are any JSON value).

  >>> coder = ServedCoder()
  >>> texts = np.empty(2, dtype=object)
  >>> texts[0], texts[1] = ("a", 7), None
  >>> served = coder.decode(coder.encode(Served(np.array([3, 5]), texts)))
  >>> served.ids.tolist(), served.values.tolist()
  ([3, 5], [('a', 7), None])
  """

  TYPE = Served
  DETERMINISTIC = False

  def __init__(self):
    self._objects = beam.coders.FastPrimitivesCoder()

  def encode(self, value: Served) -> bytes:
    if not value.values.dtype.hasobject:
      return b"\x00" + _NUMERIC_SERVED.encode(value)
    ids = np.ascontiguousarray(value.ids, dtype="<i8")
    return b"".join([b"\x01", _DIM.pack(len(ids)), ids.tobytes(),
                     self._objects.encode(value.values.tolist())])

  def decode(self, encoded: bytes) -> Served:
    if encoded[:1] == b"\x00":
      return _NUMERIC_SERVED.decode(encoded[1:])
    (n,) = _DIM.unpack_from(encoded, 1)
    at = 1 + _DIM.size
    ids = np.frombuffer(encoded, dtype="<i8", count=n, offset=at).copy()
    listed = self._objects.decode(encoded[at + 8 * n:])
    values = np.empty(n, dtype=object)
    for i, item in enumerate(listed):  # Item by item: pairs stay pairs.
      values[i] = item
    return Served(ids, values)


class _NumericServedCoder(ArraysCoder):
  TYPE = Served


_NUMERIC_SERVED = _NumericServedCoder()
beam.coders.registry.register_coder(Served, ServedCoder)


class BatchByShard(beam.DoFn):
  """Elements → one ``element_type`` of int64 columns per node shard and
  bundle: ``row(element)`` gives each element's columns, and the shard is
  that of column ``by`` (so rows with the same value there meet).

  Args:
    element_type: a NamedTuple of arrays, one field per column.
    row: element → tuple of ints, in ``element_type``'s field order.
    shards: the number of node shards.
    by: the column whose value picks the shard.
  """

  def __init__(self, element_type, row, shards: int, by: int = 0):
    self._type = element_type
    self._row = row
    self._shards = shards
    self._by = by

  def start_bundle(self):
    self._rows = []

  def process(self, element):
    self._rows.append(self._row(element))

  def finish_bundle(self):
    if not self._rows:
      return
    columns = [np.array(c, dtype=np.int64) for c in zip(*self._rows)]
    self._rows = []
    for shard, parts in lsh_kernels.split_by_shard(
        lsh_kernels.node_shard(columns[self._by], self._shards), *columns):
      yield GlobalWindows.windowed_value((shard, self._type(*parts)))


class ShardOutputs:
  """A DoFn's outputs gathered per destination shard over a bundle, for
  steps that route each input's rows to many shards: at most one element
  per shard per bundle leaves the step (and per ``max_rows`` rows held),
  instead of one per input and shard (64 x 64 small elements per step
  otherwise). Each shard receives the same rows in the same order (by
  input, then by row), only in fewer batches.

  In ``process``: ``yield from outputs.add_rows(shards, *columns)`` (it
  returns the gathered elements when ``max_rows`` are held, else nothing);
  in ``finish_bundle``: return ``outputs.flush()``.

  Args:
    element_type: the NamedTuple (or dataclass) of arrays to emit, built
      from the concatenated columns.
    max_rows: rows held before the step emits them early (memory bound).
  """

  def __init__(self, element_type, max_rows: int = 1 << 20):
    self._type = element_type
    self._max_rows = max_rows
    self._parts = []
    self._rows = 0

  def add_rows(self, shards: np.ndarray, *columns):
    """Adds rows: ``shards[i]`` is where row i of the columns goes."""
    if len(shards):
      self._parts.append((shards, columns))
      self._rows += len(shards)
    return self._take() if self._rows >= self._max_rows else []

  def flush(self) -> list:
    """The gathered elements as windowed values (for ``finish_bundle``)."""
    return [GlobalWindows.windowed_value(out) for out in self._take()]

  def _take(self) -> list:
    if not self._parts:
      return []
    shards = np.concatenate([shards for shards, _ in self._parts])
    columns = lsh_kernels.concat_arrays(columns for _, columns in self._parts)
    self._parts, self._rows = [], 0
    return [(shard, self._type(*parts)) for shard, parts in
            lsh_kernels.split_by_shard(shards, *columns)]


class RouteByShard(beam.DoFn):
  """A DoFn that routes the rows of each input to many of ``shards`` shards
  through :class:`ShardOutputs` of its ``OUTPUT`` type: a subclass's
  ``process`` yields ``from self.outputs.add_rows(shards, *columns)``."""

  OUTPUT = None

  def __init__(self, shards: int):
    self._shards = shards

  def setup(self):
    self.outputs = ShardOutputs(self.OUTPUT)

  def finish_bundle(self):
    return self.outputs.flush()


class FieldsCoder(ElementCoder):
  """Coder of the NamedTuple ``TYPE`` whose fields are plain values (int,
  float, str, bool, None, and lists, tuples and dicts of them): the fields
  as a plain tuple through Beam's ``FastPrimitivesCoder``, which encodes
  those natively but pickles a NamedTuple. Deterministic where the fields
  hold no dict (``DETERMINISTIC``)."""

  def __init__(self):
    self._fields = beam.coders.FastPrimitivesCoder()

  def encode(self, value) -> bytes:
    return self._fields.encode(tuple(value))

  def decode(self, encoded: bytes):
    return self.TYPE(*self._fields.decode(encoded))


def fields_coder(element_type, module: str, deterministic: bool = True
                 ) -> type:
  """The :class:`FieldsCoder` of ``element_type``, named ``<type>Coder``
  and registered with Beam's coder registry; assign it to that name in
  ``module`` (its ``__name__``), so it pickles by reference."""
  name = f"{element_type.__name__}Coder"
  coder = type(name, (FieldsCoder,), {"TYPE": element_type,
                                      "DETERMINISTIC": deterministic,
                                      "__module__": module,
                                      "__qualname__": name})
  beam.coders.registry.register_coder(element_type, coder)
  return coder


def _arrays_coder(element_type) -> type:
  """The :class:`ArraysCoder` of ``element_type``, named ``<type>Coder``
  (a module attribute of that name, so it pickles by reference)."""
  name = f"{element_type.__name__}Coder"
  return type(name, (ArraysCoder,), {"TYPE": element_type,
                                     "__module__": __name__,
                                     "__qualname__": name})


SignatureBatchCoder = _arrays_coder(SignatureBatch)
KeyShardCoder = _arrays_coder(KeyShard)
BucketMembersCoder = _arrays_coder(BucketMembers)
EdgeBatchCoder = _arrays_coder(EdgeBatch)
TextRequestCoder = _arrays_coder(TextRequest)
VerifiedEdgesCoder = _arrays_coder(VerifiedEdges)
MemberBatchCoder = _arrays_coder(MemberBatch)
ClusterBatchCoder = _arrays_coder(ClusterBatch)
AskedBatchCoder = _arrays_coder(AskedBatch)
WantedCoder = _arrays_coder(Wanted)

CODERS = (SignatureBatchCoder, KeyShardCoder, BucketMembersCoder,
          EdgeBatchCoder, TextRequestCoder, VerifiedEdgesCoder, MemberBatchCoder, ClusterBatchCoder,
          AskedBatchCoder, WantedCoder)
for _coder in CODERS:
  beam.coders.registry.register_coder(_coder.TYPE, _coder)
