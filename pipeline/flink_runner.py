"""Beam's FlinkRunner, with a job state that is polled often enough for a
batch CLI.

With ``--flink_submit_uber_jar`` Beam's client learns that a job ended by
polling Flink's REST API, sleeping 1 s and then 1.2 times longer after every
poll, up to 60 s: a job of 89 s ended 18 s before the CLI returned (measured
on the session cluster, 1M documents), and the sleeps keep growing with the
job. Here they grow from ``FIRST_POLL_S`` to at most ``MAX_POLL_S``.

Polling is not free: every state request about a running Beam job makes the
JobManager stringify the Beam metrics accumulators of all its tasks
(``SchedulerBase.requestJob``; Flink's ``/jobs/<id>/status`` and
``/jobs/overview`` take the same path), 0.15-0.3 s of JobManager CPU a
request on the batch job's 116 vertices (measured: 4 requests a second kept
0.6-0.76 of a core busy, none 0.05-0.19). A poll every ``I`` seconds of a
``T``-second job costs ``T / I`` such requests and up to ``I`` seconds of
waiting at its end; on 2 cores the two balance near ``I = 3`` s for a 90 s
job, hence ``MAX_POLL_S``. Everything else is Beam's.
``engines.configure_flink`` names this class as the runner, and Beam imports
it (and its REST client) only for a Flink job.
"""

from __future__ import annotations

import time

from apache_beam.runners.portability import flink_runner
from apache_beam.runners.portability import flink_uber_jar_job_server

FIRST_POLL_S = 0.5
MAX_POLL_S = 3.0
POLL_GROWTH = 1.2


def poll_delays():
  """The sleeps between two polls of a job's state: ``FIRST_POLL_S``, then
  ``POLL_GROWTH`` times longer each time, never over ``MAX_POLL_S``."""
  delay = FIRST_POLL_S
  while True:
    yield delay
    delay = min(MAX_POLL_S, delay * POLL_GROWTH)


class _PolledFlinkJob(flink_uber_jar_job_server.FlinkBeamJob):
  """An uber-jar job whose state stream polls at ``poll_delays()``."""

  def get_state_stream(self):
    def states():
      for delay in poll_delays():
        yield self.get_state()
        time.sleep(delay)

    for state, timestamp in self.with_state_history(states()):
      yield state, timestamp
      if self.is_terminal_state(state):
        break


class _PolledUberJarJobServer(flink_uber_jar_job_server.FlinkUberJarJobServer):
  """Beam's uber-jar job server, creating :class:`_PolledFlinkJob` jobs."""

  def create_beam_job(self, job_id, job_name, pipeline, options):
    return _PolledFlinkJob(self._master_url, self.executable_jar(), job_id,
                           job_name, pipeline, options,
                           artifact_port=self._artifact_port)


class FlinkRunner(flink_runner.FlinkRunner):
  """``--runner FlinkRunner`` as Beam's, whose uber-jar submissions (a remote
  ``--flink_master`` with ``--flink_submit_uber_jar``) see the job's end
  within ``MAX_POLL_S``."""

  def default_job_server(self, options):
    server = super().default_job_server(options)
    if type(server) is flink_uber_jar_job_server.FlinkUberJarJobServer:  # pylint: disable=unidiomatic-typecheck
      # Beam's server as Beam made it (it also rewrote --flink_master for the
      # jar's own use); the subclass only creates other jobs and has no
      # state of its own.
      server.__class__ = _PolledUberJarJobServer
    return server
