"""Runs the batch CLI in this process with one fault hook, for tests that
must stop a job at an exact point of its finalization:

    python tests/hooked_cli.py HOOK VALUE -- <the CLI's arguments>

* ``hold FOLDER``: before the job's last step moves anything, writes
  ``FOLDER/ready`` and waits until ``FOLDER/go`` exists (signals are taken
  meanwhile, as anywhere in the job).
* ``kill_before N`` / ``kill_after N``: SIGKILLs this process just before
  (after) the N-th rename into the output folder (1-based: the last step
  renames each staged file into place, then ``_SUCCESS.tmp`` to
  ``_SUCCESS``; renames within the staging folder are not counted).

The job runs on the default in-process runner, so the hook runs where the
last step does.
"""

import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=wrong-import-position
from apache_beam.io.filesystems import FileSystems  # noqa: E402

from pipeline import cli  # noqa: E402
from transforms import finalize  # noqa: E402


def hold(folder: str) -> None:
  real = finalize.finalize_output

  def held(*args, **kwargs):
    with open(os.path.join(folder, "ready"), "w", encoding="utf-8"):
      pass
    while not os.path.exists(os.path.join(folder, "go")):
      time.sleep(0.05)
    return real(*args, **kwargs)

  finalize.finalize_output = held


def kill_at_rename(n: int, after: bool) -> None:
  real = FileSystems.rename
  calls = []

  def rename(sources, targets):
    counted = f"/{finalize.STAGING_DIR}/" not in targets[0]
    if counted:
      calls.append(sources)
    if counted and len(calls) == n and not after:
      os.kill(os.getpid(), signal.SIGKILL)
    real(sources, targets)
    if counted and len(calls) == n and after:
      os.kill(os.getpid(), signal.SIGKILL)

  FileSystems.rename = staticmethod(rename)


def main(argv):
  hook, value, separator, *args = argv
  assert separator == "--", "usage: hooked_cli.py HOOK VALUE -- ARGS"
  if hook == "hold":
    hold(value)
  elif hook in ("kill_before", "kill_after"):
    kill_at_rename(int(value), hook == "kill_after")
  else:
    raise SystemExit(f"unknown hook {hook!r}")
  sys.argv = ["python -m pipeline"] + args
  return cli.run()


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
