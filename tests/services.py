"""Processes that tests start (job servers, worker pools, emulators, a Flink
session cluster): each in its own process group, logging to a file, and
stopped by that group's id, also when the test fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence

import yaml

STOP_TIMEOUT_S = 10


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def free_ports(count: int) -> List[int]:
  """``count`` distinct free ports (each held while the next is chosen)."""
  held = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      held.append(s)
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in held]
  finally:
    for s in held:
      s.close()


def group_members(pgid: int) -> List[int]:
  """The live (not zombie) processes of group ``pgid``."""
  members = []
  for name in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{name}/stat", encoding="utf-8") as f:
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and ")".
        state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
    except (OSError, ValueError):
      continue
    if int(pgrp) == pgid and state != "Z":
      members.append(int(name))
  return members


def wait_group_gone(pgid: int, timeout_s: float = STOP_TIMEOUT_S) -> List[int]:
  """Waits for group ``pgid`` to empty (its leader's children die after it);
  returns the processes still left after ``timeout_s``."""
  deadline = time.monotonic() + timeout_s
  while group_members(pgid) and time.monotonic() < deadline:
    time.sleep(0.2)
  return group_members(pgid)


def rss_mib(pid: int) -> float:
  """Process ``pid``'s resident set in MiB (``ps -o rss``'s figure)."""
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise ValueError(f"no VmRSS for pid {pid}")


def python_worker_env(root: str) -> Dict[str, str]:
  """The environment of a Beam worker pool whose workers (it starts them as
  plain ``python``) are this interpreter and import ``root``'s code."""
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (root, env.get("PYTHONPATH")) if p)
  return env


def worker_pool(root: str, log_dir: str,
                state_cache_mb: Optional[int] = None) -> "Service":
  """The project's SDK worker pool (``--environment_type EXTERNAL``;
  ``python -m pipeline.worker_pool``: Beam's, with the state cache on) on a
  free port, its workers this interpreter with ``root``'s code; the caller
  waits for it to listen and stops it. ``state_cache_mb``: the workers'
  state cache (default: the pool's)."""
  port = free_port()
  cache = ([] if state_cache_mb is None
           else ["--state_cache_mb", str(state_cache_mb)])
  return Service(
      "sdk-worker-pool",
      [sys.executable, "-m", "pipeline.worker_pool", "--service_port",
       str(port), *cache], port, log_dir,
      env=python_worker_env(root), cwd=root)


class Service:
  """``command`` as a subprocess that is to listen on 127.0.0.1:``port``."""

  def __init__(self, name: str, command: List[str], port: int, log_dir: str,
               env: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None):
    self.name = name
    self.port = port
    self.log_path = os.path.join(log_dir, f"{name}.log")
    with open(self.log_path, "wb") as log:
      self.proc = subprocess.Popen(
          command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
          stderr=subprocess.STDOUT, start_new_session=True)

  def log_tail(self, chars: int = 3000) -> str:
    """The last ``chars`` characters of the service's log."""
    with open(self.log_path, encoding="utf-8", errors="replace") as f:
      return f"--- {self.name} log ---\n" + f.read()[-chars:]

  def wait_listening(self, timeout_s: float) -> "Service":
    """Returns once the port accepts connections; stops the service and
    raises if it exits or does not listen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"{self.name} exited with {self.proc.returncode}"
                           f"\n{self.log_tail()}")
      try:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
          return self
      except OSError:
        time.sleep(0.2)
    self.stop()
    raise TimeoutError(f"{self.name} not listening on port {self.port} after"
                       f" {timeout_s}s\n{self.log_tail()}")

  def stop(self) -> None:
    """Terminates the service and whatever it started (its group)."""
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        os.killpg(self.proc.pid, 9)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
      except ProcessLookupError:
        pass
    else:
      # The group may outlive its leader (a worker it spawned).
      try:
        os.killpg(self.proc.pid, 9)
      except (ProcessLookupError, PermissionError):
        pass


def _flattened(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flattened(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


class FlinkSessionCluster:
  """A standalone Flink session cluster of ``flink_home`` on this machine:
  one JobManager and one TaskManager of ``slots`` slots, each its
  ``bin/*.sh start-foreground`` as a Service (the scripts exec the JVM, so a
  Service's pid is its JVM's), on free ports.

  Its FLINK_CONF_DIR, lib folder (the distribution's jars and ``lib_jars``),
  logs, pid files and temporary files are under ``work_dir``; its
  config.yaml (what Flink 1.19's distribution holds; older ones read
  flink-conf.yaml) is the distribution's with the ports, those folders and
  ``settings`` on top, and ``taskmanager_settings`` on top of that for the
  TaskManager alone. ``stop()``, also on leaving a ``with`` block, stops both
  JVMs by their groups.
  """

  def __init__(self, flink_home: str, work_dir: str, slots: int,
               settings: Dict[str, object], lib_jars: Sequence[str] = (),
               taskmanager_settings: Optional[Dict[str, object]] = None):
    self.flink_home = flink_home
    self.slots = slots
    self.log_dir = os.path.join(work_dir, "log")
    conf_dir = os.path.join(work_dir, "conf")
    lib_dir = os.path.join(work_dir, "lib")
    tmp_dir = os.path.join(work_dir, "tmp")
    os.makedirs(self.log_dir)
    os.makedirs(lib_dir)
    os.makedirs(tmp_dir)
    dist_lib = os.path.join(flink_home, "lib")
    for jar in [*(os.path.join(dist_lib, n) for n in os.listdir(dist_lib)),
                *lib_jars]:
      os.symlink(jar, os.path.join(lib_dir, os.path.basename(jar)))
    shutil.copytree(os.path.join(flink_home, "conf"), conf_dir)
    with open(os.path.join(conf_dir, "config.yaml"), encoding="utf-8") as f:
      config = _flattened(yaml.safe_load(f))
    self.rest_port, rpc_port, tm_rpc_port = free_ports(3)
    config.update({
        "rest.port": self.rest_port, "jobmanager.rpc.port": rpc_port,
        "taskmanager.rpc.port": tm_rpc_port,
        "taskmanager.numberOfTaskSlots": slots,
        "io.tmp.dirs": tmp_dir, "web.tmpdir": tmp_dir, **settings})
    with open(os.path.join(conf_dir, "config.yaml"), "w",
              encoding="utf-8") as f:
      yaml.safe_dump(config, f, width=float("inf"))
    self._env = dict(os.environ, FLINK_HOME=flink_home,
                     FLINK_CONF_DIR=conf_dir, FLINK_LIB_DIR=lib_dir,
                     FLINK_LOG_DIR=self.log_dir, FLINK_PID_DIR=work_dir)
    # bin/config.sh would take these from the environment over FLINK_HOME's.
    for name in ("FLINK_OPT_DIR", "FLINK_PLUGINS_DIR"):
      self._env.pop(name, None)
    self._tm_args = [arg for key, value in (taskmanager_settings or {}).items()
                     for arg in ("-D", f"{key}={value}")]
    self._tm_rpc_port = tm_rpc_port
    self.jobmanager: Optional[Service] = None
    self.taskmanager: Optional[Service] = None
    # Every TaskManager started, the killed ones too (so stop() and the
    # tests' checks reach each group).
    self.all_taskmanagers: List[Service] = []
    self.startup_s: Optional[float] = None

  def _script(self, name: str, *args: str) -> List[str]:
    return [os.path.join(self.flink_home, "bin", name), "start-foreground",
            *args]

  def start(self, timeout_s: float) -> "FlinkSessionCluster":
    """Returns once the TaskManager's slots are registered with the
    JobManager; stops both and raises if that takes over ``timeout_s``."""
    began = time.monotonic()
    try:
      self.jobmanager = Service("jobmanager", self._script("jobmanager.sh"),
                                self.rest_port, self.log_dir, env=self._env)
      self.taskmanager = self._new_taskmanager()
      self.jobmanager.wait_listening(timeout_s)
      self.taskmanager.wait_listening(timeout_s - (time.monotonic() - began))
      self._wait_until(lambda: self._slots() >= self.slots,
                       (self.jobmanager, self.taskmanager), began, timeout_s,
                       f"no {self.slots} slots")
    except BaseException:
      self.stop()
      raise
    self.startup_s = time.monotonic() - began
    return self

  def _new_taskmanager(self) -> Service:
    count = len(self.all_taskmanagers)
    port, args = self._tm_rpc_port, list(self._tm_args)
    if count:
      # A replacement listens on a port of its own: the JobManager's Pekko
      # holds the killed one's address as a read-only association and
      # discards every message from it, so a TaskManager reusing that
      # port never registers (seen in CI: "Discarding inbound message ...
      # in read-only association", 120 s without registering).
      port = free_port()
      args += ["-D", f"taskmanager.rpc.port={port}"]
    service = Service(
        "taskmanager" if count == 0 else f"taskmanager-{count + 1}",
        self._script("taskmanager.sh", *args), port, self.log_dir,
        env=self._env)
    self.all_taskmanagers.append(service)
    return service

  def kill_taskmanager(self) -> None:
    """SIGKILLs the TaskManager's process group (a crash, no shutdown) and
    waits for the group to be gone."""
    service = self.taskmanager
    try:
      os.killpg(service.proc.pid, 9)
    except ProcessLookupError:
      pass
    service.proc.wait(timeout=STOP_TIMEOUT_S)
    wait_group_gone(service.proc.pid)

  def start_taskmanager(self, timeout_s: float) -> "FlinkSessionCluster":
    """Starts a new TaskManager with the same conf (after
    ``kill_taskmanager``); returns once the JobManager lists a TaskManager
    it did not list before (a killed one stays listed until its heartbeats
    time out)."""
    began = time.monotonic()
    known = self._taskmanager_ids()
    self.taskmanager = self._new_taskmanager()
    try:
      self.taskmanager.wait_listening(timeout_s)
      self._wait_until(lambda: bool(self._taskmanager_ids() - known),
                       (self.taskmanager,), began, timeout_s,
                       f"{self.taskmanager.name} not registered")
    except BaseException:
      self.stop()
      raise
    return self

  def _wait_until(self, done, services, began: float, timeout_s: float,
                  what: str) -> None:
    """Polls ``done()`` until true; raises if one of ``services`` exits or
    ``timeout_s`` passes from ``began`` (``what`` says what was missing)."""
    while not done():
      for service in services:
        if service.proc.poll() is not None:
          raise RuntimeError(f"{service.name} exited with"
                             f" {service.proc.returncode}"
                             f"\n{service.log_tail()}")
      if time.monotonic() - began > timeout_s:
        raise TimeoutError(f"{what} after {timeout_s}s\n"
                           f"{services[-1].log_tail()}")
      time.sleep(0.2)

  def _taskmanager_ids(self) -> set:
    """The ids of the TaskManagers the JobManager lists."""
    try:
      return {m["id"] for m in self.rest("/taskmanagers")["taskmanagers"]}
    except urllib.error.HTTPError:
      return set()

  def _slots(self) -> int:
    try:
      return self.rest("/overview")["slots-total"]
    except urllib.error.HTTPError:
      return 0  # 503 while the JobManager elects its dispatcher

  def rest(self, path: str) -> dict:
    """GET ``path`` of the JobManager's REST API, as JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}",
                                timeout=30) as response:
      return json.load(response)

  def cancel_job(self, jid: str) -> None:
    """Cancels job ``jid`` (``PATCH /jobs/<id>?mode=cancel``: Beam's own
    cancel of a portable job reports CANCELLED and leaves the Flink job
    running) and waits until Flink reports it CANCELED."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{self.rest_port}/jobs/{jid}?mode=cancel",
        method="PATCH")
    with urllib.request.urlopen(request, timeout=30):
      pass
    deadline = time.monotonic() + 60
    while self.rest(f"/jobs/{jid}")["state"] not in ("CANCELED", "FAILED"):
      if time.monotonic() > deadline:
        raise TimeoutError(f"job {jid} not cancelled after 60 s")
      time.sleep(0.2)

  def log_tails(self) -> str:
    """The ends of both JVMs' logs."""
    return "\n".join(s.log_tail()
                     for s in (self.jobmanager, *self.all_taskmanagers)
                     if s is not None)

  def stop(self) -> None:
    """Stops the TaskManager, then the JobManager, each by its group."""
    for service in (*self.all_taskmanagers, self.jobmanager):
      if service is not None:
        service.stop()

  def __enter__(self) -> "FlinkSessionCluster":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()
