"""Flex Template entry point: runs the streaming job with the launcher's
flags (``--runner=DataflowRunner`` plus every template parameter as
``--name=value``); the exit code is the CLI's (2 for bad arguments)."""

import logging
import sys

from pipeline.streaming import main

# A Flex Template launcher must return once the job is submitted; a
# streaming job never finishes on its own.
EXTRA = ("--streaming", "--no_wait_until_finish")

if __name__ == "__main__":
  logging.getLogger().setLevel(logging.INFO)
  args = sys.argv[1:]
  sys.exit(main(args + [flag for flag in EXTRA if flag not in args]))
