"""The batch graph's step labels stay what they were: monitoring and
runner-side state are keyed by them. A refactor that renames
a step must update the golden files in ``tests/data/step_labels/`` on
purpose (``NEARDUP_WRITE_LABELS=1`` rewrites them)."""

import os

import apache_beam as beam
import pytest

from pipeline import job
from transforms.config import DedupConfig

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
