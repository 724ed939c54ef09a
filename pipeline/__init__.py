"""Pipeline options, graph assembly and the command-line entry point."""

import logging

__version__ = "0.1.0"

# Beam logs two warnings at import time about optional Google Cloud client
# libraries (apitools, google.cloud.storage) that a local or Flink run never
# needs; they appeared on every command, --help included. Dropped here,
# before anything imports apache_beam; a GCS path still fails with Beam's own
# error when the library is missing.
_IMPORT_NOISE = ("apitools not found", "Failed to import GCSFileSystem")


def _not_import_noise(record: logging.LogRecord) -> bool:
  message = record.msg if isinstance(record.msg, str) else ""
  return not message.startswith(_IMPORT_NOISE)


for _name in ("", "apache_beam.io.filesystems"):
  logging.getLogger(_name).addFilter(_not_import_noise)
