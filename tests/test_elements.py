"""The named elements between the batch stages and their coders: exact round
trips, and no hot-path PCollection left to Beam's pickling fallback."""

import collections

import apache_beam as beam
import numpy as np
import pytest

from pipeline import job
from transforms import elements
from transforms.components import PairsCoder
from transforms.config import DedupConfig


@pytest.mark.parametrize("coder", elements.CODERS)
def test_coders_round_trip_exactly_into_writable_arrays(coder):
  rng = np.random.default_rng(3)
  columns = [rng.integers(0, 2**62, 5).astype(np.uint64),
             np.arange(5, dtype=np.int64), rng.random(5),
             rng.integers(-2**62, 2**62, 5), np.arange(5, 10), rng.random(5)]
  if coder.TYPE is elements.SignatureBatch:
    columns = [columns[1], rng.integers(0, 2**32, (5, 7)).astype(np.uint32)]
  if coder.TYPE is elements.KeyShard:
    columns = [columns[0], np.array([1 << 41]), np.arange(5, dtype=np.uint16)]
  value = coder.TYPE(*columns[:len(coder.TYPE._fields)])
  encoded = coder().encode(value)
  decoded = coder().decode(encoded)
  assert type(decoded) is coder.TYPE and coder().is_deterministic()
  for got, want in zip(decoded, value):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want) and got.flags.writeable
  assert coder().encode(decoded) == encoded
  empty = coder.TYPE(*(c[:0] for c in value))
  assert [len(c) for c in coder().decode(coder().encode(empty))] == [0] * len(
      value)


def test_a_coder_refuses_object_arrays_and_trailing_bytes():
  coder = elements.EdgeBatchCoder()
  with pytest.raises(TypeError, match="numeric arrays"):
    coder.encode(elements.EdgeBatch(np.array(["a"], dtype=object),
                                    np.array([1])))
  encoded = coder.encode(elements.EdgeBatch(np.array([1]), np.array([2])))
  with pytest.raises(ValueError, match="left over"):
    coder.decode(encoded + b"x")


# The main outputs of the stages that carry every document or candidate.
HOT = ("NearDedup/ComputeSignatures/SignatureBatches/Apply",
       "NearDedup/BandKey/ComputeBandKeys",
       "NearDedup/FindCandidates/GroupByShard",
       "NearDedup/FindCandidates/CollideInShard",
       "NearDedup/FindCandidates/DistinctEdges",
       "NearDedup/VerifyExact/CompareShingleSets/Compare",
       "NearDedup/VerifyEdges/CompareSignatures/Compare",
       "NearDedup/KeepAllCandidates/SpanningForest",
       "NearDedup/ConnectedComponents/BatchEdges",
       "NearDedup/ConnectedComponents/ResolveResidual/Label",
       "NearDedup/SelectKept/BatchMembers",
       "NearDedup/SelectKept/ChooseKept",
       "NearDedup/ExplainClusters/EdgeEnds",
       "NearDedup/ExplainClusters/PairsToCompare",
       "NearDedup/ExplainClusters/ChooseMatched")


def _main_output_coders(verify: str, steps) -> dict:
  """The registry's coder of each of the CLI graph's ``steps``' main
  output, for ``verify``."""
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(verify=verify),
            run_id="coders")
  coders = {}

  class Visitor(beam.pipeline.PipelineVisitor):

    def visit_transform(self, node):
      # A ParDo is the primitive inside its labelled step.
      label = node.full_label.rsplit("/ParDo(", 1)[0]
      if label in steps:
        coders[label] = beam.coders.registry.get_coder(
            node.outputs[None].element_type)

  p.visit(Visitor())
  return coders


@pytest.mark.parametrize("verify", ["exact", "signature", "none"])
def test_hot_path_elements_get_their_deterministic_coders(verify):
  coders = _main_output_coders(verify, HOT)
  assert len(coders) == 13
  for label, coder in coders.items():
    assert coder.is_deterministic(), (label, coder)
    assert any(isinstance(c, (elements.ArraysCoder, PairsCoder))
               for c in _components(coder)), (label, coder)


def test_large_bucket_members_get_their_coder_into_the_edge_join():
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(), run_id="coders")
  found = {}

  class Visitor(beam.pipeline.PipelineVisitor):

    def visit_transform(self, node):
      if node.full_label.startswith(
          "NearDedup/FindCandidates/CollideInShard/"):
        found.update({tag: beam.coders.registry.get_coder(pc.element_type)
                      for tag, pc in node.outputs.items()})

  p.visit(Visitor())
  assert any(isinstance(c, elements.BucketMembersCoder)
             for c in _components(found["large"])), found


def _components(coder):
  yield coder
  for c in coder._get_component_coders():
    yield from _components(c)


def test_text_batches_round_trip_and_refuse_mismatched_bytes():
  coder = elements.TextBatchCoder()
  batch = elements.TextBatch(np.array([7, 1 << 40, 3], dtype=np.int64),
                             ["", "caf\u00e9 \U0001f600", "a\nb\x00"])
  encoded = coder.encode(batch)
  decoded = coder.decode(encoded)
  assert decoded.ids.dtype == np.int64 and decoded.ids.flags.writeable
  assert decoded.ids.tolist() == batch.ids.tolist()
  assert decoded.texts == batch.texts and coder.is_deterministic()
  assert coder.encode(decoded) == encoded
  with pytest.raises(ValueError, match="add up"):
    coder.decode(encoded + b"x")
  with pytest.raises(ValueError, match="2 ids and 1 texts"):
    coder.encode(elements.TextBatch(np.array([1, 2]), ["a"]))


def test_read_batches_get_their_coder():
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(), run_id="coders")
  found = []

  class Visitor(beam.pipeline.PipelineVisitor):

    def visit_transform(self, node):
      if node.full_label.startswith("ReadDocuments/ReadFiles/ParDo("):
        found.append(beam.coders.registry.get_coder(
            node.outputs["batches"].element_type))

  p.visit(Visitor())
  assert [type(c) for c in found] == [elements.TextBatchCoder]


def test_key_shards_hold_ids_as_the_narrowest_offsets_and_give_them_back():
  keys = np.array([5, 6, 7], dtype=np.uint64)
  batch = np.array([(3 << 40) + 9, 3 << 40, (3 << 40) + 4095])
  wide = np.array([(3 << 40) + 9, 3 << 40, (3 << 40) + 2**31])
  spread = np.array([1, 2 << 40, 7])
  for ids, dtype in ((batch, np.uint16), (wide, np.uint32),
                     (spread, np.int64)):
    shard = elements.KeyShard.of(keys, ids)
    assert shard.id_offsets.dtype == dtype
    assert shard.doc_ids().tolist() == ids.tolist()
  edge = elements.KeyShard.of(keys[:2], np.array([10, 10 + 65535]))
  assert edge.id_offsets.dtype == np.uint16
  assert edge.doc_ids().tolist() == [10, 10 + 65535]
  got = elements.key_columns([elements.KeyShard.of(keys, wide),
                              elements.KeyShard.of(keys, spread)])
  assert [c.tolist() for c in got] == [
      [5, 6, 7, 5, 6, 7], wide.tolist() + spread.tolist()]
  empty = elements.KeyShard.of(keys[:0], wide[:0])
  assert elements.key_columns([empty])[1].tolist() == []
  assert [c.tolist() for c in elements.key_columns([])] == [[], []]
  coder = elements.KeyShardCoder()
  shard = elements.KeyShard.of(keys, batch)
  assert coder.decode(coder.encode(shard)).doc_ids().tolist() == batch.tolist()


def test_shard_outputs_gather_rows_per_shard_in_input_order():
  outputs = elements.ShardOutputs(elements.EdgeBatch, max_rows=6)
  assert outputs.add_rows(np.array([2, 0, 2]), np.array([1, 2, 3]),
                          np.array([10, 20, 30])) == []
  assert outputs.add_rows(np.array([], dtype=np.int64),
                          np.array([], dtype=np.int64),
                          np.array([], dtype=np.int64)) == []
  assert outputs.add_rows(np.array([0, 2]), np.array([4, 5]),
                          np.array([40, 50])) == []
  # One element per shard, rows by input and then by row.
  got = [(w.value[0], w.value[1].src.tolist(), w.value[1].dst.tolist())
         for w in outputs.flush()]
  assert got == [(0, [2, 4], [20, 40]), (2, [1, 3, 5], [10, 30, 50])]
  assert outputs.flush() == []
  # Holding max_rows rows hands them out at once.
  outputs.add_rows(np.array([1] * 4), *[np.arange(4)] * 2)
  early = outputs.add_rows(np.array([3, 1]), *[np.arange(2)] * 2)
  assert [(s, b.src.tolist()) for s, b in early] == [(1, [0, 1, 2, 3, 1]),
                                                      (3, [0])]
  assert outputs.flush() == []


@pytest.mark.parametrize("verify,steps", [
    ("exact", ("NearDedup/VerifyExact/ServeTexts/RequestByFile",
               "NearDedup/VerifyExact/ServeTexts/ReadCandidates",
               "NearDedup/ExplainClusters/ServeTexts/RequestByFile",
               "NearDedup/ExplainClusters/ServeTexts/ReadCandidates")),
    ("signature", ("NearDedup/VerifyEdges/RouteSignatures",
                   "NearDedup/VerifyEdges/ServeSignatures/RequestEndpoints",
                   "NearDedup/VerifyEdges/ServeSignatures/ServeValues"))])
def test_text_and_signature_servers_shuffle_with_their_own_coders(verify,
                                                                  steps):
  coders = _main_output_coders(verify, steps)
  assert sorted(coders) == sorted(steps)
  for label, coder in coders.items():
    assert any(isinstance(c, (elements.WantedCoder, elements.ServedCoder))
               for c in _components(coder)), (label, coder)


def test_served_values_round_trip_without_pickling(monkeypatch):
  import pickle  # pylint: disable=import-outside-toplevel
  coder = elements.ServedCoder()
  sigs = np.arange(12, dtype=np.uint32).reshape(3, 4)
  numeric = coder.decode(coder.encode(elements.Served(np.array([1, 2, 9]),
                                                      sigs)))
  assert numeric.values.dtype == np.uint32 and numeric.values.shape == (3, 4)
  assert (numeric.values == sigs).all() and numeric.ids.tolist() == [1, 2, 9]
  values = np.empty(5, dtype=object)
  for i, v in enumerate(["caf\u00e9", None, ("text", {"a": [1, 2]}),
                         (None, 7), ("", "id")]):
    values[i] = v
  served = elements.Served(np.array([4, 5, 6, 7, 8]), values)

  def no_pickling(*args, **kwargs):
    raise AssertionError("pickled")

  monkeypatch.setattr(pickle, "dumps", no_pickling)
  decoded = coder.decode(coder.encode(served))
  assert decoded.ids.tolist() == [4, 5, 6, 7, 8]
  assert decoded.values.dtype == object
  assert decoded.values.tolist() == values.tolist()
  assert isinstance(decoded.values[2], tuple)


def test_plain_field_records_round_trip_through_their_registered_coders():
  from transforms import metrics, read, report  # pylint: disable=import-outside-toplevel
  values = [
      read.InputFile(3, "/data/a b.jsonl", "jsonl", 1 << 40),
      read.Document(7, "caf\u00e9", {"k": [1, None]}, b'{"text": "x"}\n'),
      read.Rejected(9, "/d.jsonl", 4, "malformed_json", "line 1", "{x"),
      report.Summary([(4, 10)], {4: [(True, 5, 0.75, False)]}, {4: 0.5}, 2)]
  for value in values:
    coder = beam.coders.registry.get_coder(type(value))
    assert isinstance(coder, elements.FieldsCoder), coder
    decoded = coder.decode(coder.encode(value))
    assert type(decoded) is type(value) and decoded == value
  assert beam.coders.registry.get_coder(read.InputFile).is_deterministic()
  assert not beam.coders.registry.get_coder(report.Summary).is_deterministic()
  counts = collections.Counter({"docs_in": 3, "worker_ms_x": 1.5})
  coder = metrics.SumByName().get_accumulator_coder()
  decoded = coder.decode(coder.encode(counts))
  assert type(decoded) is collections.Counter and decoded == counts
