"""The SDK worker pool for ``--environment_type EXTERNAL``: Beam's worker
pool service, its SDK workers with the state cache on.

``python -m apache_beam.runners.worker.worker_pool_main`` (Beam 2.77) starts
every SDK worker with ``state_cache_size=0`` and has no flag to change it:
each read of a stateful DoFn's state is then a gRPC round trip to the
runner, even when the runner (Flink does) hands out cache tokens. Beam's
own ``sdk_worker_main`` (what the SDK container's boot runs) caches 100 MB
by default. This pool serves the same ``BeamFnExternalWorkerPool`` API and
starts each worker as :mod:`pipeline.sdk_worker` (Beam's SDK harness, its
cache entries sized cheaply) with a cache sized to the machine (a quarter
of its memory, or of the container's limit, shared by one worker per CPU);
the README's streaming benchmark has what each part changes on Flink.

  python -m pipeline.worker_pool --service_port 50000 [--state_cache_mb N]

SIGTERM or SIGINT stops the pool and every SDK worker it started.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures
from typing import Dict, List, Optional

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc

# Beam's sdk_worker_main default (--max_cache_memory_usage_mb): the least a
# worker gets.
MIN_STATE_CACHE_MB = 100
# The SDK workers' caches together take at most this share of the memory.
CACHE_SHARE = 4
# cgroup v2, then v1: a container's memory limit ("max" or a huge number
# when there is none).
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max",
                        "/sys/fs/cgroup/memory/memory.limit_in_bytes")
STOP_TIMEOUT_S = 10

_LOGGER = logging.getLogger(__name__)


def default_state_cache_mb(memory_bytes: int, cpus: int) -> int:
  """Each SDK worker's state cache: a quarter of ``memory_bytes`` shared by
  one worker per CPU, at least Beam's 100 MB.

  A cache smaller than the keyed state its worker serves misses on every
  read: the streaming graph's bucket shards (about 8 KB of state per kept
  document, README "Sizing state") are then fetched whole from the runner
  at every invocation. Measured on Flink, 100,000 documents: 100 MB per
  worker gave ~200 verdicts/s and a drain of more than 6 minutes after the
  last verdict; 1,500 MB gave 556 documents/s for the whole job.
  """
  return max(MIN_STATE_CACHE_MB,
             memory_bytes // (CACHE_SHARE * max(1, cpus)) >> 20)


def machine_memory_bytes() -> int:
  """Physical memory, or the container's (cgroup) limit when lower."""
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  for path in CGROUP_MEMORY_LIMITS:
    try:
      with open(path, encoding="ascii") as f:
        limit = f.read().strip()
    except OSError:
      continue
    if limit.isdigit():
      memory = min(memory, int(limit))
    break
  return memory


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
  """The pool's flags; errors say how to fix them."""
  parser = argparse.ArgumentParser(
      prog="python -m pipeline.worker_pool",
      description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--service_port", type=int, required=True,
                      help="port the pool listens on (the address in the"
                      " job's --environment_config)")
  parser.add_argument("--state_cache_mb", type=int, default=None,
                      help="state cache of each SDK worker, MB (0: off, as"
                      " Beam's worker_pool_main; default: a quarter of the"
                      " machine's or container's memory over its CPUs, at"
                      f" least {MIN_STATE_CACHE_MB}; size it to the keyed"
                      " state one worker serves)")
  args = parser.parse_args(argv)
  if not 0 <= args.service_port <= 65535:
    parser.error(f"--service_port must be 0..65535, got {args.service_port}")
  if args.state_cache_mb is None:
    args.state_cache_mb = default_state_cache_mb(
        machine_memory_bytes(), len(os.sched_getaffinity(0)))
  if args.state_cache_mb < 0:
    parser.error(f"--state_cache_mb must be >= 0 (0 turns the cache off),"
                 f" got {args.state_cache_mb}")
  return args


def worker_command(control_endpoint: str, worker_id: str,
                   state_cache_bytes: int) -> List[str]:
  """The command of one SDK worker: this interpreter running
  :mod:`pipeline.sdk_worker`."""
  return [sys.executable, "-m", "pipeline.sdk_worker", "--control_endpoint",
          control_endpoint, "--worker_id", worker_id, "--state_cache_bytes",
          str(state_cache_bytes)]


def _stop(proc: subprocess.Popen) -> None:
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


class WorkerPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
  """Starts and stops SDK worker processes for the runner's requests."""

  def __init__(self, state_cache_bytes: int):
    self._state_cache_bytes = state_cache_bytes
    self._workers: Dict[str, subprocess.Popen] = {}
    self._lock = threading.Lock()

  # pylint: disable=invalid-name  (gRPC method names)
  def StartWorker(self, request, unused_context):
    try:
      proc = subprocess.Popen(  # pylint: disable=consider-using-with
          worker_command(request.control_endpoint.url, request.worker_id,
                         self._state_cache_bytes), stdin=subprocess.DEVNULL)
    except OSError as err:
      return beam_fn_api_pb2.StartWorkerResponse(
          error=f"could not start SDK worker {request.worker_id}: {err}")
    with self._lock:
      old = self._workers.pop(request.worker_id, None)
      self._workers[request.worker_id] = proc
    if old is not None:
      _stop(old)
    _LOGGER.info("started SDK worker %s (pid %d)", request.worker_id,
                 proc.pid)
    return beam_fn_api_pb2.StartWorkerResponse()

  def StopWorker(self, request, unused_context):
    with self._lock:
      proc = self._workers.pop(request.worker_id, None)
    if proc is not None:
      _stop(proc)
    return beam_fn_api_pb2.StopWorkerResponse()

  def stop_all(self) -> None:
    """Stops every worker this pool started."""
    with self._lock:
      procs, self._workers = list(self._workers.values()), {}
    for proc in procs:
      _stop(proc)


def main(argv: Optional[List[str]] = None) -> int:
  """Serves until SIGTERM or SIGINT, then stops the SDK workers."""
  args = parse_args(argv)
  # Beam's import may have set up the root logger: this log is the pool's.
  logging.basicConfig(level=logging.INFO, force=True)
  pool = WorkerPool(args.state_cache_mb << 20)
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
  beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
      pool, server)
  port = server.add_insecure_port(f"[::]:{args.service_port}")
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  server.start()
  _LOGGER.info("SDK worker pool on port %d, state cache %d MB per worker",
               port, args.state_cache_mb)
  try:
    stop.wait()
  finally:
    server.stop(0)
    pool.stop_all()
  return 0


if __name__ == "__main__":
  sys.exit(main())
