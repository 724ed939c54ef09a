"""Suite-wide set-up: the engine tier (see ``tests/engines.py``) and
fixtures shared by several test files."""

import os

import pytest

import pipeline.cli
from tests import engines

# Before any test module imports ``main``, so that every caller gets it.
pipeline.cli.main = engines.cross_checked(pipeline.cli.main,
                                          engines.selected_engine())

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                      "sample", "*.jsonl")


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  engines.stop_services()


@pytest.fixture(autouse=True)
def _current_test(request):
  engines.current_test = request.node
  yield
  engines.current_test = None


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory):
  """The output folder of the README's sample command (run once)."""
  out = str(tmp_path_factory.mktemp("sample") / "out")
  assert pipeline.cli.main(["--input", SAMPLE, "--output", out,
                            "--overwrite", "true"]) == 0
  return out
