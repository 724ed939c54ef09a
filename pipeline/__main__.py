"""``python -m pipeline``: run the batch near-duplicate job."""

import sys

from pipeline.cli import run

sys.exit(run())
