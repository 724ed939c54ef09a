"""JoinByKey: CoGroupByKey's result, each value through its input's own
coder, one coder for the whole flatten, and no pickling of the named
elements."""

from typing import Tuple

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.typehints.native_type_compatibility import (
    convert_to_beam_type)

from pipeline import job
from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import EdgeBatch
from transforms.join import JoinByKey
from transforms.select import (ClusterColumns, ClusterInfo, ClusterInfoCoder,
                               cluster_columns, cluster_rows,
                               split_cluster_columns)
from hypothesis import given, settings
from hypothesis import strategies as st


def _canonical(element):
  """(key, {tag: sorted plain values}) with arrays as lists, for equality."""
  key, grouped = element
  plain = {}
  for tag, values in grouped.items():
    plain[tag] = sorted(
        (tuple(a.tolist() for a in v) if isinstance(v, EdgeBatch) else v)
        for v in values)
  return key, plain


def test_join_groups_every_tag_per_key_with_empty_lists_where_absent():
  info = ClusterInfo(4, 2, False, 4, 4, "doc-4", 0.75, 0.75, False)
  with TestPipeline("FnApiRunner") as p:
    infos = p | "Infos" >> beam.Create([(7, info)]).with_output_types(
        Tuple[int, ClusterInfo])
    edges = p | "Edges" >> beam.Create(
        [(7, EdgeBatch(np.array([1, 2]), np.array([3, 4]))),
         (9, EdgeBatch(np.array([5]), np.array([6])))]).with_output_types(
             Tuple[int, EdgeBatch])
    plain = p | "Plain" >> beam.Create([(9, ("x", 1.5)), (9, ("y", None)),
                                        (11, [1, 2])])
    joined = ({"info": infos, "edges": edges, "plain": plain}
              | JoinByKey() | beam.Map(_canonical))
    assert_that(joined, equal_to([
        (7, {"info": [info], "edges": [([1, 2], [3, 4])], "plain": []}),
        (9, {"info": [], "edges": [([5], [6])],
             "plain": [("x", 1.5), ("y", None)]}),
        (11, {"info": [], "edges": [], "plain": [[1, 2]]}),
    ]))


def test_join_keys_plain_inputs_by_their_key_function():
  info = ClusterInfo(4, 2, False, 4, 4, "doc-4", 0.75, 0.75, False)
  with TestPipeline("FnApiRunner") as p:
    infos = p | "Infos" >> beam.Create([info, ClusterInfo(9, 2, True, 9)
                                        ]).with_output_types(ClusterInfo)
    plain = p | "Plain" >> beam.Create([(9, "x")])
    joined = ({"info": infos, "plain": plain}
              | JoinByKey(key_by={"info": lambda i: i.cluster_id})
              | beam.Map(lambda e: (e[0], dict(e[1]))))
    assert_that(joined, equal_to([
        (4, {"info": [info], "plain": []}),
        (9, {"info": [ClusterInfo(9, 2, True, 9)], "plain": ["x"]})]))
  with pytest.raises(ValueError, match="key_by names no input"):
    with TestPipeline("FnApiRunner") as p:
      _ = {"a": p | beam.Create([(1, 2)])} | JoinByKey(key_by={"b": int})


def test_join_values_keep_their_types():
  info = ClusterInfo(1, 3, True, 1)

  def types(element):
    _, grouped = element
    return sorted(type(v).__name__ for vs in grouped.values() for v in vs)

  with TestPipeline("FnApiRunner") as p:
    infos = p | "Infos" >> beam.Create([(1, info)]).with_output_types(
        Tuple[int, ClusterInfo])
    edges = p | "Edges" >> beam.Create(
        [(1, EdgeBatch(np.array([1]), np.array([2])))]).with_output_types(
            Tuple[int, EdgeBatch])
    assert_that({"a": infos, "b": edges} | JoinByKey() | beam.Map(types),
                equal_to([["ClusterInfo", "EdgeBatch"]]))


def test_cluster_info_coder_round_trips_every_field():
  coder = ClusterInfoCoder()
  for info in (ClusterInfo(0, 2, True, 0),
               ClusterInfo(2**45 + 3, 7, False, 2**45, 2**45 + 1, "a/b:3",
                           0.8125, 0.5, True),
               ClusterInfo(5, 2, False, 4, 4, 17, float("nan"), None, False),
               ClusterInfo(5, 2, False, 4, 4, None, 1.0, 1.0, False)):
    decoded = coder.decode(coder.encode(info))
    assert type(decoded) is ClusterInfo
    assert repr(decoded) == repr(info)  # NaN != NaN, but reprs match
  assert beam.coders.registry.get_coder(ClusterInfo) == coder
  assert len(coder.encode(ClusterInfo(1, 2, False, 1, 1, "x", 0.9, 0.9))) < 60


_MAYBE_ID = st.one_of(st.none(), st.integers(0, 2**60))
_MAYBE_SIM = st.one_of(st.none(), st.floats(allow_nan=True,
                                            allow_infinity=False))
_INFO = st.builds(ClusterInfo, st.integers(0, 2**60), st.integers(2, 10**6),
                  st.booleans(), _MAYBE_ID, _MAYBE_ID,
                  st.one_of(st.none(), st.integers(), st.text(max_size=8),
                            st.lists(st.integers(), max_size=3)),
                  _MAYBE_SIM, _MAYBE_SIM, st.booleans())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), _INFO), max_size=30))
def test_cluster_columns_give_back_the_rows_through_their_coder(rows):
  coder = beam.coders.registry.get_coder(ClusterColumns)
  decoded = coder.decode(coder.encode(cluster_columns(rows)))
  back = list(cluster_rows(decoded))
  assert all(type(info) is ClusterInfo for _, info in back)
  assert repr(back) == repr(rows)  # NaN != NaN, but reprs match
  for (_, got), (_, want) in zip(back, rows):
    assert [type(v) for v in got] == [type(v) for v in want]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), _INFO), max_size=30),
       st.integers(1, 4))
def test_split_cluster_columns_gives_each_key_its_rows(rows, n_keys):
  keys = np.array([doc % n_keys for doc, _ in rows], dtype=np.int64)
  parts = list(split_cluster_columns(cluster_columns(rows), keys))
  assert [key for key, _ in parts] == sorted(set(keys.tolist()))
  for key, columns in parts:
    assert repr(list(cluster_rows(columns))) == repr(
        [row for row, k in zip(rows, keys.tolist()) if k == key])


def test_every_join_of_the_job_shares_one_compiled_coder():
  """No input of a join, nor its flatten, is left to Beam's pickling
  fallback: all carry (int key, (tag index, bytes))."""
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(), run_id="join")
  flattens = {}

  class Visitor(beam.pipeline.PipelineVisitor):

    def visit_transform(self, node):
      parts = node.full_label.split("/")
      if parts[-1] == "Flatten" and len(parts) > 1 and any(
          p.startswith("Tag[") for p in _siblings(node)):
        flattens[node.full_label] = [
            beam.coders.registry.get_coder(i.element_type)
            for i in node.inputs] + [beam.coders.registry.get_coder(
                node.outputs[None].element_type)]

  def _siblings(node):
    return [part.full_label.split("/")[-1] for part in node.parent.parts]

  p.visit(Visitor())
  assert len(flattens) >= 8, sorted(flattens)
  want = beam.coders.registry.get_coder(
      convert_to_beam_type(Tuple[int, Tuple[int, bytes]]))
  for label, coders in flattens.items():
    assert all(c == want for c in coders), (label, coders)


def test_sum_by_name_sums_each_stat_over_bundles_and_sorts_names():
  with TestPipeline("FnApiRunner") as p:
    counts = p | beam.Create([("b", 2), ("a", 1), ("b", 3), ("c", 0)],
                             reshuffle=True)
    totals = counts | beam.CombineGlobally(metrics.SumByName())
    assert_that(totals | beam.Map(lambda d: list(d.items())),
                equal_to([[("a", 1), ("b", 5), ("c", 0)]]))
