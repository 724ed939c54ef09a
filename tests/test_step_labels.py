"""The batch graph's step labels stay what they were: monitoring and
runner-side state are keyed by them. A refactor that renames
a step must update the golden files in ``tests/data/step_labels/`` on
purpose (``NEARDUP_WRITE_LABELS=1`` rewrites them)."""

import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import TypeOptions

from pipeline import job
from transforms.config import DedupConfig
from transforms.index import Index
from transforms.write import OutputOptions

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                      "step_labels")
COMPONENTS = "NearDedup/ConnectedComponents"
VARIANTS = {
    "exact_first": dict(verify="exact", keep="first"),
    "signature_longest": dict(verify="signature", keep="longest"),
    "none_first": dict(verify="none", keep="first"),
}


def step_labels(config: DedupConfig):
  """Every step's full label in the job graph built for ``config``."""
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, ["in/*.jsonl"], "out", config, run_id="labels")
  labels = set()

  class Visitor(beam.pipeline.PipelineVisitor):

    def enter_composite_transform(self, node):
      labels.add(node.full_label)

    def visit_transform(self, node):
      labels.add(node.full_label)

  p.visit(Visitor())
  labels.discard("")
  # The connected-component rounds' inner steps belong to that stage's own
  # tests (tests/test_components.py); its label is kept here.
  return sorted(l for l in labels
                if not l.startswith(COMPONENTS + "/"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batch_step_labels_are_unchanged(variant):
  labels = step_labels(DedupConfig(**VARIANTS[variant]))
  path = os.path.join(GOLDEN, f"batch_{variant}.txt")
  if os.environ.get("NEARDUP_WRITE_LABELS") == "1":
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(labels) + "\n")
  with open(path, encoding="utf-8") as f:
    golden = f.read().split("\n")[:-1]
  assert labels == golden, (
      f"added {sorted(set(labels) - set(golden))}, "
      f"removed {sorted(set(golden) - set(labels))}")


def _fake_index() -> Index:
  """An index as its manifest describes it: graph building reads no more."""
  return Index("idx", {
      "files": [{"index": 0, "path": "idx/in.jsonl", "format": "jsonl",
                 "size": 1}],
      "next_file_index": 1,
      "shards": {kind: ["part-00000-of-00001.parquet"]
                 for kind in ("keys", "signatures", "docs")}})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_graph_variant_passes_beams_type_check(variant):
  # Beam's construction-time type check is also what propagates the element
  # types its coders are chosen by (without it, keys fall back to pickling):
  # every variant, with every output option, an index read and one written,
  # must pass it.
  p = beam.Pipeline(runner="FnApiRunner")
  assert p.options.view_as(TypeOptions).pipeline_type_check
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(**VARIANTS[variant]),
            run_id="types", against=_fake_index(), index_out="index",
            output_options=OutputOptions(annotate=True, removal_list=True))
