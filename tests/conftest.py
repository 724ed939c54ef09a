"""Fixtures shared by several test files."""

import os

import pytest

from pipeline.cli import main

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                      "sample", "*.jsonl")


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory):
  """The output folder of the README's sample command (run once)."""
  out = str(tmp_path_factory.mktemp("sample") / "out")
  assert main(["--input", SAMPLE, "--output", out, "--overwrite", "true"]) == 0
  return out
