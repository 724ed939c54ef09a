"""pipeline.flink_runner: Beam's FlinkRunner whose uber-jar jobs poll their
state at least every MAX_POLL_S (no JVM is started here; the session
cluster tests submit real jobs through it)."""

import itertools

from apache_beam.options.pipeline_options import (FlinkRunnerOptions,
                                                  PipelineOptions,
                                                  StandardOptions)
from apache_beam.portability.api import beam_job_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability import flink_runner as beam_flink
from apache_beam.runners.portability import flink_uber_jar_job_server
from apache_beam.runners.runner import create_runner
from google.protobuf import struct_pb2

from pipeline import engines, flink_runner
from pipeline.options import DedupOptions

JobState = beam_job_api_pb2.JobState


def test_poll_delays_grow_from_the_first_to_the_cap_and_stay_there():
  delays = list(itertools.islice(flink_runner.poll_delays(), 40))
  assert delays[0] == flink_runner.FIRST_POLL_S
  assert all(b == min(flink_runner.MAX_POLL_S, a * flink_runner.POLL_GROWTH)
             for a, b in zip(delays, delays[1:]))
  assert max(delays) == delays[-1] == flink_runner.MAX_POLL_S
  # Beam's own schedule (1 s, then 1.2 times longer up to 60 s) sleeps
  # 44.6 s across its first 13 polls; this one at most MAX_POLL_S each.
  assert sum(delays[:13]) < 13 * flink_runner.MAX_POLL_S < 44.6


def test_job_state_stream_polls_at_poll_delays_until_a_terminal_state(
    monkeypatch):
  job = flink_runner._PolledFlinkJob(  # pylint: disable=protected-access
      "http://localhost:1", "unused.jar", "job", "name",
      beam_runner_api_pb2.Pipeline(), struct_pb2.Struct())
  states = iter([JobState.RUNNING] * 6 + [JobState.DONE, JobState.RUNNING])
  slept = []
  monkeypatch.setattr(job, "get_state", lambda: (next(states), None))
  monkeypatch.setattr(flink_runner.time, "sleep", slept.append)
  seen = [state for state, _ in job.get_state_stream()]
  # The recorded history (STOPPED) first, then each poll until DONE.
  assert seen == [JobState.STOPPED] + [JobState.RUNNING] * 6 + [JobState.DONE]
  assert slept == list(itertools.islice(flink_runner.poll_delays(), 6))


def _flink_options(jar, *extra):
  jar.write_bytes(b"")
  return PipelineOptions(["--runner", "FlinkRunner", "--flink_job_server_jar",
                          str(jar), *extra])


def test_beam_resolves_the_configured_runner_to_the_polled_flink_runner():
  runner = create_runner(engines.FLINK_RUNNER)
  assert isinstance(runner, flink_runner.FlinkRunner)
  assert isinstance(runner, beam_flink.FlinkRunner)


def test_uber_jar_submission_to_a_remote_master_gets_the_polled_server(
    tmp_path):
  options = _flink_options(tmp_path / "submit.jar", "--flink_master", "localhost:8081",
                           "--flink_submit_uber_jar")
  server = flink_runner.FlinkRunner().default_job_server(options)
  assert isinstance(server, flink_runner._PolledUberJarJobServer)  # pylint: disable=protected-access
  job = server.create_beam_job("id", "name", beam_runner_api_pb2.Pipeline(),
                               struct_pb2.Struct())
  assert isinstance(job, flink_runner._PolledFlinkJob)  # pylint: disable=protected-access
  # Beam's own rewrite of the master for the jar's main is kept.
  assert options.view_as(FlinkRunnerOptions).flink_master == "[auto]"


def test_other_flink_submissions_keep_beams_job_server(tmp_path):
  server = flink_runner.FlinkRunner().default_job_server(
      _flink_options(tmp_path / "server.jar", "--flink_master", "[local]"))
  assert not isinstance(server,
                        flink_uber_jar_job_server.FlinkUberJarJobServer)


def test_configure_flink_names_the_polled_runner(tmp_path):
  jar = tmp_path / "server.jar"
  jar.write_bytes(b"")
  opts = DedupOptions(["--input", "x", "--output", "y", "--runner",
                       "FlinkRunner", "--flink_job_server_jar", str(jar)])
  engines.configure_flink(opts)
  assert opts.view_as(StandardOptions).runner == engines.FLINK_RUNNER
  assert engines.FLINK_RUNNER.endswith(".FlinkRunner")
