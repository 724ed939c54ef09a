"""Suite-wide set-up: the engine tier (see ``tests/engines.py``)."""

import pytest

import pipeline.cli
from tests import engines

# Before any test module imports ``main``, so that every caller gets it.
pipeline.cli.main = engines.cross_checked(pipeline.cli.main,
                                          engines.selected_engine())


@pytest.fixture(autouse=True)
def _current_test(request):
  engines.current_test = request.node
  yield
  engines.current_test = None
