"""Flink, embedded (``--flink_master [local]``): the job server installed by
``scripts/install_flink.sh``, found by the CLI for ``--runner FlinkRunner``,
outputs byte-identical to FnApiRunner's, and no JVM left behind. The whole
end-to-end suite also runs on embedded Flink in the engine tier
(``NEARDUP_ENGINE=flink``, see ``tests/engines.py``)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pipeline import cli, engines
from tests import engines as engine_tier
from tests import services
from tests.corpus import seed_corpus, tree_bytes
from tests.stream_harness import read_rows, wait_for_rows

# The engine tests' corpus fixture and job flags, shared so both engines are
# checked on the same job.
from tests.test_engines import SEED_ARGS, corpus  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "install_flink.sh")
pytestmark = [pytest.mark.engine, pytest.mark.extended]


def _cache_with_installed_server(tmp_path):
  """A fresh engines cache holding (a link to) the installed job server."""
  real = os.path.dirname(engine_tier.require_flink_job_server())
  cache = tmp_path / "cache"
  (cache / "flink").mkdir(parents=True)
  os.symlink(real, cache / "flink" / os.path.basename(real))
  return cache


def test_versions_are_pinned_in_one_file():
  versions = engines.flink_versions()
  assert versions["BEAM_FLINK_RUNNER"] == "2.62.0"
  assert engines.flink_minor() == "1.19"
  script = open(SCRIPT, encoding="utf-8").read()
  assert "BEAM_FLINK_RUNNER=" not in script and "FLINK=" not in script


def _path_with(tmp_path, *tools):
  """A PATH folder holding only ``tools`` (and bash, dirname)."""
  folder = tmp_path / "bin"
  folder.mkdir()
  for tool in ("bash", "dirname", *tools):
    found = shutil.which(tool)
    if found:
      os.symlink(found, folder / tool)
  return str(folder)


def test_install_script_answers_from_the_cache_without_maven(tmp_path):
  cache = _cache_with_installed_server(tmp_path)
  env = dict(os.environ, NEARDUP_ENGINES_CACHE=str(cache),
             PATH=_path_with(tmp_path))
  done = subprocess.run([shutil.which("bash"), SCRIPT], env=env,
                        capture_output=True, text=True, check=True,
                        timeout=30)
  assert done.stdout.strip() == os.path.join(
      str(cache), os.path.relpath(engines.flink_job_server_path(),
                                  engines.engines_cache()))


def test_install_script_without_maven_fails_naming_it(tmp_path):
  if not shutil.which("java"):
    pytest.skip("needs java")
  env = dict(os.environ, NEARDUP_ENGINES_CACHE=str(tmp_path / "cache"),
             PATH=_path_with(tmp_path, "java", "jar", "mktemp", "mkdir"))
  done = subprocess.run([shutil.which("bash"), SCRIPT], env=env, capture_output=True,
                        text=True, timeout=30)
  assert done.returncode == 1
  assert "mvn is not installed" in done.stderr


def test_another_flink_version_than_the_installed_server_exits_2(
    tmp_path, capsys, corpus):
  engine_tier.require_flink_job_server()
  code = cli.main(["--input", corpus, "--output", str(tmp_path / "out"),
                   "--runner", "FlinkRunner", "--flink_version", "1.20"])
  assert code == 2
  assert "runs Flink 1.19" in capsys.readouterr().err


def _job_server_pids(jar):
  out = subprocess.run(["pgrep", "-f", jar], capture_output=True, text=True)
  return {int(p) for p in out.stdout.split()}


def test_flink_runner_outputs_are_byte_identical_and_its_jvm_stops(
    corpus, tmp_path):
  jar = engine_tier.require_flink_job_server()
  before = _job_server_pids(jar)
  args = ["--input", corpus, *SEED_ARGS]
  assert cli.main([*args, "--output", str(tmp_path / "ref"),
                   "--runner", "FnApiRunner"]) == 0
  # The user's command, only the runner added: the CLI finds the job server
  # and its Flink version; Beam stops the job server's JVM at exit.
  done = subprocess.run(
      [sys.executable, "-m", "pipeline", *args, "--output",
       str(tmp_path / "flink"), "--runner", "FlinkRunner"], cwd=ROOT,
      capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  ours, ref = tree_bytes(str(tmp_path / "flink")), tree_bytes(
      str(tmp_path / "ref"))
  assert sorted(ours) == sorted(ref)
  assert [n for n in ref if ours[n] != ref[n]] == []
  assert any(name.startswith("clusters") for name in ours)
  assert _job_server_pids(jar) - before == set()


def test_streaming_flink_runner_without_job_server_exits_2(
    monkeypatch, tmp_path, capsys, corpus):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path / "empty"))
  code = cli.main(["--streaming", "--input", corpus, "--output",
                   str(tmp_path / "out"), "--runner", "FlinkRunner"])
  assert code == 2
  assert "scripts/install_flink.sh" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()


STREAM_ARGS = ["--event_time_field", "ts", "--settle", "1s",
               "--output_window", "1m"]
# Checkpointed jobs: the interval, and how long the test waits after the
# last verdict for an extra copy to show (three checkpoints).
CHECKPOINT_MS = 1000
HOLD_S = 3.0


def _verdicts(folder):
  return {r["id"]: (r["verdict"], r["duplicate_of"])
          for r in read_rows(folder / "verdicts")}


@pytest.fixture(scope="module")
def stream_docs(tmp_path_factory):
  """A JSONL file of seed-style documents with event times and the
  BundleBasedDirectRunner's verdicts for it (id -> (verdict, of))."""
  engine_tier.require_flink_job_server()
  folder = tmp_path_factory.mktemp("flink-stream")
  texts, _ = seed_corpus(n_base=120, edit_frac=0.02, seed=4)
  path = folder / "docs.jsonl"
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"id": f"d{i}", "text": t, "ts": 1000 + i}) + "\n"
                 for i, t in enumerate(texts))
  done = subprocess.run(
      [sys.executable, "-m", "pipeline", "--streaming", "--input", str(path),
       *STREAM_ARGS, "--output", str(folder / "direct")], cwd=ROOT,
      capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  direct = _verdicts(folder / "direct")
  assert len(direct) == len(texts)
  assert any(v == "duplicate" for v, _ in direct.values())
  return str(path), direct


def test_streaming_file_job_on_flink_gives_the_direct_runners_verdicts(
    tmp_path, stream_docs):
  """Every document of a file input gets the verdict it gets on the
  BundleBasedDirectRunner (streaming on embedded Flink, no checkpoints)."""
  path, direct = stream_docs
  done = subprocess.run(
      [sys.executable, "-m", "pipeline", "--streaming", "--input", path,
       *STREAM_ARGS, "--output", str(tmp_path / "flink"), "--runner",
       "FlinkRunner", "--environment_type", "LOOPBACK"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert _verdicts(tmp_path / "flink") == direct


def test_checkpointed_streaming_on_flink_writes_each_verdict_once(
    tmp_path, stream_docs):
  """With --checkpointing_interval on embedded Flink, every document gets
  exactly one verdict line, the BundleBasedDirectRunner's, and no line more
  appears over the next checkpoints. The job runs until cancelled (a
  checkpointed Flink job keeps its sources): the test stops the CLI's
  process group, the job server Beam started with it included."""
  jar = engine_tier.require_flink_job_server()
  path, direct = stream_docs
  before = _job_server_pids(jar)
  out = tmp_path / "flink"
  log = open(tmp_path / "cli.log", "wb")
  began = time.monotonic()
  cli = subprocess.Popen(
      [sys.executable, "-m", "pipeline", "--streaming", "--input", path,
       *STREAM_ARGS, "--output", str(out), "--runner", "FlinkRunner",
       "--environment_type", "LOOPBACK", "--checkpointing_interval",
       str(CHECKPOINT_MS)], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
      stderr=subprocess.STDOUT, start_new_session=True)
  try:
    first = wait_for_rows(out / "verdicts", len(direct), 300,
                          alive=lambda: cli.poll() is None, hold_s=HOLD_S)
  finally:
    log.close()
    if cli.poll() is None:
      os.killpg(cli.pid, signal.SIGTERM)
    left = services.wait_group_gone(cli.pid, 30)
    if left:
      os.killpg(cli.pid, signal.SIGKILL)
    cli.wait()
  rows = read_rows(out / "verdicts")
  assert sorted(r["id"] for r in rows) == sorted(direct)
  assert _verdicts(out) == direct
  kept = sorted(i for i, (v, _) in direct.items() if v == "kept")
  assert sorted(r["id"] for r in read_rows(out / "deduped")) == kept
  assert left == [] and _job_server_pids(jar) - before == set()
  print(f"\ncheckpointed embedded Flink: {len(direct)} docs, every verdict"
        f" {first:.1f} s after the CLI started (checkpoint every"
        f" {CHECKPOINT_MS} ms)")
