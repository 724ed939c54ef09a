"""Processes that tests start (job servers, worker pools, emulators): each in
its own process group, logging to a file, and stopped by that group's id,
also when the test fails."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Dict, List, Optional

STOP_TIMEOUT_S = 10


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


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
