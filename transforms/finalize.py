"""Atomic outputs: the job writes under ``<output>/_temporary/<run id>/`` and
its last step, :class:`FinalizeOutput`, moves everything into place and then
writes the ``_SUCCESS`` marker (as Hadoop and Spark jobs do).

Guarantees: outputs without ``_SUCCESS`` next to them are incomplete (a
failed or killed run never leaves one, and the marker is written only once
every file it lists is in place with its size); an earlier run's outputs are
deleted only once the new run has written all of its own, by the job itself
(so also on Dataflow or Flink when the launcher does not wait). Every step
can be retried: a retried finalization continues where the last attempt
stopped.

One run at a time writes to an output folder: the launcher claims it
(:func:`claim_output`) by writing ``_RUN`` into its staging folder, which no
other run deletes while that run may be alive. A second launcher finding a
live claim refuses to start; a run whose staging folder was deleted, or
that finds another run committing, fails instead of finalizing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import List, NamedTuple, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

STAGING_DIR = "_temporary"
SUCCESS_FILE = "_SUCCESS"
# Written into the staging folder once the old outputs are gone: a retried
# finalization must not delete the new files it has already moved in.
_COMMITTING = "_COMMITTING"
# The launcher's claim on the output folder (see claim_output).
RUN_FILE = "_RUN"
# _SUCCESS is written here, then renamed into the output folder: a kill in
# between leaves nothing there but whole output files.
_MARKER_DRAFT = SUCCESS_FILE + ".tmp"
# Staging files that are bookkeeping, never outputs.
_BOOKKEEPING = (_COMMITTING, RUN_FILE, _MARKER_DRAFT)
# Run ids this process has claimed and not released: tests and notebooks
# call the CLI's main() many times in one process, so a pid alone does not
# say whether that process's claim is live.
_ACTIVE = set()


class OutputBusyError(RuntimeError):
  """Another run may be writing to the same output folder."""


class OutputNotWritableError(OSError):
  """The output folder cannot be written; the message names the fix."""
_COUNTS = ("docs_in", "kept", "removed", "rejected", "clusters",
           "clustered_docs")


def staging_path(output: str, run_id: str) -> str:
  """Where a run with ``run_id`` writes before it finalizes."""
  return FileSystems.join(output, STAGING_DIR, run_id)


class Claim(NamedTuple):
  """A run's claim on its output folder: its staging folder and those of
  dead runs that its finalization deletes."""
  staging: str
  stale: Sequence[str]


def claim_output(output: str, run_id: str) -> Claim:
  """Claims ``output`` for the run ``run_id`` before its job starts, which
  also probes that the folder can be written.

  Another run's staging folder (``_temporary/<id>/``) is live when its
  ``_RUN`` names a process on this host that is still running (the same
  pid, started at the same time), or a process on another host (which
  cannot be checked here); it is stale when that process is gone or the
  folder has no ``_RUN`` (a run killed before claiming, or an earlier
  version's). Of two runs that claim at the same moment, the later claim
  (by time, then run id) gives way.

  Raises:
    OutputBusyError: a live run writes to ``output``.
    OutputNotWritableError: ``_RUN`` cannot be written there.
  """
  own = staging_path(output, run_id)
  others = _other_runs(output, run_id)
  _raise_if_live(output, others.values(), None)
  record = dict(_process_identity(), run_id=run_id,
                claimed_at=round(time.time(), 6))
  try:
    _write_bytes(FileSystems.join(own, RUN_FILE),
                 json.dumps(record, sort_keys=True).encode("utf-8"))
  except (OSError, IOError) as e:
    raise OutputNotWritableError(
        f"--output {output}: cannot be written ({type(e).__name__}: {e}); "
        "choose a folder you can create and write, or fix its permissions")
  _ACTIVE.add(run_id)
  # Claims written meanwhile (the check above and the write are not one
  # step): the earlier claim stays.
  others = _other_runs(output, run_id)
  try:
    _raise_if_live(output, others.values(), record)
  except OutputBusyError:
    release_claim(output, run_id)
    raise
  stale = sorted(path for path, claim in others.items()
                 if claim is None or not _is_live(claim))
  return Claim(own, tuple(stale))


def release_claim(output: str, run_id: str) -> None:
  """Ends a run's claim once its job has stopped (a finalized run has no
  staging folder left); what a failed run staged stays for inspection
  until the next run's finalization deletes it."""
  _ACTIVE.discard(run_id)
  claim = FileSystems.join(staging_path(output, run_id), RUN_FILE)
  if FileSystems.exists(claim):
    FileSystems.delete([claim])


def finalize_state(staging: str) -> str:
  """How far a run's finalization got, from its staging folder (read while
  the run still holds its claim): ``pending`` (outputs untouched),
  ``committing`` (old outputs deleted, not all new ones in place) or
  ``finalized`` (``_SUCCESS`` written, the staging folder deleted)."""
  files = _files_under(staging)
  if FileSystems.join(staging, RUN_FILE) not in files:
    return "finalized"
  if FileSystems.join(staging, _COMMITTING) in files:
    return "committing"
  return "pending"


def _other_runs(output: str, run_id: str) -> dict:
  """``{staging folder: its _RUN record or None}`` of the other runs."""
  root = FileSystems.join(output, STAGING_DIR)
  runs = {}
  for path in _files_under(root):
    parts = path[len(root):].lstrip("/").split("/")
    if len(parts) < 2 or parts[0] == run_id:
      continue
    folder = FileSystems.join(root, parts[0])
    runs.setdefault(folder, None)
    if parts[1:] == [RUN_FILE]:
      runs[folder] = _read_record(path)
  return runs


def _read_record(path: str):
  try:
    with FileSystems.open(path) as handle:
      record = json.loads(handle.read())
    return record if isinstance(record, dict) else None
  except (OSError, IOError, ValueError):
    return None


def _raise_if_live(output: str, claims, own) -> None:
  for claim in claims:
    if claim is None or not _is_live(claim):
      continue
    if own is not None and (own["claimed_at"], own["run_id"]) < (
        claim.get("claimed_at", 0), str(claim.get("run_id"))):
      continue
    where = (f"pid {claim.get('pid')}" if claim.get("host") ==
             socket.gethostname() else
             f"pid {claim.get('pid')} on host {claim.get('host')}")
    folder = staging_path(output, str(claim.get("run_id")))
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                          time.gmtime(float(claim.get("claimed_at", 0))))
    raise OutputBusyError(
        f"--output {output}: another run ({where}, since {since}) is "
        "writing to it; wait for it to end or choose another --output (if "
        f"that run is no longer running, delete {folder} and rerun)")


def _process_identity() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "pid_started": _start_time(os.getpid())}


def _start_time(pid: int):
  """The process's start time in clock ticks (Linux), else None: tells a
  live process from a later one that got the same pid."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as handle:
      return int(handle.read().rsplit(b")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _is_live(claim: dict) -> bool:
  """Whether the claiming process may still be running (see
  :func:`claim_output`)."""
  if claim.get("host") != socket.gethostname():
    return True
  pid = claim.get("pid")
  if not isinstance(pid, int):
    return False
  if pid == os.getpid():
    return claim.get("run_id") in _ACTIVE
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's live process
  started = claim.get("pid_started")
  return started is None or _start_time(pid) in (None, started)


class FinalizeOutput(beam.PTransform):
  """Moves a finished run's outputs from ``staging`` into ``output``.

  The input is the run's report (one dict holding ``stats``), the job's last
  result, so this runs after every output file is complete. ``names`` are the
  top-level outputs (folders or files); those of an earlier run are deleted
  first, and only if ``overwrite`` (otherwise their presence fails the job).
  ``stale``: staging folders of dead runs (:func:`claim_output`), deleted
  once this run has finalized. Returns the ``_SUCCESS`` contents: the
  counts and every data file with its size in bytes (the same bytes for
  the same input and seed).

  Fails, before touching the outputs, when this run's ``_RUN`` claim is
  gone (another run deleted its staging folder) or another run is
  committing into ``output``; fails without writing ``_SUCCESS`` when a
  file it moved is not in place with its size.
  """

  def __init__(self, staging: str, output: str, names: List[str],
               overwrite: bool, stale: Sequence[str] = ()):
    super().__init__()
    self._args = (staging, output, tuple(names), overwrite, tuple(stale))

  def expand(self, report):
    return report | "MoveIntoPlace" >> beam.Map(finalize_output, *self._args)


def finalize_output(report: dict, staging: str, output: str, names,
                    overwrite: bool, stale: Sequence[str] = ()) -> dict:
  """See :class:`FinalizeOutput`; safe to call again after a failure."""
  join = FileSystems.join
  marker = join(output, SUCCESS_FILE)
  committing = join(staging, _COMMITTING)
  staged = _files_under(staging)
  if join(staging, RUN_FILE) not in staged:
    raise OutputBusyError(
        f"{output}: this run's staging folder {staging} lost its files while "
        "the job ran: another run wrote to the same --output; nothing was "
        "finalized: rerun when no other run writes there")
  # A dead run's commit (killed in the middle) no longer moves anything.
  ignored = tuple(folder.rstrip("/") + "/" for folder in (staging, *stale))
  committers = [path for path in _files_under(join(output, STAGING_DIR))
                if path.endswith("/" + _COMMITTING)
                and not path.startswith(ignored)]
  if committers:
    raise OutputBusyError(
        f"{output}: another run is replacing the outputs there "
        f"({committers[0]}); nothing of this run was finalized: rerun when "
        "no other run writes there")
  if not FileSystems.exists(committing):
    old = [name for name in names if _files_under(join(output, name))]
    if old and not overwrite:
      raise FileExistsError(
          f"{output} holds {old} from another run that finished after this "
          "one started; rerun with --overwrite true or another --output")
    # From here on the old outputs no longer look complete.
    _remove(marker)
    for name in old:
      _remove(join(output, name))
    _write_bytes(committing, b"")
  moved = {}
  for path, size in sorted(staged.items()):
    relative = path[len(staging):].lstrip("/")
    if relative in _BOOKKEEPING:
      continue
    target = join(output, *relative.split("/"))
    _mkdirs(target.rsplit("/", 1)[0])
    FileSystems.rename([path], [target])
    moved[relative] = size
  # One listing after the moves: a retried call finds the files it moved
  # already in place, and every moved file must be there with its size.
  found = _files_under(output)
  for path, size in found.items():
    relative = path[len(output):].lstrip("/")
    if relative.split("/", 1)[0] in names:
      moved.setdefault(relative, size)
  _check_in_place(output, moved, found)
  stats = report["stats"]
  success = {
      "counts": {name: stats.get(name, 0) for name in _COUNTS},
      "balanced": stats.get("balanced"),
      # The report files carry measured timings, so their sizes differ run
      # to run; the data files' sizes are the same for the same input.
      "files": {name: size for name, size in sorted(moved.items())
                if not name.startswith("report.")},
  }
  draft = join(staging, _MARKER_DRAFT)
  _write_bytes(draft, json.dumps(
      success, indent=2, sort_keys=True).encode("utf-8") + b"\n")
  FileSystems.rename([draft], [marker])
  # Also what dead runs left there; never a live run's staging folder.
  for folder in (staging, *stale):
    _remove(folder)
  parent = staging.rstrip("/").rsplit("/", 1)[0]
  if not _files_under(parent):
    _remove(parent)
  return success


def _check_in_place(output: str, moved: dict, found: dict) -> None:
  """Raises unless every moved file is in ``found`` (the listing of
  ``output``) with its size."""
  join = FileSystems.join
  lost = [name for name, size in sorted(moved.items())
          if found.get(join(output, *name.split("/"))) != size]
  if lost:
    raise OutputBusyError(
        f"{output}: {len(lost)} of this run's files are not in place after "
        f"the move (first: {lost[0]}): another run or process changed the "
        "folder meanwhile; no _SUCCESS was written: rerun when nothing else"
        " writes there")


def read_success(output: str):
  """The ``_SUCCESS`` marker of ``output`` as a dict, or None if absent."""
  marker = FileSystems.join(output, SUCCESS_FILE)
  if not FileSystems.exists(marker):
    return None
  with FileSystems.open(marker) as handle:
    return json.loads(handle.read())


def _files_under(path: str) -> dict:
  """``{file path: size}`` of every file below ``path`` (or of ``path``
  itself if it is a file); empty if nothing is there."""
  found = {}
  for pattern in (path, FileSystems.join(path, "**")):
    for result in FileSystems.match([pattern]):
      found.update((meta.path, meta.size_in_bytes)
                   for meta in result.metadata_list
                   if not _is_local_dir(meta.path))
  return found


def _is_local_dir(path: str) -> bool:
  # Only the local filesystem has folders; object stores list files.
  return "://" not in path and os.path.isdir(path)


def _mkdirs(path: str) -> None:
  try:
    FileSystems.mkdirs(path)
  except IOError:
    pass  # exists already (or an object store, where folders are implied)


def _remove(path: str) -> None:
  """Deletes a file or a folder's tree; on object stores, every object under
  the prefix (they have no folder to delete)."""
  if FileSystems.exists(path):
    FileSystems.delete([path])
  files = list(_files_under(path))
  if files:
    FileSystems.delete(files)


def _write_bytes(path: str, data: bytes) -> None:
  with FileSystems.create(path) as handle:
    handle.write(data)
