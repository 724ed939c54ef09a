"""Where the local engines are: Beam's Prism runner built by
``scripts/install_prism.sh`` at the pinned Beam version, and the Flink job
server (and Flink distribution and submission jar) that
``scripts/install_flink.sh`` assembles at the versions of
``templates/flink/versions.env``.

Nothing here downloads anything: a missing engine is reported with the
command that installs it.
"""

from __future__ import annotations

import os
import zipfile
from typing import List, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import (FlinkRunnerOptions,
                                                  PipelineOptions,
                                                  StandardOptions)

BEAM_VERSION = beam.__version__
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL_PRISM = "scripts/install_prism.sh"
INSTALL_FLINK = "scripts/install_flink.sh"
# What configure_flink sets --runner to: Beam's FlinkRunner, polling an
# uber-jar job's state at least every 3 s.
FLINK_RUNNER = "pipeline.flink_runner.FlinkRunner"
FLINK_VERSIONS_FILE = os.path.join(ROOT, "templates", "flink", "versions.env")


def engines_cache() -> str:
  """The cache folder the install scripts write to (same rule as theirs)."""
  explicit = os.environ.get("NEARDUP_ENGINES_CACHE")
  if explicit:
    return explicit
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "neardup-engines")


def prism_path() -> str:
  """Where ``scripts/install_prism.sh`` puts Prism for this Beam version."""
  return os.path.join(engines_cache(), "prism", f"v{BEAM_VERSION}", "prism")


def find_prism() -> Optional[str]:
  """The cached Prism binary for the installed Beam version, or None."""
  path = prism_path()
  return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def missing_prism_reason() -> str:
  """Why Prism cannot be used here, naming the script that fixes it."""
  return (f"Prism for Beam {BEAM_VERSION} is not installed at {prism_path()};"
          f" run {INSTALL_PRISM} (needs Go) to build it")


def flink_versions() -> dict:
  """``templates/flink/versions.env`` as a dict (BEAM_FLINK_RUNNER, FLINK)."""
  out = {}
  with open(FLINK_VERSIONS_FILE, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line and not line.startswith("#") and "=" in line:
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
  return out


def flink_minor() -> str:
  """The Flink ``major.minor`` the pinned runner is built for (1.19)."""
  return flink_versions()["FLINK"].rsplit(".", 1)[0]


def flink_job_server_path() -> str:
  """Where ``scripts/install_flink.sh`` puts the job server's thin jar."""
  runner = flink_versions()["BEAM_FLINK_RUNNER"]
  return os.path.join(engines_cache(), "flink",
                      f"beam-{runner}-flink-{flink_minor()}",
                      "beam-flink-job-server.jar")


def find_flink_job_server() -> Optional[str]:
  """The cached Flink job-server jar, or None."""
  path = flink_job_server_path()
  return path if os.path.isfile(path) else None


def flink_submit_jar_path() -> str:
  """Where ``scripts/install_flink.sh cluster`` puts the submission jar: the
  base of ``--flink_submit_uber_jar``, naming the job server's jars by
  absolute URL (so a cluster that sees this cache loads them from there)."""
  return os.path.join(os.path.dirname(flink_job_server_path()),
                      "beam-flink-submit.jar")


def find_flink_submit_jar() -> Optional[str]:
  """The cached submission jar, or None."""
  path = flink_submit_jar_path()
  return path if os.path.isfile(path) else None


def flink_taskmanager_jars() -> List[str]:
  """The cached job server's jars that a TaskManager's lib/ takes so that it
  loads Beam's runner itself: all but Flink's own (its distribution has every
  class of them) and slf4j's (Flink binds slf4j to log4j). Loaded so (with
  ``classloader.resolve-order: parent-first``), an SDK environment outlives
  its task for ``--environment_cache_millis``; loaded from the job's jar, the
  runner starts one per task."""
  jars = os.path.join(os.path.dirname(flink_job_server_path()), "jars")
  return [os.path.join(jars, name) for name in sorted(os.listdir(jars))
          if name.endswith(".jar")
          and not name.startswith(("flink-", "slf4j-"))]


def kafka_io_path() -> str:
  """Where ``scripts/install_flink.sh kafka`` puts Beam's KafkaIO jars."""
  runner = flink_versions()["BEAM_FLINK_RUNNER"]
  return os.path.join(engines_cache(), "flink", f"beam-{runner}-kafka-io")


def kafka_expansion_jar_path() -> str:
  """The expansion service's thin jar (Beam's ExpansionService with KafkaIO
  on its classpath)."""
  return os.path.join(kafka_io_path(), "beam-kafka-expansion-service.jar")


def kafka_job_server_path() -> str:
  """The Flink job server's thin jar with KafkaIO's jars added, so that
  Flink runs KafkaIO's Java steps in its embedded Java harness."""
  return os.path.join(kafka_io_path(), "beam-flink-job-server-kafka.jar")


def kafka_submit_jar_path() -> str:
  """The submission jar of Kafka jobs (``--flink_submit_uber_jar``): the Kafka
  job server's jars by absolute URL, as :func:`flink_submit_jar_path`'s."""
  return os.path.join(kafka_io_path(), "beam-flink-submit-kafka.jar")


def kafka_taskmanager_jars() -> List[str]:
  """KafkaIO's jars that the job server lacks: what a TaskManager's lib/
  takes besides :func:`flink_taskmanager_jars` to run a Kafka job's Java
  steps (the Kafka job server's own Class-Path entries under ``jars/``)."""
  with zipfile.ZipFile(kafka_job_server_path()) as jar:
    text = jar.read("META-INF/MANIFEST.MF").decode("utf-8")
  # A manifest's continuation lines start with one space.
  text = text.replace("\r\n", "\n").replace("\n ", "")
  class_path = next(line.split(": ", 1)[1] for line in text.splitlines()
                    if line.startswith("Class-Path: "))
  return [os.path.join(kafka_io_path(), entry)
          for entry in class_path.split() if entry.startswith("jars/")]


def kafka_broker_jars() -> str:
  """The folder of the Kafka broker's jars (``scripts/kafka.sh`` runs
  them)."""
  return os.path.join(engines_cache(), "kafka",
                      f"kafka-{flink_versions()['KAFKA_BROKER']}", "jars")


def missing_kafka_reason() -> str:
  """Why Kafka I/O cannot be used here, naming the script that fixes it;
  empty when it can."""
  if all(os.path.isfile(p) for p in (kafka_expansion_jar_path(),
                                     kafka_job_server_path(),
                                     kafka_submit_jar_path())):
    return ""
  return (f"Beam's KafkaIO is not installed at {kafka_io_path()}; run"
          f" {INSTALL_FLINK} kafka (needs Java and Maven)")


def kafka_expansion_service(address: Optional[str] = None):
  """What expands KafkaIO: the service at ``address`` (host:port) when
  given, else one that Beam starts from the cached jar for the job and
  stops after it, with Java class lookup allowed, an EMBEDDED environment
  (Flink runs the Java steps in its own JVM) and ``use_deprecated_read``
  (without it on the expansion service, measured: a streaming read on Flink
  advanced its offsets and emitted nothing).

  Raises:
    ValueError: no address is given and the jar is not installed.
  """
  if address:
    return address
  reason = missing_kafka_reason()
  if reason:
    raise ValueError(f"Kafka I/O: {reason}, or pass --expansion_service"
                     " host:port.")
  # pylint: disable=import-outside-toplevel
  from apache_beam.transforms.external import JavaJarExpansionService
  return JavaJarExpansionService(
      kafka_expansion_jar_path(),
      extra_args=["{{PORT}}", "--javaClassLookupAllowlistFile=*",
                  "--defaultEnvironmentType=EMBEDDED",
                  "--experiments=use_deprecated_read"])


def flink_home_path() -> str:
  """Where ``scripts/install_flink.sh cluster`` assembles Flink."""
  return os.path.join(engines_cache(), "flink",
                      f"flink-{flink_versions()['FLINK']}")


def find_flink_home() -> Optional[str]:
  """The cached Flink distribution (its FLINK_HOME), or None."""
  path = flink_home_path()
  return path if os.access(os.path.join(path, "bin", "jobmanager.sh"),
                           os.X_OK) else None


def missing_flink_reason(cluster: bool = False) -> str:
  """Why Flink (``cluster``: its distribution and submission jar) cannot be
  used here, naming the script that fixes it."""
  if cluster:
    return (f"the Flink cluster files are not installed ({flink_home_path()},"
            f" {flink_submit_jar_path()}); run {INSTALL_FLINK} cluster (needs"
            " Java, Maven and pip)")
  return (f"the Flink job server is not installed at"
          f" {flink_job_server_path()}; run {INSTALL_FLINK} (needs Java and"
          " Maven)")


def configure_flink(opts: PipelineOptions, kafka: bool = False) -> None:
  """Points FlinkRunner at the cached job server (with
  ``--flink_submit_uber_jar``: the cached submission jar; with ``kafka``:
  the job server or submission jar that runs KafkaIO) and its Flink
  version, and sets the
  runner to ``FLINK_RUNNER`` (Beam's FlinkRunner, seeing an uber-jar job's
  end within 3 s).

  Raises:
    ValueError: no such jar is given or cached, or --flink_version
      differs from the cached jars' Flink.
  """
  # Imported by Beam only when the job is built.
  opts.view_as(StandardOptions).runner = FLINK_RUNNER
  flink = opts.view_as(FlinkRunnerOptions)
  uber = flink.flink_submit_uber_jar
  if kafka and not flink.flink_job_server_jar:
    reason = missing_kafka_reason()
    if reason:
      raise ValueError(f"--runner FlinkRunner with Kafka: {reason}, or pass"
                       " --flink_job_server_jar.")
    flink.flink_job_server_jar = (kafka_submit_jar_path() if uber
                                  else kafka_job_server_path())
  if not flink.flink_job_server_jar:
    flink.flink_job_server_jar = (find_flink_submit_jar() if uber
                                  else find_flink_job_server())
    if flink.flink_job_server_jar is None:
      flag = "--flink_submit_uber_jar" if uber else "--runner FlinkRunner"
      raise ValueError(f"{flag}: {missing_flink_reason(cluster=uber)}"
                       ", or pass --flink_job_server_jar.")
  minor = flink_minor()
  given = opts.get_all_options(drop_default=True).get("flink_version")
  # Also an explicit --flink_job_server_jar that is an installed one.
  if (given is not None and given != minor
      and flink.flink_job_server_jar in (find_flink_job_server(),
                                         find_flink_submit_jar(),
                                         kafka_job_server_path(),
                                         kafka_submit_jar_path())):
    raise ValueError(
        f"--flink_version {given}: the installed job server"
        f" ({flink_job_server_path()}) runs Flink {minor}; drop the"
        " flag, or pass --flink_job_server_jar for that Flink")
  if given is None:
    flink.flink_version = minor
