"""Command line: ``python -m pipeline --input ... --output ...``."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (PipelineOptions,
                                                  PrismRunnerOptions,
                                                  StandardOptions)
from apache_beam.runners.runner import PipelineState

from pipeline import engines, graph
from pipeline.options import (REQUIRED_OPTIONS, DedupOptions,
                              config_from_options)
from transforms import metrics
from transforms.config import ConfigError
from transforms.documents import expand_inputs
from transforms.report import REPORT_HTML, REPORT_JSON, write_report_files
from transforms.write import (CLUSTERS_DIR, DEDUPED_DIR, REJECTED_DIR,
                              STATS_FILE, join_path)

# Measured faster than Prism here from 20 to 1M documents (README, "Local
# runners"); Prism is used when asked for, and by Beam's DirectRunner.
DEFAULT_RUNNER = "FnApiRunner"
PRISM_RUNNERS = ("PrismRunner", "DirectRunner")
_OUTPUTS = (DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR, STATS_FILE, REPORT_JSON,
            REPORT_HTML)


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the job; returns the process exit code (0 ok, 2 bad arguments)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  beam_args = [a for a in argv if a not in ("-h", "--help")]
  if PipelineOptions(beam_args).view_as(StandardOptions).streaming:
    from pipeline import streaming  # pylint: disable=import-outside-toplevel
    return streaming.main(argv)
  try:
    # The job's parser, not PipelineOptions': Beam's base parser knows none of
    # the job's flags, so its --help listed nothing.
    opts = DedupOptions(argv)
  except SystemExit as e:  # --help (0) or an invalid value/choice (2)
    return 0 if e.code is None else int(e.code)
  missing = [f"--{name}" for name in REQUIRED_OPTIONS
             if not getattr(opts, name)]
  if missing:
    print(f"error: {' and '.join(missing)} required; see --help.",
          file=sys.stderr)
    return 2
  try:
    choose_runner(opts)
    config = config_from_options(opts)
    patterns = [p.strip() for p in opts.input.split(",") if p.strip()]
    expand_inputs(patterns, opts.input_format)
    _prepare_output(opts.output, opts.overwrite)
  except (ConfigError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2

  show_progress()
  metrics.reset_progress()
  started = time.perf_counter()
  with beam.Pipeline(options=opts) as p:
    graph.build(p, patterns, opts.output, config, opts.input_format,
                opts.text_field, opts.id_field)
  if p.result.state == PipelineState.DONE:
    _add_wall_time(opts.output, time.perf_counter() - started)

  stats_path = join_path(opts.output, STATS_FILE)
  if FileSystems.exists(stats_path):
    with FileSystems.open(stats_path) as f:
      stats = json.loads(f.read())
    print(summary(stats))
    print(f"report: {join_path(opts.output, REPORT_HTML)}")
  return 0


def choose_runner(opts: PipelineOptions) -> str:
  """Sets the runner when none is given, and points Prism (also the one the
  stock DirectRunner tries first) at the binary ``scripts/install_prism.sh``
  cached, so that Beam never tries to download one. Returns the runner.

  Raises:
    ValueError: PrismRunner was asked for and no Prism binary is known.
  """
  standard = opts.view_as(StandardOptions)
  if standard.runner is None:
    standard.runner = DEFAULT_RUNNER
  runner = standard.runner.rsplit(".", 1)[-1]
  prism = opts.view_as(PrismRunnerOptions)
  if runner in PRISM_RUNNERS and not prism.prism_location:
    prism.prism_location = engines.find_prism()
    if prism.prism_location is None:
      if runner == "PrismRunner":
        raise ValueError(f"--runner PrismRunner: {engines.missing_prism_reason()}"
                         ", or pass --prism_location.")
      print(f"note: DirectRunner: {engines.missing_prism_reason()}; Beam will"
            " try to download Prism, then fall back to its in-process runner.",
            file=sys.stderr)
  if runner in PRISM_RUNNERS:
    # Beam logs every start and stop of the Prism subprocess as a warning.
    logging.getLogger("apache_beam.utils.subprocess_server").setLevel(
        logging.ERROR)
  return runner


class _StderrHandler(logging.StreamHandler):
  """Writes to the current ``sys.stderr``, even once it has been replaced."""

  def __init__(self):
    logging.Handler.__init__(self)  # pylint: disable=non-parent-init-called

  @property
  def stream(self):
    return sys.stderr


def show_progress() -> None:
  """Sends the job's progress lines (logger ``neardup``, INFO) to stderr,
  once, without raising Beam's own log level."""
  logger = logging.getLogger("neardup")
  if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s neardup %(message)s",
                                           "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


def _add_wall_time(output: str, seconds: float) -> None:
  """Adds the job's wall time to the finished job's report, re-rendered."""
  with FileSystems.open(join_path(output, REPORT_JSON)) as f:
    report = json.loads(f.read())
  report["wall_seconds"] = round(seconds, 3)
  write_report_files(output, report)


def _prepare_output(output: str, overwrite: bool) -> None:
  existing = [name for name in _OUTPUTS
              if FileSystems.exists(join_path(output, name))]
  if existing and not overwrite:
    raise ValueError(f"{output} already holds {existing}; pass --overwrite "
                     "true to replace them or choose another --output.")
  for name in existing:
    FileSystems.delete([join_path(output, name)])


def summary(stats: dict) -> str:
  p = stats["params"]
  return (f"docs in {stats['docs_in']:,}: kept {stats['kept']:,}, removed "
          f"{stats['removed']:,} as duplicates, rejected {stats['rejected']:,}"
          f"\nclusters {stats['clusters']:,}; candidate edges "
          f"{stats['candidate_edges']:,}, verified {stats['verified_edges']:,}"
          f" (removed {stats.get('verify_removed_edges', 0):,});"
          f" CC rounds used {stats['cc_rounds_used']}"
          f"\nparams: {p['shingle_unit']} {p['ngram']}-grams, K={p['num_perm']}"
          f", {p['bands']} bands x {p['rows']} rows (S-curve threshold "
          f"~{p['lsh_threshold']:.2f}), verify={p['verify']} at "
          f"{p['threshold']}")


if __name__ == "__main__":
  logging.getLogger().setLevel(logging.WARNING)
  sys.exit(main())
