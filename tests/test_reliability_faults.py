"""Faults injected into the job's DoFns (failing on some bundles).

* BundleBasedDirectRunner retries a failed bundle (up to 4 attempts): with a
  first-attempt failure in reading, in writing (after part of a file is
  written) and in finalization (after part of the outputs moved), the
  outputs are byte-identical to a clean run: nothing duplicated or lost.
* FnApiRunner and Prism (Beam 2.77) do not retry bundles: the run fails
  loudly (exit 1, the cause on the last line, no ``_SUCCESS``), and a rerun
  gives the clean run's bytes.
"""
# pylint: disable=protected-access

import os
import signal
import subprocess
import sys

import pytest

from pipeline import engines
from pipeline.cli import main
from tests.corpus import seed_corpus, tree_bytes, write_jsonl
from transforms import finalize, read, write

pytestmark = pytest.mark.extended

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 300
ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold", "0.4"]


class InjectedFault(RuntimeError):
  """Raised by the injected faults."""


class Faults:
  """Which injected faults fire: each once (the first attempt), or always."""

  def __init__(self, folder, always=False):
    self._folder = folder
    self._always = always

  def fire(self, name) -> bool:
    if self._always:
      return True
    try:
      # A marker file: attempts may run in other threads of this process.
      os.close(os.open(os.path.join(self._folder, name),
                       os.O_CREAT | os.O_EXCL))
      return True
    except FileExistsError:
      return False


def inject(monkeypatch, faults):
  """Reading file 1 fails after its first output (a batch of its texts),
  writing its first part once 3 lines are written, and finalization after
  moving 2 files."""
  process = read._ReadFileFn.process

  def flaky_read(self, input_file):
    for i, out in enumerate(process(self, input_file)):
      yield out
      if input_file.index == 1 and i == 0 and faults.fire("read"):
        raise InjectedFault("injected fault while reading file 1")

  add = write._LineSink.add_lines  # what every written line goes through

  def flaky_add(self, lines, count):
    add(self, lines, count)
    if ("part-00001-" in self._path and self._count >= 3
        and faults.fire("write")):
      raise InjectedFault("injected fault while writing file 1")

  mkdirs = finalize._mkdirs
  calls = []

  def flaky_mkdirs(path):
    calls.append(path)
    if len(calls) == 3 and faults.fire("finalize"):
      raise InjectedFault("injected fault while finalizing")
    mkdirs(path)

  monkeypatch.setattr(read._ReadFileFn, "process", flaky_read)
  monkeypatch.setattr(write._LineSink, "add_lines", flaky_add)
  monkeypatch.setattr(finalize, "_mkdirs", flaky_mkdirs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Two input files and the clean run's output tree."""
  folder = tmp_path_factory.mktemp("faults")
  texts, _ = seed_corpus(n_base=300, seed=5)
  half = len(texts) // 2
  write_jsonl(folder / "a.jsonl", texts[:half])
  write_jsonl(folder / "b.jsonl", texts[half:])
  inputs = f"{folder}/*.jsonl"
  assert main(["--input", inputs, "--output", str(folder / "clean"),
               "--runner", "FnApiRunner", *ARGS]) == 0
  return inputs, tree_bytes(folder / "clean")


def test_retrying_runner_gives_byte_identical_outputs_despite_faults(
    corpus, tmp_path, monkeypatch):
  inputs, clean = corpus
  inject(monkeypatch, Faults(tmp_path))
  out = tmp_path / "out"
  assert main(["--input", inputs, "--output", str(out), "--runner",
               "BundleBasedDirectRunner", *ARGS]) == 0
  assert sorted(os.listdir(tmp_path)) == ["finalize", "out", "read", "write"]
  assert tree_bytes(out) == clean


RUNNERS = {
    "FnApiRunner": [],
    "PrismRunner": ["--prism_location", str(engines.find_prism()),
                    "--environment_type", "LOOPBACK"],
}


def cli_with_faults(argv):
  """``main(argv)`` with every fault firing on every attempt if
  ``NEARDUP_TEST_FAULTS`` names a folder (for :func:`run_cli`)."""
  folder = os.environ.get("NEARDUP_TEST_FAULTS")
  if folder:
    inject(pytest.MonkeyPatch(), Faults(folder, always=True))
  return main(argv)


def run_cli(argv, faults_folder=None):
  """The CLI in a process group of its own (Beam stops the Prism it starts
  only when the process exits); returns ``(exit code, stderr)``. Whatever
  is left of the group is killed."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH"))
                                      if p)
  env.pop("NEARDUP_TEST_FAULTS", None)
  if faults_folder:
    env["NEARDUP_TEST_FAULTS"] = str(faults_folder)
  proc = subprocess.Popen(
      [sys.executable, "-c", "import sys; from tests.test_reliability_faults"
       " import cli_with_faults; sys.exit(cli_with_faults(sys.argv[1:]))",
       *argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      start_new_session=True)
  try:
    _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
  return proc.returncode, err.decode(errors="replace")


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_runner_without_retries_fails_loudly_and_a_rerun_is_identical(
    corpus, tmp_path, runner):
  if runner == "PrismRunner" and engines.find_prism() is None:
    pytest.skip(engines.missing_prism_reason())
  inputs, clean = corpus
  out = tmp_path / "out"
  argv = ["--input", inputs, "--output", str(out), "--runner", runner,
          *RUNNERS[runner], *ARGS]
  code, err = run_cli(argv, faults_folder=tmp_path)
  assert code == 1, err[-3000:]
  lines = err.splitlines()
  # Prism's in-process worker may still log its shutdown after these.
  failed = [i for i, line in enumerate(lines)
            if line.startswith("error: the job failed: ")]
  assert failed, err[-3000:]
  assert "injected fault while reading file 1" in lines[failed[0]]
  assert lines[failed[0] + 1].startswith("(no outputs were finalized")
  assert not (out / "_SUCCESS").exists()
  assert not (out / "deduped").exists()
  code, err = run_cli(argv)
  assert code == 0, err[-3000:]
  assert tree_bytes(out) == clean


def test_failed_finalization_is_completed_by_an_overwrite_rerun(
    corpus, tmp_path, monkeypatch, capsys):
  inputs, clean = corpus
  out = tmp_path / "out"
  argv = ["--input", inputs, "--output", str(out), "--runner", "FnApiRunner",
          *ARGS]
  with monkeypatch.context() as patch:
    mkdirs = finalize._mkdirs
    calls = []

    def flaky_mkdirs(path):
      calls.append(path)
      if len(calls) == 3:
        raise InjectedFault("injected fault while finalizing")
      mkdirs(path)
    patch.setattr(finalize, "_mkdirs", flaky_mkdirs)
    assert main(argv) == 1
  assert "injected fault while finalizing" in capsys.readouterr().err
  assert not (out / "_SUCCESS").exists()
  assert any((out / name).exists() for name in ("clusters", "deduped"))
  # Part of the outputs is in place, unmarked: the rerun must be told.
  assert main(argv) == 2
  assert "--overwrite" in capsys.readouterr().err
  assert main(argv + ["--overwrite", "true"]) == 0
  assert tree_bytes(out) == clean
