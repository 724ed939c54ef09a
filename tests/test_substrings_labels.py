"""Stable step labels of the --substrings job graphs (golden files beside
tests/test_step_labels.py's), which also pass Beam's type check."""

import os

import pytest

from pipeline import job
from tests.test_step_labels import GOLDEN, step_labels
from transforms.config import DedupConfig, SubstringsConfig

VARIANTS = {"substrings_after_near_dup": True, "substrings_alone": False}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_substrings_step_labels_are_unchanged(variant, monkeypatch):
  build = job.build
  monkeypatch.setattr(job, "build", lambda *a, **k: build(
      *a, substrings=SubstringsConfig(100), near_dup=VARIANTS[variant], **k))
  labels = [l for l in step_labels(DedupConfig())
            if "Substring" in l or not VARIANTS[variant]]
  path = os.path.join(GOLDEN, f"batch_{variant}.txt")
  if os.environ.get("NEARDUP_WRITE_LABELS") == "1":
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(f"{label}\n" for label in labels))
  with open(path, encoding="utf-8") as f:
    changed = sorted(set(labels) ^ set(f.read().splitlines()))
  assert not changed, f"labels added or removed: {changed}"
  assert any(l.startswith("StrikeSubstrings/") for l in labels)
