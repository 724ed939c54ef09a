"""Atomic outputs: the job writes under ``<output>/_temporary/<run id>/`` and
its last step, :class:`FinalizeOutput`, moves everything into place and then
writes the ``_SUCCESS`` marker (as Hadoop and Spark jobs do).

Guarantees: outputs without ``_SUCCESS`` next to them are incomplete (a
failed or killed run never leaves one); an earlier run's outputs are deleted
only once the new run has written all of its own, by the job itself (so also
on Dataflow or Flink when the launcher does not wait). Every step can be
retried: a retried finalization continues where the last attempt stopped.
"""

from __future__ import annotations

import json
import os
from typing import List

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

STAGING_DIR = "_temporary"
SUCCESS_FILE = "_SUCCESS"
# Written into the staging folder once the old outputs are gone: a retried
# finalization must not delete the new files it has already moved in.
_COMMITTING = "_COMMITTING"
_COUNTS = ("docs_in", "kept", "removed", "rejected", "clusters",
           "clustered_docs")


def staging_path(output: str, run_id: str) -> str:
  """Where a run with ``run_id`` writes before it finalizes."""
  return FileSystems.join(output, STAGING_DIR, run_id)


class FinalizeOutput(beam.PTransform):
  """Moves a finished run's outputs from ``staging`` into ``output``.

  The input is the run's report (one dict holding ``stats``), the job's last
  result, so this runs after every output file is complete. ``names`` are the
  top-level outputs (folders or files); those of an earlier run are deleted
  first, and only if ``overwrite`` (otherwise their presence fails the job).
  Returns the ``_SUCCESS`` contents: the counts and every data file with
  its size in bytes (the same bytes for the same input and seed).
  """

  def __init__(self, staging: str, output: str, names: List[str],
               overwrite: bool):
    super().__init__()
    self._args = (staging, output, tuple(names), overwrite)

  def expand(self, report):
    return report | "MoveIntoPlace" >> beam.Map(finalize_output, *self._args)


def finalize_output(report: dict, staging: str, output: str, names,
                    overwrite: bool) -> dict:
  """See :class:`FinalizeOutput`; safe to call again after a failure."""
  join = FileSystems.join
  marker = join(output, SUCCESS_FILE)
  committing = join(staging, _COMMITTING)
  staged = _files_under(staging)
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
    if relative == _COMMITTING:
      continue
    target = join(output, *relative.split("/"))
    _mkdirs(target.rsplit("/", 1)[0])
    FileSystems.rename([path], [target])
    moved[relative] = size
  # A retried call finds the files it moved already in place.
  for name in names:
    for path, size in _files_under(join(output, name)).items():
      moved.setdefault(path[len(output):].lstrip("/"), size)
  stats = report["stats"]
  success = {
      "counts": {name: stats.get(name, 0) for name in _COUNTS},
      "balanced": stats.get("balanced"),
      # The report files carry measured timings, so their sizes differ run
      # to run; the data files' sizes are the same for the same input.
      "files": {name: size for name, size in sorted(moved.items())
                if not name.startswith("report.")},
  }
  _write_bytes(marker + ".tmp", json.dumps(
      success, indent=2, sort_keys=True).encode("utf-8") + b"\n")
  FileSystems.rename([marker + ".tmp"], [marker])
  # Also what killed runs left there, as Hadoop's job commit does: one run
  # at a time writes to an output folder.
  _remove(join(output, STAGING_DIR))
  return success


def remove_staging(staging: str) -> None:
  """Deletes a run's staging folder, and ``_temporary`` once it is empty."""
  _remove(staging)
  parent = staging.rstrip("/").rsplit("/", 1)[0]
  if not _files_under(parent):
    _remove(parent)


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
