"""``--config run.yaml``: a job's flags from a YAML file.

The file is a mapping from flag names (without ``--``) to values; flags on
the command line override it, because its flags are placed before them and
argparse keeps the last value given. Lists become comma-separated values
(``input: [a/*.jsonl, b/*.parquet]``), booleans ``true``/``false``. Each
value is checked as its flag's parser would (type and choices), and a key
given twice is refused, each error naming the file.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Callable, List, Optional, Sequence, Tuple

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


def expand(argv: Sequence[str],
           parser: Callable[[], argparse.ArgumentParser]) -> List[str]:
  """``argv`` with the flags of its ``--config`` file placed first.

  Args:
    argv: the command line, without the program name.
    parser: returns the parser of every known ``--flag`` (called only when
      a file is given).

  Raises:
    RunConfigError: the file is missing, is not a YAML mapping of known flags
      to values their flags accept (scalars or lists of scalars), repeats a
      key, or names ``config`` itself.
  """
  path = config_path(argv)
  if path is None:
    return list(argv)
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    repeated = _repeated_key(yaml.compose(text, Loader=yaml.SafeLoader))
    data = yaml.safe_load(text)
  except OSError as e:
    raise RunConfigError(f"{FLAG} {path}: cannot read it ({e.strerror})") from e
  except yaml.YAMLError as e:
    raise RunConfigError(f"{FLAG} {path}: not valid YAML ({e})") from e
  if repeated:
    raise RunConfigError(f"{FLAG} {path}: the key {repeated[0]!r} is given "
                         f"twice (again on line {repeated[1]}): keep one")
  if data is None:
    data = {}
  if not isinstance(data, dict):
    raise RunConfigError(f"{FLAG} {path}: must be a mapping of flag names to "
                         f"values (e.g. 'threshold: 0.8'), not a "
                         f"{type(data).__name__}")
  actions = {flag: action for action in parser()._actions  # pylint: disable=protected-access
             for flag in action.option_strings if flag.startswith("--")}
  out = []
  for key, value in data.items():
    out.append(f"--{key}={_value(path, key, value, actions)}")
  return out + list(argv)


def _repeated_key(node) -> Optional[Tuple[str, int]]:
  """``(key, line)`` of the first top-level key that a YAML document's
  mapping repeats (``safe_load`` keeps the last one silently), or None.
  Read from the composed nodes, which are never constructed into objects."""
  if not isinstance(node, yaml.MappingNode):
    return None
  seen = set()
  for key, _ in node.value:
    if isinstance(key, yaml.ScalarNode):
      if key.value in seen:
        return key.value, key.start_mark.line + 1
      seen.add(key.value)
  return None


def _value(path: str, key, value, actions: dict) -> str:
  flag = f"--{key}"
  if not isinstance(key, str) or flag not in actions or key == "config":
    close = difflib.get_close_matches(flag, list(actions), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0][2:]}?" if close else "; see --help"
    raise RunConfigError(f"{FLAG} {path}: unknown key {key!r}{hint}")
  if isinstance(value, list) and all(_is_scalar(v) for v in value):
    text = ",".join(_scalar(v) for v in value)
  elif _is_scalar(value):
    text = _scalar(value)
  else:
    raise RunConfigError(f"{FLAG} {path}: {key}: use a number, a string, "
                         f"true/false or a list of those, not {value!r}")
  _check(path, key, text, actions[flag])
  return text


def _check(path: str, key: str, text: str, action: argparse.Action) -> None:
  """Refuses a value that the flag's parser would refuse, as argparse
  converts and checks it (its own message would not name the file)."""
  convert = action.type if callable(action.type) else (lambda v: v)
  try:
    value = convert(text)
  except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
    kind = _KINDS.get(getattr(action.type, "__name__", ""), "a valid value")
    raise RunConfigError(f"{FLAG} {path}: {key}: {text!r} is not {kind}"
                         f" ({e})") from e
  if action.choices is not None and value not in action.choices:
    raise RunConfigError(
        f"{FLAG} {path}: {key}: {text!r} is not one of "
        f"{', '.join(map(str, action.choices))}")


# How an error names what a flag's type accepts.
_KINDS = {"int": "an integer", "float": "a number",
          "parse_bool": "true or false"}


def _is_scalar(value) -> bool:
  return isinstance(value, (str, int, float, bool))


def _scalar(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)
