"""Reliability, round two (issue 26), outputs: one run at a time writes an
output folder, `_SUCCESS` is never written for a file set that lost a file,
unwritable outputs and bad config files are refused before the job, signals
say what they left, and kills inside the final moves are safe."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from pipeline.cli import main
from transforms import finalize
from transforms.finalize import (RUN_FILE, SUCCESS_FILE, STAGING_DIR,
                                 OutputBusyError, claim_output,
                                 finalize_output, read_success,
                                 release_claim, staging_path)
from transforms.report import MEASURED_FIELDS
from tests.corpus import seed_corpus, tree_bytes, write_jsonl

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKED = os.path.join(ROOT, "tests", "hooked_cli.py")
TIMEOUT_S = 240
# For runs the launcher refuses before any runner starts, where the engine
# tier's twin output folder could not mirror the case (an unwritable
# folder, one that is also an index): they run once, here.
LAUNCHER_ONLY = ("--runner", "FnApiRunner")


def cli(capsys, *argv):
  code = main([str(a) for a in argv])
  return code, capsys.readouterr().err


def outputs(out):
  """The output tree without staging folders."""
  return {name: data for name, data in tree_bytes(out).items()
          if not name.startswith(STAGING_DIR)}


def start(hook, value, *argv):
  """The CLI in a process of its own with a fault hook (tests/hooked_cli.py)."""
  return subprocess.Popen(
      [sys.executable, HOOKED, hook, str(value), "--", *map(str, argv)],
      cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, start_new_session=True)


def finish(proc):
  """``(exit code, stderr)``; the process is killed if it outlives the test's
  patience, and always reaped."""
  try:
    _, err = proc.communicate(timeout=TIMEOUT_S)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  return proc.returncode, err.decode(errors="replace")


def wait_for(path, proc):
  deadline = time.monotonic() + TIMEOUT_S
  while not os.path.exists(path):
    assert proc.poll() is None, finish(proc)[1][-3000:]
    assert time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.05)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Two input files, and an undisturbed run's outputs of them."""
  folder = tmp_path_factory.mktemp("outputs")
  texts, _ = seed_corpus(n_base=400, edit_frac=0.02, seed=11)
  half = len(texts) // 2
  write_jsonl(folder / "a.jsonl", texts[:half])
  write_jsonl(folder / "b.jsonl", texts[half:])
  assert main(["--input", str(folder / "*.jsonl"), "--output",
               str(folder / "new")]) == 0
  return folder, outputs(folder / "new")


def old_outputs(corpus, out):
  """``out`` holding an earlier complete run (of one input file)."""
  folder, _ = corpus
  assert main(["--input", str(folder / "a.jsonl"), "--output", str(out)]) == 0
  return outputs(out)


# --- 1. two runs into one --output ------------------------------------------

@contextlib.contextmanager
def held_run(tmp_path, *argv):
  """A CLI process (see :func:`start`) stopped before its job's last step
  moves anything; the block runs meanwhile and ``release()`` lets it go
  on. Yields ``(process, release)``; the process is reaped at the end."""
  gate = tmp_path / "gate"
  gate.mkdir()
  proc = start("hold", gate, *argv)
  try:
    wait_for(gate / "ready", proc)
    yield proc, (gate / "go").touch
  finally:
    (gate / "go").touch()
    finish(proc)


def test_a_second_run_into_a_busy_output_is_refused_and_the_first_completes(
    corpus, tmp_path, capsys):
  folder, new = corpus
  out = tmp_path / "out"
  with held_run(tmp_path, "--input", folder / "*.jsonl", "--output",
                out) as (first, release):
    # The first run has staged everything and waits to move it into place.
    code, err = cli(capsys, "--input", folder / "a.jsonl", "--output", out,
                    "--overwrite", "true")
    assert code == 2, err
    assert f"error: --output {out}: another run (pid {first.pid}" in err
    release()
    code, err = finish(first)
  assert code == 0, err[-3000:]
  assert outputs(out) == new
  success = read_success(str(out))
  assert any(name.startswith("deduped/") for name in success["files"])
  assert not (out / STAGING_DIR).exists()


def test_a_run_whose_staging_another_run_deleted_fails_without_success(
    corpus, tmp_path):
  # What an earlier version's finalization did to every other run: it
  # deleted the whole _temporary/ folder.
  folder, _ = corpus
  out = tmp_path / "out"
  with held_run(tmp_path, "--input", folder / "*.jsonl", "--output",
                out) as (proc, release):
    shutil.rmtree(out / STAGING_DIR)
    release()
    code, err = finish(proc)
  assert code == 1
  assert "lost its files while the job ran: another run wrote to the same" \
      in err
  assert not (out / SUCCESS_FILE).exists()


def test_a_claim_of_a_dead_run_is_stale_and_removed_by_the_next_run(
    corpus, tmp_path, capsys):
  folder, new = corpus
  out = tmp_path / "out"
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, check=True, text=True)
  stale = out / STAGING_DIR / "deadrun"
  stale.mkdir(parents=True)
  (stale / RUN_FILE).write_text(json.dumps({
      "host": socket.gethostname(), "pid": int(dead.stdout),
      "pid_started": None, "run_id": "deadrun", "claimed_at": 1.0}))
  (stale / "_COMMITTING").touch()  # killed in the middle of its commit
  (out / STAGING_DIR / "noclaim" / "deduped").mkdir(parents=True)
  code, err = cli(capsys, "--input", folder / "*.jsonl", "--output", out)
  assert code == 0, err
  assert outputs(out) == new
  assert not (out / STAGING_DIR).exists()


def test_a_claim_from_another_host_is_refused_naming_what_to_delete(
    corpus, tmp_path, capsys):
  folder, _ = corpus
  out = tmp_path / "out"
  other = out / STAGING_DIR / "elsewhere"
  other.mkdir(parents=True)
  (other / RUN_FILE).write_text(json.dumps({
      "host": "another-host.invalid", "pid": 1, "run_id": "elsewhere",
      "claimed_at": 1.0}))
  code, err = cli(capsys, "--input", folder / "a.jsonl", "--output", out)
  assert code == 2
  assert "on host another-host.invalid" in err
  assert f"delete {other} and rerun" in err
  assert sorted(os.listdir(out / STAGING_DIR)) == ["elsewhere"]


def test_of_two_claims_at_once_the_later_gives_way(tmp_path, monkeypatch):
  out = str(tmp_path / "out")
  claim_output(out, "first")
  try:
    # A claim written between another run's check and its own write: that
    # run sees an earlier live claim and withdraws.
    monkeypatch.setattr(finalize, "_raise_if_live",
                        _skip_first_check(finalize._raise_if_live))
    with pytest.raises(OutputBusyError, match="another run"):
      claim_output(out, "second")
    assert not os.path.exists(os.path.join(
        staging_path(out, "second"), RUN_FILE))
  finally:
    release_claim(out, "first")


def _skip_first_check(real):
  calls = []

  def check(output, claims, own):
    calls.append(own)
    if len(calls) > 1:
      real(output, claims, own)
  return check


def _staged_run(tmp_path, files):
  """A finished run's staging folder holding ``files`` and its claim."""
  out = str(tmp_path / "out")
  claim = claim_output(out, "run")
  for name, data in files.items():
    path = os.path.join(claim.staging, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(data)
  return out, claim


REPORT = {"stats": {"docs_in": 1, "kept": 1, "balanced": True}}


def test_finalize_refuses_while_another_run_commits(tmp_path):
  out, claim = _staged_run(tmp_path, {"deduped/part-0.jsonl": b"x\n"})
  try:
    other = os.path.join(out, STAGING_DIR, "other")
    os.makedirs(other)
    open(os.path.join(other, "_COMMITTING"), "wb").close()
    with pytest.raises(OutputBusyError, match="another run is replacing"):
      finalize_output(REPORT, claim.staging, out, ["deduped"], True)
    assert not os.path.exists(os.path.join(out, "deduped"))
    assert not os.path.exists(os.path.join(out, SUCCESS_FILE))
  finally:
    release_claim(out, "run")


def test_no_success_for_a_file_set_that_lost_a_file(tmp_path, monkeypatch):
  out, claim = _staged_run(tmp_path, {"deduped/part-0.jsonl": b"x\n",
                                      "deduped/part-1.jsonl": b"y\n"})
  real = finalize.FileSystems.rename

  def losing(sources, targets):
    real(sources, targets)
    if targets[0].endswith("part-1.jsonl"):
      os.remove(targets[0])  # what a concurrent writer's delete does

  monkeypatch.setattr(finalize.FileSystems, "rename", staticmethod(losing))
  try:
    with pytest.raises(OutputBusyError, match="not in place after the move"):
      finalize_output(REPORT, claim.staging, out, ["deduped"], True)
    assert not os.path.exists(os.path.join(out, SUCCESS_FILE))
  finally:
    release_claim(out, "run")


# --- kills inside FinalizeOutput --------------------------------------------

@pytest.mark.parametrize("where", ["first move", "between moves",
                                   "before _SUCCESS", "after _SUCCESS"])
def test_sigkill_inside_the_final_moves_is_safe(corpus, tmp_path, where):
  folder, new = corpus
  out = tmp_path / "out"
  old = old_outputs(corpus, out)
  # Every staged file is renamed into place, then _SUCCESS.tmp.
  moves = len([name for name in new if name != SUCCESS_FILE])
  hook, n = {"first move": ("kill_before", 1),
             "between moves": ("kill_before", moves // 2 + 1),
             "before _SUCCESS": ("kill_before", moves + 1),
             "after _SUCCESS": ("kill_after", moves + 1)}[where]
  proc = start(hook, n, "--input", folder / "*.jsonl", "--output", out,
               "--overwrite", "true")
  code, _ = finish(proc)
  assert code == -signal.SIGKILL
  found = outputs(out)
  if where == "after _SUCCESS":
    assert found == new
  else:
    # Nothing says these outputs are complete, and each file there is a
    # whole file of one of the two runs.
    assert SUCCESS_FILE not in found
    assert all(data in (old.get(name), new.get(name))
               for name, data in found.items())
  # An undisturbed rerun completes and removes the killed run's staging.
  assert main(["--input", str(folder / "*.jsonl"), "--output", str(out),
               "--overwrite", "true"]) == 0
  assert outputs(out) == new
  assert not (out / STAGING_DIR).exists()


# --- 8. outputs that cannot be written --------------------------------------

def test_an_output_under_a_regular_file_is_refused_before_the_job(
    corpus, tmp_path, capsys):
  folder, _ = corpus
  blocker = tmp_path / "x.jsonl"
  blocker.write_bytes(b"")
  started = time.monotonic()
  code, err = cli(capsys, "--input", folder / "a.jsonl", "--output",
                  blocker / "sub", *LAUNCHER_ONLY)
  assert code == 2
  assert f"error: --output {blocker / 'sub'}: cannot be written" in err
  assert "Traceback" not in err and "neardup" not in err
  assert time.monotonic() - started < 30


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_an_output_in_a_read_only_folder_is_refused_before_the_job(
    corpus, tmp_path, capsys):
  folder, _ = corpus
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o555)
  try:
    code, err = cli(capsys, "--input", folder / "a.jsonl", "--output",
                    locked / "out", *LAUNCHER_ONLY)
  finally:
    locked.chmod(0o755)
  assert code == 2 and "cannot be written (PermissionError" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux only")
def test_an_output_where_no_folder_can_be_made_is_refused(
    corpus, tmp_path, capsys):
  # /proc takes no new folders, even for root.
  folder, _ = corpus
  code, err = cli(capsys, "--input", folder / "a.jsonl", "--output",
                  "/proc/neardup-out", *LAUNCHER_ONLY)
  assert code == 2 and "--output /proc/neardup-out: cannot be written" in err


def test_an_output_that_is_the_index_folder_is_refused(corpus, tmp_path,
                                                       capsys):
  folder, _ = corpus
  index = tmp_path / "index"
  assert main(["--input", str(folder / "a.jsonl"), "--output",
               str(tmp_path / "first"), "--index_out", str(index)]) == 0
  code, err = cli(capsys, "--input", folder / "b.jsonl", "--output", index,
                  "--against", index, *LAUNCHER_ONLY)
  assert code == 2
  assert f"--output {index}: is the --against folder" in err
  code, err = cli(capsys, "--input", folder / "b.jsonl", "--output",
                  tmp_path / "new_index", "--index_out", tmp_path /
                  "new_index", *LAUNCHER_ONLY)
  assert code == 2 and "is the --index_out folder" in err


# --- 9. config files and signals --------------------------------------------

@pytest.mark.parametrize("text,message", [
    ("threshold: abc\n", "threshold: 'abc' is not a number"),
    ("ngram: 2.5\n", "ngram: '2.5' is not an integer"),
    ("overwrite: maybe\n", "overwrite: 'maybe' is not true or false"),
    ("input_format: xml\n", "input_format: 'xml' is not one of auto, jsonl"),
    ("threshold: 0.7\nngram: 3\nthreshold: 0.9\n",
     "the key 'threshold' is given twice (again on line 3): keep one"),
])
def test_a_config_value_its_flag_refuses_names_the_file_without_usage(
    tmp_path, capsys, text, message):
  path = tmp_path / "run.yaml"
  path.write_text(text)
  code, err = cli(capsys, "--config", path, "--input", "x.jsonl", "--output",
                  tmp_path / "out")
  assert code == 2
  assert err == f"error: --config {path}: {message}" + err.split(
      message, 1)[1]
  assert "usage:" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_exits_128_plus_it_saying_no_outputs_changed(
    corpus, tmp_path, signum):
  folder, _ = corpus
  out = tmp_path / "out"
  old = old_outputs(corpus, out)
  with held_run(tmp_path, "--input", folder / "*.jsonl", "--output", out,
                "--overwrite", "true") as (proc, _):
    proc.send_signal(signum)
    code, err = finish(proc)
  name = signal.Signals(signum).name
  assert code == 128 + signum, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      f"error: interrupted ({name}); no outputs were changed: {out} holds its"
      " earlier outputs, if any")
  assert "Traceback" not in err
  assert outputs(out) == old


# --- 10. what varies between runs -------------------------------------------

def test_report_json_differs_between_runs_only_in_its_measured_fields(
    corpus, tmp_path):
  folder, _ = corpus
  reports = []
  for name in ("one", "two"):
    assert main(["--input", str(folder / "*.jsonl"), "--output",
                 str(tmp_path / name)]) == 0
    with open(tmp_path / name / "report.json", encoding="utf-8") as f:
      reports.append(json.load(f))
  differing = {key for key in reports[0].keys() | reports[1].keys()
               if reports[0].get(key) != reports[1].get(key)}
  assert differing <= set(MEASURED_FIELDS)
  assert {"started_at", "wall_seconds", "worker_seconds"} <= set(
      MEASURED_FIELDS)
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  assert all(f"`{field}`" in readme for field in MEASURED_FIELDS)


def test_finalize_state_says_how_far_an_interrupted_run_got(tmp_path):
  out, claim = _staged_run(tmp_path, {"deduped/part-0.jsonl": b"x\n"})
  assert finalize.finalize_state(claim.staging) == "pending"
  open(os.path.join(claim.staging, "_COMMITTING"), "wb").close()
  assert finalize.finalize_state(claim.staging) == "committing"
  finalize_output(REPORT, claim.staging, out, ["deduped"], True)
  assert finalize.finalize_state(claim.staging) == "finalized"
  release_claim(out, "run")
  assert read_success(out)["files"] == {"deduped/part-0.jsonl": 2}
