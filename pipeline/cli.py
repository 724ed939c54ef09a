"""Command line: ``python -m pipeline --input ... --output ...``."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
import uuid
from typing import List, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import (PipelineOptions,
                                                  PrismRunnerOptions,
                                                  StandardOptions)
from apache_beam.runners.runner import PipelineState

from pipeline import engines, introspection, job, run_config
from pipeline.options import (REQUIRED_OPTIONS, DedupOptions,
                              SubstringsOptions, config_from_options,
                              substrings_config, options_parser,
                              output_options, unknown_flags)
from pipeline.preflight import (check_index, check_inputs, dataset_patterns,
                                same_folder)
from transforms import metrics
from transforms.config import ConfigError
from transforms.finalize import (SUCCESS_FILE, OutputBusyError,
                                 OutputNotWritableError, claim_output,
                                 finalize_state, release_claim)
from transforms.index import Index
from transforms.report import REPORT_HTML
from transforms.write import STATS_FILE, join_path

# Measured faster than Prism at 20 and 100k documents, and Prism failed at
# 1M (README, "Local runners"); Prism runs when asked for, and under Beam's
# DirectRunner.
DEFAULT_RUNNER = "FnApiRunner"
PRISM_RUNNERS = ("PrismRunner", "DirectRunner")
# Failures a user can fix, raised in workers: their message is the error.
_USER_ERRORS = ("InputReadError", "InputChangedError", "NoTextFieldError",
                "FileExistsError", "ConfigError", "AnnotationConflictError",
                "OutputBusyError")
# CPython's full collections rescan every live object, and a job's heap is
# mostly long-lived (Beam's modules, the graph, buffered bundles): at 100k
# documents the default collector spent 2.5 s in the run and 2.4 s at exit.
# A young generation about 30 times larger, with the heap frozen once
# imported and again before exit, brought that to 0.7 s, and a 1M run from
# 122.8 s to 99.8 s at the same peak RSS (README, "Issue 12 run"). The
# older generations keep their default ratios to the young one: with them
# at 50 and 100, a 1M run was no faster.
GC_THRESHOLDS = (20_000, 10, 10)


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM, as :func:`run` raises them; ``args[0]`` starts with
  the signal's name. A KeyboardInterrupt with a message, so that Beam
  passes it through with its type kept (a bare KeyboardInterrupt raised in
  a DoFn comes out as a RuntimeError)."""


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the job; returns the process exit code (0 ok, 1 the job failed,
  2 bad arguments or inputs, found before anything is written; 130 or 143
  interrupted by SIGINT or SIGTERM)."""
  try:
    return _main(argv)
  except KeyboardInterrupt as e:
    return _interrupted(_signal_of(e), "no outputs were changed")


def _main(argv: Optional[List[str]]) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  introspection.memoize_introspection()
  try:
    argv = run_config.expand(argv, options_parser)
  except run_config.RunConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  beam_args = [a for a in argv if a not in ("-h", "--help", "--version")]
  if PipelineOptions(beam_args).view_as(StandardOptions).streaming:
    from pipeline import streaming  # pylint: disable=import-outside-toplevel
    return streaming.main(argv)
  opts = parse_options(argv)
  if isinstance(opts, int):
    return opts
  try:
    choose_runner(opts)
    config = config_from_options(opts)
    substrings = substrings_config(opts)
    near_dup = opts.view_as(SubstringsOptions).near_dup
    if not near_dup and (opts.index_out or opts.against):
      raise ConfigError("--near_dup false has no index to write or match:"
                        " drop --index_out/--against, or keep near-dup on.")
  except (ConfigError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  patterns = dataset_patterns(
      [p.strip() for p in opts.input.split(",") if p.strip()])
  index, problems = preflight(patterns, opts, config)
  if problems:
    for problem in problems:
      print(f"error: {problem}", file=sys.stderr)
    return 2

  run_id = uuid.uuid4().hex[:16]
  try:
    claim = claim_output(opts.output, run_id)
  except (OutputBusyError, OutputNotWritableError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  show_progress()
  metrics.reset_progress()
  started = time.time()
  # A job left running (--no_wait_until_finish, as Flex Templates launch)
  # keeps its claim: its own last step removes it.
  stopped = True
  try:
    with beam.Pipeline(options=opts) as p:
      job.build(p, patterns, opts.output, config, opts.input_format,
                opts.text_field, opts.id_field, overwrite=opts.overwrite,
                run_id=run_id, started=started,
                output_options=output_options(opts), against=index,
                index_out=opts.index_out, stale_runs=claim.stale,
                substrings=substrings, near_dup=near_dup)
    stopped = PipelineState.is_terminal(p.result.state)
  except Exception as e:  # pylint: disable=broad-except
    if str(e).startswith("KeyboardInterrupt"):
      # SIGINT's own KeyboardInterrupt, which Beam re-raised from a DoFn
      # as a RuntimeError (run() installs a handler that avoids this).
      return _interrupted(signal.SIGINT,
                          _outputs_after_interrupt(opts.output, claim))
    return _job_failed(e, opts.output)
  except KeyboardInterrupt as e:
    return _interrupted(_signal_of(e),
                        _outputs_after_interrupt(opts.output, claim))
  finally:
    if stopped:
      release_claim(opts.output, run_id)
  if p.result.state == PipelineState.DONE:
    log_totals(p.result)

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
  cached, and FlinkRunner at the job server ``scripts/install_flink.sh``
  cached, so that Beam never tries to download either. Returns the runner.

  Raises:
    ValueError: PrismRunner or FlinkRunner was asked for and its engine is
      not installed, or --flink_version names another Flink than the
      installed job server's.
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
  if runner == "FlinkRunner":
    engines.configure_flink(opts)
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


def log_totals(result) -> None:
  """Ends the progress lines with each stage's total, from the job's
  counters (a runner that reports no metrics gets none)."""
  try:
    found = result.metrics().query(
        MetricsFilter().with_namespace(metrics.NAMESPACE))["counters"]
  except NotImplementedError:
    return
  counters = {}
  for c in found:
    name = c.key.metric.name
    counters[name] = counters.get(name, 0) + (c.committed or c.attempted or 0)
  progress = logging.getLogger(metrics.PROGRESS_LOGGER)
  for line in metrics.progress_totals(counters):
    progress.info(line)


def parse_options(argv: List[str]) -> Union[DedupOptions, int]:
  """The job's options, or the exit code after printing why there are none:
  ``--help`` (0), an invalid value, an unknown flag or a missing one (2)."""
  try:
    # The job's parser, not PipelineOptions': Beam's base parser knows none of
    # the job's flags, so its --help listed nothing.
    opts = DedupOptions(argv)
  except SystemExit as e:  # --help (0) or an invalid value/choice (2)
    return 0 if e.code is None else int(e.code)
  # Unknown flags first: a misspelled --input is the reason it is missing.
  problems = unknown_flags(argv)
  problems += [f"--{name} required; see --help" for name in REQUIRED_OPTIONS
               if not getattr(opts, name)]
  for problem in problems:
    print(f"error: {problem}", file=sys.stderr)
  return 2 if problems else opts


def preflight(patterns: List[str], opts: DedupOptions, config
              ) -> Tuple[Optional[Index], List[str]]:
  """``(the --against index or None, every problem)`` with the inputs, the
  output folder and the indexes, one line each, before anything is written
  (see :mod:`pipeline.preflight`)."""
  files, problems = check_inputs(patterns, opts.input_format,
                                 opts.text_field, opts.annotate)
  problems += check_output(opts.output, opts.overwrite)
  problems += [f"--output {opts.output}: is the {flag} folder; write the "
               "run's outputs to a folder of their own"
               for flag, folder in (("--against", opts.against),
                                    ("--index_out", opts.index_out))
               if folder and same_folder(opts.output, folder)]
  if not (opts.against or opts.index_out):
    return None, problems
  params = job.effective_params(config, opts.input_format, opts.text_field,
                                opts.id_field)
  index, index_problems = check_index(opts.against, opts.index_out, params,
                                      files)
  return index, problems + index_problems


def check_output(output: str, overwrite: bool) -> List[str]:
  """Refuses to replace an earlier run's outputs without ``overwrite``;
  with it, they are replaced only once the new run has succeeded (by the
  job's last step), never deleted here."""
  existing = [name for name in job.OUTPUT_NAMES + (SUCCESS_FILE,)
              if FileSystems.exists(join_path(output, name))]
  if existing and not overwrite:
    return [f"{output}: already holds {existing}; pass --overwrite true to "
            "replace them (once this run has succeeded) or choose another "
            "--output"]
  if "://" not in output and os.path.exists(output) and not os.path.isdir(
      output):
    return [f"{output}: is a file; --output names a folder"]
  return []


def _drop_interrupt_tracebacks(record: logging.LogRecord) -> bool:
  """Beam logs the traceback of every exception a DoFn raises, an
  interrupt's too; an interrupt is reported in one line instead."""
  error = record.exc_info[1] if record.exc_info else record.msg
  return not isinstance(error, KeyboardInterrupt)


def _signal_of(interrupt: KeyboardInterrupt) -> int:
  if isinstance(interrupt, Interrupted):
    return signal.Signals[str(interrupt.args[0]).split()[0]]
  return signal.SIGINT


def _interrupted(signum: int, outputs: str) -> int:
  """Says the run was interrupted and what that left; returns 128 +
  ``signum`` (the shell's code for a process a signal ended)."""
  print(f"error: interrupted ({signal.Signals(signum).name}); {outputs}",
        file=sys.stderr)
  return 128 + signum


def _outputs_after_interrupt(output: str, claim) -> str:
  """What an interrupted job left in ``output``, from its staging folder:
  untouched outputs, or a replacement cut short or already complete."""
  state = finalize_state(claim.staging)
  if state == "committing":
    return (f"it stopped while replacing the outputs in {output}: that folder"
            f" holds no {SUCCESS_FILE} (parts of the old and new outputs);"
            " rerun to complete it")
  if state == "finalized":
    return f"{output} holds this run's complete outputs ({SUCCESS_FILE})"
  return (f"no outputs were changed: {output} holds its earlier outputs, "
          "if any")


def _job_failed(error: Exception, output: str) -> int:
  """Prints why the job failed, the cause a user can fix on the last line
  (the worker's traceback only when it is not such a cause); returns 1."""
  reason = _user_error(error)
  if reason is None:
    traceback.print_exception(error, file=sys.stderr)
    lines = [l for l in str(error).splitlines() if l.strip()]
    reason = lines[-1] if lines else type(error).__name__
  print(f"error: the job failed: {reason}\n(no outputs were finalized: "
        f"{output} holds no new {SUCCESS_FILE}; earlier outputs there are "
        "unchanged)", file=sys.stderr)
  return 1


def _user_error(error: BaseException) -> Optional[str]:
  """The message of a fixable failure anywhere in ``error``: its exception
  chain (in-process runners keep the type) or, from a portable runner, the
  remote traceback's text."""
  seen = error
  while seen is not None:
    if type(seen).__name__ in _USER_ERRORS:
      return str(seen).split(" [while running", 1)[0].strip()
    seen = seen.__cause__ or seen.__context__
  found = re.findall(rf"(?:{'|'.join(_USER_ERRORS)}): ([^\n]+)", str(error))
  return found[-1].split(" [while running", 1)[0].strip() if found else None


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


def run() -> int:
  """The command's entry point (``python -m pipeline``, ``neardup``): main()
  in a process that runs one job, with the collector tuned for it (see
  ``GC_THRESHOLDS``) and, outside an IPython session, IPython's import
  blocked. A library call of main() leaves both as they are."""
  # Beam's first apply imports IPython, where it is installed, to ask
  # whether it runs in one (interactive_utils.is_in_ipython): 0.36 s with
  # IPython 8.12 here. An IPython session has imported IPython already, so
  # where it has not, None makes the import raise ImportError, which Beam
  # reads as "not in IPython".
  sys.modules.setdefault("IPython", None)
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, _raise_interrupted)
  logging.getLogger("apache_beam.runners.common").addFilter(
      _drop_interrupt_tracebacks)
  gc.freeze()
  gc.set_threshold(*GC_THRESHOLDS)
  code = main()
  # What is live now lives until exit: the interpreter need not rescan it.
  gc.freeze()
  return code


def _raise_interrupted(signum, _frame):
  raise Interrupted(signal.Signals(signum).name)


if __name__ == "__main__":
  sys.exit(run())
