"""``python -m pipeline.worker_pool``: Beam's SDK worker pool with the
workers' state cache on, stopped with the workers it started; and
:mod:`pipeline.sdk_worker`'s sizing of cache entries, equal to Beam's."""

import os
import signal
import subprocess
import sys
import time
import types

import grpc
import numpy as np
import pytest
from apache_beam.portability.api import (beam_fn_api_pb2,
                                         beam_fn_api_pb2_grpc, endpoints_pb2)
from apache_beam.runners.worker import statecache
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import sdk_worker, worker_pool
from tests import services

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("argv, message", [
    (["--service_port", "70000"], "--service_port must be 0..65535"),
    (["--service_port", "5", "--state_cache_mb", "-1"],
     "--state_cache_mb must be >= 0"),
])
def test_bad_flags_say_how_to_fix_them(argv, message, capsys):
  with pytest.raises(SystemExit) as exited:
    worker_pool.parse_args(argv)
  assert exited.value.code == 2
  assert message in capsys.readouterr().err


@pytest.mark.parametrize("memory_gb, cpus, mb", [
    (24, 2, 3072),     # this 2-core machine: a quarter over two workers
    (64, 16, 1024),
    (2, 16, 100),      # never below Beam's 100 MB
    (8, 0, 2048),      # no CPU count: one worker
])
def test_default_cache_is_a_quarter_of_memory_per_cpu(memory_gb, cpus, mb):
  assert worker_pool.default_state_cache_mb(memory_gb << 30, cpus) == mb


@pytest.mark.parametrize("limit, expected_gb", [
    ("2147483648\n", 2),   # a container's limit below the machine's memory
    ("max\n", None),       # cgroup v2 without a limit: the machine's
])
def test_machine_memory_honours_the_container_limit(limit, expected_gb,
                                                    tmp_path, monkeypatch):
  path = tmp_path / "memory.max"
  path.write_text(limit)
  monkeypatch.setattr(worker_pool, "CGROUP_MEMORY_LIMITS",
                      (str(path), str(tmp_path / "absent")))
  physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  assert worker_pool.machine_memory_bytes() == (
      physical if expected_gb is None else min(physical, expected_gb << 30))


def test_default_flag_sizes_the_cache_to_this_machine():
  expected = worker_pool.default_state_cache_mb(
      worker_pool.machine_memory_bytes(), len(os.sched_getaffinity(0)))
  assert worker_pool.parse_args(["--service_port", "1"]).state_cache_mb == (
      expected)
  assert worker_pool.parse_args(
      ["--service_port", "1", "--state_cache_mb", "0"]).state_cache_mb == 0


def _cmdline(pid: int) -> str:
  with open(f"/proc/{pid}/cmdline", "rb") as f:
    return f.read().replace(b"\0", b" ").decode()


def _children(pid: int):
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat", encoding="ascii") as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      if int(fields[1]) == pid and fields[0] != "Z":
        found.append(int(entry))
  return found


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


@pytest.mark.parametrize("cache_mb", [None, 7])
def test_workers_get_the_state_cache_and_stop_with_the_pool(tmp_path,
                                                             cache_mb):
  pool = services.worker_pool(ROOT, str(tmp_path), cache_mb)
  try:
    pool.wait_listening(60)
    endpoint = f"localhost:{services.free_port()}"
    with grpc.insecure_channel(f"localhost:{pool.port}") as channel:
      # No runner listens at the control endpoint: the worker waits for it,
      # long enough to be seen.
      answer = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(
          channel).StartWorker(beam_fn_api_pb2.StartWorkerRequest(
              worker_id="w-1", control_endpoint=endpoints_pb2.
              ApiServiceDescriptor(url=endpoint)))
    assert answer.error == ""
    deadline = time.monotonic() + 30
    while not _children(pool.proc.pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    (worker,) = _children(pool.proc.pid)
    expected = (cache_mb if cache_mb is not None else worker_pool.parse_args(
        ["--service_port", "1"]).state_cache_mb) << 20
    assert _cmdline(worker).endswith(
        f" -m pipeline.sdk_worker --control_endpoint {endpoint} --worker_id"
        f" w-1 --state_cache_bytes {expected} ")
    # SIGTERM to the pool alone (not its group): it stops its worker.
    os.kill(pool.proc.pid, signal.SIGTERM)
    assert pool.proc.wait(30) == 0
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _alive(worker)
  finally:
    pool.stop()
  assert services.wait_group_gone(pool.proc.pid) == []


def test_help_names_the_cache_flag():
  done = subprocess.run([sys.executable, "-m", "pipeline.worker_pool",
                         "--help"], cwd=ROOT, capture_output=True, text=True,
                        check=False, timeout=60)
  assert done.returncode == 0
  assert "--state_cache_mb" in done.stdout


# ------------------------------------------------- the state cache's sizing

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=50) | st.binary(max_size=200),
    lambda inner: st.lists(inner, max_size=6) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_fast_sizing_weighs_as_beams_state_cache(value):
  fast = sdk_worker.fast_deep_size(sdk_worker.beam_sizing_settings())
  assert fast(value) == statecache.get_deep_size(value)
  assert fast([value]) == statecache.get_deep_size([value])


def test_fast_sizing_excludes_module_globals_loaded_after_its_first_call():
  fast = sdk_worker.fast_deep_size(sdk_worker.beam_sizing_settings())
  values = [[np.arange(100)], [b"x" * 1000, "y"], [vars(os)], []]
  assert [fast(v) for v in values] == [
      statecache.get_deep_size(v) for v in values]
  # A module imported after the first call: its globals are excluded too.
  fresh = types.ModuleType("neardup_sizing_probe")
  fresh.big = b"z" * 100_000
  sys.modules[fresh.__name__] = fresh
  try:
    holder = [vars(fresh)]
    assert fast(holder) == statecache.get_deep_size(holder)
    assert fast(holder) < 1000
  finally:
    del sys.modules[fresh.__name__]
  # Once it is unloaded, its globals are counted again, as Beam counts them.
  assert fast(holder) == statecache.get_deep_size(holder) > 100_000


def test_installed_sizing_is_what_the_state_cache_uses():
  original = statecache.get_deep_size
  try:
    sdk_worker.install_fast_sizing()
    assert statecache.get_deep_size is not original
    cache = statecache.StateCache(1 << 20)
    cache.put("k", [b"x" * 5000])
    # pylint: disable=protected-access
    assert cache._current_weight == original([b"x" * 5000])
  finally:
    statecache.get_deep_size = original


def test_sdk_worker_flags():
  with pytest.raises(SystemExit):
    sdk_worker.parse_args(["--control_endpoint", "h:1", "--worker_id", "w",
                           "--state_cache_bytes", "-5"])
  args = sdk_worker.parse_args(["--control_endpoint", "h:1", "--worker_id",
                                "w"])
  assert args.state_cache_bytes == 0
