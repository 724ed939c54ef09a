"""Flex Template entry point: runs the batch job with the launcher's flags.

The launcher executes this file as a script (FLEX_TEMPLATE_PYTHON_PY_FILE)
with ``--runner=DataflowRunner`` plus every template parameter as
``--name=value``; the exit code is the CLI's (2 for bad arguments).
"""

import logging
import sys

from pipeline.cli import main

# A Flex Template launcher must return once the job is submitted, never wait
# for it to finish (Dataflow's contract for template programs).
NO_WAIT = "--no_wait_until_finish"

if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  args = sys.argv[1:]
  sys.exit(main(args if NO_WAIT in args else args + [NO_WAIT]))
