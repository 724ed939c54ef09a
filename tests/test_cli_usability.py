"""The command line people expect: --config files, bare boolean flags,
--version, defaults in --help, no import-time noise, final stage totals."""

import copy
import gc
import json
import pickle
import os
import subprocess
import sys
import time
import types

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import (StandardOptions,
                                                  TypeOptions)
from apache_beam.portability import common_urns
from apache_beam.runners import pipeline_context

import pipeline
from pipeline import cli, job, run_config
from pipeline.cli import main, parse_options
from pipeline.options import DedupOptions, known_flags, options_parser
from tests.conftest import SAMPLE
from transforms import metrics
from transforms.config import DedupConfig
from transforms.elements import ElementCoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, text):
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_config_file_flags_come_first_so_the_command_line_overrides(tmp_path):
  path = write(tmp_path / "run.yaml",
               "input: [a.jsonl, 'b/*.parquet']\nthreshold: 0.7\n"
               "lowercase: false\noverwrite: true\n")
  argv = run_config.expand(["--config", path, "--threshold", "0.6"],
                           options_parser)
  assert argv == ["--input=a.jsonl,b/*.parquet", "--threshold=0.7",
                  "--lowercase=false", "--overwrite=true", "--config", path,
                  "--threshold", "0.6"]
  opts = DedupOptions(argv)
  assert (opts.input, opts.threshold, opts.lowercase, opts.overwrite) == (
      "a.jsonl,b/*.parquet", 0.6, False, True)


def test_no_config_flag_leaves_argv_alone():
  def never():
    raise AssertionError("known flags are needed only with a config file")
  assert run_config.expand(["--input", "x"], never) == ["--input", "x"]


@pytest.mark.parametrize("text,message", [
    ("thresold: 0.7\n", "unknown key 'thresold'; did you mean threshold?"),
    ("- a\n- b\n", "must be a mapping of flag names to values"),
    ("ngram: {n: 3}\n", "ngram: use a number, a string, true/false or a list"),
    ("config: other.yaml\n", "unknown key 'config'"),
    ("input: [a\n", "not valid YAML"),
])
def test_a_bad_config_file_is_refused_before_the_job_naming_it(
    tmp_path, capsys, text, message):
  path = write(tmp_path / "run.yaml", text)
  assert main(["--config", path]) == 2
  err = capsys.readouterr().err
  assert f"error: --config {path}: " in err and message in err


def test_a_missing_config_file_is_refused(tmp_path, capsys):
  assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
  assert "cannot read it (No such file or directory)" in capsys.readouterr().err
  assert main(["--input", "x", "--config"]) == 2
  assert "--config needs a YAML file" in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["--overwrite"], True),
    (["--overwrite", "true"], True),
    (["--overwrite=false"], False),
    (["--overwrite", "--nfkc", "no"], True),
    ([], False),
])
def test_boolean_flags_work_bare_and_with_a_value(argv, expected):
  opts = DedupOptions(["--input", "x", "--output", "y", *argv])
  assert opts.overwrite is expected
  assert opts.input == "x"


def test_a_bare_flag_does_not_swallow_the_next_flag():
  opts = DedupOptions(["--chain_guard", "--lowercase", "false", "--input", "x"])
  assert opts.chain_guard is True and opts.lowercase is False


def test_the_job_options_make_one_view_per_class_sharing_their_values():
  opts = DedupOptions(["--input", "x", "--output", "y", "--runner",
                       "FnApiRunner", "--threshold", "0.6"])
  view = opts.view_as(StandardOptions)
  assert opts.view_as(StandardOptions) is view
  assert opts.view_as(DedupOptions).threshold == 0.6
  # A value set through one view is what every other view (and a fresh,
  # uncached view of the same values) reads.
  view.runner = "PrismRunner"
  assert opts.view_as(StandardOptions).runner == "PrismRunner"
  opts.view_as(DedupOptions).threshold = 0.7
  assert opts.threshold == 0.7
  assert beam.options.pipeline_options.PipelineOptions.view_as(
      opts, DedupOptions).threshold == 0.7
  # Copies (Beam deep-copies a pipeline's options) and pickles start
  # without the views and still read and share the same values.
  for other in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
    assert "_views" not in other.__dict__
    assert other.view_as(StandardOptions).runner == "PrismRunner"
    other.view_as(DedupOptions).threshold = 0.9
    assert other.view_as(DedupOptions).threshold == 0.9
    assert opts.threshold == 0.7


def test_version_and_help(capsys):
  assert parse_options(["--version"]) == 0
  out = capsys.readouterr().out
  assert out.strip().endswith(pipeline.__version__)
  assert parse_options(["--help"]) == 0
  text = capsys.readouterr().out
  assert "(default: 0.8)" in text  # --threshold
  assert "(default: False)" in text  # --overwrite


def test_usage_names_the_module_and_beam_import_noise_is_gone():
  proc = subprocess.run([sys.executable, "-m", "pipeline", "--help"],
                        cwd=ROOT, capture_output=True, text=True, check=True,
                        timeout=120)
  assert proc.stdout.startswith("usage: python -m pipeline ")
  assert "apitools" not in proc.stderr
  assert "GCSFileSystem" not in proc.stderr
  assert proc.stderr == ""


def test_a_metered_dofn_times_its_work_even_when_it_raises():

  class Metered(metrics.MeteredDoFn):
    STAGE = "selection"

  fn = Metered()
  fn.setup()
  with pytest.raises(ZeroDivisionError):
    with fn.meter.timed():
      time.sleep(0.003)
      _ = 1 / 0
  with fn.meter.timed():
    time.sleep(0.003)
  fn.meter.done(2)
  (timing,) = fn.finish_bundle()
  name, ms = timing.value.value
  assert name == metrics.TIMING_PREFIX + "selection" and ms >= 6
  assert fn.finish_bundle() == []


def test_quantities_are_singular_for_one():
  assert metrics.quantity(1, "documents") == "1 document"
  assert metrics.quantity(2, "band keys") == "2 band keys"
  assert metrics.quantity(1, "band keys") == "1 band key"
  assert metrics.quantity(1234, "clusters") == "1,234 clusters"


def test_every_meter_stage_has_a_registered_unit():
  with pytest.raises(ValueError, match="PROGRESS_UNITS"):
    metrics.StageMeter("new_stage")

  class Unregistered(metrics.MeteredDoFn):
    STAGE = "new_stage"

  with pytest.raises(ValueError, match="Unregistered.STAGE 'new_stage'"):
    Unregistered().setup()
  assert metrics.progress_totals({"signatures_documents": 1,
                                  "writing_documents": 3}) == [
                                      "signatures: 1 document in total",
                                      "writing: 3 documents in total"]


@pytest.mark.e2e
def test_a_run_from_a_config_file_records_its_effective_config(
    tmp_path, capsys):
  out = tmp_path / "out"
  path = write(tmp_path / "run.yaml",
               f"input: [{SAMPLE}]\noutput: {out}\nthreshold: 0.7\n"
               "ngram: 3\nlowercase: false\n")
  assert main(["--config", path, "--ngram", "4"]) == 0
  err = capsys.readouterr().err
  params = json.loads((out / "stats.json").read_text())["params"]
  assert (params["threshold"], params["ngram"], params["lowercase"]) == (
      0.7, 4, False)
  assert (params["text_field"], params["id_field"],
          params["input_format"]) == ("text", "id", "auto")
  stats = json.loads((out / "stats.json").read_text())
  totals = [line.split(" neardup ", 1)[1] for line in err.splitlines()
            if line.endswith(" in total")]
  signed = stats["docs_in"] - stats["rejected"]
  assert totals[0] == f"signatures: {signed:,} documents in total"
  assert totals[-1] == (
      f"writing: {stats['docs_in']:,} documents in total")


def test_the_command_tunes_the_collector_and_blocks_ipython_main_does_not(
    monkeypatch, capsys):
  thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
  ipython = sys.modules.pop("IPython", None)
  seen = {}

  def fake_main():
    seen["thresholds"] = gc.get_threshold()
    seen["frozen"] = gc.get_freeze_count()
    seen["ipython"] = sys.modules.get("IPython", "absent")
    return 3

  try:
    assert cli.main(["--help"]) == 0
    capsys.readouterr()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)
    assert "IPython" not in sys.modules
    monkeypatch.setattr(cli, "main", fake_main)
    assert cli.run() == 3
    assert seen["thresholds"] == cli.GC_THRESHOLDS
    assert seen["frozen"] > frozen
    assert seen["ipython"] is None
    # In an IPython session (IPython imported), the import is left alone.
    session = sys.modules["IPython"] = types.ModuleType("IPython")
    assert cli.run() == 3
    assert seen["ipython"] is session
  finally:
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    sys.modules.pop("IPython", None)
    if ipython is not None:
      sys.modules["IPython"] = ipython
  assert gc.get_threshold() == thresholds


@pytest.mark.e2e
def test_the_command_does_not_import_ipython(tmp_path):
  # python -m pipeline, with a check of sys.modules at exit.
  check = ("import atexit, runpy, sys; atexit.register(lambda: print("
           "'IPython imported:', sys.modules.get('IPython') is not None)); "
           "runpy.run_module('pipeline', run_name='__main__', alter_sys=True)")
  proc = subprocess.run(
      [sys.executable, "-c", check, "--input", SAMPLE, "--output",
       str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[-1] == "IPython imported: False"



def test_the_cli_graph_shuffles_its_named_elements_with_their_own_coders():
  # Beam's construction-time type check is what carries the element types
  # its coders are chosen by: a run without it (--no_pipeline_type_check)
  # shuffled every batch through FastPrimitivesCoder, byte-identical outputs
  # but 1 GB more peak memory at 1M documents.
  opts = parse_options(["--input", "in/*.jsonl", "--output", "out"])
  assert opts.view_as(TypeOptions).pipeline_type_check
  p = beam.Pipeline(options=opts)
  job.build(p, ["in/*.jsonl"], "out", DedupConfig(), run_id="coders")
  proto = p.to_runner_api()
  context = pipeline_context.PipelineContext(proto.components)
  value_coders = {}
  for transform in proto.components.transforms.values():
    if transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn:
      (pcoll,) = transform.inputs.values()
      kv = context.coders.get_by_id(
          proto.components.pcollections[pcoll].coder_id)
      value_coders[transform.unique_name] = kv.value_coder()
  step = "NearDedup/FindCandidates/GroupByShard"
  assert isinstance(value_coders[step], ElementCoder), value_coders[step]
  # The joins group their values already encoded by each input's coder.
  for step in ("NearDedup/FindCandidates/GroupEdges/GroupByKey",
               "NearDedup/VerifyExact/CompareShingleSets/GroupEdgeEnds/"
               "GroupByKey"):
    assert value_coders[step] == beam.coders.TupleCoder(
        [beam.coders.VarIntCoder(), beam.coders.BytesCoder()]), (
            step, value_coders[step])
