"""JoinByKey: the project's one join, CoGroupByKey's result with one coder
for every input.

Beam's CoGroupByKey tags each input's values and flattens them into one
GroupByKey; the flattened PCollection's type is a Union, whose coder is the
pickling fallback, and because its coder differs from the inputs' the local
runner adds a stage that only re-encodes the flatten (measured: 3.6 of 28 s
of stage time at 100k documents). Here each tagged value is encoded by its
own input's coder (from the input's element type: the array coders of
:mod:`transforms.elements`, ``PairsCoder``, ``ClusterInfoCoder``), so every
input and the flatten share ``Tuple[int, Tuple[int, bytes]]`` and the
runner writes the inputs straight into the grouping.

A key's values then stay encoded in a :class:`Joined` until a step asks for
a tag. The runner samples the size of the elements a step emits by
encoding them; a plain dict of decoded values would be encoded by Beam's
pickling fallback (measured at 100k documents: every one of the 44,404
``ClusterInfo`` of the write stage's join pickled once), while a
:class:`Joined` is encoded by :class:`JoinedCoder` as the bytes it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.typehints import native_type_compatibility, typehints

_Tagged = Tuple[int, Tuple[int, bytes]]


class JoinByKey(beam.PTransform):
  """``{tag: PCollection of (int key, value)}`` → ``(key, {tag: [values]})``
  for every key of any input, like :class:`beam.CoGroupByKey` on a dict
  (every tag present, an empty list where an input has no value for the
  key; the order of values within a list is unspecified). The mapping is a
  read-only :class:`Joined`.

  A value is encoded with the coder of its input's declared value type
  (``Tuple[int, V]``: ``V``'s registered coder; otherwise Beam's
  ``FastPrimitivesCoder``), so declare the types of inputs that carry the
  project's named elements.

  Args:
    key_by: for the tags whose input holds plain values rather than ``(int
      key, value)`` pairs, the function that gives a value its key; the
      join's own tag step applies it (a separate keying step would be one
      more transform for the runner to build, translate and set up).
  """

  def __init__(self, key_by: Optional[Dict[str, Callable[[Any], int]]] = None):
    super().__init__()
    self._key_by = dict(key_by or {})

  def expand(self, pcolls: Dict[str, beam.PCollection]):
    tags = list(pcolls)
    unknown = sorted(set(self._key_by) - set(tags))
    if unknown:
      raise ValueError(f"JoinByKey: key_by names no input: {unknown}")
    hints = [(native_type_compatibility.convert_to_beam_type(
        pcolls[tag].element_type) if tag in self._key_by
              else _value_hint(pcolls[tag])) for tag in tags]
    coders = [beam.coders.registry.get_coder(hint) for hint in hints]
    tagged = [
        pcolls[tag] | f"Tag[{tag}]" >> (
            beam.Map(_encode_by, index, coders[index], self._key_by[tag])
            if tag in self._key_by else
            beam.Map(_encode, index, coders[index])).with_output_types(
                _Tagged)
        for index, tag in enumerate(tags)]
    return (tagged
            | "Flatten" >> beam.Flatten().with_output_types(_Tagged)
            | "GroupByKey" >> beam.GroupByKey()
            | "Collect" >> beam.Map(_collect, tags, coders).with_output_types(
                typehints.Tuple[int, JoinedType(tags, hints)]))


def _value_hint(pcoll):
  hint = native_type_compatibility.convert_to_beam_type(pcoll.element_type)
  if (isinstance(hint, typehints.TupleConstraint) and
      len(hint.tuple_types) == 2):
    return hint.tuple_types[1]
  return typehints.Any


def _encode(element, index: int, coder: beam.coders.Coder):
  key, value = element
  return key, (index, coder.encode(value))


def _encode_by(value, index: int, coder: beam.coders.Coder, key):
  return key(value), (index, coder.encode(value))


def _collect(element, tags, coders):
  key, tagged = element
  payloads = [[] for _ in tags]
  for index, payload in tagged:
    payloads[index].append(payload)
  return key, Joined(tags, payloads, coders)


class Joined(Mapping):
  """One key's values of every tag of a :class:`JoinByKey`: ``joined[tag]``
  is the list of that input's values (empty where it has none), decoded
  on first access; iterating gives the tags in the join's order."""

  def __init__(self, tags: Sequence[str], payloads: List[List[bytes]],
               coders: Sequence[beam.coders.Coder]):
    self._tags = list(tags)
    self.payloads = payloads
    self._coders = list(coders)
    self._decoded: Dict[str, List[Any]] = {}

  def __getitem__(self, tag: str) -> List[Any]:
    if tag not in self._decoded:
      try:
        index = self._tags.index(tag)
      except ValueError:
        raise KeyError(tag) from None
      coder = self._coders[index]
      self._decoded[tag] = [coder.decode(p) for p in self.payloads[index]]
    return self._decoded[tag]

  def __iter__(self):
    return iter(self._tags)

  def __len__(self) -> int:
    return len(self._tags)

  def __repr__(self) -> str:
    return f"Joined({dict(self)!r})"


class JoinedType(typehints.TypeConstraint):
  """The type of a :class:`JoinByKey`'s joined values: its ``tags`` and
  each one's value type, from which :class:`JoinedCoder` gets its coders."""

  def __init__(self, tags: Sequence[str], value_types: Sequence[Any]):
    self.tags = tuple(tags)
    self.value_types = tuple(value_types)

  def type_check(self, instance):
    if not isinstance(instance, Joined):
      raise typehints.CompositeTypeHintError(
          f"{self!r} type-constraint violated: got {type(instance).__name__}")

  def _consistent_with_check_(self, sub):
    return sub == self

  def __eq__(self, other):
    return (isinstance(other, JoinedType) and self.tags == other.tags
            and self.value_types == other.value_types)

  def __hash__(self):
    return hash((JoinedType, self.tags))

  def __repr__(self):
    return f"Joined[{', '.join(self.tags)}]"


class JoinedCoder(beam.coders.Coder):
  """:class:`Joined` as the encoded values it holds, tag by tag: encoding
  it (as the runner's size sampling does) decodes no value."""

  def __init__(self, tags: Sequence[str], coders: Sequence[beam.coders.Coder]):
    self._tags = tuple(tags)
    self._coders = list(coders)
    self._payloads = beam.coders.IterableCoder(
        beam.coders.IterableCoder(beam.coders.BytesCoder()))

  @classmethod
  def from_type_hint(cls, typehint, registry):
    return cls(typehint.tags,
               [registry.get_coder(t) for t in typehint.value_types])

  def encode(self, value: Joined) -> bytes:
    return self._payloads.encode(value.payloads)

  def decode(self, encoded: bytes) -> Joined:
    return Joined(self._tags, [list(p) for p in self._payloads.decode(encoded)],
                  self._coders)

  def is_deterministic(self) -> bool:
    return False  # never a grouping key

  def to_type_hint(self):
    return JoinedType(self._tags, [c.to_type_hint() for c in self._coders])

  def __eq__(self, other):
    return (type(self) is type(other) and self._tags == other._tags
            and self._coders == other._coders)

  def __hash__(self):
    return hash((type(self), self._tags))


beam.coders.registry.register_coder(JoinedType, JoinedCoder)
