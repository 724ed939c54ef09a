"""PipelineOptions for the dedup job; every DedupConfig knob is a flag."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import sys
from typing import List, Sequence

from apache_beam.options.pipeline_options import (PipelineOptions,
                                                  StandardOptions)

from transforms.config import (SUBSTRING_STRIKES, SubstringsConfig,
                               KEEP_POLICIES, SHINGLE_UNITS, SKETCHES,
                               VERIFY_MODES, DedupConfig)
from transforms.read import FORMATS
from transforms.write import OUTPUT_COMPRESSIONS, OutputOptions

import pipeline

_DEFAULTS = DedupConfig(bands=1, rows=1)


def parse_bool(value) -> bool:
  if isinstance(value, bool):
    return value
  text = str(value).strip().lower()
  if text in ("true", "1", "yes", "y", "on"):
    return True
  if text in ("false", "0", "no", "n", "off"):
    return False
  raise ValueError(f"not a boolean: {value!r} (use true or false)")


def add_bool_flag(group, flag: str, default: bool, help: str) -> None:  # pylint: disable=redefined-builtin
  """A boolean flag that works bare (``--overwrite``) and with a value
  (``--overwrite true``, ``--overwrite=false``)."""
  group.add_argument(flag, type=parse_bool, nargs="?", const=True,
                     default=default, metavar="BOOL", help=help)


def program_name() -> str:
  """What the usage line calls the command: ``python -m pipeline`` when run
  as a module, else the console script's name (``neardup``)."""
  name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  return "python -m pipeline" if name in ("", "__main__.py", "-c") else name


# What --help cannot list: the streaming job's flags and Beam's own.
BATCH_EPILOG = """\
streaming (an online job: Pub/Sub, Kafka or a folder in, verdicts out):
  %(prog)s --streaming ...
  %(prog)s --streaming --help       its flags
runner flags (Beam's; taken as well, not listed above):
  --runner NAME             FnApiRunner (default), PrismRunner, FlinkRunner,
                            DataflowRunner (README: Local runners, Other runners)
  --direct_num_workers N    processes of the local runner
  --flink_master, --parallelism, --environment_type, --checkpointing_interval
                            Flink (scripts/install_flink.sh, templates/flink/)
  --project, --region, --temp_location, --setup_file
                            Dataflow (templates/dataflow/)
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
  """Defaults after each flag's help; the epilog's lines as written."""


def describe_parser(parser, epilog: str = BATCH_EPILOG) -> None:
  """Usage line, defaults and ``epilog`` in ``--help``, and ``--version``,
  for a job parser."""
  parser.prog = program_name()
  parser.formatter_class = _HelpFormatter
  parser.epilog = epilog
  parser.add_argument("--version", action="version",
                      version=f"%(prog)s {pipeline.__version__}")


def _default(name):
  return getattr(_DEFAULTS, name)


class DedupOptions(PipelineOptions):
  """Options of the batch near-duplicate job (see README for each).

  ``view_as`` makes one view per options class and then returns it again:
  a view holds no values of its own (all share this object's), and Beam
  asks the pipeline's options for views several times per applied
  transform (870 times while the batch graph is built), each a new
  argparse parser (about 1 ms).
  """

  def view_as(self, cls):
    views = self.__dict__.setdefault("_views", {})
    if cls not in views:
      views[cls] = super().view_as(cls)
    return views[cls]

  def __getstate__(self):
    # Copies and pickles (Beam deep-copies a pipeline's options) start
    # without the views, which would otherwise travel along.
    state = dict(super().__getstate__())
    state.pop("_views", None)
    return state

  @classmethod
  def _add_argparse_args(cls, parser):
    describe_parser(parser)
    parser.add_argument("--config", metavar="YAML",
                        help="YAML file with flags as keys (input: a list or"
                        " a comma-separated string); flags given on the"
                        " command line override it.")
    add_io_arguments(parser)
    add_index_arguments(parser)
    add_output_arguments(parser)
    add_detection_arguments(parser)


class _Only:
  """An argument group that adds only the flags named in ``names``."""

  def __init__(self, group, names):
    self._group = group
    self._names = frozenset(names)

  def add_argument(self, flag, *args, **kwargs):
    if flag[2:] in self._names:
      self._group.add_argument(flag, *args, **kwargs)


def add_io_arguments(parser) -> None:
  """Adds the job's input and output flags (``--input``, ``--output``,
  ``--input_format``, ``--text_field``, ``--id_field``, ``--overwrite``) to
  an argparse parser; the offline tools share them with the job."""
  io = parser.add_argument_group("input and output")
  # Not argparse-required: Beam parses every registered options class for
  # any pipeline in the process, and a required flag would break those.
  io.add_argument("--input",
                  help="Input file pattern(s), comma-separated; local or any"
                  " Beam filesystem (gs://, s3://). Sorted by path.")
  io.add_argument("--output",
                  help="Output directory for deduped/, clusters/, rejected/,"
                  " stats.json, report.json and report.html.")
  io.add_argument("--input_format", default="auto",
                  choices=("auto",) + FORMATS,
                  help="auto picks by extension: .jsonl/.ndjson/.json,"
                  " .parquet, .arrow/.feather (Arrow IPC), anything else is"
                  " text (one doc per line).")
  io.add_argument("--text_field", default="text",
                  help="JSONL field / Parquet or Arrow column holding the"
                  " text; a dotted JSONL path (metadata.body) reaches into"
                  " nested objects, a top-level key spelled with the dot"
                  " wins.")
  io.add_argument("--id_field", default="id",
                  help="Optional user id field (dotted like --text_field),"
                  " reported in clusters/.")
  add_bool_flag(io, "--overwrite", False,
                "Replace the outputs of an earlier run in --output.")


def add_index_arguments(parser) -> None:
  """Adds ``--index_out`` and ``--against`` (incremental dedup)."""
  index = parser.add_argument_group("incremental dedup")
  index.add_argument("--index_out", default=None, metavar="DIR",
                     help="Write an LSH index of this run's documents (and"
                     " of the --against index) to this new or empty folder.")
  index.add_argument("--against", default=None, metavar="DIR",
                     help="Deduplicate the inputs against the index an"
                     " earlier run wrote with --index_out: a document similar"
                     " to an indexed one is removed.")


def add_output_arguments(parser) -> None:
  """Adds the flags of :class:`~transforms.write.OutputOptions`."""
  out = parser.add_argument_group("outputs")
  add_bool_flag(out, "--annotate", False,
                "Write every document to annotated/ (instead of the kept"
                " ones to deduped/) with the fields dup_cluster_id,"
                " dup_cluster_size, dup_kept and the explanation added.")
  add_bool_flag(out, "--removal_list", False,
                "Also write removed/: Parquet rows (id, source, position,"
                " cluster_id, kept_doc_id, ...) of every removed document.")
  out.add_argument("--output_compression", default="auto",
                   choices=OUTPUT_COMPRESSIONS,
                   help="Compression of JSONL and text outputs in deduped/"
                   " or annotated/: auto = that of each input file.")


def output_options(options: PipelineOptions) -> OutputOptions:
  """The write stage's :class:`OutputOptions` for these options."""
  view = options.view_as(DedupOptions)
  return OutputOptions(view.annotate, view.removal_list,
                       view.output_compression)


def add_detection_arguments(parser, only: Sequence[str] = None) -> None:
  """Adds the flag of every DedupConfig field (or of those in ``only``) to
  an argparse parser, with the job's defaults and help."""
  dedup = parser.add_argument_group("near-duplicate detection")
  if only is not None:
    dedup = _Only(dedup, only)
  dedup.add_argument("--shingle_unit", default=_default("shingle_unit"),
                     choices=SHINGLE_UNITS, help="word or char n-grams.")
  dedup.add_argument("--ngram", type=int, default=_default("ngram"),
                     help="Shingle size n (units per n-gram).")
  dedup.add_argument("--num_perm", type=int, default=_default("num_perm"),
                     help="MinHash permutations K (signature length).")
  dedup.add_argument("--sketch", default=_default("sketch"),
                     choices=SKETCHES,
                     help="classic: K-permutation MinHash, O(n K) per"
                     " document; oph: one-permutation hashing with optimal"
                     " densification, O(n + K), same Jaccard estimator.")
  dedup.add_argument("--bands", type=int, default=None,
                     help="LSH bands b; with --rows, overrides --threshold's"
                     " choice. b*rows <= num_perm.")
  dedup.add_argument("--rows", type=int, default=None,
                     help="Rows per band r.")
  dedup.add_argument("--threshold", type=float,
                     default=_default("threshold"),
                     help="Jaccard similarity that makes a duplicate: picks"
                     " bands/rows when not given and verifies candidates.")
  dedup.add_argument("--fp_weight", type=float,
                     default=_default("fp_weight"),
                     help="Weight of false positives (candidate area below"
                     " --threshold) when choosing b, r.")
  dedup.add_argument("--fn_weight", type=float,
                     default=_default("fn_weight"),
                     help="Weight of false negatives (missed area above"
                     " --threshold) when choosing b, r; the default 0.95"
                     " over-generates candidates for verification.")
  dedup.add_argument("--verify", default=_default("verify"),
                     choices=VERIFY_MODES,
                     help="exact: keep a candidate edge only if the true"
                     " Jaccard of its shingle sets is >= --threshold;"
                     " signature: if its estimated Jaccard is; none: keep"
                     " all.")
  dedup.add_argument("--seed", type=int, default=_default("seed"),
                     help="Seed of every hash function (same on all"
                     " workers).")
  for name, text in (("nfkc", "Unicode NFKC normalisation."),
                     ("lowercase", "Lowercase the text."),
                     ("strip_punctuation",
                      "Turn punctuation and symbols into spaces."),
                     ("fold_digits", "Map every digit to 0.")):
    add_bool_flag(dedup, f"--{name}", _default(name), text)
  dedup.add_argument("--min_tokens", type=int,
                     default=_default("min_tokens"),
                     help="Documents with fewer units are kept unclustered.")
  dedup.add_argument("--keep", default=_default("keep"),
                     choices=KEEP_POLICIES,
                     help="Which document of a cluster is kept: first (lowest"
                     " id = input order) or longest.")
  dedup.add_argument("--max_cc_rounds", type=int,
                     default=_default("max_cc_rounds"),
                     help="Connected-component rounds unrolled in the graph.")
  dedup.add_argument("--max_residual_edges", type=int,
                     default=_default("max_residual_edges"),
                     help="Most unsettled edges resolved by union-find after"
                     " the rounds before the job fails.")
  dedup.add_argument("--lsh_shards", type=int,
                     default=_default("lsh_shards"),
                     help="Shards of the band-key shuffle; raise for large"
                     " corpora (aim for <= ~20M band keys per shard).")
  dedup.add_argument("--exhaustive_bucket_size", type=int,
                     default=_default("exhaustive_bucket_size"),
                     help="LSH buckets of up to this many documents have"
                     " all their pairs verified (k(k-1)/2 pairs); larger"
                     " ones give the same components from about k x"
                     " (components) comparisons.")
  add_bool_flag(dedup, "--chain_guard", _default("chain_guard"),
                "Remove a clustered document only if its exact Jaccard to"
                " the kept one reaches --threshold; the others stay in"
                " deduped/.")


class SubstringsOptions(PipelineOptions):
  """Options of exact-substring deduplication (README, "Exact substrings")
  and of turning near-dup off for it."""

  @classmethod
  def _add_argparse_args(cls, parser):
    group = parser.add_argument_group("exact substrings")
    add_bool_flag(group, "--near_dup", True,
                  "Run near-duplicate detection (false: only --substrings).")
    group.add_argument("--substrings", type=int, default=0, metavar="T",
                       help="Strike every repeated substring of at least T"
                       " UTF-8 bytes (0: off; 100 is common).")
    group.add_argument("--substrings_strike", default="later",
                       choices=SUBSTRING_STRIKES,
                       help="later: keep each repeated substring's first"
                       " occurrence (input order); all: strike every one.")
    group.add_argument("--substrings_shards", type=int, default=64,
                       help="Shards of the anchor shuffles.")


def substrings_config(options: PipelineOptions) -> SubstringsConfig:
  """The validated SubstringsConfig for these options (raises ConfigError)."""
  view = options.view_as(SubstringsOptions)
  return SubstringsConfig(view.substrings, view.substrings_strike,
                          view.substrings_shards)


REQUIRED_OPTIONS = ("input", "output")
# Flags of the command line only, not job parameters (a template has none).
CLI_ONLY = ("config", "version")
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(DedupConfig))


def config_from_options(options: PipelineOptions) -> DedupConfig:
  """The validated DedupConfig for these options (raises ConfigError)."""
  view = options.view_as(DedupOptions)
  return DedupConfig(**{name: getattr(view, name) for name in CONFIG_FIELDS})


# Runners whose job server defines more options at submission time, which no
# Python options class knows: other unknown flags pass through to them.
PASS_THROUGH_RUNNERS = ("FlinkRunner", "SparkRunner", "PortableRunner")


def _all_options_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
  """The parser of every registered options class (every runner's too)."""
  parsers = []
  options = PipelineOptions(list(argv))
  beam_log = logging.getLogger(PipelineOptions.__module__)
  level = beam_log.level
  # Beam's own "Discarding unparseable args" warning would repeat ours.
  beam_log.setLevel(logging.ERROR)
  try:
    # The callback receives the parser of every registered options class.
    options.get_all_options(add_extra_args_fn=parsers.append)
  finally:
    beam_log.setLevel(level)
  return parsers[0]


def _long_flags(parser: argparse.ArgumentParser) -> List[str]:
  actions = parser._actions  # pylint: disable=protected-access
  return sorted({flag for action in actions for flag in action.option_strings
                 if flag.startswith("--")})


def known_flags() -> List[str]:
  """Every ``--flag`` this job or any Beam options class knows."""
  return _long_flags(options_parser())


def options_parser() -> argparse.ArgumentParser:
  """The parser of every ``--flag`` this job or any Beam options class
  knows."""
  return _all_options_parser([])


def unknown_flags(argv: Sequence[str]) -> List[str]:
  """One line per argument that neither this job nor any Beam options class
  (every runner's flags included) knows, with the closest known flag.

  Beam itself only logs a warning and drops them, so ``--threshhold 0.5``
  ran with the default threshold. On a runner in ``PASS_THROUGH_RUNNERS``
  an unknown flag is reported only if it is close to a known one.
  """
  parser = _all_options_parser(argv)
  _, unknown = parser.parse_known_args(list(argv))
  known = _long_flags(parser)
  runner = str(PipelineOptions(list(argv)).view_as(StandardOptions).runner
               or "")
  lenient = runner.rsplit(".", 1)[-1] in PASS_THROUGH_RUNNERS
  problems, after_flag = [], False
  for arg in unknown:
    if arg == "--":
      break
    if not arg.startswith("-"):
      if not after_flag:
        problems.append(f"unexpected argument {arg!r} (flags are --name "
                        "value or --name=value); see --help")
      after_flag = False
      continue
    name = arg.split("=", 1)[0]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    after_flag = "=" not in arg
    if lenient and not close:
      continue
    hint = f"; did you mean {close[0]}?" if close else "; see --help"
    problems.append(f"unknown flag {name}{hint}")
  return problems
