"""A job killed (SIGKILL) at random points never leaves outputs that look
complete, never damages the previous run's complete outputs, and a rerun
gives the same bytes as an undisturbed run.

Quick form: 3 seeds; NEARDUP_FULL=1: 20. Odd seeds kill near the end of the
run, where the outputs are moved into place (the narrowest window).
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.corpus import seed_corpus, tree_bytes, write_jsonl

pytestmark = pytest.mark.extended

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = os.environ.get("NEARDUP_FULL") == "1"
SEEDS = range(20 if FULL else 3)
RUN_TIMEOUT_S = 300
ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold", "0.4"]


def start(inputs, out):
  """The CLI in its own process group (so the kill reaches all of it)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH"))
                                      if p)
  return subprocess.Popen(
      [sys.executable, "-m", "pipeline", "--input", inputs, "--output",
       str(out), "--overwrite", "true", *ARGS], cwd=ROOT, env=env,
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, start_new_session=True)


def run_to_end(inputs, out):
  """Runs the CLI undisturbed; returns its wall time in seconds."""
  started = time.monotonic()
  proc = start(inputs, out)
  try:
    _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
  finally:
    kill(proc)
  assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
  return time.monotonic() - started


def kill(proc):
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()


def final_outputs(out):
  """Files under their final names (the staging folder left out)."""
  return {name: data for name, data in tree_bytes(out).items()
          if not name.startswith("_temporary")}


def raw_files(out):
  """Every file under ``out`` as relative path -> its bytes, as written."""
  files = {}
  for root, _, names in os.walk(out):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, out)] = f.read()
  return files


def write_tree(out, files):
  for name, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
    with open(os.path.join(out, name), "wb") as f:
      f.write(data)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Inputs, a previous run's complete outputs, the new run's and its
  undisturbed wall time."""
  folder = tmp_path_factory.mktemp("kill")
  texts, _ = seed_corpus(n_base=900, seed=3)
  third = len(texts) // 3
  for i in range(3):
    write_jsonl(folder / f"part{i}.jsonl", texts[i * third:(i + 1) * third])
  seconds = run_to_end(f"{folder}/part*.jsonl", folder / "new")
  new = final_outputs(folder / "new")
  # An earlier run's outputs: other bytes, and a part the new run lacks. Its
  # files are written as a run writes them (the report with its timings),
  # then compared as the new run's are.
  raw = raw_files(folder / "new")
  raw = {name: data + b"\n" if name.startswith("deduped/") else data
         for name, data in raw.items()}
  raw["deduped/part-00009-00000.jsonl"] = b'{"text": "stale"}\n'
  success = json.loads(raw["_SUCCESS"])
  success["files"] = {name: len(data) for name, data in raw.items()
                      if not name.startswith(("report.", "_SUCCESS"))}
  raw["_SUCCESS"] = json.dumps(success).encode()
  write_tree(folder / "old", raw)
  old = final_outputs(folder / "old")
  return folder, old, new, seconds


@pytest.mark.slow
def test_sigkill_at_random_points_never_leaves_complete_looking_outputs(
    runs, tmp_path):
  folder, old, new, seconds = runs
  assert old != new and "_SUCCESS" in old and "_SUCCESS" in new
  outcomes = []
  out = tmp_path / "out"
  for seed in SEEDS:
    rng = random.Random(seed)
    at = seconds * (rng.uniform(0.85, 1.02) if seed % 2 else
                    rng.uniform(0.1, 1.0))
    if out.exists():
      shutil.rmtree(out)
    shutil.copytree(folder / "old", out)
    proc = start(f"{folder}/part*.jsonl", out)
    try:
      time.sleep(at)
    finally:
      kill(proc)
    found = final_outputs(out)
    if "_SUCCESS" in found:
      # Complete: exactly one whole run's outputs, the marker's sizes true.
      assert found in (old, new), (seed, at)
      success = json.loads(found["_SUCCESS"])
      assert all(len(found[name]) == size
                 for name, size in success["files"].items())
      outcomes.append("old" if found == old else "new")
    else:
      # Caught while moving into place: whatever is there is whole files of
      # one of the two runs, and nothing says it is complete.
      assert all(found[name] in (old.get(name), new.get(name))
                 for name in found), (seed, at)
      outcomes.append("incomplete")
  # The last kill's folder, rerun undisturbed, ends as the new run.
  run_to_end(f"{folder}/part*.jsonl", out)
  assert final_outputs(out) == new
  assert not (out / "_temporary").exists()
  print(f"kill outcomes over {len(SEEDS)} seeds (run {seconds:.1f} s):",
        {o: outcomes.count(o) for o in set(outcomes)})
