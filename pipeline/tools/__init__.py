"""Offline tools beside the job: ``python -m pipeline.tools.params`` (choose
bands and rows), ``pipeline.tools.truth`` (exact ground truth of a corpus)
and ``pipeline.tools.evaluate`` (a run's clusters against a truth).

They share one way to build and parse their command lines with the job's
flags (:func:`tool_parser`, :func:`parse_args`, :func:`config_from_args`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, List, Optional, Union

from pipeline.options import CONFIG_FIELDS
from transforms.config import DedupConfig


def tool_parser(module: str, doc: str) -> argparse.ArgumentParser:
  """The parser of the tool ``pipeline.tools.<module>``, described by the
  first line of its module docstring ``doc``."""
  return argparse.ArgumentParser(
      prog=f"python -m pipeline.tools.{module}",
      description=doc.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def run_tool(main: Callable[[], int]) -> None:
  """Runs a tool's ``main`` as the process and exits with its code; output
  piped into a reader that stops early (``| head``) ends it quietly, with
  exit code 0, instead of a BrokenPipeError traceback."""
  try:
    code = main()
    sys.stdout.flush()
  except BrokenPipeError:
    # Python flushes stdout again at exit: point it at /dev/null first.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 0
  sys.exit(code)


def parse_args(parser: argparse.ArgumentParser, argv: Optional[List[str]]
               ) -> Union[argparse.Namespace, int]:
  """The parsed arguments, or the exit code when there are none (``--help``:
  0, an invalid value: 2, after argparse printed why). Flags may be spelled
  with hyphens (``--num-perm``) as well as underscores."""
  argv = [_underscored(arg) for arg in (sys.argv[1:] if argv is None
                                        else argv)]
  try:
    return parser.parse_args(argv)
  except SystemExit as e:
    return 0 if e.code is None else int(e.code)


def _underscored(arg: str) -> str:
  if not arg.startswith("--"):
    return arg
  name, sep, value = arg.partition("=")
  return name.replace("-", "_").replace("__", "--", 1) + sep + value


def config_from_args(args: argparse.Namespace) -> DedupConfig:
  """The validated DedupConfig of the DedupConfig flags a tool parsed (the
  others keep their defaults); raises ConfigError."""
  given = vars(args)
  return DedupConfig(**{name: given[name] for name in CONFIG_FIELDS
                        if name in given})
