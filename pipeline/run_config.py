"""``--config run.yaml``: a job's flags from a YAML file.

The file is a mapping from flag names (without ``--``) to values; flags on
the command line override it, because its flags are placed before them and
argparse keeps the last value given. Lists become comma-separated values
(``input: [a/*.jsonl, b/*.parquet]``), booleans ``true``/``false``.
"""

from __future__ import annotations

import difflib
from typing import Callable, List, Optional, Sequence

import yaml

FLAG = "--config"


class RunConfigError(ValueError):
  """The config file cannot be used; the message names it and the fix."""


def config_path(argv: Sequence[str]) -> Optional[str]:
  """The ``--config`` value in ``argv`` (the last one), or None."""
  path = None
  for i, arg in enumerate(argv):
    if arg == FLAG:
      if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise RunConfigError(f"{FLAG} needs a YAML file: {FLAG} run.yaml")
      path = argv[i + 1]
    elif arg.startswith(FLAG + "="):
      path = arg.split("=", 1)[1]
  return path


def expand(argv: Sequence[str], known: Callable[[], List[str]]) -> List[str]:
  """``argv`` with the flags of its ``--config`` file placed first.

  Args:
    argv: the command line, without the program name.
    known: returns every known ``--flag`` (called only when a file is given).

  Raises:
    RunConfigError: the file is missing, is not a YAML mapping of known flags
      to scalars or lists of scalars, or names ``config`` itself.
  """
  path = config_path(argv)
  if path is None:
    return list(argv)
  try:
    with open(path, encoding="utf-8") as f:
      data = yaml.safe_load(f)
  except OSError as e:
    raise RunConfigError(f"{FLAG} {path}: cannot read it ({e.strerror})") from e
  except yaml.YAMLError as e:
    raise RunConfigError(f"{FLAG} {path}: not valid YAML ({e})") from e
  if data is None:
    data = {}
  if not isinstance(data, dict):
    raise RunConfigError(f"{FLAG} {path}: must be a mapping of flag names to "
                         f"values (e.g. 'threshold: 0.8'), not a "
                         f"{type(data).__name__}")
  flags = known()
  out = []
  for key, value in data.items():
    out.append(f"--{key}={_value(path, key, value, flags)}")
  return out + list(argv)


def _value(path: str, key, value, flags: List[str]) -> str:
  flag = f"--{key}"
  if not isinstance(key, str) or flag not in flags or key == "config":
    close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0][2:]}?" if close else "; see --help"
    raise RunConfigError(f"{FLAG} {path}: unknown key {key!r}{hint}")
  if isinstance(value, list) and all(_is_scalar(v) for v in value):
    return ",".join(_scalar(v) for v in value)
  if _is_scalar(value):
    return _scalar(value)
  raise RunConfigError(f"{FLAG} {path}: {key}: use a number, a string, true/"
                       f"false or a list of those, not {value!r}")


def _is_scalar(value) -> bool:
  return isinstance(value, (str, int, float, bool))


def _scalar(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)
