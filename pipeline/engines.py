"""Where the local engines are: Beam's Prism runner built by
``scripts/install_prism.sh`` at the pinned Beam version.

Nothing here downloads anything: a missing engine is reported with the
command that installs it.
"""

from __future__ import annotations

import os
from typing import Optional

import apache_beam as beam

BEAM_VERSION = beam.__version__
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL_PRISM = "scripts/install_prism.sh"


def engines_cache() -> str:
  """The cache folder the install scripts write to (same rule as theirs)."""
  explicit = os.environ.get("NEARDUP_ENGINES_CACHE")
  if explicit:
    return explicit
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "neardup-engines")


def prism_path() -> str:
  """Where ``scripts/install_prism.sh`` puts Prism for this Beam version."""
  return os.path.join(engines_cache(), "prism", f"v{BEAM_VERSION}", "prism")


def find_prism() -> Optional[str]:
  """The cached Prism binary for the installed Beam version, or None."""
  path = prism_path()
  return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def missing_prism_reason() -> str:
  """Why Prism cannot be used here, naming the script that fixes it."""
  return (f"Prism for Beam {BEAM_VERSION} is not installed at {prism_path()};"
          f" run {INSTALL_PRISM} (needs Go) to build it")
