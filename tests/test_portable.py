"""The batch job gives byte-identical outputs on the portable path.

Runs ``pipeline.cli.main`` three ways on one small corpus and compares whole
output trees: in-process (the default FnApiRunner), FnApiRunner with two
worker processes, and the PortableRunner against Beam's local job service
with an EXTERNAL worker pool. The last is the same submission path as Flink
(job service + SDK harness outside the runner), offline and on 127.0.0.1.
"""

import os
import sys
import threading

import pytest

from pipeline.cli import main
from tests.corpus import seed_corpus, stats_of, tree_bytes, write_jsonl
from tests.services import Service, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED_ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold",
             "0.4"]
START_TIMEOUT_S = 60
JOB_TIMEOUT_S = 120


def worker_env() -> dict:
  """Environment in which spawned SDK workers import this repository's code
  with this interpreter (the worker pool starts them as plain ``python``)."""
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Two JSONL files (two writer groups) with planted near-duplicates."""
  texts, _ = seed_corpus(n_base=300, seed=3)
  folder = tmp_path_factory.mktemp("portable_corpus")
  half = len(texts) // 2
  write_jsonl(folder / "a.jsonl", texts[:half])
  write_jsonl(folder / "b.jsonl", texts[half:],
              ids=[f"b-{i}" for i in range(len(texts) - half)])
  return str(folder / "*.jsonl")


def run_bounded(argv, timeout_s=JOB_TIMEOUT_S) -> int:
  """``main(argv)`` in a daemon thread, so a job that never finishes (e.g.
  workers that never connect) fails the test instead of hanging it."""
  result = {}

  def target():
    try:
      result["code"] = main(argv)
    except BaseException as e:  # pylint: disable=broad-except
      result["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    raise TimeoutError(f"job did not finish within {timeout_s}s: {argv}")
  if "error" in result:
    raise result["error"]
  return result["code"]


def run_job(pattern, out, *extra) -> dict:
  code = run_bounded(["--input", pattern, "--output", str(out), *SEED_ARGS,
                      *extra])
  assert code == 0
  return tree_bytes(str(out))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("portable_ref") / "out"
  files = run_job(corpus, out)
  stats = stats_of(str(out))
  assert stats["clusters"] > 0 and stats["removed"] > 0
  assert any(name.startswith("clusters" + os.sep) for name in files)
  return files


@pytest.fixture(scope="module")
def portable_services(tmp_path_factory):
  """Local job service + external worker pool, both on 127.0.0.1."""
  log_dir = str(tmp_path_factory.mktemp("portable_logs"))
  job_port = free_port()
  pool_port = free_port()
  while pool_port == job_port:
    pool_port = free_port()
  services = []
  try:
    services.append(Service(
        "job_service",
        [sys.executable, "-m",
         "apache_beam.runners.portability.local_job_service_main",
         "--port", str(job_port)], job_port, log_dir, env=worker_env(),
        cwd=ROOT))
    services.append(Service(
        "worker_pool",
        [sys.executable, "-m", "pipeline.worker_pool", "--service_port",
         str(pool_port)], pool_port, log_dir,
        env=worker_env(), cwd=ROOT))
    for service in services:
      service.wait_listening(START_TIMEOUT_S)
    yield services
  finally:
    for service in services:
      service.stop()


def assert_same_tree(files, reference):
  assert sorted(files) == sorted(reference)
  differing = [name for name in reference if files[name] != reference[name]]
  assert not differing, f"outputs differ from the in-process run: {differing}"


def test_multiprocess_fnapi_matches_in_process(corpus, reference, tmp_path,
                                               monkeypatch):
  # Worker processes unpickle this repository's DoFns by module name.
  monkeypatch.chdir(ROOT)
  monkeypatch.setenv("PYTHONPATH", worker_env()["PYTHONPATH"])
  files = run_job(corpus, tmp_path / "out", "--direct_num_workers", "2",
                  "--direct_running_mode", "multi_processing")
  assert_same_tree(files, reference)


def test_portable_runner_external_pool_matches_in_process(
    corpus, reference, portable_services, tmp_path):
  job_service, pool = portable_services
  try:
    files = run_job(
        corpus, tmp_path / "out", "--runner", "PortableRunner",
        "--job_endpoint", f"localhost:{job_service.port}",
        "--environment_type", "EXTERNAL",
        "--environment_config", f"localhost:{pool.port}")
  except BaseException:
    print(job_service.log_tail(), pool.log_tail(), sep="\n")
    raise
  assert_same_tree(files, reference)
  assert stats_of(str(tmp_path / "out"))["clusters"] > 0
  # The job really ran in an SDK worker the external pool started.
  assert "started SDK worker" in pool.log_tail(chars=10**6), pool.log_tail()
